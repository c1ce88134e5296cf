"""A ``foreachBatch`` sink for sources whose rows carry a replayable (partition, offset), Kafka's shape.

There are no Gazette UUIDs to sequence: every row is a message, in offset order within its partition.
2P-set writes are idempotent; increments (:class:`zcluster.Incr`, :class:`zcluster.Count`) are fenced by
(source ``<query_name>/<topic>/<partition>``, the row's offset, its index among the row's increments), so a
retried task, a replayed micro-batch or a new checkpoint directory reading the same offsets again changes
nothing. Producer duplicates (the same event at two offsets) count twice: they are the producer's business
(Kafka's idempotent producer). Offsets of one partition must be distinct (a re-created topic starts again at
0: use a new ``query_name``); a batch's rows may come in any order.

Offsets out of order across batches: a fence keeps one position, so it cannot tell a replay (rows applied
before: a batch run again, a new checkpoint directory) from rows a source hands late (lower offsets than a
batch already applied: Spark's file source takes files by modification time, and files sharing one come in
listing order). A ledger per (query, prefix, topic, partition) (:mod:`zcluster.state.ledger`: the high-water
offset and the holes below it) tells them apart. ``out_of_order="fail"`` (the default) fails the batch with a
:class:`zcluster.ConfigError` naming the partition, the late offsets and the fence, before any of that
partition's rows of the batch is written (other partitions' rows of the batch may have been, each once; the
batch run again writes them no more). ``out_of_order="apply"`` applies late rows exactly once: from the first
application holding late rows, a partition's increments are fenced at positions numbered per application
(``2**52 +`` its number: above every offset position) and replays are skipped (counted in ``seen``), so a late
row's increments land above the fence. Limits: the ledger keeps the newest 1,024 holes (a source's real gaps,
Kafka's transaction markers, are holes that never fill): a row further back is taken for a replay; an
application whose task died before its done mark must be finished by the same rows (the same batch, as Spark
runs it again from the same checkpoint) before any other (else :class:`zcluster.ConfigError`: other rows first
could let a fence pass its unfinished ones); a query name used before the ledger existed starts one with its
next batch, so a new checkpoint directory re-reading older offsets is refused as late by default (and counted
again with ``"apply"``: give it a new ``query_name``). ``"fail"`` is the default because ``"apply"`` gives up
those offset positions for good, and a source that promises order (Kafka) should say so loudly when it breaks
it; ``"apply"`` is not available with ``publish`` (the partition's checkpoint is one offset).

A fence keeps one position per (key, source): a partition's increments must reach it in offset order, so the
sink brings each (topic, partition)'s rows of a batch into one task (a shuffle) whatever the source's cut.
Spark cuts one partition's rows over several tasks more often than it seems (a file source packs a batch's
files into tasks; Kafka's ``minPartitions`` splits a topic-partition's offset range): fencing each task's own
rows would let the task holding later offsets move the fence past the other's, silently refused as applied
before.

Publishing (``publish=``, :mod:`zcluster.state.txn`): the mapper may also return :class:`zcluster.Publish`
messages. A transaction is one (topic, partition)'s rows of one micro-batch, in the one task the shuffle gave
them: it begins when that task reaches the partition (the claim of its checkpoint) and ends with the save of
the checkpoint and the append of its ACK intents, before the task goes on to its next partition. The
checkpoint is a ``v4`` record of the application (``query_name``) under :func:`partition_checkpoint`'s name,
``~<topic>/<partition>`` (no journal's name begins with ``~``: it never meets a journal of a ``Consumer`` of the
same name); it holds the offset one past the last row applied (no producer states: rows carry no UUIDs) and
the ACK intents. In order: the task attempt claims the checkpoint (a new producer id; the last checkpoint's
intents appended again: ACKs a crash lost delivered), skips the rows below the checkpoint's offset (their
messages were published and committed, their writes made, by an earlier attempt), maps the rest, appends their
messages uncommitted and writes their writes, saves the checkpoint (fenced) with the new offset and intents,
and only then appends the intents. Why that is exactly once:

* a task retried (or an executor lost) claims anew: the failed attempt's messages are under its own producer
  id, never ACKed, never read committed; if it had saved, the claim adopts the save and its intents, and the
  retry skips its rows;
* a speculative copy and the original claim in turn: the later claim fences the earlier attempt, whose save
  raises :class:`zcluster.FencedError` (its task fails and appends nothing); a save that landed before the
  later claim read the checkpoint is adopted by it (even if its own read-back then raised FencedError: its
  intents are appended once, by the later attempt's claim), and the later attempt skips those rows;
* a replayed batch (a lost Spark commit, a driver restarted) and a new checkpoint directory re-read offsets
  the checkpoints in the cluster (keyed by ``query_name`` and the source's own offsets, not Spark's batch ids)
  already passed: nothing is published again, and nothing saved;
* increments are fenced and 2P-set writes idempotent as without ``publish``, so an attempt that wrote and
  then failed before its save changes nothing when its rows are written again.

Each task attempt that claims is a new producer to downstream readers: give them a ``prune_horizon``. The
claim needs one master per key (a :class:`zcluster.Cluster`): a publishing sink on a farm is refused when made
(:class:`zcluster.ConfigError`, see :func:`zcluster.state.txn.check_store`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from zcluster.config import StoreConfig, Where, store_config, with_nodes
from zcluster.errors import ConfigError, MapperError
from zcluster.journal.store import close_store
from zcluster.journal.urls import open_store
from zcluster.spark.observe import TASK_SCHEMA, add_rows, task_batch
from zcluster.spark.shipping import ship_by_value
from zcluster.state.batch import BatchStats, WriteBuffer
from zcluster.state.ledger import Ledger
from zcluster.state.store import StateStore
from zcluster.state.txn import Publishing, check_store, partition_checkpoint
from zcluster.types import Store

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
    out_of_order: str = "fail"
    publish: str | None = field(default=None, repr=False)  # a URL, maybe with a password: not in a traceback

    def run(self, batches: Iterator[Any]) -> Iterator[Any]:
        """``mapInArrow`` function: rows in, one stats row out. A task's rows of a (topic, partition) are applied
        in offset order, each partition's writes flushed before the task ends (with ``publish``: each partition's
        rows are one transaction, see :meth:`_transaction`). Exact only when the task holds every row of the
        batch of each of its partitions (:meth:`PositionedSink.__call__` shuffles them so): a fence moved by
        another task's later offsets of the partition refuses this task's earlier ones."""
        stats = BatchStats()
        # Keyed by (topic, partition): the shuffle hashes both into shared buckets, so a task may hold the
        # same partition number of several topics, each its own fence source and checkpoint.
        parts: dict[tuple[str, Any], list[dict[str, Any]]] = {}
        for batch in batches:
            for row in batch.to_pylist():
                parts.setdefault((row_topic(row, self.topic), row[self.partition]), []).append(row)
        store = self.config.shared()
        # A Publishing per task attempt: its claims (producer ids) are this attempt's alone.
        publishing = None if self.publish is None else Publishing(open_store(self.publish), self.retries)
        try:
            for (topic, part), rows in sorted(parts.items(), key=lambda p: (p[0][0], str(p[0][1]))):
                rows.sort(key=lambda r: r[self.offset])
                ledger = Ledger(StateStore(store, self.app), topic, part, self.out_of_order, prefix=store.prefix)
                plan = ledger.plan(sorted({int(r[self.offset]) for r in rows}))
                if plan.state.numbered and plan.replays:  # replays: applied before, skipped
                    keep = set(plan.apply)
                    applied = [r for r in rows if int(r[self.offset]) in keep]
                    stats.frames += len(rows) - len(applied)
                    stats.seen += len(rows) - len(applied)
                    rows = applied
                if publishing is None:
                    self._apply(store, f"{topic}/{part}", rows, stats, plan.position)
                else:
                    self._transaction(store, publishing, topic, part, rows, stats, plan.position)
                ledger.finish(plan)
        finally:
            if publishing is not None:
                close_store(publishing.writer)
        yield task_batch(stats)

    def _apply(
        self,
        store: Store,
        name: str,
        rows: list[dict[str, Any]],
        stats: BatchStats,
        position: Callable[[int], int],
        publish: Callable[[list[Any], str, int, dict[str, Any]], list[Any]] | None = None,
    ) -> None:
        """Map and write ``rows`` of partition ``name`` (in offset order), a row's increments fenced at
        (``position(offset)``, offset, index) (:meth:`zcluster.state.ledger.Plan.position`); ``publish``: what
        takes the mapped writes' :class:`zcluster.Publish` items (``Publishing.published`` on the transaction's
        claim)."""
        writes = WriteBuffer(store, self.flush, self.retries, stats, source=f"{self.app}/{name}")
        for row in rows:
            offset = int(row[self.offset])
            stats.frames += 1
            stats.delivered += 1
            mapped = self._map(name, offset, row)
            if publish is not None:
                mapped = publish(mapped, name, offset, row)
            writes.add(mapped, name, offset, position(offset))
        writes.flush()

    def _transaction(
        self,
        store: Store,
        publishing: Publishing,
        topic: str,
        part: Any,
        rows: list[dict[str, Any]],
        stats: BatchStats,
        position: Callable[[int], int],
    ) -> None:
        """One consumer transaction over a partition's rows of the batch (see :class:`PositionedSink`): claim
        the partition's checkpoint (appending its ACK intents again), skip the rows it passed, publish the
        others' messages uncommitted and write their writes, save the fenced checkpoint (offset: one past the
        last row) with the new ACK intents, then append them. A :class:`zcluster.FencedError` (a newer
        attempt claimed) fails the task with nothing of this attempt appended as committed."""
        name, journal = f"{topic}/{part}", partition_checkpoint(topic, part)
        state = StateStore(store, self.app)
        with publishing.guard(journal):
            claim = publishing.claimed(state, journal)
            done = claim.checkpoint.offset
            fresh = [r for r in rows if int(r[self.offset]) >= done]
            stats.frames += len(rows) - len(fresh)
            stats.seen += len(rows) - len(fresh)  # published and committed by an earlier attempt

            def publish(writes: list[Any], name: str, offset: int, row: dict[str, Any]) -> list[Any]:
                return publishing.published(claim, writes, "partition", name, offset, row)

            self._apply(store, name, fresh, stats, position, publish)
            through = max(done, int(fresh[-1][self.offset]) + 1) if fresh else done
            stats.published += publishing.commit(state, journal, claim, through, [], "")

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
    batch) and the rest ``applied``; ``seen``: rows skipped as applied before (with ``publish``, below their
    partition's checkpoint; with numbered positions, replays); with ``publish``, ``published`` (messages
    published and checkpointed).

    ``publish``: a journal store URL (``file:///dir``, ``redis://host:port?prefix=p``; see
    :func:`zcluster.journal.urls.open_store`) the mapper's :class:`zcluster.Publish` messages go to, exactly
    once: each (topic, partition)'s rows of a batch are one consumer transaction with a fenced checkpoint
    (see the module for where it begins and ends, and why retries, speculative tasks, replayed batches and new
    checkpoint directories publish nothing twice). Read-committed readers of the target journals see each
    message once, when its transaction's checkpoint is saved and its ACK appended (per journal, as in Gazette).
    The checkpoint also skips rows it passed: rows a source hands late fail the batch (``out_of_order="apply"``
    is refused with ``publish``), and a re-created topic needs a new ``query_name``. Without
    ``publish``, a mapper returning a ``Publish`` fails the batch with a :class:`zcluster.MapperError` naming
    the partition and offset.

    Guarantee: every row's increments count exactly once however Spark partitions the batch (file sources,
    Kafka's ``minPartitions``, any ``repartition`` before the sink), across task retries, replayed batches
    and new checkpoint directories. Cost: each batch is shuffled by (``topic`` column if any, partition)
    into ``spark.sql.shuffle.partitions`` tasks (fewer where adaptive execution coalesces them; Spark's
    default 200 leaves most empty for a few partitions: set it near the executors' cores), and a partition's
    rows are applied by one task; a mapper writing only 2P-set writes (idempotent, no fences) pays it too, as
    the sink cannot know that before the mapper runs. The ledger costs five round trips per partition per batch.

    ``out_of_order``: ``"fail"`` (default) or ``"apply"``: what rows below a partition's fence that were never
    applied do (see the module). Guarantee with ``"fail"``: such a row is never dropped silently (within the
    ledger's newest 1,024 holes); with ``"apply"``: it counts exactly once.

    Errors: a mapper failure or a refused write is a :class:`zcluster.MapperError` naming the partition and
    offset; shard failures are retried, then fail the batch; a :class:`zcluster.FencedError` fails a task
    attempt that a newer one fenced; a :class:`zcluster.ConfigError` names rows a source handed late under
    ``out_of_order="fail"``, an unfinished application of the partition that this batch does not finish, or
    two batches of one partition claimed at once (two queries under one ``query_name``). A failed batch ends
    the query (Spark does not run a failed ``foreachBatch`` again by itself; see
    :class:`zcluster.spark.ZClusterSink`): start it again from its checkpoint, and Spark runs the batch again;
    its increments count once (the fences).
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
        publish: str | None = None,
        out_of_order: str = "fail",
    ) -> None:
        if not query_name or "/" in query_name:
            raise ConfigError(f"query_name must be non-empty and without '/', got {query_name!r}")
        if out_of_order not in ("fail", "apply"):
            raise ConfigError(f"out_of_order must be 'fail' or 'apply', got {out_of_order!r}")
        if out_of_order == "apply" and publish is not None:
            raise ConfigError(
                "out_of_order='apply' with publish= is not supported: a partition's publishing checkpoint is one "
                "offset, so late rows below it would be skipped"
            )
        config = store_config(cluster, prefix=prefix)
        if publish is not None:  # here, not first in every task: a farm cannot hold its fenced checkpoints
            check_store(config.shared(), query_name)
        self.job = _Job(config, query_name, mapper, partition, offset, topic, flush, retries, out_of_order, publish)
        self.history: list[BatchStats] = []
        self.shipped = ship_by_value(mapper, None, owner="PositionedSink")

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
