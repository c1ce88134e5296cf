"""The walker: resumable, rate limited, bounded in memory whatever the divergence, and past dead replicas."""

from __future__ import annotations

import random
import threading
from typing import Any

import pytest
from farm_helpers import Model, all_keys, farm_of, held, put

from zcluster import Cluster, Delete, Insert, KeyScoreMember
from zcluster.farm import Farm, Walker
from zcluster.testing import LocalShards
from zcluster.types import Write


def scatter(
    farm: Farm, rng: random.Random, keys: list[str], members: int = 4, out: list[list[Write]] | None = None
) -> Model:
    """Random writes of ``keys``, each onto a random non-empty subset of the replicas; the model of all
    (``out`` receives each replica's writes)."""
    model = Model()
    per_replica: list[list[Write]] = [[] for _ in farm.clusters]
    for key in keys:
        for j in range(rng.randint(1, members)):
            score = float(rng.randint(0, 5))
            write: Write = rng.choice([Insert, Insert, Delete])(key, score, f"m{j}")
            model.apply(write)
            for i in rng.sample(range(len(farm.clusters)), rng.randint(1, len(farm.clusters))):
                per_replica[i].append(write)
    for cluster, writes in zip(farm.clusters, per_replica, strict=True):
        put(cluster, writes)
    if out is not None:
        out.extend(per_replica)
    return model


def converged(farm: Farm, model: Model, keys: list[str]) -> None:
    expected = {k: model.held(k) for k in keys}
    for c in farm.clusters:
        assert held(c, keys) == expected
        assert all_keys(c) == sorted(keys)


def test_a_walk_stopped_by_max_keys_resumes_from_its_position(trio: LocalShards, prefix: str) -> None:
    keys = [f"k{i:03d}" for i in range(300)]
    with farm_of(trio.urls, prefix) as farm:
        model = scatter(farm, random.Random(1), keys)
        walker = Walker(farm, batch_size=20)
        reports = [walker.run(max_keys=50)]
        assert reports[0].position is not None and 50 <= reports[0].keys < len(keys)
        while reports[-1].position is not None:
            reports.append(walker.run(position=reports[-1].position, max_keys=50))
            assert len(reports) < 100
        assert len(reports) > 3
        assert sum(r.keys for r in reports) >= len(keys)
        assert sum(r.diverged for r in reports) > 0 and all(r.failures == [] for r in reports)
        assert sum(r.repaired for r in reports) == farm.repairs.done
        converged(farm, model, keys)
        final = walker.run()
        assert final.diverged == 0 and final.repaired == 0 and final.position is None


def test_a_walk_stopped_by_its_event_resumes(trio: LocalShards, prefix: str) -> None:
    keys = [f"k{i:03d}" for i in range(120)]
    with farm_of(trio.urls, prefix) as farm:
        model = scatter(farm, random.Random(2), keys)
        stop = threading.Event()
        seen: list[int] = []

        def progress(report: Any, replica: int) -> None:
            seen.append(replica)
            stop.set()

        first = Walker(farm, batch_size=10).run(stop=stop, progress=progress)
        assert first.position is not None and len(seen) == 1
        rest = Walker(farm, batch_size=10).run(position=first.position, progress=lambda r, i: seen.append(i))
        assert rest.position is None and sorted(set(seen)) == [0, 1, 2]
        converged(farm, model, keys)


@pytest.mark.parametrize("position", ["garbage", "", "7/1/", "0/1/nope", "1/1/", "0/2/", "0/1/0:x", "-1/1/", "0/1/9:0"])
def test_a_bad_position_is_a_value_error(trio: LocalShards, prefix: str, position: str) -> None:
    with farm_of(trio.urls, prefix) as farm:
        farm.insert([("k", 1.0, "m")])
        with pytest.raises(ValueError):
            Walker(farm).run(position=position)


@pytest.mark.parametrize("batch_size", [0, -1, True, 1.5])
def test_a_bad_batch_size_is_a_value_error(trio: LocalShards, prefix: str, batch_size: Any) -> None:
    with farm_of(trio.urls, prefix) as farm, pytest.raises(ValueError):
        Walker(farm, batch_size=batch_size)


def test_a_rate_limited_walk_completes_and_takes_a_token_per_key(trio: LocalShards, prefix: str) -> None:
    keys = [f"k{i:03d}" for i in range(400)]
    with farm_of(trio.urls, prefix) as farm:
        model = scatter(farm, random.Random(3), keys)
        walker = Walker(farm, rate=5000, batch_size=50)
        assert walker._bucket is not None
        taken: list[float] = []
        wait = walker._bucket.wait

        def counting(n: float = 1.0) -> None:
            taken.append(n)
            wait(n)

        walker._bucket.wait = counting  # type: ignore[method-assign]
        report = walker.run()
        assert report.position is None and report.diverged > 0
        assert sum(taken) == report.keys and max(taken) <= 50
        converged(farm, model, keys)


