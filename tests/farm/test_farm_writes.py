"""Writes at a quorum with replicas killed, and killed replicas rebuilt by reads and by the walker."""

from __future__ import annotations

import pytest
from farm_helpers import all_keys, farm_of, held, pairs

from zcluster import Delete, Insert, KeyMember, KeyScoreMember, PartialWriteError, QuorumError
from zcluster.farm import RepairAll, SendAllReadAll, Walker
from zcluster.testing import LocalShards

KSM = KeyScoreMember


def test_one_dead_replica_of_three_is_within_the_quorum() -> None:
    with LocalShards(3) as s, farm_of(s.urls) as farm:
        dead = f"replica1/{farm.clusters[1].shards[0]}"
        s.kill(1)
        tuples = [KSM(f"k{i}", 1.0, "m") for i in range(20)]
        result = farm.insert(tuples)
        assert result.ok and result.failures == [] and result.quorum == 2
        assert result.confirmed == [2] * 20 and result.applied == [True] * 20
        failed = {r: fs for r, fs in result.replica_failures.items() if fs}
        assert list(failed) == ["replica1"]
        assert [f.shard for f in failed["replica1"]] == [dead]
        assert sorted(i for f in failed["replica1"] for i in f.indices) == list(range(20))
        # the other replicas hold it; reads answer from them
        assert all(pairs(v) == [("m", 1.0)] for v in farm.select([t.key for t in tuples]).values())


def test_two_dead_replicas_of_three_raise_quorum_error_naming_them() -> None:
    with LocalShards(3) as s, farm_of(s.urls) as farm:
        names = [f"replica{i}/{c.shards[0]}" for i, c in enumerate(farm.clusters)]
        farm.insert([KSM("before", 1.0, "m")])
        s.kill(0)
        s.kill(2)
        tuples = [KSM(f"k{i}", 2.0, "m") for i in range(10)]
        with pytest.raises(QuorumError) as info:
            farm.insert(tuples)
        assert isinstance(info.value, PartialWriteError)
        result = info.value.result
        assert result.failed_indices == list(range(10))
        assert result.confirmed == [1] * 10 and result.applied == [True] * 10  # replica1 took them
        assert sorted({f.shard for f in result.failures}) == [names[0], names[2]]
        assert names[0] in str(info.value) and names[2] in str(info.value) and names[1] not in str(info.value)
        assert "fewer than 2 replica(s)" in str(info.value)
        # roshi's "select after no quorum": the one replica that took the writes answers them
        assert pairs(farm.select(["k3"])["k3"]) == [("m", 2.0)]
        # without raise_on_error the same result comes back
        result = farm.delete([KSM("k3", 3.0, "m"), KSM("k4", 3.0, "m")], raise_on_error=False)
        assert not result.ok and result.failed_indices == [0, 1] and result.confirmed == [1, 1]


def test_a_tuple_below_the_quorum_is_reported_alone() -> None:
    # Two shards per replica: kill one shard on two replicas, so only the tuples routed there fall short.
    with LocalShards(6) as s:
        replicas = [s.urls[0:2], s.urls[2:4], s.urls[4:6]]
        with farm_of(replicas) as farm:
            c0 = farm.clusters[0]
            keys = [f"k{i}" for i in range(60)]
            on_second = {i for i, k in enumerate(keys) if c0.shard_of(k) == c0.shards[1]}
            assert 0 < len(on_second) < len(keys)
            s.kill(1)  # replica0's second shard
            s.kill(3)  # replica1's second shard (same routing: same keys)
            with pytest.raises(QuorumError) as info:
                farm.insert([KSM(k, 1.0, "m") for k in keys])
            result = info.value.result
            assert set(result.failed_indices) == on_second
            assert {f.shard for f in result.failures} == {
                f"replica0/{farm.clusters[0].shards[1]}",
                f"replica1/{farm.clusters[1].shards[1]}",
            }
            assert all(result.confirmed[i] == (1 if i in on_second else 3) for i in range(len(keys)))


def _history(farm_keys: list[str]) -> list[Insert | Delete]:
    writes: list[Insert | Delete] = []
    for i, k in enumerate(farm_keys):
        writes += [Insert(k, 1.0, "a"), Insert(k, 2.0, "b"), Insert(k, float(i), "c")]
        if i % 3 == 0:
            writes.append(Delete(k, 2.0, "b"))  # a tombstone the restarted replica must get back
    return writes


