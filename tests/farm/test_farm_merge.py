"""roshi's farm union/difference scenarios, re-expressed on the 2P-set merge: the pure ``winner``, then
through real reads over three replicas (the merged answer, the repairs, and the replicas afterwards)."""

from __future__ import annotations

import itertools
import math

import pytest
from farm_helpers import farm_of, held, pairs, put

from zcluster import Delete, Insert, KeyMember
from zcluster.farm import NoRepair, SendAllReadAll
from zcluster.farm.merge import as_write, differs, winner
from zcluster.testing import LocalShards
from zcluster.types import NOT_PRESENT, Presence

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
