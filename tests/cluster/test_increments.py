"""Fenced increments against real servers, in both topologies: applied once per (key, source, position),
kinds of keys refuse each other's writes, overflow and bad input are clear errors with nothing applied."""

from __future__ import annotations

import random
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zcluster import Cluster, ConfigError, Count, Delete, Fence, Incr, Insert, InvalidTupleError, WriteRefusedError
from zcluster._keys import KeyLayout
from zcluster.testing import LocalRedisCluster


def totals(c: Cluster, key: str) -> dict[str, float]:
    return {str(e.member): e.score for e in c.select([key], limit=1000)[key]}


def test_each_position_counts_once_whatever_is_sent_again(any_cluster: Cluster) -> None:
    c = any_cluster
    items = [(1, Incr("lb", "alice", 5)), (1, Incr("lb", "bob", 3)), (2, Incr("lb", "alice", 2.5))]
    assert c.increment("j1", items).applied == [True, True, True]
    assert c.increment("j1", items).applied == [False, False, False]  # a replay: fenced
    assert c.increment("j1", items[1:]).applied == [False, False]  # a resend of part of it
    assert totals(c, "lb") == {"alice": 7.5, "bob": 3.0}
    assert c.increment("j2", items[:1]).applied == [True]  # another source has its own fence
    assert totals(c, "lb")["alice"] == 12.5
    assert c.increment("j1", [(3, Incr("lb", "carol", 1)), (3, Incr("lb", "carol", 1))]).applied == [True, True]
    assert totals(c, "lb")["carol"] == 2.0  # two increments of one position: j tells them apart
    # select reads a leaderboard: highest first, ties by member descending
    c.increment("j1", [(4, Incr("lb", "dave", 3))])
    assert [e.member for e in c.select(["lb"], limit=10)["lb"]] == ["alice", "dave", "bob", "carol"]
    ranks = c.ranks([("lb", "bob"), ("lb", "alice"), ("lb", "nobody"), ("none", "x")])
    assert list(ranks.values()) == [(2, 3.0), (0, 12.5), None, None]


def test_fences_say_how_far_each_source_reached_and_top_reads_pages(any_cluster: Cluster) -> None:
    c = any_cluster
    c.increment("app/a", [(1, Incr("lb", "x", 2)), (1, Incr("lb", "y", 1)), (5, Incr("lb", "x", 1))])
    c.increment("app/b", [(3, Count("hits", "f", 4)), ((7, 2, 0), Incr("lb", "z", 9))])
    c.insert([("plain", 1.0, "m")])
    fences = c.fences(["lb", "hits", "plain", "never"])
    assert fences == {
        "lb": {"app/a": Fence((5, 0, 0), 3), "app/b": Fence((7, 2, 0), 1)},
        "hits": {"app/b": Fence((3, 0, 0), 1)},
        "plain": None,  # a 2P-set
        "never": None,
    }
    c.increment("app/a", [(1, Incr("lb", "x", 2))])  # at the fence: neither position nor count moves
    assert c.fences(["lb"])["lb"]["app/a"] == Fence((5, 0, 0), 3)
    page = c.top(["lb", "never"], offset=1, limit=2)
    assert [(e.member, e.score) for e in page["lb"]] == [("x", 3.0), ("y", 1.0)] and page["never"] == []


def test_counters_are_exact_int64_and_refuse_overflow(any_cluster: Cluster) -> None:
    c = any_cluster
    big = 2**62
    assert c.increment("s", [(1, Count("views", "a", big)), (2, Count("views", "a", big - 1))]).ok
    assert c.counters(["views", "none"]) == {"views": {"a": 2**63 - 1}, "none": {}}
    with pytest.raises(WriteRefusedError, match="int64") as info:
        c.increment("s", [(3, Count("views", "a", 1)), (4, Count("views", "b", 7)), (5, Count("other", "a", 1))])
    assert sorted(info.value.refused) == [0, 1]  # the key stops at its refused increment; other keys go on
    assert info.value.result.applied == [False, False, True]
    assert c.counters(["views", "other"]) == {"views": {"a": 2**63 - 1}, "other": {"a": 1}}
    assert c.increment("s", [(4, Count("views", "b", 7))]).applied == [True]  # the fence stayed at 2
    assert c.counters(["views"])["views"] == {"a": 2**63 - 1, "b": 7}


