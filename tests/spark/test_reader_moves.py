"""The reader's Redis Cluster partitions (hash slots) through a reshard and a half-migrated slot between
planning and reading, and mid-read: every row read exactly once. Driven through the reader's own partitions
and read calls (what Spark's tasks call), so the moves land at known points of the read."""

from __future__ import annotations

from typing import Any

import pytest

from zcluster import Cluster, KeyScoreMember
from zcluster._keys import KeyLayout
from zcluster.spark.reader import TupleReader
from zcluster.testing import LocalRedisCluster

pytestmark = pytest.mark.spark


def test_a_reshard_and_a_half_migrated_slot_during_the_read_lose_and_repeat_nothing(prefix: str) -> None:
    layout = KeyLayout(prefix)
    tag = next(f"hot{i}" for i in range(10_000) if layout.slot(f"hot{i}".encode()) > 16_000)
    rows = [KeyScoreMember(f"u:{i}", float(j), f"m{j}") for i in range(3000) for j in range(1 + i % 3)]
    rows += [KeyScoreMember(f"{tag}}}:{i}", 1.0, "h") for i in range(40)]  # 40 keys of one slot
    expected = sorted((r.key, r.score, r.member) for r in rows)
    with LocalRedisCluster(3) as rc:
        cluster = Cluster.from_cluster_url(rc.url, prefix=prefix)
        cluster.insert(rows)
        reader = TupleReader({"cluster_url": rc.url, "prefix": prefix, "batch": "64"})  # 4 slots a step
        parts = reader.partitions()
        assert len(parts) == 3  # the three masters' slots
        new = rc.add_master()  # after planning: the plan names none of its slots

        first = reader.read(parts[0])
        got = [tuple(r.values()) for r in _rows_of(next(first))]
        # Mid-read of partition 0: 4096 slots (the lowest of each master, some of them partition 0's
        # still unread) move to the new master.
        assert rc.reshard(4096, new) == 4096
        # ... and the hot slot is left half-migrated (redis-cli's steps, stopped halfway).
        hot = layout.slot(tag.encode())
        src = rc.slot_owner(hot)
        dst = next(i for i in range(4) if i != src)
        with rc.servers[src].client() as sc, rc.servers[dst].client() as dc:
            dc.execute_command("CLUSTER", "SETSLOT", hot, "IMPORTING", rc.node_id(src))
            sc.execute_command("CLUSTER", "SETSLOT", hot, "MIGRATING", rc.node_id(dst))
            held = sc.execute_command("CLUSTER", "COUNTKEYSINSLOT", hot)  # 40, and any u: key the prefix puts there
            half = sc.execute_command("CLUSTER", "GETKEYSINSLOT", hot, 20)
            sc.execute_command("MIGRATE", "127.0.0.1", rc.servers[dst].port, "", 0, 5000, "KEYS", *half)
            assert held >= 40 and sc.execute_command("CLUSTER", "COUNTKEYSINSLOT", hot) == held - 20
        for batch in first:
            got += [tuple(r.values()) for r in _rows_of(batch)]
        for part in parts[1:]:
            for batch in reader.read(part):
                got += [tuple(r.values()) for r in _rows_of(batch)]
        assert len(got) == len(expected)  # nothing twice
        assert sorted(got) == expected  # nothing lost
        cluster.close()


def _rows_of(batch: Any) -> list[dict[str, Any]]:
    return batch.to_pylist()  # type: ignore[no-any-return]