def test_memory_is_bounded_by_one_batch_whatever_the_divergence(trio: LocalShards, prefix: str) -> None:
    batch = 200
    keys = [f"user:{i:05d}" for i in range(20_000)]
    with farm_of(trio.urls, prefix) as farm:
        # every key diverges: replica0 holds two members, replica2 a tombstone, replica1 nothing
        put(farm.clusters[0], [Insert(k, 1.0, m) for k in keys for m in ("a", "b")])
        put(farm.clusters[2], [Delete(k, 2.0, "b") for k in keys])
        writes: list[tuple[int, int]] = []  # (keys, records) of each repair write
        read_whole: list[int] = []
        repair_now, records = farm.repair_now, farm.records

        def watched_repairs(repairs: Any) -> tuple[int, int]:
            writes.append((len({r[-1].key for r in repairs}), len(repairs)))
            return repair_now(repairs)

        def watched_records(ks: Any) -> Any:
            ks = list(ks)
            read_whole.append(len(ks))
            return records(ks)

        farm.repair_now = watched_repairs  # type: ignore[method-assign]
        farm.records = watched_records  # type: ignore[method-assign]
        report = Walker(farm, batch_size=batch).run()
        assert report.position is None and report.failures == []
        assert report.diverged == len(keys)
        # each key needs: a and b onto replica1, b's tombstone onto replica0 and replica1, a onto replica2
        assert report.repaired == 4 * len(keys) == sum(n for _, n in writes)
        assert len(writes) >= len(keys) // batch
        assert max(k for k, _ in writes) <= batch and max(n for _, n in writes) <= 4 * batch
        assert max(read_whole) <= batch
        expected = {("a", True, 1.0), ("b", False, 2.0)}
        sample = keys[::97]
        for c in farm.clusters:
            assert all(v == expected for v in held(c, sample).values())
        again = Walker(farm, batch_size=2000).run()
        assert again.keys >= len(keys) and again.diverged == 0


def test_a_dead_replica_is_reported_and_the_others_still_converge() -> None:
    keys = [f"k{i:03d}" for i in range(150)]
    with LocalShards(3) as s, farm_of(s.urls) as farm:
        per_replica: list[list[Write]] = []
        model = scatter(farm, random.Random(4), keys, out=per_replica)
        s.kill(1)
        report = Walker(farm, batch_size=25).run()
        assert report.position is None
        assert report.failures and all(f.shard.startswith("replica1/") for f in report.failures)
        merged = Model()  # what the two survivors hold between them
        for w in per_replica[0] + per_replica[2]:
            merged.apply(w)
        survivors = {k: merged.held(k) for k in keys}
        assert survivors != {k: model.held(k) for k in keys}  # replica1 alone held some winners
        for c in (farm.clusters[0], farm.clusters[2]):
            assert held(c, keys) == survivors
        s.start(1)  # empty: what it alone held is gone, the walker copies the survivors' records onto it
        report = Walker(farm, batch_size=25).run()
        left = [k for k in keys if survivors[k]]
        assert report.failures == [] and report.diverged == len(left) < len(keys)
        converged(farm, merged, left)


def test_floors_are_replicated_and_forgotten_records_do_not_come_back() -> None:
    """A replica restarted empty has lost its floor: a late insert below it lands there only; the walk
    raises its floor, drops the record, and the replicas converge (a second walk finds nothing)."""
    with LocalShards(3) as shards:
        clusters = [Cluster.from_urls([u], floors=True) for u in shards.urls]
        farm = Farm(clusters)
        farm.insert([("k", 1, "a"), ("k", 3, "b")])
        farm.forget(["k"], 2.0)
        shards.kill(1)
        shards.start(1)
        assert farm.insert([("k", 1.5, "late")]).applied == [False]
        assert clusters[1].records(["k"])["k"] == [Insert("k", 1.5, "late")]
        first = Walker(farm).run()
        assert (first.diverged, first.floors_raised) == (1, 1)
        second = Walker(farm).run()
        assert second.diverged == 0
        for c in clusters:
            assert c.records(["k"])["k"] == [Insert("k", 3.0, "b")]
            assert c.floors_of(["k"])["k"] == 2.0
        assert farm.select(["k"])["k"] == [KeyScoreMember("k", 3.0, "b")]
        farm.close()


def test_equal_floors_written_as_different_text_do_not_diverge_forever(trio: LocalShards, prefix: str) -> None:
    # A trim stores the floor as the server prints it ("1"), forget() as the client sent it ("1.0").
    a = Cluster.from_urls([trio.urls[0]], prefix=prefix, max_size=2)
    b = Cluster.from_urls([trio.urls[1]], prefix=prefix, max_size=2)
    farm = Farm([a, b])
    a.apply([Insert("k", 1.0, "x"), Insert("k", 2.0, "y"), Insert("k", 3.0, "z")])
    b.apply([Insert("k", 2.0, "y"), Insert("k", 3.0, "z")])
    assert Walker(farm).run().floors_raised == 1
    again = Walker(farm).run()
    assert (again.diverged, again.floors_raised) == (0, 0)
    assert a.fingerprints(["k"]) == b.fingerprints(["k"])


def test_a_shard_that_cannot_be_scanned_is_reported_by_a_walk_stopped_early() -> None:
    fast = {"socket_connect_timeout": 0.5, "socket_timeout": 2.0}
    with LocalShards(3) as shards:
        a = Cluster.from_urls([shards.urls[0]], connection=fast)
        b = Cluster.from_urls([shards.urls[1], shards.urls[2]], connection=fast)
        farm = Farm([a, b], write_quorum=1)
        b.apply([Insert(f"k{i}", 1.0, "x") for i in range(200)])
        shards.kill(1)
        position, failures = None, []
        while True:
            report = Walker(farm, batch_size=10).run(position, max_keys=10)
            failures += report.failures
            position = report.position
            if position is None:
                break
        assert any(f.shard == f"replica1/127.0.0.1:{shards.servers[1].port}" for f in failures)
        farm.close()
