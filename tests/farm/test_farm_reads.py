"""Read strategies over real replicas: fallbacks, first answers and their lingering repairs, the broadcast
budget of SendVar, and the exact window merge of ``select`` / ``select_range`` against a Python model."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from farm_helpers import Model, farm_of, held, pairs, put, writes_of

from zcluster import Cursor, Delete, Insert, KeyMember, PartialReadError
from zcluster.farm import (
    Farm,
    NoRepair,
    RepairAll,
    SendAllReadAll,
    SendAllReadFirstLinger,
    SendOneReadOne,
    SendVarReadFirstLinger,
)
from zcluster.testing import LocalShards


class Calls:
    """Wraps the read methods of a farm's clusters: counts calls per replica, records select windows, and
    can hold a replica's reads until released."""

    def __init__(self, farm: Farm) -> None:
        self.counts = [0] * len(farm.clusters)
        self.windows: list[int] = []
        self.gates = [threading.Event() for _ in farm.clusters]
        for g in self.gates:
            g.set()
        self._lock = threading.Lock()
        for i, c in enumerate(farm.clusters):
            for name in ("select", "select_range", "score"):
                setattr(c, name, self._wrap(i, getattr(c, name), name))

    def _wrap(self, i: int, method: Callable[..., Any], name: str) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            if not args[0]:  # the farm's validation of paging arguments: sends nothing
                return method(*args, **kwargs)
            with self._lock:
                self.counts[i] += 1
                if name == "select":
                    self.windows.append(args[2] if len(args) > 2 else kwargs["limit"])
            assert self.gates[i].wait(120), "a held read was never released"
            return method(*args, **kwargs)

        return call

    def asked(self) -> set[int]:
        """Replicas asked since the last call, and reset."""
        with self._lock:
            out = {i for i, n in enumerate(self.counts) if n}
            self.counts = [0] * len(self.counts)
            return out

    @contextmanager
    def holding(self, *replicas: int) -> Iterator[None]:
        for i in replicas:
            self.gates[i].clear()
        try:
            yield
        finally:
            for i in replicas:
                self.gates[i].set()


# -- SendOneReadOne ---------------------------------------------------------------------------------------------


def test_send_one_read_one_rotates_and_falls_back_past_a_dead_replica() -> None:
    with LocalShards(3) as s, farm_of(s.urls, read=SendOneReadOne()) as farm:
        for i, c in enumerate(farm.clusters):  # each replica holds its own answer: we see who answered
            put(c, [Insert("k", 1.0, f"r{i}")])
        seen = {pairs(farm.select(["k"])["k"])[0][0] for _ in range(6)}
        assert seen == {"r0", "r1", "r2"}  # round robin, one replica each, no merge
        assert farm.repairs.requested == 0
        s.kill(1)
        answers = [pairs(farm.select(["k"])["k"]) for _ in range(9)]
        assert {a[0][0] for a in answers} == {"r0", "r2"} and all(len(a) == 1 for a in answers)
        km = KeyMember("k", "r2")
        assert all(farm.score([km])[km].present in (True, False) for _ in range(6))  # never raises
        s.kill(0)
        s.kill(2)
        with pytest.raises(PartialReadError) as info:
            farm.select(["k"])
        assert info.value.errors["k"].shard.startswith("replica")
        assert farm.select(["k"], strict=False).errors.keys() == {"k"}


# -- SendAllReadFirstLinger -------------------------------------------------------------------------------------


def test_first_linger_returns_the_first_answer_and_repairs_in_the_background(trio: LocalShards, prefix: str) -> None:
    with farm_of(trio.urls, prefix, read=SendAllReadFirstLinger(), repair=RepairAll()) as farm:
        farm.insert([("k", 1.0, "old")])
        put(farm.clusters[0], [Insert("k", 2.0, "new"), Delete("k", 1.0, "old")])
        put(farm.clusters[1], [Insert("k", 2.0, "new"), Delete("k", 1.0, "old")])
        calls = Calls(farm)
        with calls.holding(0, 1):  # only the lagging replica can answer first
            got = farm.select(["k"])
            assert pairs(got["k"]) == [("old", 1.0)]  # its stale view: the first answer, not a merge
            assert farm.repairs.requested == 0  # the merge waits for the held replicas
        assert farm.flush_repairs(timeout=120)
        assert farm.repairs.requested == farm.repairs.done == 2  # "new" and the tombstone onto replica2
        expected = {("new", True, 2.0), ("old", False, 1.0)}
        assert all(held(c, ["k"])["k"] == expected for c in farm.clusters)
        assert pairs(farm.select(["k"])["k"]) == [("new", 2.0)]
        assert farm.flush_repairs(timeout=120) and farm.repairs.requested == 2