def test_kinds_of_keys_refuse_each_others_writes_and_change_nothing(any_cluster: Cluster) -> None:
    c = any_cluster
    c.insert([("set", 1.0, "m")])
    c.increment("j", [(1, Incr("sums", "m", 2)), (1, Count("counts", "f", 3))])
    refused = [
        (lambda: c.increment("j", [(2, Incr("set", "m", 1))]), "another kind"),
        (lambda: c.increment("j", [(2, Count("sums", "m", 1))]), "another kind"),
        (lambda: c.increment("j", [(2, Incr("counts", "f", 1))]), "another kind"),
        (lambda: c.apply([Insert("sums", 9.0, "m")]), "aggregate"),
        (lambda: c.apply([Delete("sums", 9.0, "m")]), "aggregate"),
        (lambda: c.apply([Insert("counts", 9.0, "f")]), "aggregate"),
        (lambda: c.delete([("counts", 9.0, "f")]), "aggregate"),
    ]
    for call, why in refused:
        with pytest.raises(WriteRefusedError, match=why) as info:
            call()
        assert info.value.index == 0
    assert c.select(["set"])["set"][0].score == 1.0
    assert totals(c, "sums") == {"m": 2.0} and c.counters(["counts"])["counts"] == {"f": 3}
    # the rest of a call goes on: only the refused write is left out
    with pytest.raises(WriteRefusedError) as info:
        c.apply([Insert("a", 1.0, "x"), Insert("sums", 1.0, "m"), Insert("b", 1.0, "y")])
    assert info.value.index == 1
    assert c.select(["a", "b"]) == {"a": [("a", 1.0, "x")], "b": [("b", 1.0, "y")]}
    result = c.apply([Insert("sums", 1.0, "m")], raise_on_error=False)
    assert result.refused is not None and not result.ok


def test_bad_increments_are_clear_errors_and_nothing_is_sent(any_cluster: Cluster) -> None:
    c = any_cluster
    bad = [
        [(1, Incr("k", "m", float("nan")))],
        [(1, Incr("k", "m", float("inf")))],
        [(1, Incr("k", "m", "3"))],  # type: ignore[arg-type]
        [(1, Incr("k", "m", True))],
        [(1, Incr("k", "m", 2**60 + 1))],  # not exact as a double
        [(1, Incr("k", "m", 10**400))],  # beyond any double (float() overflows)
        [(1, Count("k", "f", 1.5))],  # type: ignore[arg-type]
        [(1, Count("k", "f", 2**63))],
        [(1, Incr("", "m", 1))],
        [(-1, Incr("k", "m", 1))],
        [(2**53, Incr("k", "m", 1))],
        [(5, Incr("k", "m", 1)), (4, Incr("k", "m", 1))],  # positions go backwards
        [(1, Insert("k", 1.0, "m"))],  # type: ignore[list-item]
    ]
    for items in bad:
        with pytest.raises(InvalidTupleError):
            c.increment("j", items)
    with pytest.raises(ConfigError, match="source"):
        c.increment("a|b", [(1, Incr("k", "m", 1))])
    assert c.select(["k"]) == {"k": []} and c.counters(["k"]) == {"k": {}}


def test_a_ttl_is_set_when_the_key_is_created_and_not_refreshed(shards: object, prefix: str) -> None:
    with Cluster.from_urls(shards.urls, prefix=prefix) as c:  # type: ignore[attr-defined]
        c.increment("j", [(1, Incr("hour:1", "m", 1))], ttl=100)
        ttls = [s.client.ttl(f"{{{prefix}hour:1}}+") for s in c._transport.topology.shards]
        assert max(ttls) in range(90, 101)
        for s in c._transport.topology.shards:
            s.client.expire(f"{{{prefix}hour:1}}+", 1000)
        c.increment("j", [(2, Incr("hour:1", "m", 1))], ttl=100)
        assert max(s.client.ttl(f"{{{prefix}hour:1}}+") for s in c._transport.topology.shards) > 900


