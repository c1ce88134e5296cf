"""The exactly-once ``foreachBatch`` sink: journal messages, read committed, into the CRDT cluster.

Per micro-batch, on the driver: if the batch id is already recorded as committed for this query, the batch
is a replay and is skipped. Otherwise the rows (one per journal frame, see :mod:`zcluster.spark.source`)
are partitioned by journal and sorted by offset, and each executor task, per journal:

1. restores a Sequencer from the producer states stored in the cluster (:class:`zcluster.state.StateStore`);
2. skips frames below the stored checkpoint offset (already sequenced), queues the others in offset order
   and dequeues read-committed messages (duplicates dropped, rolled-back
   transactions dropped, transactions whose ACK arrives in a later batch replayed from the journal);
3. passes each non-ACK message to the mapper and writes its inserts and deletes with batched cluster
   writes (retrying unconfirmed tuples: writes are idempotent);
4. stores the new producer states with the read-through offset, atomically, only after the writes.

When every task succeeded, the driver records the batch as committed for ``(query_name, query id)``.

Why this is exactly-once: every effect is a CRDT write, so applying a message's tuples again (a retried
task, a replayed batch, a zombie query) changes nothing; producer states only move forward (their scores
are clocks); and the Sequencer's states keep duplicates and rolled-back messages out. A new checkpoint
directory gives a new Spark query id, so its batch ids (restarting at 0) are not mistaken for old ones,
while producer states (keyed by ``query_name``) still drop messages the old query already applied.
"""

from __future__ import annotations

import itertools
import json
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple, TypeVar

from zcluster.cluster import Cluster
from zcluster.journal.urls import open_store
from zcluster.message.envelope import Envelope
from zcluster.message.framing import FramingError, JsonFraming, framing_for
from zcluster.message.journals import JournalSpec
from zcluster.message.readers import ReadUncommittedIter
from zcluster.message.sequencer import QueueOutcome, Sequencer
from zcluster.spark.config import ClusterConfig
from zcluster.state.store import StateStore
from zcluster.types import KeyScoreMember, PartialReadError, PartialWriteError, ZClusterError

log = logging.getLogger("zcluster.spark")


T = TypeVar("T")


def retrying(call: Callable[[], T], retries: int, what: str) -> T:
    """``call()``, again after a backoff while a shard fails (state reads and writes are idempotent)."""
    attempt = 0
    while True:
        try:
            return call()
        except (PartialReadError, PartialWriteError) as exc:
            if attempt == retries:
                raise
            log.warning("%s: retrying after a shard failure: %s", what, exc)
            time.sleep(min(0.2 * 2**attempt, 5.0))
            attempt += 1


class Insert(NamedTuple):
    """A mapper's request to insert ``member`` into ``key`` at ``score``."""

    key: str | bytes
    score: float
    member: str | bytes


class Delete(NamedTuple):
    """A mapper's request to delete ``member`` from ``key`` at ``score``."""

    key: str | bytes
    score: float
    member: str | bytes


Mapper = Callable[[Any], Iterable[Insert | Delete | KeyScoreMember]]
"""Turns one committed message into writes; must be deterministic (a replay must write the same tuples)."""


class MapperError(ZClusterError):
    """The mapper raised; names the journal, offset and message kind. The batch is not committed."""


@dataclass
class BatchStats:
    """What one micro-batch did (summed over its tasks)."""

    batch_id: int = -1
    query_id: str = ""
    skipped: bool = False
    frames: int = 0
    seen: int = 0
    delivered: int = 0
    acks: int = 0
    duplicates: int = 0
    rollbacks: int = 0
    replays: int = 0
    malformed: int = 0
    inserts: int = 0
    deletes: int = 0
    applied: int = 0
    seconds: float = 0.0
    outcomes: dict[str, int] = field(default_factory=dict)

    def add(self, other: dict[str, Any]) -> None:
        for name, value in other.items():
            if name == "outcomes":
                for k, v in value.items():
                    self.outcomes[k] = self.outcomes.get(k, 0) + v
            elif isinstance(value, int) and not isinstance(value, bool):
                setattr(self, name, getattr(self, name) + value)


_DUPLICATE = {
    QueueOutcome.OUTSIDE_ALREADY_ACKED,
    QueueOutcome.CONTINUE_ALREADY_ACKED,
    QueueOutcome.CONTINUE_TXN_CLOCK_LARGER,  # a copy of a message of the still-open span
}


