"""A bounded set (``max_size``) replayed: every write it took, or refused, stays refused on a replay in any order.

Two ways a member's record could fall below a newer write the set had forgotten, both found from the bounded
property test's example (``tests/cluster/test_properties.py``): the floor only judges members without a record,
so a member's record must never be older than a write of that member the set already forgot or refused.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from bounded_helpers import bounded_cluster

from zcluster import Cluster, KeyMember, KeyScoreMember, Presence

KSM = KeyScoreMember


@pytest.fixture(params=["shards", "cluster"])
def one(request: pytest.FixtureRequest, prefix: str) -> Iterator[Cluster]:
    """A cluster with max_size=1 over either topology."""
    with bounded_cluster(request, prefix, 1) as c:
        yield c


def members(c: Cluster, key: str) -> list[tuple[str, float]]:
    return [(t.member, t.score) for t in c.select([key], limit=100)[key]]


def test_an_insert_refused_by_a_full_set_drops_the_members_older_tombstone(one: Cluster) -> None:
    c = one
    assert c.delete([KSM("k", 0.0, "b")]).applied == [True]
    assert c.insert([KSM("k", 2.0, "c")]).applied == [True]
    # Below the full set's lowest (c at 2): refused as if added and trimmed at once, the floor rises to 1.
    # b's tombstone at 0 is older than that insert: left there, it (not the floor) would judge b's replay.
    assert c.insert([KSM("k", 1.0, "b")]).applied == [False]
    assert c.score([("k", "b")])[KeyMember("k", "b")].present is False
    assert c.insert([KSM("k", 2.0, "a")]).applied == [True]  # trimmed at once (a ranks below c): floor 2
    assert c.delete([KSM("k", 2.0, "c")]).applied == [True]  # at the floor: no tombstone, K+ empty
    assert members(c, "k") == []
    # The replay: the set has room now, and b's insert must stay refused (it showed ('b', 1.0) here).
    assert c.insert([KSM("k", 1.0, "b")]).applied == [False]
    assert c.delete([KSM("k", 0.0, "b"), KSM("k", 2.0, "c")]).applied == [False, False]
    assert c.insert([KSM("k", 2.0, "c"), KSM("k", 2.0, "a")]).applied == [False, False]
    assert members(c, "k") == []


def test_a_delete_at_or_below_the_floor_still_raises_the_members_tombstone(one: Cluster) -> None:
    c = one
    assert c.delete([KSM("k", 0.0, "m")]).applied == [True]
    assert c.insert([KSM("k", 6.0, "z")]).applied == [True]
    assert c.insert([KSM("k", 6.0, "w")]).applied == [True]  # trimmed at once (w ranks below z): floor 6
    assert c.delete([KSM("k", 6.0, "z")]).applied == [True]  # at the floor: no tombstone, K+ empty
    # m has a record (its tombstone at 0), so the floor does not judge it: the newer delete raises it.
    assert c.delete([KSM("k", 3.0, "m")]).applied == [True]
    assert c.score([("k", "m")])[KeyMember("k", "m")] == Presence(True, False, 3.0)
    # An insert older than that delete is stale (it was shown at 2, though deleted at 3).
    assert c.insert([KSM("k", 2.0, "m")]).applied == [False]
    assert members(c, "k") == []
    assert c.delete([KSM("k", 3.0, "m"), KSM("k", 0.0, "m")]).applied == [False, False]
    assert members(c, "k") == []
    assert c.insert([KSM("k", 4.0, "m")]).applied == [True]  # newer than its record: its record decides
    assert members(c, "k") == [("m", 4.0)]