@pytest.mark.parametrize("how", ["reads", "walker"])
def test_a_replica_restarted_empty_is_repaired(how: str) -> None:
    with LocalShards(3) as s, farm_of(s.urls, read=SendAllReadAll(), repair=RepairAll()) as farm:
        keys = [f"k{i}" for i in range(30)]
        farm.apply(_history(keys[:15]))
        s.kill(2)
        result = farm.apply(_history(keys[15:]))
        assert result.ok and list(result.replica_failures) == ["replica0", "replica1", "replica2"]
        assert [f.shard for f in result.replica_failures["replica2"]] == [f"replica2/{farm.clusters[2].shards[0]}"]
        s.start(2)  # empty: no persistence
        assert all_keys(farm.clusters[2]) == []
        reference = held(farm.clusters[0], keys)
        assert held(farm.clusters[1], keys) == reference
        if how == "reads":
            got = farm.select(keys, limit=100)
            assert {k: pairs(v) for k, v in got.items()} == {
                k: sorted(((m, sc) for m, ins, sc in reference[k] if ins), key=lambda e: (e[1], e[0]), reverse=True)
                for k in keys
            }
            members = {k: {r for r in reference[k] if r[1]} for k in keys}
            assert {k: {r for r in v if r[1]} for k, v in held(farm.clusters[2], keys).items()} == members
            # a select shows members only; the tombstones come back with the reads that touch them
            assert held(farm.clusters[2], keys) != reference
            kms = [KeyMember(k, m) for k in keys for m, _, _ in reference[k]]
            got_scores = farm.score(kms)
            assert {(km.key, km.member, p.inserted, p.score) for km, p in got_scores.items()} == {
                (k, m, ins, sc) for k in keys for m, ins, sc in reference[k]
            }
        else:
            report = Walker(farm, batch_size=7).run()
            assert report.position is None and report.failures == []
            assert report.diverged == len(keys) and report.repaired == sum(len(v) for v in reference.values())
        assert held(farm.clusters[2], keys) == reference
        assert farm.repairs.failed == 0 and farm.repairs.done == sum(len(v) for v in reference.values())


def test_a_whole_replica_of_two_shards_is_rebuilt_by_the_walker() -> None:
    with LocalShards(6) as s:
        replicas = [s.urls[0:2], s.urls[2:4], s.urls[4:6]]
        with farm_of(replicas) as farm:
            keys = [f"user:{i}" for i in range(400)]
            writes: list[Insert | Delete] = []
            for i, k in enumerate(keys):
                writes += [Insert(k, float(j), f"m{j}") for j in range(i % 7 + 1)]
                if i % 5 == 0:
                    writes.append(Delete(k, 0.0, "m0"))
                if i % 11 == 0:
                    writes.append(Delete(k, 9.0, "gone"))  # a key of one tombstone only... plus members
            tombstone_only = [f"tomb:{i}" for i in range(20)]
            writes += [Delete(k, 1.0, "x") for k in tombstone_only]
            farm.apply(writes[: len(writes) // 2])
            s.kill(2)  # replica1 dies whole: both its shards
            s.kill(3)
            assert farm.apply(writes[len(writes) // 2 :]).ok  # the quorum holds without it
            s.start(2)
            s.start(3)
            everything = keys + tombstone_only
            assert all(not v for v in held(farm.clusters[1], everything).values())
            report = Walker(farm, batch_size=50).run()
            assert report.position is None and report.failures == [] and report.repair_failures == 0
            assert report.diverged == len(everything)
            reference = held(farm.clusters[0], everything)
            assert all(reference[k] for k in everything)
            for c in farm.clusters:
                assert held(c, everything) == reference
                assert all_keys(c) == sorted(everything)
            again = Walker(farm, batch_size=50).run()
            assert again.diverged == 0 and again.repaired == 0


def test_applied_means_new_to_every_replica_that_answered(trio: LocalShards, prefix: str) -> None:
    with farm_of(trio.urls, prefix) as farm:
        farm.clusters[0].insert([KSM("k", 2.0, "a")])  # replica0 alone already holds it
        farm.clusters[2].delete([KSM("k", 1.0, "c")])  # replica2 alone holds a tombstone at the same score
        result = farm.insert([KSM("k", 2.0, "a"), KSM("k", 3.0, "b"), KSM("k", 1.0, "c")])
        assert result.ok and result.confirmed == [3, 3, 3]
        assert result.applied == [False, True, False]  # a duplicate somewhere is a duplicate for the farm
        assert farm.insert([KSM("k", 3.0, "b")]).applied == [False]
        assert farm.delete([KSM("k", 3.0, "b")]).applied == [True]  # a delete wins the tie everywhere
