"""A ``foreachBatch`` sink for sources whose rows carry a replayable (partition, offset), Kafka's shape.

There are no Gazette UUIDs to sequence: every row is a message, in offset order within its partition.
2P-set writes are idempotent; increments (:class:`zcluster.Incr`, :class:`zcluster.Count`) are fenced by
(source ``<query_name>/<topic>/<partition>``, the row's offset, its index among the row's increments), so a
retried task, a replayed micro-batch or a new checkpoint directory reading the same offsets again changes
nothing. Producer duplicates (the same event at two offsets) count twice: they are the producer's business
(Kafka's idempotent producer). Offsets of one partition must be distinct and grow from one batch to the next
(they do in Kafka; a re-created topic starts again at 0: use a new ``query_name``); a batch's rows may come
in any order.

A fence keeps one position per (key, source): a partition's increments must reach it in offset order, so the
sink brings each (topic, partition)'s rows of a batch into one task (a shuffle) whatever the source's cut.
Spark cuts one partition's rows over several tasks more often than it seems (a file source packs a batch's
files into tasks; Kafka's ``minPartitions`` splits a topic-partition's offset range): fencing each task's own
rows would let the task holding later offsets move the fence past the other's, silently refused as applied
before.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

from zcluster.config import StoreConfig, Where, store_config, with_nodes
from zcluster.errors import ConfigError, MapperError
from zcluster.spark.observe import TASK_SCHEMA, add_rows, task_batch
from zcluster.spark.shipping import ship_by_value
from zcluster.state.batch import BatchStats, WriteBuffer

__all__ = ["PositionedSink"]


@dataclass(frozen=True)
class _Job:
    """What an executor task needs (pickled by Spark)."""

    config: StoreConfig
    app: str
    mapper: Callable[[dict[str, Any]], Any]
    partition: str
    offset: str
    topic: str | None
    flush: int
    retries: int

    def run(self, batches: Iterator[Any]) -> Iterator[Any]:
        """``mapInArrow`` function: rows in, one stats row out. A task's rows of a partition are applied in
        offset order, each partition's writes flushed before the task ends. Exact only when the task holds
        every row of the batch of each of its partitions (:meth:`PositionedSink.__call__` shuffles them so):
        a fence moved by another task's later offsets of the partition refuses this task's earlier ones."""
        stats = BatchStats()
        parts: dict[Any, list[dict[str, Any]]] = {}
        for batch in batches:
            for row in batch.to_pylist():
                parts.setdefault(row[self.partition], []).append(row)
        store = self.config.shared()
        for part, rows in sorted(parts.items(), key=lambda p: str(p[0])):
            name = f"{row_topic(rows[0], self.topic)}/{part}"
            writes = WriteBuffer(store, self.flush, self.retries, stats, source=f"{self.app}/{name}")
            for row in sorted(rows, key=lambda r: r[self.offset]):
                offset = int(row[self.offset])
                stats.frames += 1
                stats.delivered += 1
                writes.add(self._map(name, offset, row), name, offset, offset)
            writes.flush()
        yield task_batch(stats)

    def _map(self, name: str, offset: int, row: dict[str, Any]) -> list[Any]:
        try:
            return list(self.mapper(row))
        except Exception as exc:
            raise MapperError(f"mapper failed on {name} offset {offset}: {type(exc).__name__}: {exc}") from exc


def row_topic(row: dict[str, Any], topic: str | None) -> str:
    """The topic a row belongs to: its ``topic`` column (Kafka's), else ``topic``, else ``-``."""
    return str(row.get("topic") or topic or "-")


class PositionedSink:
    """A ``foreachBatch`` function applying rows of a (partition, offset) source exactly once (see the module).

    ``cluster``: where the cluster is (any form :func:`zcluster.connect` takes, or a
    :class:`~zcluster.farm.FarmConfig`: increments then need every replica, see ``Farm.increment``).
    ``mapper``: a row as a dict -> writes (Insert, Delete, Incr, Count); deterministic.
    ``query_name`` names the fences' sources, with the row's ``topic`` column (or ``topic=``) and its
    ``partition`` column; ``offset`` names the offset column (Kafka's columns by default: ``topic``,
    ``partition``, ``offset``; other sources rename theirs or pass these). ``flush``: writes per batch sent;
    ``retries``: resends of unconfirmed writes. ``history`` holds a :class:`BatchStats` per batch:
    ``increments`` sent, of which ``fenced`` were found at or below their fence (applied before: a replayed
    batch) and the rest ``applied``.

    Guarantee: every row's increments count exactly once however Spark partitions the batch (file sources,
    Kafka's ``minPartitions``, any ``repartition`` before the sink), across task retries, replayed batches
    and new checkpoint directories. Cost: each batch is shuffled by (``topic`` column if any, partition)
    into ``spark.sql.shuffle.partitions`` tasks (fewer where adaptive execution coalesces them; Spark's
    default 200 leaves most empty for a few partitions: set it near the executors' cores), and a partition's
    rows are applied by one task; a mapper writing only 2P-set writes (idempotent, no fences) pays it too, as
    the sink cannot know that before the mapper runs.

    Errors: a mapper failure or a refused write is a :class:`zcluster.MapperError` naming the partition and
    offset; shard failures are retried, then fail the batch. A failed batch ends the query (Spark does not
    run a failed ``foreachBatch`` again by itself; see :class:`zcluster.spark.ZClusterSink`): start it again
    from its checkpoint, and Spark runs the batch again; its increments count once (the fences).
    """

    def __init__(
        self,
        cluster: Where | StoreConfig,
        mapper: Callable[[dict[str, Any]], Any],
        query_name: str,
        *,
        partition: str = "partition",
        offset: str = "offset",
        topic: str | None = None,
        flush: int = 16384,
        retries: int = 5,
        prefix: str | None = None,
    ) -> None:
        if not query_name or "/" in query_name:
            raise ConfigError(f"query_name must be non-empty and without '/', got {query_name!r}")
        self.job = _Job(
            store_config(cluster, prefix=prefix), query_name, mapper, partition, offset, topic, flush, retries
        )
        self.history: list[BatchStats] = []
        self.shipped = ship_by_value(mapper, None)

    def __call__(self, df: Any, batch_id: int) -> None:
        started = time.perf_counter()
        missing = {self.job.partition, self.job.offset} - set(df.columns)
        if missing:
            raise ConfigError(f"PositionedSink needs the columns {sorted(missing)}; the rows have {df.columns}")
        stats = BatchStats(batch_id=batch_id)
        # Every row of a (topic, partition) into one task, whatever Spark's cut of the batch: see the module.
        together = df.repartition(*(["topic"] if "topic" in df.columns else []), self.job.partition)
        job = replace(self.job, config=with_nodes(self.job.config))  # seeds for a worker started mid-failover
        add_rows(stats, together.mapInArrow(job.run, TASK_SCHEMA).collect())
        stats.seconds = time.perf_counter() - started
        self.history.append(stats)
