"""The exactly-once ``foreachBatch`` sink: thin Spark glue over :class:`zcluster.state.Applier`.

Per micro-batch: the source's rows go through ``DataFrame.mapInArrow`` to executor tasks, each running
the applier over its journals as the source's partitions give them (journal ranges, each in offset
order: no shuffle, no sort); see :mod:`zcluster.state.applier` for why that is exactly once. The rows are
either the journal ranges themselves (the source's ``rows=ranges``: the task reads the bytes from the
journal store, past the stored checkpoint only, so no frame crosses the JVM and a re-run batch reads
nothing) or one row per frame (the source's
default). Only ``mapInArrow`` and ``collect`` are used, so the sink runs on classic Spark and on Spark
Connect alike.

Batch progress: on classic Spark the driver also records each batch as committed for
``(query_name, Spark query id)`` and skips a batch Spark runs again after its commit was lost. A new
checkpoint directory gives a new query id, so its batch ids (restarting at 0) are never mistaken for old
ones. Spark Connect does not expose the query id to a ``foreachBatch`` function; there the sink keeps no
batch progress, and a re-run batch is read again and delivers nothing: the per-journal checkpoint
offsets in the cluster (keyed by ``query_name``, whatever the checkpoint directory) are what make it
exactly once in both cases.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from zcluster._retry import retrying
from zcluster.config import StoreConfig, Where, store_config, with_nodes
from zcluster.errors import ConfigError
from zcluster.journal.frames import RawFrame
from zcluster.journal.store import JournalStore, close_store
from zcluster.journal.urls import open_store
from zcluster.spark.observe import METRICS_NAME, TASK_SCHEMA, add_rows, observed, task_batch
from zcluster.spark.shipping import explain_missing_module, ship_by_value
from zcluster.spark.source import RANGE_COLUMNS
from zcluster.spark.workers import freeze_heap
from zcluster.state.applier import Applier, Mapper
from zcluster.state.batch import BatchStats
from zcluster.state.store import StateStore
from zcluster.state.txn import check_store

log = logging.getLogger("zcluster.spark")


STATS_SCHEMA = TASK_SCHEMA
"""What each sink task returns (:mod:`zcluster.spark.observe`): its BatchStats counters, and its journals' lags."""


