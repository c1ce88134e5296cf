"""Increments on a farm: confirmed by every replica, read from the replica whose copy leads, and repaired
exactly (by reads and by the walker) after a replica was SIGKILLed and came back empty."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import pytest
from farm_helpers import farm_of

from zcluster import Cluster, Count, Fence, Incr, QuorumError, WriteRefusedError
from zcluster._aggregate_keys import KeyState, whole_keys_of
from zcluster.farm import Farm, Walker
from zcluster.farm._aggregates import leader, leads
from zcluster.testing import LocalShards


def history(n: int, seed: int, start: int = 0) -> list[tuple[int, Incr | Count]]:
    rng = random.Random(seed)
    out: list[tuple[int, Incr | Count]] = []
    for p in range(start, start + n):
        if rng.random() < 0.7:
            out.append((p, Incr(f"lb{rng.randrange(3)}", f"u{rng.randrange(6)}", float(rng.randint(-2, 5)))))
        else:
            out.append((p, Count("hits", f"f{rng.randrange(4)}", rng.randint(1, 9))))
    return out


def model(items: list[tuple[int, Incr | Count]]) -> tuple[dict[str, dict[str, float]], dict[str, int]]:
    sums: dict[str, Counter[str]] = {}
    counts: Counter[str] = Counter()
    for _, w in items:
        if isinstance(w, Incr):
            sums.setdefault(str(w.key), Counter())[str(w.member)] += w.delta
        else:
            counts[str(w.field)] += w.delta
    return {k: dict(v) for k, v in sums.items()}, dict(counts)


def totals(store: Any) -> tuple[dict[str, dict[str, float]], dict[str, int]]:
    """What ``store`` (a farm, or one replica) answers for every key of :func:`history`."""
    tops = store.top(["lb0", "lb1", "lb2"], limit=100)
    sums = {str(k): {str(t.member): t.score for t in v} for k, v in tops.items() if v}
    return sums, {str(f): n for f, n in store.counters(["hits"])["hits"].items()}


def test_leads_orders_copies_by_position_and_count_per_source() -> None:
    a = {b"s": Fence((5, 0, 0), 5), b"t": Fence((2, 0, 0), 2)}
    emptied = {b"s": Fence((5, 0, 0), 1)}  # restarted empty, then took one increment at the same position
    assert leads(a, emptied) and not leads(emptied, a)
    assert not leads({b"s": Fence((9, 0, 0), 9)}, a)  # ahead on s but lacks t
    state = lambda f: KeyState("s", b"", f)  # noqa: E731
    assert leader({0: state(emptied), 1: state(a), 2: state(a)}) == 1
    split = {0: state({b"s": Fence((9, 0, 0), 9)}), 1: state({b"t": Fence((3, 0, 0), 3)})}
    assert leader(split) is None  # each ahead on another source: nobody leads
    assert leader({0: state(a), 1: KeyState("2", b"", {})}) is None  # a 2P-set on one replica


def test_an_increment_is_confirmed_only_by_every_replica_and_a_resend_counts_once() -> None:
    with LocalShards(3) as servers:
        farm = farm_of(servers.urls, prefix="inc:")
        try:
            items = history(120, seed=1)
            first = farm.increment("app/j", items[:60])
            assert first.quorum == 3 and first.applied_count == 60 and all(c == 3 for c in first.confirmed)
            servers.kill(2)
            with pytest.raises(QuorumError) as caught:
                farm.increment("app/j", items[60:])
            result = caught.value.result
            assert result.failed_indices == list(range(60))  # every one: replica2 never confirmed them
            assert all(f.shard.startswith("replica2/") for f in result.failures)
            servers.start(2)  # empty: it lost everything
            assert farm.clusters[2].fences(["lb0"])["lb0"] is None
            farm.increment("app/j", items[60:])  # the resend: applied on 2, a no-op on 0 and 1
            farm.increment("app/j", items)  # a replay of everything: nothing changes on 0 and 1
            assert totals(farm.clusters[0]) == totals(farm.clusters[1]) == model(items)
            assert totals(farm.clusters[2]) != model(items)  # it lacks the first 60 ...
            assert totals(farm) == model(items)  # ... and the farm reads from a replica that has them all
            assert farm.repairs.done >= 1
            assert totals(farm.clusters[2]) == model(items)  # read-repair copied the leading replica's keys
        finally:
            farm.close()


def test_the_walker_repairs_a_replica_restarted_empty_to_the_exact_totals() -> None:
    with LocalShards(3) as servers:
        farm = farm_of(servers.urls, prefix="walk:", repair="none")
        try:
            items = history(300, seed=2)
            farm.increment("app/a", items[:200])
            farm.insert([("plain", 1.0, "x")])  # a 2P-set key beside them: repaired by its own rules
            servers.kill(0)
            servers.start(0)
            farm.increment("app/a", items[200:])  # replica0 takes these, at the same fences' positions
            farm.increment("app/b", [(1, Incr("lb0", "u0", 0.5))])
            want = model([*items, (1, Incr("lb0", "u0", 0.5))])
            report = Walker(farm, batch_size=2).run()
            assert report.position is None and report.failures == [] and report.unsettled == []
            assert report.repaired >= 4  # lb0, lb1, lb2, hits on replica0, and plain
            for c in farm.clusters:
                assert totals(c) == want
                assert c.fences(["lb0"]) == farm.clusters[1].fences(["lb0"])
                assert [t.member for t in c.select(["plain"])["plain"]] == ["x"]
            again = Walker(farm).run()
            assert again.diverged == 0 and again.repaired == 0
        finally:
            farm.close()


def test_copies_that_no_replica_leads_are_reported_and_left_alone() -> None:
    with LocalShards(2) as servers:
        farm = farm_of(servers.urls, prefix="split:")
        try:
            # Behind the farm's back: each replica is ahead on another source.
            farm.clusters[0].increment("s", [(1, Incr("lb0", "u0", 1.0)), (2, Incr("lb0", "u0", 1.0))])
            farm.clusters[1].increment("t", [(1, Incr("lb0", "u1", 5.0))])
            before = [c.top(["lb0"]) for c in farm.clusters]
            report = farm.repair_aggregates(["lb0", "nothing"])
            assert report.aggregates == ["lb0"] and report.unsettled == ["lb0"] and report.repaired == 0
            assert [c.top(["lb0"]) for c in farm.clusters] == before
            assert Walker(farm).run().unsettled == ["lb0"]
        finally:
            farm.close()


def test_a_repair_never_overwrites_a_copy_that_moved_since_it_was_read() -> None:
    with LocalShards(1) as servers:
        farm = farm_of([servers.urls[0], servers.urls[0]], prefix="cas:")  # two views of one server suffice
        try:
            c = farm.clusters[0]
            plan = whole_keys_of(c)
            c.increment("s", [(1, Incr("a", "m", 1.0)), (2, Incr("a", "m", 1.0))])
            lead = plan.states(["a"], dump=True)["a"]
            c.increment("s", [(1, Count("b", "f", 1))])
            seen = plan.states(["b"])["b"]
            c.increment("s", [(2, Count("b", "f", 1))])  # b moves after it was read
            assert plan.restore("b", seen.canon, lead) is False
            assert c.counters(["b"])["b"] == {"f": 2}
            fresh = plan.states(["b"])["b"]
            assert plan.restore("b", fresh.canon, lead) is True  # replaced whole: now a copy of a
            assert c.top(["b"])["b"][0].score == 2.0 and c.fences(["b"])["b"] == c.fences(["a"])["a"]
            c.insert([("twop", 1.0, "x")])
            assert plan.restore("twop", b"", lead) is False  # a 2P-set is never replaced
        finally:
            farm.close()


def test_a_refused_increment_on_a_farm_raises_and_applies_nothing() -> None:
    with LocalShards(2) as servers:
        farm: Farm = farm_of(servers.urls, prefix="ref:")
        try:
            farm.insert([("k", 1.0, "x")])
            with pytest.raises(WriteRefusedError) as caught:
                farm.increment("s", [(1, Incr("k", "x", 1.0))])
            assert caught.value.index == 0
            assert [t.score for t in farm.select(["k"])["k"]] == [1.0]
        finally:
            farm.close()


def test_forget_refuses_aggregate_keys_on_every_replica_and_forgets_the_others(trio: LocalShards) -> None:
    prefix = "forget-agg:"
    farm = Farm([Cluster.from_urls([u], prefix=prefix, floors=True) for u in trio.urls])
    try:
        farm.insert([("set", 50.0, "old"), ("set", 500.0, "new")])
        farm.increment("j", [(1, Incr("points", "low", 50)), (2, Incr("points", "high", 500))])
        with pytest.raises(WriteRefusedError, match=r"'points' is a sums \(Incr\) aggregate key") as info:
            farm.forget(["points", "set"], 100)
        assert list(info.value.refused) == [0] and info.value.result.applied == [False, True]
        for replica in farm.clusters:
            assert {str(t.member): t.score for t in replica.top(["points"])["points"]} == {"low": 50, "high": 500}
            assert [str(t.member) for t in replica.select(["set"])["set"]] == ["new"]
    finally:
        farm.close()
