"""The 2P-set contract (DESIGN.md §3) and roshi's cluster scenarios, on standalone shards and a Redis Cluster."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
from bounded_helpers import bounded_cluster

from zcluster import Cluster, Cursor, InvalidTupleError, KeyMember, KeyScoreMember, Presence

KSM = KeyScoreMember


@pytest.fixture(params=["shards", "cluster"])
def bounded(request: pytest.FixtureRequest, prefix: str) -> Iterator[Cluster]:
    """A cluster with max_size=5 over either topology."""
    with bounded_cluster(request, prefix, 5) as c:
        yield c


def members(c: Cluster, key: str, limit: int = 100) -> list[tuple[str, float]]:
    return [(t.member, t.score) for t in c.select([key], limit=limit)[key]]


def test_select_offsets_order_and_ties(any_cluster: Cluster) -> None:
    c = any_cluster
    c.insert([KSM("foo", 1.0, "a"), KSM("foo", 2.0, "b"), KSM("foo", 3.0, "c"), KSM("foo", 2.0, "bb")])
    assert members(c, "foo") == [("c", 3.0), ("bb", 2.0), ("b", 2.0), ("a", 1.0)]  # ties: member descending
    assert [t.member for t in c.select(["foo"], offset=1, limit=2)["foo"]] == ["bb", "b"]
    assert c.select(["foo"], offset=10, limit=5)["foo"] == []
    assert c.select(["never-written"], limit=5) == {"never-written": []}


@pytest.mark.parametrize("limit", [0, -1])
def test_select_with_nonpositive_limit_is_an_error(any_cluster: Cluster, limit: int) -> None:
    with pytest.raises(ValueError, match="limit"):
        any_cluster.select(["foo"], limit=limit)


def test_results_keep_the_callers_key_order_and_objects(any_cluster: Cluster) -> None:
    keys = [f"k{i}" for i in range(50)]
    any_cluster.insert([KSM(k, 1.0, "m") for k in keys])
    assert list(any_cluster.select(keys, limit=1)) == keys


def test_stale_writes_are_rejected(any_cluster: Cluster) -> None:
    c = any_cluster
    assert c.insert([KSM("s", 5.0, "m")]).applied == [True]
    assert c.insert([KSM("s", 4.0, "m")]).applied == [False]  # older insert
    assert c.insert([KSM("s", 5.0, "m")]).applied == [False]  # same insert again: no effect
    assert c.delete([KSM("s", 4.0, "m")]).applied == [False]  # older delete
    assert members(c, "s") == [("m", 5.0)]
    assert c.delete([KSM("s", 5.0, "m")]).applied == [True]  # delete wins the tie
    assert members(c, "s") == []
    assert c.insert([KSM("s", 5.0, "m")]).applied == [False]  # tie after the delete: delete still wins
    assert c.insert([KSM("s", 6.0, "m")]).applied == [True]
    assert c.score([KeyMember("s", "m")])[KeyMember("s", "m")] == Presence(True, True, 6.0)


def test_delete_of_unknown_member_leaves_a_tombstone(any_cluster: Cluster) -> None:
    c = any_cluster
    assert c.delete([KSM("t", 9.0, "ghost")]).applied == [True]
    assert c.insert([KSM("t", 8.0, "ghost")]).applied == [False]
    assert members(c, "t") == []
    presence = c.score([("t", "ghost")])[KeyMember("t", "ghost")]
    assert presence == Presence(True, False, 9.0)


def test_score_of_unknown_member(any_cluster: Cluster) -> None:
    p = any_cluster.score([("nokey", "nomember")])[KeyMember("nokey", "nomember")]
    assert not p.present and not p.inserted and math.isnan(p.score)


def test_exact_double_scores_round_trip(any_cluster: Cluster) -> None:
    c = any_cluster
    # neighbouring doubles must stay distinct (Lua prints 14 digits; the script must not round-trip via Lua)
    a = 1700000000.123456
    b = math.nextafter(a, math.inf)
    c.insert([KSM("x", a, "a"), KSM("x", b, "b")])
    assert members(c, "x") == [("b", b), ("a", a)]
    assert c.insert([KSM("x", a, "b")]).applied == [False]
    assert c.delete([KSM("x", a, "b")]).applied == [False]  # b's insert is one ulp newer


def test_raw_bytes_keys_and_members_round_trip(any_cluster: Cluster) -> None:
    c = any_cluster
    key, member = b"\xff\x00key}{", b"\x80\x81\x00\xfe"
    c.insert([KSM(key, 1.0, member)])
    got = c.select([key])[key]
    assert [(t.member.encode("utf-8", "surrogateescape"), t.score) for t in got] == [(member, 1.0)]
    # the str form read back addresses the same member
    assert c.delete([KSM(key, 2.0, got[0].member)]).applied == [True]
    assert c.select([key])[key] == []


def test_keys_with_braces_share_slots_and_work(any_cluster: Cluster) -> None:
    c = any_cluster
    keys = ["}", "}lead", "{tag}rest", "a}b{c", "{", "{}"]
    assert c.insert([KSM(k, 1.0, "m") for k in keys]).applied == [True] * len(keys)
    assert c.delete([KSM(k, 2.0, "m") for k in keys]).applied == [True] * len(keys)
    assert all(v == [] for v in c.select(keys).values())


def test_bad_input_is_rejected_before_anything_is_sent(any_cluster: Cluster) -> None:
    c = any_cluster
    batch = [KSM("b", 1.0, "ok"), KSM("b", math.nan, "nan")]
    with pytest.raises(InvalidTupleError, match=r"#1 .*finite.*nothing of this call was sent"):
        c.insert(batch)
    assert members(c, "b") == []  # the good tuple was not half-applied
    for bad, reason in [
        (("", 1.0, "m"), "empty"),
        ((1, 1.0, "m"), "key must be str or bytes"),
        (("k", 1.0, 3), "member must be"),
        (("k", "1", "m"), "score must be int or float"),
        (("k", 1.0), "expected a"),
        (None, "expected a"),
    ]:
        with pytest.raises(InvalidTupleError, match=reason):
            c.insert([bad])  # type: ignore[list-item]


def test_large_batches_are_split_and_fully_applied(any_cluster: Cluster) -> None:
    c = any_cluster
    tuples = [KSM(f"big{i % 7}", float(i), f"m{i}") for i in range(5000)]
    assert c.insert(tuples).applied_count == 5000
    assert sum(len(v) for v in c.select([f"big{i}" for i in range(7)], limit=5000).values()) == 5000
    # ARGV far above Lua's unpack limit in a single call
    huge = c.view(c.prefix, batch_size=20000)
    assert huge.insert([KSM("one", float(i), f"m{i}") for i in range(12000)]).applied_count == 12000
    assert len(c.select(["one"], limit=20000)["one"]) == 12000


def test_select_range_pages_with_cursors(any_cluster: Cluster) -> None:
    c = any_cluster
    # many members share scores, so cursor paging must break ties by member
    c.insert([KSM("r", float(i // 5), f"m{i:03d}") for i in range(60)])
    expected = members(c, "r")
    pages, start = [], None
    while True:
        page = c.select_range(["r"], start=start, limit=7)["r"]
        if not page:
            break
        pages.extend((t.member, t.score) for t in page)
        start = Cursor.parse(str(Cursor(page[-1].score, page[-1].member)))  # through roshi's string form
    assert pages == expected
    # a stop cursor excludes itself and everything after it
    stop = Cursor(expected[20][1], expected[20][0])
    assert [(t.member, t.score) for t in c.select_range(["r"], stop=stop, limit=100)["r"]] == expected[:20]
    with pytest.raises(ValueError):
        c.select_range(["r"], limit=0)


def test_keys_scan_reports_each_key_once(any_cluster: Cluster) -> None:
    c = any_cluster
    c.insert([KSM(f"user:{i}", 1.0, "m") for i in range(300)])
    c.delete([KSM("gone", 1.0, "m"), KSM("user:0", 2.0, "m")])
    found = [k for batch in c.keys(batch_size=50) for k in batch]
    assert sorted(found) == sorted(f"user:{i}" for i in range(1, 300))
    with_removed = [k for batch in c.keys(batch_size=50, include_removed=True) for k in batch]
    assert len(with_removed) == len(set(with_removed)) == 301  # user:0 (K- only now) and gone
    assert {k for b in c.keys(match="user:1?") for k in b} == {f"user:1{i}" for i in range(10)}


def test_namespaces_isolate_applications(shards: object, prefix: str) -> None:
    urls = shards.urls  # type: ignore[attr-defined]
    a = Cluster.from_urls(urls, prefix=prefix + "a:")
    b = Cluster.from_urls(urls, prefix=prefix + "b:")
    a.insert([KSM("shared", 1.0, "from-a")])
    assert b.select(["shared"])["shared"] == []
    assert [k for batch in b.keys() for k in batch] == []
    assert [k for batch in a.keys() for k in batch] == ["shared"]


def test_size_bound_keeps_highest_and_rejects_below_lowest(bounded: Cluster) -> None:
    c = bounded
    c.insert([KSM("cap", float(i), f"m{i}") for i in range(10)])
    assert members(c, "cap") == [(f"m{i}", float(i)) for i in range(9, 4, -1)]
    assert c.insert([KSM("cap", 3.0, "late")]).applied == [False]  # below the full set's lowest
    assert c.insert([KSM("cap", 20.0, "new")]).applied == [True]
    assert [m for m, _ in members(c, "cap")] == ["new", "m9", "m8", "m7", "m6"]


def test_trimmed_tombstone_does_not_resurrect_an_older_insert(bounded: Cluster) -> None:
    c = bounded
    c.insert([KSM("z", 1.0, "victim")])
    c.delete([KSM("z", 2.0, "victim")])
    # push the tombstone out of K- (bound 5) with newer deletes
    c.delete([KSM("z", 10.0 + i, f"d{i}") for i in range(6)])
    assert c.score([("z", "victim")])[KeyMember("z", "victim")].present is False  # tombstone trimmed
    # a replay of the original insert must stay dead (roshi would resurrect it here)
    assert c.insert([KSM("z", 1.0, "victim")]).applied == [False]
    assert c.insert([KSM("z", 1.5, "victim")]).applied == [False]
    assert members(c, "z") == []
    # newer than everything forgotten: accepted
    assert c.insert([KSM("z", 100.0, "victim")]).applied == [True]


def test_forget_drops_old_records_and_blocks_their_replays(any_cluster: Cluster) -> None:
    c = any_cluster.view(any_cluster.prefix, floors=True)
    c.insert([KSM("ret", float(i), f"m{i}") for i in range(10)])
    c.delete([KSM("ret", 3.5, "m3"), KSM("ret", 20.0, "late-ghost")])
    assert c.forget(["ret", "never"], up_to=4.0) == 5  # m0 m1 m2 m4 (m3 is K-) and m3's tombstone
    assert [m for m, _ in members(c, "ret")] == [f"m{i}" for i in range(9, 4, -1)]
    # replays of anything at or below the horizon are stale now, deleted or not
    assert c.insert([KSM("ret", 3.0, "m3"), KSM("ret", 1.0, "m1"), KSM("never", 4.0, "x")]).applied == [False] * 3
    assert c.insert([KSM("ret", 4.5, "m3")]).applied == [True]
    assert c.score([("ret", "late-ghost")])[KeyMember("ret", "late-ghost")] == Presence(True, False, 20.0)
    with pytest.raises(Exception, match="floors"):
        any_cluster.forget(["ret"], 1.0)


def test_floor_judges_only_members_without_a_record(bounded: Cluster) -> None:
    # Found by the bounded property test: a floor raised by other members' trimmed tombstones must not
    # freeze a live member at an older score.
    c = bounded.view(bounded.prefix, max_size=1)
    c.insert([KSM("f", 0.0, "c")])
    c.delete([KSM("f", 1.0, "a")])
    c.delete([KSM("f", 1.0, "b")])  # K- holds one tombstone: a's is trimmed, the floor rises to 1
    assert c.score([("f", "a")])[KeyMember("f", "a")].present is False
    assert c.insert([KSM("f", 1.0, "c")]).applied == [True]  # c's own record (0) decides, not the floor
    assert members(c, "f") == [("c", 1.0)]
    assert c.insert([KSM("f", 1.0, "a")]).applied == [False]  # a has no record: the floor decides
