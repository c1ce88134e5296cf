"""roshi's farm union/difference scenarios, re-expressed on the 2P-set merge: the pure ``winner``, then
through real reads over three replicas (the merged answer, the repairs, and the replicas afterwards)."""

from __future__ import annotations

import itertools
import math

import pytest
from farm_helpers import farm_of, held, pairs, put

from zcluster import Delete, Insert, KeyMember, KeyScoreMember
from zcluster.farm import KeyDiff, NoRepair, SendAllReadAll
from zcluster.farm._merge import (
    Answer,
    as_write,
    by_member,
    diff_key,
    differs,
    merge_records,
    merge_scores,
    merge_windows,
    settle,
    winner,
)
from zcluster.testing import LocalShards
from zcluster.types import NOT_PRESENT, Presence, ReadResult, ShardFailure

INS = {s: Presence(True, True, float(s)) for s in range(10)}
DEL = {s: Presence(True, False, float(s)) for s in range(10)}

# roshi's TestUnionDifferenceFullResponse and TestUnionDifferenceMismatchedScores, one key per letter
# ("A5" is member a of key a at score 5, "--" absent on that replica): the union is the merged answer,
# the difference the key-members some replica lacks (or holds at another score).
ROSHI = {
    "A5B3C1 A5B3C1 A5B3C1": ("A5B3C1", ""),
    "A5B3C1 A5B3C1 A5B3--": ("A5B3C1", "C"),
    "A5B3C1 A5B3-- A5----": ("A5B3C1", "BC"),
    "A5B3-- A5---- ------": ("A5B3--", "AB"),
    "A5---- ------ ------": ("A5----", "A"),
    "A5B3-- A5---- ----C1": ("A5B3C1", "ABC"),
    "A5B3-- A5--C1 --B3--": ("A5B3C1", "ABC"),
    "A5B3-- A5--C1 --B3C1": ("A5B3C1", "ABC"),
    "A5B3C1 A5B3C1 A5B2C1": ("A5B3C1", "B"),
    "A5B3C1 A5B2C1 A5B2C1": ("A5B3C1", "B"),
    "A5B2C1 A5B2C1 A5--C1": ("A5B2C1", "B"),
    "A5B3C1 A5B2-- A5----": ("A5B3C1", "BC"),
}


def parse_set(text: str) -> dict[str, float]:
    """``"A5B3--"`` -> {"a": 5.0, "b": 3.0}."""
    return {text[i].lower(): float(text[i + 1]) for i in range(0, len(text), 2) if text[i] != "-"}


# -- the pure merge ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("replicas", "expected"), ROSHI.items())
def test_roshi_union_difference_on_winner(replicas: str, expected: tuple[str, str]) -> None:
    sets = [parse_set(s) for s in replicas.split()]
    union, difference = parse_set(expected[0]), set(expected[1].lower())
    got_union, got_difference = {}, set()
    for m in "abc":
        have = [Presence(True, True, s[m]) if m in s else NOT_PRESENT for s in sets]
        best = winner(have)
        if best is not None:
            assert best.inserted
            got_union[m] = best.score
            if any(differs(h, best) for h in have):
                got_difference.add(m)
    assert got_union == union
    assert got_difference == difference


def test_highest_score_wins_whatever_the_order() -> None:
    records = [INS[3], DEL[2], INS[7], DEL[5], NOT_PRESENT, None]
    for perm in itertools.permutations(records):
        assert winner(list(perm)) == INS[7]
    assert winner([DEL[8], INS[7]]) == DEL[8]
    assert winner([INS[1], DEL[9], INS[2]]) == DEL[9]


def test_a_delete_wins_a_tie_in_either_order() -> None:
    assert winner([INS[4], DEL[4]]) == DEL[4]
    assert winner([DEL[4], INS[4]]) == DEL[4]
    for perm in itertools.permutations([INS[4], DEL[4], INS[4], NOT_PRESENT]):
        assert winner(list(perm)) == DEL[4]
    # ... but only a tie: a newer insert beats an older delete
    assert winner([DEL[4], INS[5]]) == INS[5]


def test_no_bias_toward_adds() -> None:
    # One replica's tombstone beats the others' inserts at or below its score, however many they are.
    assert winner([INS[3], INS[3], DEL[3]]) == DEL[3]
    assert winner([INS[3], INS[2], INS[3], DEL[3]]) == DEL[3]
    assert winner([DEL[6], INS[5], INS[5]]) == DEL[6]