@dataclass(frozen=True)
class _Job:
    """Everything an executor task needs; pickled by Spark (the mapper and decode with cloudpickle)."""

    config: StoreConfig
    app: str
    journals: str | None = field(repr=False)  # URLs, maybe with a password (also publish): not in a traceback
    mapper: Mapper
    decode: Callable[[Any], Any] | None
    ring: int
    flush: int
    retries: int
    prune_horizon: float | None
    fail_on_data_loss: bool = True
    lag: bool = True
    publish: str | None = field(default=None, repr=False)

    def run(self, batches: Iterator[Any]) -> Iterator[Any]:
        """``mapInArrow`` function: frames (Arrow record batches of the source's rows) in, stats out.

        The source's partitions hold journal byte ranges, each in offset order, so a task applies its
        frames as they come: no shuffle, no sort. A journal whose frames go backwards (the rows were
        reordered before the sink) fails the task instead of being checkpointed wrongly.
        """
        freeze_heap()  # the worker's full collection after each task then skips its imports
        stats = BatchStats()
        first = next(batches, None)
        with _collector_paused():
            self._apply(first, batches, stats)
        yield task_batch(stats)

    def _apply(self, first: Any, batches: Iterator[Any], stats: BatchStats) -> None:
        if first is None:
            return
        # The store (when given) also binds each checkpoint to its journal's identity, in both row modes.
        store = None if self.journals is None else open_store(self.journals, recover=False)
        publish = None if self.publish is None else open_store(self.publish)
        try:
            applier = self._applier(store, publish)
            if "data" in first.schema.names:
                frames = _frames(itertools.chain([first], batches))
                for journal, group in itertools.groupby(frames, key=lambda r: r[0]):
                    applier.apply(journal, _in_order(journal, group), stats)
                return
            assert store is not None  # checked by the driver
            for batch in itertools.chain([first], batches):
                for journal, content_type, begin, end in _rows(batch, RANGE_COLUMNS):
                    applier.apply_range(store, journal, content_type, begin, end, stats)
        finally:
            if store is not None:
                close_store(store)
            if publish is not None:
                close_store(publish)

    def _applier(self, journals: JournalStore | str | None, publish: JournalStore | None = None) -> Applier:
        return Applier(
            self.config.shared(),
            self.app,
            self.mapper,
            journals,
            decode=self.decode,
            ring=self.ring,
            flush=self.flush,
            retries=self.retries,
            prune_horizon=self.prune_horizon,
            fail_on_data_loss=self.fail_on_data_loss,
            lag=self.lag,
            publish=publish,
        )


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """The cyclic garbage collector off for the task's apply loop, then back as it was.

    The loop allocates several container objects per frame and keeps thousands alive (the Sequencer's
    ring, the write buffer), so the collector runs often and walks them all: about a tenth of the task's
    time, to find no cycles (the loop makes none). The task owns its Python worker process meanwhile.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _frames(batches: Iterator[Any]) -> Iterator[RawFrame]:
    for batch in batches:
        yield from map(RawFrame._make, _rows(batch, RawFrame._fields))


def _rows(batch: Any, names: Sequence[str]) -> Iterator[tuple[Any, ...]]:
    """The rows of an Arrow record batch as tuples of the columns ``names``."""
    return zip(*(batch.column(name).to_pylist() for name in names), strict=True)


def _in_order(journal: str, frames: Iterator[RawFrame]) -> Iterator[RawFrame]:
    last = -1
    for frame in frames:
        if frame.begin < last:
            raise ConfigError(
                f"journal {journal}: frame at offset {frame.begin} arrives after offset {last}; the sink needs each "
                "journal's rows in offset order (as the zcluster-journal source gives them: don't reorder them)"
            )
        last = frame.end
        yield frame


def _query_id(df: Any) -> str | None:
    """Spark's query id of the batch (classic Spark); None where it is not exposed (Spark Connect)."""
    try:
        context = df.sparkSession.sparkContext
    except Exception:  # Connect: no SparkContext in the foreachBatch process
        return None
    query_id = context.getLocalProperty("sql.streaming.queryId")
    return str(query_id) if query_id else None


def _check_columns(columns: list[str], journals: str | None) -> None:
    if "data" in columns:
        return
    if not set(RANGE_COLUMNS) <= set(columns):
        raise ConfigError(f"ZClusterSink needs the zcluster-journal source's rows, got columns {columns}")
    if journals is None:
        raise ConfigError(
            "ZClusterSink reads the journal ranges of rows=ranges from the journal store: give it journals= "
            "(the same store URL as the source's)"
        )