def test_first_linger_score_repairs_after_flush(trio: LocalShards, prefix: str) -> None:
    with farm_of(trio.urls, prefix, read="first-linger") as farm:
        put(farm.clusters[2], [Delete("k", 5.0, "m")])
        farm.clusters[0].insert([("k", 5.0, "m")])
        km = KeyMember("k", "m")
        answer = farm.score([km])[km]
        assert answer.score == 5.0 or not answer.present  # some replica's own record
        assert farm.flush_repairs(timeout=120)
        assert all(held(c, ["k"])["k"] == {("m", False, 5.0)} for c in farm.clusters)


def test_first_linger_with_a_dead_replica_answers_from_the_others() -> None:
    with LocalShards(3) as s, farm_of(s.urls, read=SendAllReadFirstLinger()) as farm:
        farm.insert([("k", 1.0, "m")])
        s.kill(0)
        for _ in range(5):
            assert pairs(farm.select(["k"])["k"]) == [("m", 1.0)]
        assert farm.flush_repairs(timeout=120)
        assert farm.repairs.failed == 0  # a dead replica is not asked to repair (it did not answer)


# -- SendVarReadFirstLinger -------------------------------------------------------------------------------------


def test_send_var_over_its_rate_asks_one_replica_and_refills(trio: LocalShards, prefix: str) -> None:
    # A broadcast every 2 s, burst 1; a long threshold, so that an answering replica is never bypassed.
    strategy = SendVarReadFirstLinger(per_second=0.5, threshold=30.0)
    with farm_of(trio.urls, prefix, read=strategy) as farm:
        farm.insert([("k", 1.0, "m")])
        calls = Calls(farm)
        assert pairs(farm.select(["k"])["k"]) == [("m", 1.0)]
        assert farm.flush_repairs(timeout=120)
        assert calls.asked() == {0, 1, 2}  # the budget's one token: a broadcast
        singles = []
        for _ in range(6):  # the budget is spent: one replica each, round robin, still answering
            assert pairs(farm.select(["k"])["k"]) == [("m", 1.0)]
            singles.append(calls.asked())
        assert all(len(a) == 1 for a in singles) and set().union(*singles) == {0, 1, 2}
        # diverge one replica: a single-replica read does not repair it, a broadcast (once refilled) does
        put(farm.clusters[1], [Insert("k", 2.0, "fresh")])
        deadline = time.monotonic() + 120
        while farm.repairs.requested == 0:
            assert time.monotonic() < deadline, "the token bucket never refilled"
            farm.select(["k"])
            assert farm.flush_repairs(timeout=120)
            if farm.repairs.requested == 0:
                time.sleep(0.05)
        assert calls.asked() >= {0, 2}
        assert all(held(c, ["k"])["k"] == {("m", True, 1.0), ("fresh", True, 2.0)} for c in farm.clusters)


def test_send_var_past_its_threshold_broadcasts() -> None:
    with LocalShards(3) as s, farm_of(s.urls, read=SendVarReadFirstLinger(per_second=0.001, threshold=0.0)) as farm:
        farm.insert([("k", 1.0, "m")])
        calls = Calls(farm)
        with calls.holding(0):  # replica0 never answers in time: whenever asked alone, the others are asked too
            for _ in range(6):
                assert pairs(farm.select(["k"])["k"]) == [("m", 1.0)]
        assert farm.flush_repairs(timeout=120)
        s.kill(2)  # a dead replica asked alone answers with errors: broadcast to the others
        for _ in range(6):
            assert pairs(farm.select(["k"])["k"]) == [("m", 1.0)]
        km = KeyMember("k", "m")
        for _ in range(6):
            assert farm.score([km])[km].score == 1.0
        assert farm.flush_repairs(timeout=120)


# -- the window merge ----------------------------------------------------------------------------------------------


