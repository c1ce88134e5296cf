"""Faults against real processes: SCRIPT FLUSH, shard restart, shard kill, slot migration under writes."""

from __future__ import annotations

import threading

import pytest

from zcluster import Cluster, KeyScoreMember, PartialReadError, PartialWriteError
from zcluster._keys import KeyLayout
from zcluster.testing import LocalRedisCluster, LocalShards

KSM = KeyScoreMember


def total(c: Cluster, keys: list[str]) -> int:
    return sum(len(v) for v in c.select(keys, limit=100000).values())


def test_script_flush_mid_run_reloads_and_resends() -> None:
    with LocalShards(2) as s:
        c = Cluster.from_urls(s.urls)
        keys = [f"k{i}" for i in range(40)]
        for rnd in range(6):
            if rnd % 2:
                for srv in s.servers:
                    with srv.client() as r:
                        r.script_flush()
            assert c.insert([KSM(k, float(rnd), f"m{rnd}") for k in keys]).applied_count == len(keys)
        assert total(c, keys) == 6 * len(keys)
        c.close()


def test_shard_restart_loses_script_cache_not_writes() -> None:
    with LocalShards(2) as s:
        c = Cluster.from_urls(s.urls)
        keys = [f"k{i}" for i in range(100)]
        c.insert([KSM(k, 1.0, "before") for k in keys])
        s.restart(0)  # graceful: data saved, script cache empty, old connections dead
        result = c.insert([KSM(k, 2.0, "after") for k in keys])
        assert result.ok and result.applied_count == len(keys)
        assert total(c, keys) == 2 * len(keys)
        c.close()


def test_killed_shard_is_reported_and_other_shards_apply() -> None:
    with LocalShards(2) as s:
        c = Cluster.from_urls(s.urls, connection={"socket_connect_timeout": 0.5})
        tuples = [KSM(f"k{i}", 1.0, "m") for i in range(200)]
        dead_name = c.shards[1]
        s.kill(1)
        with pytest.raises(PartialWriteError) as info:
            c.insert(tuples)
        result = info.value.result
        assert [f.shard for f in result.failures] == [dead_name]
        assert dead_name in str(info.value)
        failed = set(result.failed_indices)
        on_dead = {i for i, t in enumerate(tuples) if c.shard_of(t.key) == dead_name}
        assert failed == on_dead and 0 < len(failed) < len(tuples)
        assert all(result.applied[i] for i in range(len(tuples)) if i not in failed)
        # reads name the failed shard per key instead of dropping the answers
        keys = [t.key for t in tuples]
        with pytest.raises(PartialReadError) as rinfo:
            c.select(keys)
        assert {tuples[i].key for i in failed} == set(rinfo.value.errors)
        partial = c.select(keys, strict=False)
        assert set(partial.errors) == {tuples[i].key for i in failed}
        assert all(partial[k] for k in partial)
        # the shard comes back (empty: it was killed before any save); resending the failures is safe
        s.start(1)
        again = c.insert([tuples[i] for i in sorted(failed)])
        assert again.ok and again.applied_count == len(failed)
        assert total(c, keys) == len(tuples)
        c.close()


@pytest.mark.cluster
def test_slot_migration_under_concurrent_writes_loses_nothing() -> None:
    with LocalRedisCluster(3) as rc:
        c = Cluster.from_cluster_url(rc.url)
        # keys that all live in one slot, so the migration really moves them while we write
        keys = [f"{{hot}}:{i}" for i in range(50)]  # braces inside a logical key: tag is prefix + "{hot"
        layout = KeyLayout(c.prefix)
        slot = layout.slot(keys[0].encode())
        assert {layout.slot(k.encode()) for k in keys} == {slot}
        src = rc.slot_owner(slot)
        dst = (src + 1) % 3
        c.insert([KSM(k, 0.0, f"seed{j}") for k in keys for j in range(20)])
        errors: list[BaseException] = []
        written: list[int] = []
        stop = threading.Event()

        def writer() -> None:
            n = 0
            try:
                while not stop.is_set():
                    n += 1
                    c.insert([KSM(k, float(n), f"w{n}") for k in keys])
                    written.append(n)
            except BaseException as exc:  # reported below, never swallowed
                errors.append(exc)

        t = threading.Thread(target=writer)
        t.start()
        moved = rc.migrate_slot(slot, dst, batch=5, pause=0.05)
        stop.set()
        t.join(120)
        assert not errors, errors
        assert moved == len(keys)  # insert-only: one K+ per key
        assert rc.slot_owner(slot) == dst
        assert written, "the writer made progress during the migration"
        # every write that returned is there: 20 seeds + one member per round, for every key
        expect = 20 + len(written)
        assert all(len(v) == expect for v in c.select(keys, limit=100000).values())
        c.close()
