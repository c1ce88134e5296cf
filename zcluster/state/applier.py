"""The exactly-once applier: journal frames -> Sequencer -> mapper -> CRDT writes -> checkpoint.

This is the whole exactly-once logic; it knows nothing of Spark. The Spark sink runs it on executors (one
task per group of journals), :class:`zcluster.state.Consumer` runs it in a plain Python process.

Per journal, :meth:`Applier.apply`:

1. restores a Sequencer from the producer states stored in the cluster (:class:`StateStore`);
2. skips frames below the stored checkpoint offset (already sequenced), queues the others in offset order
   and dequeues read-committed messages (duplicates dropped, rolled-back transactions dropped,
   transactions whose ACK arrives later replayed from the journal);
3. passes each non-ACK message to the mapper and writes its inserts and deletes in batches, resending
   unconfirmed tuples (writes are idempotent);
4. stores the new producer states with the read-through offset, atomically, only after the writes.

With ``publish`` (a journal store), the mapper may also return :class:`zcluster.Publish` messages: each
journal's batch is then a consumer transaction that publishes them uncommitted, saves a fenced checkpoint
holding its ACK intents, and appends the intents after that (:mod:`zcluster.state.txn`).

A lost range (a file journal's damage, a Redis Streams journal's bytes trimmed by retention;
:mod:`zcluster.state.lost`) ends the journal's batch there: everything
before it is delivered and checkpointed, then :class:`zcluster.message.OffsetOutOfRangeError` names it;
with ``fail_on_data_loss=False`` the applier skips it instead (logged, counted, audited) and goes on.

Why this is exactly-once: every effect is a CRDT write, so applying a message's tuples again (a retried
task, a replayed batch, a crash before step 4, a zombie) changes nothing; producer states only move
forward (their scores are clocks); and the Sequencer's states keep duplicates and rolled-back messages
out. Guaranteed only for a deterministic mapper (a replay must map a message to the same writes).

The route of the data is one straight pipeline: :func:`zcluster.journal.frames.read_runs` cuts the journal's
bytes into runs of whole ndjson lines (other content types and the Spark source: one row per frame),
:class:`zcluster.message.decoding.FrameDecoder` turns a run into envelopes in one call, and one loop of
:meth:`Applier._apply` sequences, maps and buffers each of them, without climbing back up the layers.

Why this module is long: the per-frame loop of :meth:`Applier._apply` is one function on purpose (it runs once
per message: locals, counters added once, the commonest case's mapper called inline, no call per message it
can avoid); the publishing side lives in :mod:`zcluster.state.txn`.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, fields
from typing import Any, Final, Protocol

from zcluster._retry import retrying
from zcluster.errors import ConfigError, JournalMismatchError, MapperError
from zcluster.journal.frames import LOST_ROW, LineRun, lost_error, read_runs
from zcluster.journal.store import JournalStore, close_store
from zcluster.journal.urls import open_store
from zcluster.message.decoding import FrameDecoder
from zcluster.message.envelope import Envelope
from zcluster.message.errors import OffsetOutOfRangeError
from zcluster.message.framing import CONTENT_TYPE_NDJSON, FramingError
from zcluster.message.journals import JournalReader, JournalSpec
from zcluster.message.readers import ReadUncommittedIter
from zcluster.message.sequencer import QueueOutcome, Sequencer
from zcluster.state.batch import BatchStats, WriteBuffer
from zcluster.state.lost import audit_skip, stays_before
from zcluster.state.store import JournalCheckpoint, StateStore
from zcluster.state.txn import Claim, Publishing, check_store
from zcluster.types import Count, Delete, Incr, Insert, KeyScoreMember, Publish, Store

__all__ = ["Applier", "Mapper"]

log = logging.getLogger("zcluster.state")

Mapper = Callable[[Any], Iterable[Insert | Delete | Incr | Count | Publish | KeyScoreMember]]
"""Turns one committed message into writes; must be deterministic (a replay must write the same tuples, in
the same order: an increment's fence position counts the message's increments). A :class:`KeyScoreMember`
or plain (key, score, member) tuple is an insert; :class:`zcluster.Incr` and :class:`zcluster.Count` are
applied exactly once, fenced by the message's delivery position in its journal; :class:`zcluster.Publish`
messages are published exactly once (an applier with ``publish`` only; see :mod:`zcluster.state.txn`)."""


class FrameLike(Protocol):
    """What the applier reads of a frame: a :class:`zcluster.journal.frames.RawFrame` or a Spark Row."""

    @property
    def journal(self) -> str: ...
    @property
    def begin(self) -> int: ...
    @property
    def end(self) -> int: ...
    @property
    def content_type(self) -> str: ...
    @property
    def data(self) -> bytes | bytearray | None: ...
    @property
    def error(self) -> str | None: ...


_DUPLICATE: Final = {
    QueueOutcome.OUTSIDE_ALREADY_ACKED,
    QueueOutcome.CONTINUE_ALREADY_ACKED,
    QueueOutcome.CONTINUE_TXN_CLOCK_LARGER,  # a copy of a message of the still-open span
}
# Final globals: an Enum member read off its class costs ~50 ns per frame; compiled (zcluster._native), a Final
# global is a C static, where any other is a dict lookup at each use.
_REPLAY: Final = QueueOutcome.ACK_COMMIT_REPLAY
_OUTSIDE_COMMIT: Final = QueueOutcome.OUTSIDE_COMMIT


def _kind(message: Any) -> str:
    kind = getattr(message, "kind", None)
    return str(kind) if kind is not None else type(message).__name__


MANY_PRODUCERS = 10_000
"""Producers in one journal's checkpoint past which an application without ``prune_horizon`` is warned once."""
_warned: set[tuple[str, str]] = set()