def test_nothing_known_is_no_winner_and_differs_only_for_answering_replicas() -> None:
    assert winner([]) is None
    assert winner([None, NOT_PRESENT, None]) is None
    assert not differs(None, INS[3])  # a replica that did not answer gets no repair
    assert differs(NOT_PRESENT, INS[3])
    assert differs(INS[2], INS[3]) and differs(DEL[3], INS[3]) and differs(INS[3], DEL[3])
    assert not differs(INS[3], INS[3]) and not differs(DEL[3], DEL[3])
    assert as_write("k", "m", INS[3]) == Insert("k", 3.0, "m")
    assert as_write("k", "m", DEL[3]) == Delete("k", 3.0, "m")
    assert math.isnan(NOT_PRESENT.score)


# -- the merges of answers, each alone ---------------------------------------------------------------------------

NAMES = ["r0", "r1", "r2"]


def answer(values: dict[object, object], errors: dict[object, str] | None = None) -> ReadResult[object, object]:
    """A replica's read answer: ``values``, and the items its shard (named by the string) failed."""
    out: ReadResult[object, object] = ReadResult()
    out.update(values)
    out.errors.update((k, ShardFailure(shard, OSError(shard), ())) for k, shard in (errors or {}).items())
    return out


def test_settle_gives_the_winner_and_a_fix_for_each_replica_holding_another_record() -> None:
    best, fixes = settle("k", "m", {0: INS[3], 1: DEL[3], 2: None, 3: NOT_PRESENT})
    assert best == DEL[3]
    assert fixes == [(0, Delete("k", 3.0, "m")), (3, Delete("k", 3.0, "m"))]  # not r2: it did not answer
    assert settle("k", "m", {0: NOT_PRESENT, 1: None}) == (None, [])


def test_by_member_groups_records_by_stored_bytes_in_order_of_first_appearance() -> None:
    got = by_member({2: [("b", INS[1]), ("a", INS[2])], 0: [(b"a", DEL[5])]})
    assert list(got) == [b"b", b"a"]
    assert got[b"a"] == ("a", {2: INS[2], 0: DEL[5]}) and got[b"b"] == ("b", {2: INS[1]})
    # a member listed twice by one replica (K+ and K-, a foreign write) keeps the record that ranks higher
    assert by_member({0: [("m", INS[4]), ("m", DEL[4]), ("m", INS[2])]})[b"m"][1] == {0: DEL[4]}


def test_merge_scores_takes_winners_fixes_and_the_first_failure_of_unanswered_items() -> None:
    km, lone, lost = KeyMember("k", "m"), KeyMember("k", "n"), KeyMember("k", "x")
    answers: list[Answer] = [
        answer({km: INS[2], lone: NOT_PRESENT}, {lost: "h:1"}),
        answer({km: DEL[2], lone: NOT_PRESENT}, {lost: "h:2"}),
        TimeoutError("late"),
    ]
    result, fixes = merge_scores([km, lone, lost], answers, NAMES)
    assert dict(result) == {km: DEL[2], lone: NOT_PRESENT}  # no replica holds n: absent, no fix
    assert fixes == [(0, Delete("k", 2.0, "m"))]  # r2 did not answer: no fix for it
    assert result.errors[lost].shard == "r0/h:1"


def windows(entries: dict[str, list[tuple[str, float]]]) -> ReadResult[object, object]:
    return answer({k: [KeyScoreMember(k, s, m) for m, s in es] for k, es in entries.items()})


def test_merge_windows_agreeing_windows_are_the_answer_without_lookups() -> None:
    same = windows({"k": [("b", 2.0), ("a", 1.0)]})

    def look_up(lookups: dict[int, list[KeyMember]]) -> dict[int, Answer]:
        assert not any(lookups.values())
        return {}

    def ask(keys: list[object], window: int) -> list[Answer]:
        raise AssertionError("the first round was given")

    result, fixes = merge_windows(["k"], NAMES, 1, ask, look_up, answers=[same, same, same])
    assert [(e.member, e.score) for e in result["k"]] == [("b", 2.0)] and fixes == []