def _kind(message: Any) -> str:
    kind = getattr(message, "kind", None)
    return str(kind) if kind is not None else type(message).__name__


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
        cluster = self.config.connect()
        state = StateStore(cluster, self.app)
        stats = BatchStats()
        for journal, group in itertools.groupby(rows, key=lambda r: r.journal):
            self._journal(cluster, state, journal, group, stats)
        out = asdict(stats)
        out.pop("batch_id"), out.pop("query_id"), out.pop("skipped"), out.pop("seconds")
        yield out

    def _journal(
        self, cluster: Cluster, state: StateStore, journal: str, rows: Iterable[Any], stats: BatchStats
    ) -> None:
        checkpoint = retrying(lambda: state.load_journal(journal), self.retries, f"load checkpoint of {journal}")
        seq = Sequencer(states=checkpoint.states, buffer=self.ring)
        writes = _Writes(cluster, self.flush, self.retries, stats)
        content_type = ""
        read_through = checkpoint.offset
        for row in rows:
            stats.frames += 1
            content_type = row.content_type
            if row.end <= checkpoint.offset:
                # Already sequenced by this application (a retried task, a replayed batch, a new Spark
                # checkpoint re-reading from 0): its effects and the states after it are stored.
                stats.seen += 1
                continue
            read_through = max(read_through, row.end)
            if row.error is not None:
                stats.malformed += 1
                log.error("journal %s bytes %d..%d do not frame: %s", journal, row.begin, row.end, row.error)
                continue
            env = self._envelope(journal, row)
            if env is None:
                stats.malformed += 1
                continue
            outcome = seq.queue_uncommitted(env)
            stats.outcomes[outcome.name] = stats.outcomes.get(outcome.name, 0) + 1
            if outcome in _DUPLICATE:
                stats.duplicates += 1
            elif outcome is QueueOutcome.ACK_ROLLBACK:
                stats.rollbacks += 1
            elif outcome is QueueOutcome.ACK_COMMIT_REPLAY:
                stats.replays += 1
                seq.start_replay(self._replay(journal, content_type, *seq.replay_range()[1:]))
            while (out := seq.step()) is not None:
                if out.is_ack:
                    stats.acks += 1
                    continue
                stats.delivered += 1
                writes.add(journal, out, self._map(journal, out))
        writes.flush()  # effects first: a crash before the checkpoint re-runs them, harmlessly
        states = seq.checkpoint().states
        retrying(
            lambda: state.save_journal(journal, read_through, states), self.retries, f"save checkpoint of {journal}"
        )
        if self.prune_horizon and states:
            newest = max(s.last_ack for s in states)
            bound = newest - (round(self.prune_horizon * 10_000_000) << 4)
            if bound > 0:
                state.prune_producers(journal, bound)

    def _envelope(self, journal: str, row: Any) -> Envelope | None:
        framing = framing_for(row.content_type)
        decode = self.decode or framing.default_decode()
        data = row.data
        if type(framing) is JsonFraming and decode is not None and data.find(b"\n") == len(data) - 1:
            # Fast path, same result as the decoder below: exactly one newline-terminated line.
            try:
                record = json.loads(data.decode())  # str: json.loads(bytes) sniffs the encoding first
            except ValueError:  # includes UnicodeDecodeError
                pass  # the decoder below reports it, with its offsets
            else:
                return self._message(journal, row, decode, record)
        decoder = framing.decoder(row.begin)
        items = decoder.feed(bytes(data)) + decoder.close()
        frames = [i for i in items if not isinstance(i, FramingError)]
        if len(frames) != 1 or decode is None:
            log.error("journal %s bytes %d..%d: not exactly one decodable frame", journal, row.begin, row.end)
            return None
        return self._message(journal, row, decode, frames[0].record)

    @staticmethod
    def _message(journal: str, row: Any, decode: Callable[[Any], Any], record: Any) -> Envelope | None:
        try:
            message = decode(record)
        except (ValueError, TypeError) as exc:  # e.g. an unknown message kind: reported, the stream goes on
            log.error("journal %s offset %d: undecodable message: %s", journal, row.begin, exc)
            return None
        return Envelope(journal, row.begin, row.end, message)

    def _replay(self, journal: str, content_type: str, begin: int, end: int) -> Iterator[Envelope]:
        if self.journals is None:
            raise ZClusterError(
                f"journal {journal}: a transaction needs bytes {begin}..{end} replayed, but the sink has no "
                "'journals' store URL to read them from"
            )
        store = open_store(self.journals)
        spec = JournalSpec(journal, {"content-type": content_type})
        it = ReadUncommittedIter(store, spec, begin, end=end, decode=self.decode)
        while True:
            try:
                yield next(it)
            except FramingError:
                continue  # reported when the batch that held these bytes read them
            except StopIteration:
                return

    def _map(self, journal: str, env: Envelope) -> list[Any]:
        try:
            return list(self.mapper(env.message))
        except Exception as exc:
            raise MapperError(
                f"mapper failed on journal {journal} offset {env.begin} (message kind {_kind(env.message)}): "
                f"{type(exc).__name__}: {exc}"
            ) from exc


