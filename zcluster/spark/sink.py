"""The exactly-once ``foreachBatch`` sink: thin Spark glue over :class:`zcluster.state.Applier`.

Per micro-batch, on the driver: if the batch id is already recorded as committed for this query, the batch
is a replay and is skipped. Otherwise the rows (one per journal frame, see :mod:`zcluster.spark.source`)
are partitioned by journal and sorted by offset, and each executor task runs the applier over its
journals (sequence, map, write, then checkpoint; see :mod:`zcluster.state.applier` for why that is
exactly once). When every task succeeded, the driver records the batch as committed for
``(query_name, query id)``.

A new checkpoint directory gives a new Spark query id, so its batch ids (restarting at 0) are not mistaken
for old ones, while producer states (keyed by ``query_name``) still drop messages the old query already
applied.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from zcluster.config import ClusterConfig, Where
from zcluster.state.applier import Applier, BatchStats, Mapper, retrying
from zcluster.state.store import StateStore

log = logging.getLogger("zcluster.spark")


@dataclass(frozen=True)
class _Job:
    """Everything an executor task needs; pickled by Spark (the mapper and decode with cloudpickle)."""

    config: ClusterConfig
    app: str
    journals: str | None
    mapper: Mapper
    decode: Callable[[Any], Any] | None
    ring: int
    flush: int
    retries: int
    prune_horizon: float | None

    def run(self, rows: Iterator[Any]) -> Iterator[dict[str, Any]]:
        applier = Applier(
            self.config.shared(),
            self.app,
            self.mapper,
            self.journals,
            decode=self.decode,
            ring=self.ring,
            flush=self.flush,
            retries=self.retries,
            prune_horizon=self.prune_horizon,
        )
        stats = BatchStats()
        for journal, group in itertools.groupby(rows, key=lambda r: r.journal):
            applier.apply(journal, group, stats)
        yield stats.counters()


class ZClusterSink:
    """A ``foreachBatch`` function committing journal messages into the cluster exactly once.

    ``cluster``: where the cluster is (any form of :func:`zcluster.connect`: shard URLs, one shard URL,
    ``redis+cluster://seed``, a :class:`zcluster.ClusterConfig`). ``mapper``: message -> writes
    (:class:`zcluster.Insert` / :class:`zcluster.Delete`); it sees committed messages only, never ACKs.
    ``query_name``: the application id that keys producer states and progress. ``journals``: the journal
    store URL, needed to replay transactions that span batches. ``decode``: record -> message (e.g. a
    ``KindRegistry``'s ``decode``); default: the framing's own. ``prune_horizon``: seconds after which quiet
    producers are forgotten.

    ``history`` holds a :class:`BatchStats` per batch handled by this driver process.
    Errors: a mapper failure raises :class:`zcluster.state.MapperError` (journal, offset, kind) and fails
    the batch; shard failures are retried ``retries`` times (writes, checkpoints and progress alike, with
    backoff up to 5 s), then fail the batch. A failed batch is not recorded as committed, and Spark runs
    it again.
    """

    def __init__(
        self,
        cluster: Where,
        mapper: Mapper,
        query_name: str,
        *,
        journals: str | None = None,
        decode: Callable[[Any], Any] | None = None,
        partitions: int | None = None,
        ring: int = 8192,
        flush: int = 16384,
        retries: int = 5,
        prune_horizon: float | None = None,
        prefix: str = "zc:",
        max_size: int | None = None,
    ) -> None:
        self.config = ClusterConfig.of(cluster, prefix=prefix, max_size=max_size)
        self.query_name = query_name
        self.partitions = partitions
        self.job = _Job(self.config, query_name, journals, mapper, decode, ring, flush, retries, prune_horizon)
        self.history: list[BatchStats] = []

    def __call__(self, df: Any, batch_id: int) -> None:
        started = time.perf_counter()
        spark = df.sparkSession
        query_id = spark.sparkContext.getLocalProperty("sql.streaming.queryId") or "batch"
        state = StateStore(self.config.shared(), self.query_name)
        stats = BatchStats(batch_id=batch_id, query_id=query_id)
        retries = self.job.retries
        done = retrying(lambda: state.committed_batch(query_id), retries, "read batch progress")
        if done is not None and batch_id <= done:
            stats.skipped = True
            log.info("batch %d of query %s already committed: skipped", batch_id, query_id)
        else:
            n = self.partitions or spark.sparkContext.defaultParallelism
            rows = df.repartition(n, "journal").sortWithinPartitions("journal", "begin")
            for part in rows.rdd.mapPartitions(self.job.run).collect():
                stats.add(part)
            retrying(lambda: state.commit_batch(query_id, batch_id), retries, "record batch progress")
        stats.seconds = time.perf_counter() - started
        self.history.append(stats)
        log.info("batch %d: %s", batch_id, stats)