class ZClusterSink:
    """A ``foreachBatch`` function committing journal messages into the cluster exactly once.

    ``cluster``: where the cluster is (any form of :func:`zcluster.connect`: shard URLs, one shard URL,
    ``redis+cluster://seed``, a :class:`zcluster.ClusterConfig`), or a farm of replicas
    (:class:`zcluster.farm.FarmConfig`: checkpoints then survive the loss of a replica). ``mapper``: message -> writes
    (:class:`zcluster.Insert` / :class:`zcluster.Delete`); it sees committed messages only, never ACKs.
    ``query_name``: the application id that keys producer states and progress. ``journals``: the journal
    store URL, needed to replay transactions that span batches, and to read the ranges of a source with
    ``.option("rows", "ranges")``, where tasks read the bytes themselves (past the stored checkpoints only)
    instead of receiving every frame through the JVM. ``decode``: record -> message (e.g. a
    ``KindRegistry``'s ``decode``); default: the framing's own. ``prune_horizon``: seconds after which quiet
    producers are forgotten. ``prefix`` and ``max_size``, when given, are set on the cluster's config (on
    every replica of a farm); otherwise a config object keeps its own and URLs get ``"zc:"``, unbounded.

    ``fail_on_data_loss``: False skips the lost ranges of file journals (each logged, counted in
    ``BatchStats.lost_skipped`` and audited) instead of stopping before them (see
    :mod:`zcluster.state.lost`; with the source's ``rows=frames`` the source needs ``failOnDataLoss=false``
    too). ``lag``: the tasks measure each journal's lag after applying it (one ``end()`` of the journal
    store per journal; ``rows=ranges``). ``metrics``: called with ``(query_name, stats)`` after each batch
    (e.g. a :class:`zcluster.metrics.ApplierMetrics`).

    ``publish``: a journal store URL the mapper's :class:`zcluster.Publish` messages go to, exactly once
    (:mod:`zcluster.state.txn`). The transaction is one journal's range in one task: the task claims the
    journal (a new producer id per task attempt, fencing any earlier attempt still running: a speculative copy
    or a retry's zombie, whose save then fails: its messages commit once if the newer claim adopted that save,
    else never), appends the last checkpoint's
    ACK intents again, publishes uncommitted, saves the checkpoint with its intents and appends them. A
    replayed batch or a new checkpoint directory re-reads ranges the checkpoints already passed: nothing is
    published again. Each task attempt is a new producer to downstream readers: give them a ``prune_horizon``.
    With ``publish``, a farm of replicas as ``cluster`` raises :class:`zcluster.ConfigError` here (the fenced
    checkpoints need reads that see every acknowledged write; see :func:`zcluster.state.txn.check_store`).

    Progress in Spark: ``sink.observe(df).writeStream.foreachBatch(sink)`` (as
    :func:`zcluster.spark.run_available_now` does) runs the sink's tasks in the query's own plan, so each
    batch's figures appear in ``StreamingQueryProgress.observedMetrics["zcluster"]`` (delivered, duplicates,
    rollbacks, replays, lost ranges skipped, the lag per journal...), on classic Spark and Connect alike
    (see :mod:`zcluster.spark.observe`). ``writeStream.foreachBatch(sink)`` alone works the same without them.

    ``history`` holds a :class:`BatchStats` per batch handled by this driver process. ``shipped`` names the
    modules of the mapper (and decode) that are not installed here (e.g. the job's own ``jobs.py``), which the
    sink has cloudpickle send by value with the mapper, so that executors and a Spark Connect server need not
    import them (:func:`zcluster.spark.shipping.ship_by_value` says what is and is not shipped). Installed
    packages the mapper uses, zcluster among them, must be installed into the workers' Python.
    Errors: a mapper failure raises :class:`zcluster.MapperError` (journal, offset, kind) and fails
    the batch; shard failures are retried ``retries`` times (writes, checkpoints and progress alike, with
    backoff up to 5 s), then fail the batch. With a :class:`zcluster.Durability` on the cluster's config
    (``ClusterConfig.of(url, cluster=True, durability=Durability(replicas=1))``), writes and checkpoints
    wait for their confirmation up to ``Durability.deadline`` (60 s by default), riding out a Redis Cluster
    failover and the old master's rejoin as a replica; a :class:`zcluster.DurabilityError` after it fails
    the batch at once (no resend: it would wait as long again).

    A failed batch ends the query: a task that raises is retried by Spark up to ``spark.task.maxFailures``
    times (4 on a cluster; once in ``local[n]``), but Spark never runs a failed ``foreachBatch`` again by
    itself: the query stops, ``query.exception()`` holds the error and ``awaitTermination()`` raises it (a
    ``StreamingQueryException``). Nothing of that batch is recorded as committed, neither by Spark nor by
    the sink. What to do: fix the cause the error names, then start the query again with the same
    ``checkpointLocation`` (a supervisor can do it): Spark runs the failed batch again with the same
    batch id, and what the failed attempt applied counts once (the journal checkpoints skip it, 2P-set
    writes are idempotent, increments fenced).
    """

    def __init__(
        self,
        cluster: Where | StoreConfig,
        mapper: Mapper,
        query_name: str,
        *,
        journals: str | None = None,
        decode: Callable[[Any], Any] | None = None,
        ring: int = 8192,
        flush: int = 16384,
        retries: int = 5,
        prune_horizon: float | None = None,
        prefix: str | None = None,
        max_size: int | None = None,
        fail_on_data_loss: bool = True,
        lag: bool = True,
        metrics: Callable[[str, BatchStats], None] | None = None,
        publish: str | None = None,
    ) -> None:
        self.config = store_config(cluster, prefix=prefix, max_size=max_size)
        if publish is not None:  # here, not first in every task: a farm cannot hold its fenced checkpoints
            check_store(self.config.shared(), query_name)
        self.query_name = query_name
        self.job = _Job(
            self.config,
            query_name,
            journals,
            mapper,
            decode,
            ring,
            flush,
            retries,
            prune_horizon,
            fail_on_data_loss,
            lag,
            publish,
        )
        self.metrics = metrics
        self.history: list[BatchStats] = []
        self.shipped = ship_by_value(mapper, decode)  # the mapper's own modules, pickled with it

    def __call__(self, df: Any, batch_id: int) -> None:
        started = time.perf_counter()
        query_id = _query_id(df)
        stats = BatchStats(batch_id=batch_id, query_id=query_id or "")
        retries = self.job.retries
        state = StateStore(self.config.shared(), self.query_name)
        done = None
        if query_id is not None:
            done = retrying(lambda: state.committed_batch(query_id), retries, "read batch progress")
        if done is not None and batch_id <= done:
            stats.skipped = True
            log.info("batch %d of query %s already committed: skipped", batch_id, query_id)
        else:
            if "stats" in df.columns:  # the tasks are in the query's plan already (observe): collect their rows
                tasks = df
            else:
                _check_columns(df.columns, self.job.journals)
                tasks = df.mapInArrow(self._tasks_job().run, STATS_SCHEMA)
            try:
                rows = tasks.collect()
            except Exception as exc:
                explain_missing_module(exc, self.shipped)  # a worker that cannot import a module: what to do
                raise
            add_rows(stats, rows)
            if query_id is not None:
                retrying(lambda: state.commit_batch(query_id, batch_id), retries, "record batch progress")
        stats.seconds = time.perf_counter() - started
        self.history.append(stats)
        log.info("batch %d: %s", batch_id, stats)
        if self.metrics is not None:
            self.metrics(self.query_name, stats)

    def _tasks_job(self) -> _Job:
        """The job as the tasks get it: a Redis Cluster's config carries the nodes the driver knows now, so
        a worker process started while the seed node is down (mid-failover) still reaches the cluster."""
        return replace(self.job, config=with_nodes(self.job.config))

    def observe(self, df: Any, name: str = METRICS_NAME) -> Any:
        """``df`` (the ``zcluster-journal`` source's streaming DataFrame) with the sink's tasks in the query's
        plan and their figures observed as ``name``; write it with ``.writeStream.foreachBatch(self)``. Each
        batch's figures are then in the query's progress: ``query.lastProgress.observedMetrics[name]`` (or
        ``event.progress.observedMetrics`` in a ``StreamingQueryListener``) holds the counts of
        :data:`zcluster.spark.observe.COUNTS`, ``lag_bytes`` (summed over the batch's journals) and ``lag``
        (``(journal, lag_bytes)`` per journal); :func:`zcluster.spark.observe.figures` reads them as a dict (also
        Spark Connect's form). A batch the sink skips (committed already) reports none."""
        _check_columns(df.columns, self.job.journals)
        return observed(df.mapInArrow(self._tasks_job().run, STATS_SCHEMA), name)