class _Writes:
    """Buffers mapped writes and sends them in batches; unconfirmed tuples are resent (idempotent)."""

    def __init__(self, cluster: Cluster, size: int, retries: int, stats: BatchStats) -> None:
        self.cluster, self.size, self.retries, self.stats = cluster, size, retries, stats
        self.inserts: list[Any] = []
        self.deletes: list[Any] = []

    def add(self, journal: str, env: Envelope, writes: list[Any]) -> None:
        for w in writes:
            kind = type(w)
            if kind is Insert or kind is KeyScoreMember:  # the common cases first (exact types)
                self.inserts.append(w)
            elif kind is Delete or isinstance(w, Delete):
                self.deletes.append(w)
            elif isinstance(w, Insert | KeyScoreMember | tuple) and len(w) == 3:
                self.inserts.append(w)
            else:
                raise MapperError(
                    f"mapper returned {w!r} for journal {journal} offset {env.begin}: "
                    "expected Insert, Delete or KeyScoreMember"
                )
        if len(self.inserts) + len(self.deletes) >= self.size:
            self.flush()

    def flush(self) -> None:
        for op, items in (("insert", self.inserts), ("delete", self.deletes)):
            if items:
                applied = self._send(op, items)
                self.stats.applied += applied
                if op == "insert":
                    self.stats.inserts += len(items)
                else:
                    self.stats.deletes += len(items)
        self.inserts, self.deletes = [], []

    def _send(self, op: str, items: list[Any]) -> int:
        write = self.cluster.insert if op == "insert" else self.cluster.delete
        pending, applied = items, 0
        for attempt in range(self.retries + 1):
            result = write(pending, raise_on_error=False)
            applied += result.applied_count
            if result.ok:
                return applied
            if attempt == self.retries:
                raise PartialWriteError(result)
            log.warning(
                "retrying %d unconfirmed %s(s): %s",
                len(result.failed_indices),
                op,
                "; ".join(str(f) for f in result.failures),
            )
            pending = [pending[i] for i in result.failed_indices]
            time.sleep(min(0.2 * 2**attempt, 5.0))
        return applied


class ZClusterSink:
    """A ``foreachBatch`` function committing journal messages into the cluster exactly once.

    ``cluster``: shard URLs (list), one shard URL, ``redis+cluster://seed`` for a Redis Cluster, or a
    :class:`ClusterConfig`. ``mapper``: message -> writes (:class:`Insert`/:class:`Delete`); it sees
    committed messages only, never ACKs. ``query_name``: the application id that keys producer states and
    progress. ``journals``: the journal store URL, needed to replay transactions that span batches.
    ``decode``: record -> message (e.g. a :class:`zcluster.journal.typed.KindRegistry`'s ``decode``);
    default: the framing's own. ``prune_horizon``: seconds after which quiet producers are forgotten.

    ``history`` holds a :class:`BatchStats` per batch handled by this driver process.
    Errors: a mapper failure raises :class:`MapperError` (journal, offset, kind) and fails the batch;
    shard failures are retried ``retries`` times (writes, checkpoints and progress alike, with backoff up
    to 5 s), then fail the batch. A failed batch is not
    recorded as committed, and Spark runs it again.
    """

    def __init__(
        self,
        cluster: str | list[str] | ClusterConfig,
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
        state = StateStore(self.config.connect(), self.query_name)
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