def diverged(rng: random.Random, keys: list[str], farm: Farm) -> Model:
    """Replicas that differ a lot: replica1 deleted the top of the order (ties included), replica2 holds a
    random part, some re-inserted higher, some deleted; returns the model of their merge."""
    model = Model()
    for key in keys:
        n = rng.randint(0, 80)
        base = {f"m{j:02d}": (True, float(rng.randint(0, 30))) for j in range(n)}  # many equal scores
        top = sorted(base, key=lambda m: base[m][1], reverse=True)[: int(n * 0.7)]
        specs = [
            base,
            {**base, **{m: (False, base[m][1] + rng.choice([0.0, 0.0, 1.0])) for m in top}},
            {
                m: rng.choice([(True, s + rng.choice([0.0, 5.0])), (False, s - 1.0), (True, s)])
                for m, (_, s) in base.items()
                if rng.random() < 0.5
            },
        ]
        specs[2].update({f"x{j}": (True, float(rng.randint(0, 40))) for j in range(rng.randint(0, 5))})
        for cluster, spec in zip(farm.clusters, specs, strict=True):
            writes = writes_of(key, spec)
            if writes:
                put(cluster, writes)
            for w in writes:
                model.apply(w)
    return model


@pytest.mark.parametrize("seed", range(4))
def test_merged_select_pages_are_exact_when_replicas_differ_a_lot(trio: LocalShards, prefix: str, seed: int) -> None:
    rng = random.Random(seed)
    keys = [f"k{i}" for i in range(6)]
    with farm_of(trio.urls, prefix, read=SendAllReadAll(), repair=NoRepair()) as farm:
        model = diverged(rng, keys, farm)
        calls = Calls(farm)
        widened = 0
        for offset, limit in [(0, 1), (0, 5), (3, 4), (10, 10), (0, 200), (25, 7), (50, 50), (79, 3)]:
            calls.windows.clear()
            got = farm.select(keys, offset, limit)
            assert {k: pairs(v) for k, v in got.items()} == {
                k: model.visible(k)[offset : offset + limit] for k in keys
            }, (offset, limit)
            widened += max(calls.windows) > offset + limit
        assert widened >= 3, "the divergence did not make the windows widen"
        # cursor pages through the merge, and ranges with a stop
        for key in keys:
            expected = model.visible(key)
            start: Cursor | None = None
            paged: list[tuple[str, float]] = []
            while True:
                page = pairs(farm.select_range([key], start, None, 7)[key])
                paged += page
                if len(page) < 7:
                    break
                start = Cursor(page[-1][1], page[-1][0])
            assert paged == expected
            if len(expected) > 4:
                lo, hi = Cursor(expected[0][1], expected[0][0]), Cursor(expected[-2][1], expected[-2][0])
                assert pairs(farm.select_range([key], lo, hi, 1000)[key]) == expected[1:-2]
        assert farm.repairs.done == 0  # NoRepair: every read saw the full divergence


@pytest.mark.parametrize("read", [SendAllReadAll(), SendAllReadFirstLinger()])
def test_merge_repairs_the_divergence_to_the_model(trio: LocalShards, prefix: str, read: Any) -> None:
    keys = [f"k{i}" for i in range(6)]
    with farm_of(trio.urls, prefix, read=read, repair=RepairAll()) as farm:
        model = diverged(random.Random(99), keys, farm)
        farm.select(keys, 0, 1000)
        assert farm.flush_repairs(timeout=120)
        for c in farm.clusters:  # every member seen is repaired; its tombstones too where they won
            got = held(c, keys)
            assert {k: {r for r in got[k] if r[1]} for k in keys} == {
                k: {r for r in model.held(k) if r[1]} for k in keys
            }
        reads = Calls(farm)
        assert {k: pairs(v) for k, v in farm.select(keys, 0, 1000).items()} == {k: model.visible(k) for k in keys}
        assert farm.flush_repairs(timeout=120)
        assert reads.windows and max(reads.windows) == 1000  # agreeing windows: no widening, no lookups


def test_reading_nothing_and_bad_arguments(trio: LocalShards, prefix: str) -> None:
    with farm_of(trio.urls, prefix) as farm:
        assert farm.select([]) == {} and farm.score([]) == {}
        assert farm.select(["never"]) == {"never": []}
        with pytest.raises(ValueError):
            farm.select(["k"], limit=0)
        with pytest.raises(ValueError):
            farm.select(["k"], offset=-1)
        with pytest.raises(TypeError):
            farm.select("k")
