"""Repair strategies: what each writes, drops and counts, and the instrumentation that accounts for it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from farm_helpers import Events, farm_of, held, pairs, put

from zcluster import Insert, KeyMember
from zcluster.farm import (
    Farm,
    NonBlockingRepair,
    NoRepair,
    RateLimitedRepair,
    RepairAll,
    RepairCounts,
    SendAllReadAll,
    SendAllReadFirstLinger,
    Walker,
)
from zcluster.testing import LocalShards

N = 12


def lagging(farm: Farm, key: str = "k", n: int = N) -> None:
    """Replicas 0 and 1 hold ``n`` members of ``key``; replica 2 holds none: a full read finds ``n`` repairs."""
    for c in farm.clusters[:2]:
        put(c, [Insert(key, float(j), f"m{j:02d}") for j in range(n)])


def on_lagging(farm: Farm, key: str = "k") -> int:
    return len(held(farm.clusters[2], [key])[key])


def accounted(events: Events, counts: RepairCounts) -> None:
    """The events add up to the counts: every repair requested is written, failed or dropped, once."""
    assert events.total("farm.repair") + events.total("farm.repair_dropped") == counts.requested - counts.queued
    assert events.total("farm.repair", "applied") == counts.done
    assert events.total("farm.repair_dropped") == counts.dropped
    assert events.total("farm.repair_failed") == counts.failed
    assert counts.queued == 0


def test_repair_all_writes_every_repair_before_the_read_returns(trio: LocalShards, prefix: str) -> None:
    events = Events()
    with farm_of(trio.urls, prefix, repair=RepairAll(), instrumentation=events) as farm:
        lagging(farm)
        farm.select(["k"], limit=100)
        assert on_lagging(farm) == N  # no flush needed
        assert farm.repairs == RepairCounts(N, N, 0, 0)
        accounted(events, farm.repairs)
        assert [e.records for e in events.named("farm.repair")] == [N]
        assert events.named("farm.select") and all(e.error is None for e in events.events)


def test_no_repair_counts_every_repair_as_dropped_and_writes_nothing(trio: LocalShards, prefix: str) -> None:
    events = Events()
    with farm_of(trio.urls, prefix, repair=NoRepair(), instrumentation=events) as farm:
        lagging(farm)
        for _ in range(3):
            assert len(farm.select(["k"], limit=100)["k"]) == N
        km = KeyMember("k", "m00")
        assert farm.score([km])[km].score == 0.0
        assert on_lagging(farm) == 0
        assert farm.repairs == RepairCounts(3 * N + 1, 0, 0, 3 * N + 1)
        assert events.named("farm.repair") == []
        accounted(events, farm.repairs)


def test_rate_limited_repair_drops_beyond_its_burst(trio: LocalShards, prefix: str) -> None:
    events = Events()
    strategy = RateLimitedRepair(per_second=0.001, burst=3)  # a token every 1000 s: none comes back here
    with farm_of(trio.urls, prefix, repair=strategy, instrumentation=events) as farm:
        lagging(farm)
        farm.select(["k"], limit=100)
        assert farm.repairs == RepairCounts(N, 3, 0, N - 3)
        assert on_lagging(farm) == 3
        farm.select(["k"], limit=100)  # the budget is spent: everything left is dropped, and counted
        assert farm.repairs == RepairCounts(2 * N - 3, 3, 0, 2 * N - 6)
        assert on_lagging(farm) == 3
        accounted(events, farm.repairs)


def test_rate_limited_repair_refills(trio: LocalShards, prefix: str) -> None:
    events = Events()
    with farm_of(trio.urls, prefix, repair=RateLimitedRepair(per_second=20, burst=3), instrumentation=events) as farm:
        lagging(farm, n=40)
        farm.select(["k"], limit=100)
        first = farm.repairs
        assert first.done >= 3 and first.dropped > 0 and first.done + first.dropped == 40
        deadline = time.monotonic() + 120
        while on_lagging(farm) < 40:  # later reads find the rest again, and the bucket lets some through
            assert time.monotonic() < deadline, f"stuck at {farm.repairs}"
            farm.select(["k"], limit=100)
            time.sleep(0.05)
        counts = farm.repairs
        assert counts.done == 40 and counts.dropped > 0 and counts.requested == counts.done + counts.dropped
        accounted(events, counts)


class Gate:
    """Holds a cluster's ``apply`` (the repair writes) until released; says when a write is waiting."""

    def __init__(self, cluster: Any) -> None:
        self.entered = threading.Event()
        self.open = threading.Event()
        self.calls: list[int] = []
        apply: Callable[..., Any] = cluster.apply

        def held_apply(writes: Any, **kwargs: Any) -> Any:
            self.calls.append(len(writes))
            self.entered.set()
            assert self.open.wait(120), "the gate was never opened"
            return apply(writes, **kwargs)

        cluster.apply = held_apply