@dataclass(frozen=True)
class Applier:
    """Applies journal frames into ``cluster`` exactly once for application ``app`` (see the module).

    ``journals``: the journal store (or its URL) to replay transactions that span batches from.
    ``decode``: record -> message (e.g. a ``KindRegistry``'s ``decode``); default: the framing's own.
    ``ring``: the Sequencer's buffer of messages of open transactions. ``flush``: writes per batch sent.
    ``retries``: resends of unconfirmed writes and state calls (with backoff up to 5 s).
    ``prune_horizon``: seconds after which quiet producers are forgotten (their later duplicates would be
    delivered again), or None to keep every producer. ``fail_on_data_loss``: False skips the lost ranges
    of file journals (see the module). ``lag``: measure each journal's lag after applying it
    (``BatchStats.lag``; one ``end()`` call of the journal store per journal, when a store object is given).
    ``publish``: the journal store :class:`zcluster.Publish` messages go to (see the module); the applier then
    keeps this process's claims of its journals, so one Applier object is one process's (never pickle it with
    claims in it). With ``publish``, ``cluster`` must not be a farm of replicas (:class:`zcluster.ConfigError`;
    :func:`zcluster.state.txn.check_store` says why).

    Errors: :class:`MapperError` for a failing mapper; :class:`zcluster.ShardError` subclasses when a
    shard still fails after the retries. Either way that journal's checkpoint is not saved. A lost range:
    :class:`zcluster.message.OffsetOutOfRangeError`, after checkpointing everything before it.
    """

    cluster: Store
    app: str
    mapper: Mapper
    journals: JournalStore | str | None = None
    decode: Callable[[Any], Any] | None = None
    ring: int = 8192
    flush: int = 16384
    retries: int = 5
    prune_horizon: float | None = None
    fail_on_data_loss: bool = True
    lag: bool = True
    publish: JournalStore | None = None
    publishing: Publishing | None = field(default=None, init=False, repr=False, compare=False)

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as its constructor's arguments (a publishing applier's claims are this process's: a copy
        starts without any). A compiled frozen dataclass (:mod:`zcluster._native`) cannot be unpickled
        attribute by attribute: its ``__setattr__`` refuses."""
        return (Applier, tuple(getattr(self, f.name) for f in fields(self) if f.init))

    def __post_init__(self) -> None:
        if self.publish is not None:
            check_store(self.cluster, self.app)
        # Always set (not left to the field's default): a class compiled by mypyc (zcluster._native) has none.
        publishing = Publishing(self.publish, self.retries) if self.publish is not None else None
        object.__setattr__(self, "publishing", publishing)

    def state(self) -> StateStore:
        return StateStore(self.cluster, self.app)

    def apply(self, journal: str, frames: Iterable[FrameLike], stats: BatchStats) -> None:
        """Apply ``frames`` of ``journal`` (in offset order, from any offset up to a frame boundary).

        With a journal store object as ``journals``, the checkpoint is first checked against the journal's
        identity (:class:`JournalMismatchError`); with a URL or none, frames carry no identity to check."""
        store = None if self.journals is None or isinstance(self.journals, str) else self.journals
        with self._failing(journal):
            state, checkpoint = self._checkpoint(journal)
            journal_id = self._verify(store, journal, checkpoint, 0) if store is not None else checkpoint.journal_id
            offset = self._apply(journal, frames, stats, state, checkpoint, journal_id)
        if store is not None:
            self._measure(store, journal, offset, stats)

    def apply_range(
        self, store: JournalReader, journal: str, content_type: str, begin: int, end: int, stats: BatchStats
    ) -> None:
        """Apply bytes [begin, end) of ``journal`` (frame boundaries), read from ``store``. Only the part past
        the stored checkpoint is read: a range applied already (a retried task, a replayed batch, a new Spark
        checkpoint re-reading from 0) costs one checkpoint lookup. Raises what :func:`read_range` raises
        when the store holds fewer bytes than the range, and :class:`JournalMismatchError` when the stored
        checkpoint is not of the journal ``store`` holds now (re-created, or ending before the checkpoint)."""
        with self._failing(journal):
            state, checkpoint = self._checkpoint(journal)
            journal_id = self._verify(store, journal, checkpoint, end)
            start, offset = max(begin, checkpoint.offset), checkpoint.offset
            if start < end:
                offset = self._apply(
                    journal,
                    read_runs(store, journal, content_type, start, end),
                    stats,
                    state,
                    checkpoint,
                    journal_id,
                )
        self._measure(store, journal, offset, stats)

    def _measure(self, store: object, journal: str, offset: int, stats: BatchStats) -> None:
        """``stats.lag[journal]``: the journal's end now minus ``offset`` (when asked, and the store tells)."""
        journal_end = getattr(store, "end", None) if self.lag else None
        if journal_end is not None:
            stats.lag[journal] = max(0, journal_end(journal) - offset)

    def _failing(self, journal: str) -> contextlib.AbstractContextManager[None]:
        """A publishing applier gives up its claim of ``journal`` on any failure (see Publishing.guard)."""
        return self.publishing.guard(journal) if self.publishing is not None else contextlib.nullcontext()

    def _checkpoint(self, journal: str) -> tuple[StateStore, JournalCheckpoint]:
        state = self.state()
        if self.publishing is not None:
            held = self.publishing.claimed(state, journal).checkpoint
            return state, JournalCheckpoint(held.offset, held.states, held.journal_id, held.base)
        checkpoint = retrying(lambda: state.load_journal(journal), self.retries, f"load checkpoint of {journal}")
        return state, checkpoint

    def _verify(self, store: object, journal: str, checkpoint: JournalCheckpoint, end: int) -> str:
        """The journal's identity now (``store``'s, when it keeps one); raises :class:`JournalMismatchError`
        when the checkpoint is of another journal of that name or lies past the journal's end (``end``: an
        offset known to exist, so that the common case asks the store nothing more)."""
        info = getattr(store, "info", None)
        current = info(journal).uid if info is not None else ""
        stored = checkpoint.journal_id
        if stored and current and stored != current:
            raise JournalMismatchError(self.app, journal, checkpoint.offset, None, stored, current)
        if checkpoint.offset > end:
            journal_end = getattr(store, "end", None)
            at = journal_end(journal) if journal_end is not None else None
            if at is not None and checkpoint.offset > at:
                raise JournalMismatchError(self.app, journal, checkpoint.offset, at, stored, current)
        return current or stored

    def _apply(
        self,
        journal: str,
        frames: Iterable[FrameLike | LineRun],
        stats: BatchStats,
        state: StateStore,
        checkpoint: JournalCheckpoint,
        journal_id: str,
    ) -> int:
        """Apply, then save the checkpoint; returns its offset. At a lost range: see the module."""
        seq = Sequencer(states=checkpoint.states, buffer=self.ring)
        writes = WriteBuffer(
            self.cluster, self.flush, self.retries, stats, source=f"{self.app}/{journal}", base=checkpoint.base
        )
        content_type = ""
        decoder: FrameDecoder | None = None  # of the frames' content type
        read_through = done = checkpoint.offset
        outcomes: dict[QueueOutcome, int] = {}
        # Methods called as methods, not bound to locals: compiled (zcluster._native), those are direct C calls.
        mapper: Callable[[str, Envelope], list[Any]] = self._map
        plain: Mapper | None = self.mapper  # called inline for the commonest case (a message committed by itself)
        claim: Claim | None = None
        if self.publishing is not None:
            claim = self.publishing.claimed(state, journal)
            mapper, plain = self.publishing.mapper(claim, self._map), None
        # Counted in locals and added to `stats` once: this loop runs once per frame.
        n_frames = n_seen = n_malformed = n_acks = n_delivered = n_outside = 0
        stopped: OffsetOutOfRangeError | None = None  # the lost range this batch of the journal stops at
        skipped: list[tuple[int, OffsetOutOfRangeError]] = []  # lost ranges skipped: (offset reached, range)
        envelopes: list[Envelope | None]  # a list: compiled (zcluster._native), iterated natively
        try:
            for row in frames:
                if isinstance(row, LineRun):  # a run of whole ndjson lines (read_runs): decoded at once
                    if content_type != CONTENT_TYPE_NDJSON or decoder is None:
                        content_type = CONTENT_TYPE_NDJSON
                        decoder = FrameDecoder(journal, content_type, self.decode, log)
                    begin, lines, run_end = row
                    if begin < done:  # lines already sequenced (see below): none when read from the checkpoint on
                        cut = 0
                        while cut < len(lines) and begin + len(lines[cut]) + 1 <= done:
                            begin += len(lines[cut]) + 1
                            cut += 1
                        lines = lines[cut:]
                        n_frames += cut
                        n_seen += cut
                    read_through = max(read_through, run_end)
                    envelopes = decoder.lines(begin, lines)
                else:
                    end = row.end
                    if end <= done:
                        # Already sequenced by this application (a retried task, a replayed batch, a new Spark
                        # checkpoint re-reading from 0): its effects and the states after it are stored.
                        n_frames += 1
                        n_seen += 1
                        continue
                    if row.content_type != content_type or decoder is None:
                        content_type = row.content_type
                        decoder = FrameDecoder(journal, content_type, self.decode, log)
                    error = row.error
                    if error is not None and error.startswith(LOST_ROW):
                        n_frames += 1
                        lost = lost_error(row)
                        assert lost is not None and lost.lost_begin is not None
                        if self.fail_on_data_loss:
                            stopped = lost
                            break
                        log.warning(
                            "application %s, journal %s: skipping lost range %d..%d (fail_on_data_loss=False): %s",
                            self.app,
                            journal,
                            lost.lost_begin,
                            end,
                            lost,
                        )
                        skipped.append((read_through, lost))
                        read_through = max(read_through, end)
                        continue
                    if end > read_through:
                        read_through = end
                    if error is not None:
                        n_frames += 1
                        n_malformed += 1
                        log.error("journal %s bytes %d..%d do not frame: %s", journal, row.begin, end, error)
                        continue
                    envelopes = [decoder.frame(row.begin, end, row.data)]
                for env in envelopes:
                    n_frames += 1
                    if env is None:
                        n_malformed += 1
                        continue
                    outcome = seq.commit_outside(env)
                    if outcome is _OUTSIDE_COMMIT:  # the commonest case: a message committed by itself
                        n_delivered += 1
                        if plain is None:
                            writes.add(mapper(journal, env), journal, env.begin, env.begin)
                        else:
                            try:
                                mapped = plain(env.message)
                                if type(mapped) is not list:
                                    mapped = list(mapped)
                            except Exception as exc:
                                raise self._mapper_error(journal, env, exc) from exc
                            writes.add(mapped, journal, env.begin, env.begin)
                        n_outside += 1  # its outcome, counted (as below) once mapped, without a dict update
                        continue
                    if outcome is None:
                        outcome = seq.queue_uncommitted(env)
                        if outcome is _REPLAY:
                            seq.start_replay(self._replay(journal, content_type, *seq.replay_range()[1:]))
                        while (out := seq.step()) is not None:
                            if out.is_ack:
                                n_acks += 1
                                continue
                            n_delivered += 1
                            writes.add(mapper(journal, out), journal, out.begin, env.begin)  # delivered by env
                    outcomes[outcome] = outcomes.get(outcome, 0) + 1
        finally:
            if n_outside:
                outcomes[_OUTSIDE_COMMIT] = outcomes.get(_OUTSIDE_COMMIT, 0) + n_outside
            stats.frames += n_frames
            stats.seen += n_seen
            stats.malformed += n_malformed
            stats.acks += n_acks
            stats.delivered += n_delivered
            for outcome, n in outcomes.items():
                stats.outcomes[outcome.name] = stats.outcomes.get(outcome.name, 0) + n
                if outcome in _DUPLICATE:
                    stats.duplicates += n
                elif outcome is QueueOutcome.ACK_ROLLBACK:
                    stats.rollbacks += n
                elif outcome is QueueOutcome.ACK_COMMIT_REPLAY:
                    stats.replays += n
        writes.flush()  # effects first: a crash before the checkpoint re-runs them, harmlessly
        for offset, lost in skipped:  # recorded before the checkpoint moves past them (again on a retry: one entry)
            retrying(
                functools.partial(audit_skip, state, journal, offset, lost, checkpoint.base, journal_id),
                self.retries,
                f"record the skip of {journal}'s lost range",
            )
            stats.lost_skipped += 1
            stats.lost_bytes += (lost.lost_end or 0) - (lost.lost_begin or 0)
        # Quiet producers are forgotten here (their later duplicates would be delivered again).
        states = seq.checkpoint(self.prune_horizon or 0.0).states
        if self.prune_horizon is None and len(states) > MANY_PRODUCERS and (self.app, journal) not in _warned:
            _warned.add((self.app, journal))  # once per process and journal: the count is in the consumers view
            log.warning(
                "%s: the checkpoint of %s holds %d producers and grows with each new one (a publishing "
                "application upstream makes one per claim, a Spark sink one per task): give this application "
                "a prune_horizon longer than any retry of an append",
                self.app,
                journal,
                len(states),
            )
        if claim is not None:
            assert self.publishing is not None
            stats.published += self.publishing.commit(state, journal, claim, read_through, states, journal_id)
        else:
            retrying(
                lambda: state.save_journal(
                    journal, read_through, states, journal_id=journal_id, base=checkpoint.base, loaded=checkpoint
                ),
                self.retries,
                f"save checkpoint of {journal}",
            )
        if stopped is not None:
            raise stays_before(self.app, journal, read_through, stopped)
        return read_through

    def _replay(self, journal: str, content_type: str, begin: int, end: int) -> Iterator[Envelope]:
        if self.journals is None:
            raise ConfigError(
                f"journal {journal}: a transaction needs bytes {begin}..{end} replayed, but no journal store "
                "was given to read them from ('journals')"
            )
        store = open_store(self.journals) if isinstance(self.journals, str) else self.journals
        spec = JournalSpec(journal, {"content-type": content_type})
        pos = begin
        try:
            while pos < end:
                it = ReadUncommittedIter(store, spec, pos, end=end, decode=self.decode)
                try:
                    while True:
                        try:
                            yield next(it)
                        except FramingError:
                            continue  # reported when the batch that held these bytes read them
                        except StopIteration:
                            return
                except OffsetOutOfRangeError as exc:
                    # The checkpoint already went past it (by an operator's skip or fail_on_data_loss=False):
                    # the transaction keeps the messages that survive (see zcluster.state.lost).
                    if exc.lost_end is None:
                        raise
                    log.warning(
                        "journal %s: the replay of a transaction (bytes %d..%d) steps over lost range %s..%d",
                        journal,
                        begin,
                        end,
                        exc.lost_begin,
                        exc.lost_end,
                    )
                    pos = max(pos + 1, exc.lost_end)
        finally:
            if isinstance(self.journals, str):
                close_store(store)

    def _map(self, journal: str, env: Envelope) -> list[Any]:
        try:
            return list(self.mapper(env.message))
        except Exception as exc:
            raise self._mapper_error(journal, env, exc) from exc

    def _mapper_error(self, journal: str, env: Envelope, exc: Exception) -> MapperError:
        return MapperError(
            f"mapper failed on journal {journal} offset {env.begin} (message kind {_kind(env.message)}): "
            f"{type(exc).__name__}: {exc}"
        )