def test_merge_windows_looks_up_tombstones_and_widens_until_the_page_is_exact() -> None:
    # r0: a4 b3 c2 d1; r1: a4 c2 d1 and a tombstone of b at 3 (hidden from its window); r2 never answers
    held = [
        {"a": INS[4], "b": INS[3], "c": INS[2], "d": INS[1]},
        {"a": INS[4], "b": DEL[3], "c": INS[2], "d": INS[1]},
    ]
    asked: list[int] = []

    def window_of(i: int, size: int) -> list[tuple[str, float]]:
        shown = sorted(((m, p.score) for m, p in held[i].items() if p.inserted), key=lambda e: -e[1])
        return shown[:size]

    def ask(keys: list[object], window: int) -> list[Answer]:
        asked.append(window)
        return [windows({"k": window_of(0, window)}), windows({"k": window_of(1, window)}), OSError("down")]

    def look_up(lookups: dict[int, list[KeyMember]]) -> dict[int, Answer]:
        return {i: answer({km: held[i].get(str(km.member), NOT_PRESENT) for km in kms}) for i, kms in lookups.items()}

    result, fixes = merge_windows(["k"], NAMES, 3, ask, look_up)
    assert [(e.member, e.score) for e in result["k"]] == [("a", 4.0), ("c", 2.0), ("d", 1.0)]
    assert asked == [3, 6]  # window 3 holds only a and c exactly (b lost to r1's tombstone): doubled once
    assert fixes == [(0, Delete("k", 3.0, "b"))]


def test_merge_windows_leaves_out_a_key_whose_lookup_failed() -> None:
    def ask(keys: list[object], window: int) -> list[Answer]:
        return [windows({"k": [("a", 1.0)]}), windows({"k": [("b", 1.0)]}), windows({"k": []})]

    def look_up(lookups: dict[int, list[KeyMember]]) -> dict[int, Answer]:
        return {i: OSError("lost") if i == 1 else answer(dict.fromkeys(kms, NOT_PRESENT)) for i, kms in lookups.items()}

    result, fixes = merge_windows(["k"], NAMES, 2, ask, look_up)
    assert "k" not in result and result.errors["k"].shard == "r1/*" and fixes == []


def test_merge_windows_within_leaves_out_winners_outside_the_range() -> None:
    def ask(keys: list[object], window: int) -> list[Answer]:
        return [windows({"k": [("a", 5.0)]}), windows({"k": [("b", 1.0)]}), windows({"k": []})]

    def look_up(lookups: dict[int, list[KeyMember]]) -> dict[int, Answer]:
        records = {"a": INS[9], "b": NOT_PRESENT}  # r1 and r2 hold a at 9: outside a range below 6
        return {
            i: answer({km: records[str(km.member)] if i else NOT_PRESENT for km in kms}) for i, kms in lookups.items()
        }

    result, fixes = merge_windows(["k"], NAMES, 2, ask, look_up, within=lambda score, _: score < 6)
    assert [(e.member, e.score) for e in result["k"]] == [("b", 1.0)]
    assert (0, Insert("k", 9.0, "a")) in fixes


def test_merge_records_and_diff_key() -> None:
    held = {0: [Insert("k", 2.0, "a"), Delete("k", 1.0, "b")], 2: [Insert("k", 1.0, "b")]}
    merged = {str(m.member): m for m in merge_records("k", held)}
    assert merged["a"].held == {0: INS[2], 2: NOT_PRESENT} and merged["a"].fixes == [(2, Insert("k", 2.0, "a"))]
    assert merged["b"].best == DEL[1] and merged["b"].differing(3) == [False, False, True]
    records = [answer({"k": held[0]}), answer({}, {"k": "h:7"}), answer({"k": held[2]})]
    d = diff_key("k", records, NAMES)
    assert isinstance(d, KeyDiff) and not d.agree
    assert [str(m.member) for m in d.members] == ["a", "b"]  # merged select order
    assert d.failures["r1"].shard == "r1/h:7"
    assert diff_key("k", [answer({"k": held[0]}), answer({"k": held[0]})], NAMES).agree


# -- through real reads ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("replicas", "expected"), ROSHI.items())
def test_roshi_union_difference_through_reads(
    trio: LocalShards, prefix: str, replicas: str, expected: tuple[str, str]
) -> None:
    sets = [parse_set(s) for s in replicas.split()]
    with farm_of(trio.urls, prefix) as farm:
        for cluster, members in zip(farm.clusters, sets, strict=True):
            put(cluster, [Insert(m, s, m) for m, s in members.items()])
        union, difference = parse_set(expected[0]), set(expected[1].lower())
        got = farm.select(["a", "b", "c"])
        assert {k: pairs(v) for k, v in got.items()} == {m: [(m, union[m])] if m in union else [] for m in "abc"}
        lacking = sum(1 for m in union for s in sets if s.get(m) != union[m])
        assert {m for m in union if any(s.get(m) != union[m] for s in sets)} == difference
        assert farm.repairs.requested == farm.repairs.done == lacking
        for cluster in farm.clusters:  # every replica now holds the union
            assert held(cluster, list("abc")) == {m: {(m, True, union[m])} if m in union else set() for m in "abc"}
        again = farm.repairs
        assert farm.select(["a", "b", "c"]) == got and farm.repairs == again  # nothing left to repair


