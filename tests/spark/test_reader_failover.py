"""The reader's Redis Cluster partitions through a master killed (SIGKILL) mid-read: with a replica, the
replica takes over and every row is read exactly once; without one, the read fails naming the dead node.
Driven through the reader's own partitions and read calls (what Spark's tasks call), so the kill lands
between two batches of a partition."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from zcluster import Cluster, Durability, KeyScoreMember, PartialScanError, ShardError
from zcluster.spark.reader import TupleReader
from zcluster.testing import LocalRedisCluster

pytestmark = pytest.mark.spark

ROWS = [KeyScoreMember(f"u:{i}", float(j), f"m{j}") for i in range(2000) for j in range(1 + i % 3)]


def test_a_master_killed_mid_read_is_followed_to_its_replica_and_every_row_read_once(prefix: str) -> None:
    expected = sorted((r.key, r.score, r.member) for r in ROWS)
    with LocalRedisCluster(3, replicas=1) as rc:
        cluster = Cluster.from_cluster_url(rc.url, prefix=prefix)
        durable = cluster.view(prefix, durability=Durability(replicas=1, timeout=10.0))
        assert durable.insert(ROWS).ok  # on every replica too: the heir has every row
        # 4 slots a step; the option failover_timeout gives the read time for an election on a loaded machine
        options = {"cluster_url": rc.url, "prefix": prefix, "batch": "64", "failover_timeout": str(rc.FAILOVER_WAIT)}
        reader = TupleReader(options)
        parts = reader.partitions()
        assert len(parts) == 3  # the three masters' slots
        victim = 1
        (heir,) = rc.replicas_of(victim)
        # Partition 0 half read, partition 1 (the victim's slots) one batch read, then the kill.
        first, second = reader.read(parts[0]), reader.read(parts[victim])
        got = [*_rows_of(next(first)), *_rows_of(next(second))]
        rc.kill(victim)
        for batches in (first, second, *(reader.read(p) for p in parts[2:])):
            for batch in batches:
                got += _rows_of(batch)
        assert len(got) == len(expected)  # nothing twice
        assert sorted(got) == expected  # nothing lost
        with heir.client() as r:
            assert r.info("replication")["role"] == "master"  # the read went through a real failover
        cluster.close()


def test_a_master_killed_mid_read_without_a_replica_fails_the_read_naming_it(prefix: str) -> None:
    with LocalRedisCluster(3) as rc:
        cluster = Cluster.from_cluster_url(rc.url, prefix=prefix)
        cluster.insert(ROWS)
        reader = TupleReader({"cluster_url": rc.url, "prefix": prefix, "batch": "64"})
        parts = reader.partitions()
        victim = 1
        dead = f"127.0.0.1:{rc.servers[victim].port}"
        batches = reader.read(parts[victim])
        assert next(batches).num_rows > 0
        rc.kill(victim)
        with pytest.raises(PartialScanError) as info:
            for _ in batches:
                pass
        assert dead in str(info.value)
        assert [f.shard for f in info.value.failures] == [dead]
        assert isinstance(info.value.failures[0].error, ShardError | redis.ConnectionError)
        cluster.close()


def _rows_of(batch: Any) -> list[tuple[Any, ...]]:
    return [tuple(r.values()) for r in batch.to_pylist()]