def test_many_increments_of_one_key_go_in_order_across_calls(any_cluster: Cluster) -> None:
    c = any_cluster.view(any_cluster.prefix, batch_size=3)  # 20 increments of a key: 7 rounds
    items = [(i, Incr("hot", f"m{i % 4}", 1)) for i in range(20)] + [(20 + i, Count("c", "f", 1)) for i in range(5)]
    assert all(c.increment("src", items).applied)
    assert not any(c.increment("src", items).applied)
    assert totals(c, "hot") == {f"m{k}": 5.0 for k in range(4)} and c.counters(["c"])["c"] == {"f": 5}


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**31), st.integers(1, 60))
def test_replays_and_resends_in_any_split_count_each_position_once(shards: object, seed: int, n: int) -> None:
    """A stream of increments sent as random overlapping windows (retries, replays, zombies from older
    positions): the totals are those of sending each once."""
    rng = random.Random(seed)
    items = [
        (i // 2, Incr(f"k{rng.randrange(3)}", f"m{rng.randrange(4)}", rng.choice([1, 2, -1, 0.5]))) for i in range(n)
    ]
    expected: dict[str, dict[str, float]] = {}
    for _, inc in items:
        expected.setdefault(inc.key, {}).setdefault(inc.member, 0.0)
        expected[inc.key][inc.member] += inc.delta
    prefix = f"prop{seed}-{n}:"
    with Cluster.from_urls(shards.urls, prefix=prefix, batch_size=rng.choice([1, 2, 8, 256])) as c:  # type: ignore[attr-defined]
        frontier = 0  # everything before it was sent: a window may start anywhere up to it, never past it
        for _ in range(rng.randint(1, 5)):
            lo = rng.randrange(frontier + 1) if frontier < n else rng.randrange(n)
            hi = rng.randrange(lo, n) + 1
            while lo > 0 and items[lo][0] == items[lo - 1][0]:
                lo -= 1  # a window starts at a position's first increment (j counts from there)
            c.increment("src", items[lo:hi])
            frontier = max(frontier, hi)
        c.increment("src", items)  # whatever came before, everything once
        got = {k: totals(c, k) for k in expected}
    assert got == expected


@pytest.mark.cluster
def test_increments_during_a_slot_migration_count_once() -> None:
    """MOVED, ASK and TRYAGAIN (a key's totals and fences moved apart mid-migration) while a writer increments
    keys of the migrating slot; then the whole stream again: every round counted once."""
    with LocalRedisCluster(3) as rc, Cluster.from_cluster_url(rc.url) as c:
        keys = [f"{{hot}}:{i}" for i in range(30)]
        slot = KeyLayout(c.prefix).slot(keys[0].encode())
        dst = (rc.slot_owner(slot) + 1) % 3
        rounds: list[list[tuple[int, Incr]]] = []
        errors: list[BaseException] = []
        stop = threading.Event()

        def writer() -> None:
            try:
                while not stop.is_set() and len(rounds) < 2000:
                    n = len(rounds)
                    items = [(n, Incr(k, "m", 1)) for k in keys]
                    c.increment("w", items)
                    rounds.append(items)
            except BaseException as exc:  # reported below, never swallowed
                errors.append(exc)

        t = threading.Thread(target=writer)
        t.start()
        deadline = time.monotonic() + 120
        while not rounds and not errors:  # every key exists before the migration lists the slot's keys
            assert time.monotonic() < deadline, "the writer never finished its first round"
            time.sleep(0.005)
        moved = rc.migrate_slot(slot, dst, batch=5, pause=0.05)
        stop.set()
        t.join(120)
        assert not errors, errors
        assert moved == 2 * len(keys) and rc.slot_owner(slot) == dst  # totals and fences moved
        assert len(rounds) > 1, "the writer made progress during the migration"
        c.increment("w", [item for items in rounds for item in items])  # a replay of everything
        assert all(totals(c, k) == {"m": float(len(rounds))} for k in keys)


# -- issue 27: aggregate keys meet 2P-set-only operations; bad increments ------------------------------------


def test_forget_refuses_aggregate_keys_unchanged_and_forgets_the_others(any_cluster: Cluster) -> None:
    c = any_cluster.view(any_cluster.prefix, floors=True)
    c.insert([("set", 50.0, "old"), ("set", 500.0, "new")])
    lb = [(1, Incr("points", "low", 50)), (2, Incr("points", "high", 500))]
    c.increment("j", [*lb, (3, Count("hits", "f", 7))])
    with pytest.raises(WriteRefusedError, match=r"'points' is a sums \(Incr\) aggregate key") as info:
        c.forget(["set", "points", "hits"], 100)
    assert info.value.index == 1 and sorted(info.value.refused) == [1, 2]
    assert "counters (Count)" in info.value.refused[2]
    assert info.value.result.applied == [True, False, False] and info.value.result.ok
    assert totals(c, "points") == {"low": 50.0, "high": 500.0}  # nothing of the aggregate changed
    assert c.counters(["hits"])["hits"] == {"f": 7}
    assert c.fences(["points"])["points"] == {"j": Fence((2, 0, 0), 2)}
    assert totals(c, "set") == {"new": 500.0}  # the 2P-set of the same call was forgotten
    assert c.increment("j", lb).applied == [False, False]  # still fenced: nothing counts twice
    # A retention pass over keys() (which lists aggregate keys) runs through, refusal by refusal.
    c.insert([("set2", 1.0, "x")])
    refused: list[object] = []
    for batch in c.keys(batch_size=2):
        try:
            c.forget(batch, 100)
        except WriteRefusedError as exc:
            refused += [batch[i] for i in exc.refused]
    assert sorted(map(str, refused)) == ["hits", "points"]
    assert c.select(["set2"])["set2"] == [] and totals(c, "points") == {"low": 50.0, "high": 500.0}


@pytest.mark.parametrize("max_size", [None, 5])
def test_a_delete_at_or_below_a_floor_leaves_a_reused_key_s_totals_alone(any_cluster: Cluster, max_size: int) -> None:
    """A key forgotten as a 2P-set keeps its floor; reused as a leaderboard, a delete at or below that floor
    (no tombstone to write) removed the member's total before anything refused it."""
    c = any_cluster.view(any_cluster.prefix, floors=True, max_size=max_size)
    c.insert([("reused", 1.0, "m")])
    c.forget(["reused"], 10)  # the key is empty now, its floor stays at 10
    c.increment("j", [(1, Incr("reused", "a", 5))])
    with pytest.raises(WriteRefusedError, match="aggregate"):
        c.delete([("reused", 7.0, "a")])
    with pytest.raises(WriteRefusedError, match="aggregate"):
        c.delete([("reused", 7.0, "b")])  # no total of b: refused too (it used to be reported stale)
    assert totals(c, "reused") == {"a": 5.0}


def test_equal_full_positions_in_one_call_are_an_invalid_tuple(any_cluster: Cluster) -> None:
    c = any_cluster
    for items in (
        [((5, 0, 0), Incr("k", "a", 1)), ((5, 0, 0), Incr("k", "b", 1))],
        [((5, 0, 0), Incr("k", "a", 1)), ((5, 0, 0), Incr("other", "b", 1))],  # a position is one increment
        [((5, 0, 0), Incr("k", "a", 1)), (5, Incr("k", "b", 1))],  # 5 is (5, 0, 0) here: j counts from 0
    ):
        with pytest.raises(InvalidTupleError, match=r"item #0's too") as info:
            c.increment("j", items)
        assert info.value.index == 1
    assert c.select(["k", "other"]) == {"k": [], "other": []}
    # shorter positions count their j: one position's increments are all applied
    assert c.increment("j", [(5, Incr("k", "a", 1)), (5, Incr("k", "b", 1))]).applied == [True, True]
    assert c.increment("j", [((6, 0, 0), Incr("k", "a", 1)), ((6, 0, 1), Incr("k", "b", 1))]).ok


def test_a_sums_total_never_becomes_infinite(any_cluster: Cluster) -> None:
    c = any_cluster
    with pytest.raises(WriteRefusedError, match="finite") as info:
        c.increment("j", [(1, Incr("big", "a", 1e308)), (2, Incr("big", "a", 1e308)), (3, Incr("big", "b", 1))])
    assert sorted(info.value.refused) == [1, 2]  # the key stops at its refused increment
    assert info.value.result.applied == [True, False, False]
    with pytest.raises(WriteRefusedError, match="finite"):
        c.increment("j", [(2, Incr("big", "n", -1e308)), (3, Incr("big", "n", -1.7e308))])
    assert totals(c, "big") == {"a": 1e308, "n": -1e308}
    huge = 1.7976931348623157e308  # the largest double: reachable, and kept
    assert c.increment("j", [(4, Incr("big", "a", huge - 1e308)), (5, Incr("big", "c", 2**1000))]).ok
    assert totals(c, "big") == {"a": huge, "n": -1e308, "c": float(2**1000)}
    assert c.fences(["big"])["big"]["j"] == Fence((5, 0, 0), 4)


def test_a_ttl_redis_cannot_set_is_refused_before_anything_is_sent(any_cluster: Cluster) -> None:
    c = any_cluster
    for ttl in (10**16, 10**10 + 1, 0, -1, 1.5, True):
        with pytest.raises(ConfigError, match="ttl"):
            c.increment("j", [(1, Incr("t", "a", 1))], ttl=ttl)  # type: ignore[arg-type]
    assert c.select(["t"]) == {"t": []} and c.fences(["t"])["t"] is None
    assert c.increment("j", [(1, Incr("t", "a", 1))], ttl=10**10).ok  # the largest accepted


def test_positions_and_pairs_of_any_other_type_are_invalid_tuples_naming_the_item(any_cluster: Cluster) -> None:
    c = any_cluster
    ok = (1, Incr("p", "a", 1))
    bad_positions = [1.0, None, b"\x07", {3, 1}, {9: "x"}, "7", (1, 2, 3, 4), (), (1.0,), (True,), [1, -2]]
    for position in bad_positions:
        with pytest.raises(InvalidTupleError, match="position") as info:
            c.increment("j", [ok, (position, Incr("p", "a", 1))])  # type: ignore[list-item]
        assert info.value.index == 1, position
    for item in (Incr("p", "a", 1), Count("p", "a", 1), (2, Incr("p", "a", 1), 3), (2,), None, "ab", 7):
        with pytest.raises(InvalidTupleError, match=r"position|pair") as info:
            c.increment("j", [ok, item])  # type: ignore[list-item]
        assert info.value.index == 1, item
    assert c.select(["p"]) == {"p": []}
    assert c.increment("j", [ok, ([2, 0], Incr("p", "a", 1))]).ok  # a list spells a position too


def test_an_increment_of_the_other_kind_at_or_below_the_fence_is_refused_not_a_duplicate(any_cluster: Cluster) -> None:
    c = any_cluster
    c.increment("j", [(5, Incr("sums", "a", 1)), (5, Count("counts", "f", 1))])
    for item in (Count("sums", "a", 1), Incr("counts", "f", 1)):
        for position in (4, 5, 6):
            with pytest.raises(WriteRefusedError, match="another kind"):
                c.increment("j", [(position, item)])
    result = c.increment("j", [(3, Count("sums", "a", 1)), (4, Count("sums", "a", 1))], raise_on_error=False)
    assert result.refused is not None and sorted(result.refused.refused) == [0, 1]
    assert c.increment("j", [(5, Incr("sums", "a", 1))]).applied == [False]  # a true duplicate stays one
    assert totals(c, "sums") == {"a": 1.0} and c.counters(["counts"])["counts"] == {"f": 1}