def test_a_delete_on_one_replica_wins_the_select_and_is_repaired(trio: LocalShards, prefix: str) -> None:
    with farm_of(trio.urls, prefix) as farm:
        farm.insert([("k", float(s), f"m{s}") for s in range(1, 6)])
        put(farm.clusters[1], [Delete("k", 5.0, "m5"), Delete("k", 4.0, "m4")])  # ties with the inserts
        put(farm.clusters[2], [Delete("k", 2.5, "m2")])  # newer than the insert at 2
        assert pairs(farm.select(["k"])["k"]) == [("m3", 3.0), ("m1", 1.0)]
        assert farm.repairs.requested == farm.repairs.done == 2 * 2 + 2  # each tombstone onto two replicas
        tombstones = {("m5", False, 5.0), ("m4", False, 4.0), ("m2", False, 2.5)}
        expected = tombstones | {("m3", True, 3.0), ("m1", True, 1.0)}
        assert all(held(c, ["k"])["k"] == expected for c in farm.clusters)


def test_a_delete_seen_through_score_wins_and_is_repaired(trio: LocalShards, prefix: str) -> None:
    with farm_of(trio.urls, prefix) as farm:
        farm.insert([("k", 5.0, "m")])
        put(farm.clusters[0], [Delete("k", 5.0, "m")])
        km = KeyMember("k", "m")
        assert farm.score([km])[km] == Presence(True, False, 5.0)
        assert all(held(c, ["k"])["k"] == {("m", False, 5.0)} for c in farm.clusters)


@pytest.mark.parametrize("delete_first", [True, False])
@pytest.mark.parametrize("where", [(0, 1), (1, 0), (2, 2)])
def test_equal_score_insert_and_delete_converge_to_the_tombstone(
    trio: LocalShards, prefix: str, delete_first: bool, where: tuple[int, int]
) -> None:
    insert_on, delete_on = where
    with farm_of(trio.urls, prefix, read=SendAllReadAll()) as farm:
        ops = [(delete_on, Delete("k", 7.0, "m")), (insert_on, Insert("k", 7.0, "m"))]
        for replica, write in ops if delete_first else reversed(ops):
            put(farm.clusters[replica], [write])
        put(farm.clusters[(insert_on + 1) % 3], [Insert("k", 7.0, "m")])
        assert farm.select(["k"])["k"] == []  # the delete wins whatever the order and the majority
        assert all(held(c, ["k"])["k"] == {("m", False, 7.0)} for c in farm.clusters)
        assert farm.repairs.failed == 0 and farm.repairs.dropped == 0


def test_without_repair_the_merge_still_answers_by_the_rules(trio: LocalShards, prefix: str) -> None:
    with farm_of(trio.urls, prefix, repair=NoRepair()) as farm:
        put(farm.clusters[0], [Insert("k", 3.0, "m"), Insert("k", 1.0, "x")])
        put(farm.clusters[1], [Delete("k", 3.0, "m"), Insert("k", 2.0, "x")])
        put(farm.clusters[2], [Insert("k", 4.0, "y")])
        for _ in range(2):  # nothing repaired: the same merge each time
            assert pairs(farm.select(["k"])["k"]) == [("y", 4.0), ("x", 2.0)]
        assert farm.repairs.done == 0 and farm.repairs.dropped == farm.repairs.requested > 0
        assert held(farm.clusters[2], ["k"])["k"] == {("y", True, 4.0)}


def test_diff_repair_now_stats_and_shards_through_a_farm(trio: LocalShards, prefix: str) -> None:
    with farm_of(trio.urls, prefix) as farm:
        put(farm.clusters[0], [Insert("k", 2.0, "m")])
        put(farm.clusters[1], [Delete("k", 1.0, "m")])
        (d,) = farm.diff(["k"])
        assert not d.agree and d.failures == {}
        (m,) = d.members
        assert m.best == INS[2] and m.differing(3) == [False, True, True]
        assert farm.repair_now(m.fixes) == (2, 0) and farm.repairs.done == 2
        assert all(x.agree for x in farm.diff(["k"]))
        names = [f"replica{i}/{shard}" for i, c in enumerate(farm.clusters) for shard in c.shards]
        assert farm.shards == names
        stats = farm.stats(scan=False)
        assert [s.shard for s in stats] == names and all(s.error is None for s in stats)