def test_non_blocking_repair_drops_what_does_not_fit_the_queue(trio: LocalShards, prefix: str) -> None:
    events = Events()
    with farm_of(trio.urls, prefix, repair=NonBlockingRepair(queue_size=4), instrumentation=events) as farm:
        lagging(farm, "first", 1)
        lagging(farm)
        gate = Gate(farm.clusters[2])
        farm.select(["first"])  # one repair: the background thread takes it and waits at the gate
        assert gate.entered.wait(120)
        assert farm.select(["k"], limit=100)["k"]  # the read does not wait for its repairs
        assert farm.repairs == RepairCounts(1 + N, 0, 0, N - 4)  # 4 fit the queue, N - 4 dropped
        assert farm.repairs.queued == 5
        assert not farm.flush_repairs(timeout=0.05)  # still held
        gate.open.set()
        assert farm.flush_repairs(timeout=120)
        assert farm.repairs == RepairCounts(1 + N, 5, 0, N - 4)
        assert on_lagging(farm, "first") == 1 and on_lagging(farm) == 4
        assert gate.calls[0] == 1 and sum(gate.calls) == 5
        while on_lagging(farm) < N:  # the dropped ones are found again by the next reads
            farm.select(["k"], limit=100)
            assert farm.flush_repairs(timeout=120)
        accounted(events, farm.repairs)
        assert farm.repairs.done == 1 + N


def test_non_blocking_repairs_onto_a_replica_that_died_are_counted_failed() -> None:
    events = Events()
    with LocalShards(3) as s, farm_of(s.urls, repair=NonBlockingRepair(), instrumentation=events) as farm:
        lagging(farm)
        gate = Gate(farm.clusters[2])
        farm.select(["k"], limit=100)
        assert gate.entered.wait(120)
        s.kill(2)
        gate.open.set()
        assert farm.flush_repairs(timeout=120)
        assert farm.repairs == RepairCounts(N, 0, N, 0)
        failed = events.named("farm.repair_failed")
        assert sum(e.records for e in failed) == N
        assert any(f.startswith("replica2/") for e in events.named("farm.repair") for f in e.failed_shards)
        accounted(events, farm.repairs)
        s.start(2)
        farm.select(["k"], limit=100)
        assert farm.flush_repairs(timeout=120) and on_lagging(farm) == N


@pytest.mark.parametrize(
    "repair",
    [RepairAll(), NoRepair(), RateLimitedRepair(per_second=0.001, burst=5), NonBlockingRepair(queue_size=3)],
    ids=["all", "none", "rate", "nonblocking"],
)
@pytest.mark.parametrize("read", [SendAllReadAll(), SendAllReadFirstLinger()], ids=["all", "first-linger"])
def test_instrumentation_adds_up_to_the_counts(trio: LocalShards, prefix: str, repair: Any, read: Any) -> None:
    events = Events()
    with farm_of(trio.urls, prefix, read=read, repair=repair, instrumentation=events) as farm:
        for i in range(5):
            lagging(farm, f"k{i}", 3 + i)
            put(farm.clusters[0], [Insert(f"k{i}", 100.0, "only0")])
        keys = [f"k{i}" for i in range(5)]
        for _ in range(3):
            farm.select(keys, limit=100)
            farm.score([KeyMember(k, "only0") for k in keys])
            assert farm.flush_repairs(timeout=120)
        Walker(farm, batch_size=2).run()  # the walker's repairs are counted the same way
        counts = farm.repairs
        assert counts.requested > 0
        accounted(events, counts)
        for k in keys:  # after the walk every replica agrees, whatever the strategy dropped
            assert [held(c, [k]) for c in farm.clusters[1:]] == [held(farm.clusters[0], [k])] * 2
            assert pairs(farm.select([k], limit=1)[k]) == [("only0", 100.0)]
