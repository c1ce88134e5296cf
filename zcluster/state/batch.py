"""What one batch of the exactly-once path does: its figures, its write buffer, the mapper's error.

Shared by the applier (journal messages -> writes) and the Spark writer (rows -> writes).
"""

from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields
from typing import Any, Final

from zcluster._fasttuples import native_untrack
from zcluster._retry import backoff, waited_out
from zcluster.errors import InvalidTupleError, MapperError, PartialWriteError
from zcluster.types import Count, Delete, Incr, Increment, Insert, Store, Write, WriteResult

__all__ = ["BatchStats", "WriteBuffer"]

log = logging.getLogger("zcluster.state")

# The write types the commonest message is checked against, as Final globals: compiled (zcluster._native), a
# C static each, where an imported name is a dict lookup at each use.
_INSERT: Final = Insert
_DELETE: Final = Delete


# Buffered Inserts and Deletes taken off the cyclic garbage collector's lists (see zcluster._fasttuples).
_UNTRACK: Final = native_untrack()


APPLIER_COUNTS = (
    ("frames", "Journal frames read"),
    ("delivered", "Committed messages delivered to the mapper"),
    ("duplicates", "Duplicate messages dropped"),
    ("rollbacks", "Transactions rolled back"),
    ("replays", "Transactions replayed from the journal (their ACK came in a later batch)"),
    ("malformed", "Frames that did not frame or decode (logged)"),
    ("lost_skipped", "Lost ranges of file journals skipped (fail_on_data_loss=False)"),
    ("lost_bytes", "Bytes of the lost ranges skipped"),
    ("applied", "Writes that took effect"),
)
"""The counted fields of :class:`BatchStats` a metrics bridge exports (``zcluster.metrics``, ``zcluster.otel``),
with their help text."""


@dataclass
class BatchStats:
    """What one batch did (summed over journals and tasks): frames read, messages seen, delivered and
    dropped, writes sent and applied; lost ranges skipped (``fail_on_data_loss=False``: how many, how many
    bytes); ``lag``: per journal, the bytes between its checkpoint after the batch and its end then (for the
    journals the batch measured: those it read from a journal store). ``increments``: increments sent;
    ``fenced``: those of them found at or below their key's fence, so applied before (a replayed batch, a
    task run again, a resend whose first send had landed); ``applied``: 2P-set writes and increments that
    took effect (a sent increment is either applied or fenced once its batch succeeds); ``published``: messages
    a publishing applier published and checkpointed (:mod:`zcluster.state.txn`)."""

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
    lost_skipped: int = 0
    lost_bytes: int = 0
    inserts: int = 0
    deletes: int = 0
    increments: int = 0
    fenced: int = 0
    applied: int = 0
    published: int = 0
    seconds: float = 0.0
    outcomes: dict[str, int] = field(default_factory=dict)
    lag: dict[str, int] = field(default_factory=dict)

    def counters(self) -> dict[str, Any]:
        """The summable part (counts, outcomes, lags), as plain values a Spark task can return."""
        out: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self) if f.name in _COUNTERS}
        out["outcomes"] = dict(self.outcomes)
        out["lag"] = dict(self.lag)
        return out

    def add(self, other: dict[str, Any]) -> None:
        """Add another part's :meth:`counters` (a journal's lag measured by two parts: the larger)."""
        for name, value in other.items():
            if name == "outcomes":
                for k, v in value.items():
                    self.outcomes[k] = self.outcomes.get(k, 0) + v
            elif name == "lag":
                for k, v in value.items():
                    self.lag[k] = max(v, self.lag.get(k, v))
            elif name in _COUNTERS:
                setattr(self, name, getattr(self, name) + value)


# By the default's type, not the annotation's: a compiled dataclass (zcluster._native) has no string annotations.
_COUNTERS = frozenset(f.name for f in fields(BatchStats) if type(f.default) is int and f.name != "batch_id")


class WriteBuffer:
    """Buffers writes and sends them in batches of ``size``; unconfirmed tuples are resent (idempotent, or
    fenced) up to ``retries`` times, then :class:`PartialWriteError` propagates. A
    :class:`zcluster.DurabilityError` is raised at once: its call already asked for the confirmation until
    ``Durability.deadline`` (riding out a failover), and a resend would only wait as long again.

    Increments (:class:`zcluster.Incr`, :class:`zcluster.Count`) need a ``source`` (the applier's
    ``<app>/<journal>``): each is fenced at its delivery position (``base`` + the offset of the envelope that
    committed its message, the message's own offset, its index among the message's increments), which grows
    in delivery order and is the same on every replay, so a replayed or resent increment counts once. A
    flush sends a key's increments in order and stops that key at the first unconfirmed one; a flush that
    still has unconfirmed ones after the retries raises, so nothing later of the journal is sent before them.

    A write the cluster refuses (:class:`zcluster.InvalidTupleError` before sending, e.g. a NaN score;
    :class:`zcluster.WriteRefusedError` from the server, e.g. an Incr to a 2P-set key or an overflowing
    counter) raises :class:`MapperError` naming the journal and offset of the message it came from."""

    def __init__(
        self, cluster: Store, size: int, retries: int, stats: BatchStats, source: str = "", base: int = 0
    ) -> None:
        self.cluster, self.size, self.retries, self.stats = cluster, size, retries, stats
        self.source, self.base = source, base
        self.writes: list[Write] = []
        self.increments: list[tuple[tuple[int, int, int], Increment]] = []
        self.origins = _Origins()  # which message each queued write came from (for a MapperError)

    def add(self, writes: Iterable[Any], journal: str = "", offset: int = -1, commit: int = -1) -> None:
        """Queue ``writes`` of the message at ``offset`` of ``journal``, delivered by the envelope at
        ``commit``: Insert, Delete (an insert also as KeyScoreMember / 3-tuple), Incr or Count; anything else
        is a :class:`MapperError` naming the origin."""
        out, incs = self.writes, self.increments
        if type(writes) is list and len(writes) == 1:  # the commonest message: one write or one increment
            kind = type(w := writes[0])
            if kind is _INSERT or kind is _DELETE:
                out.append(w)
                if _UNTRACK is not None:
                    _UNTRACK(w)
                each = 1
            elif (kind is Incr or kind is Count) and self.source and commit >= 0:
                incs.append(((self.base + commit, offset, 0), w))
                each = 0
            else:
                each = -1
            if each >= 0:
                origins = self.origins
                if journal or origins.journal:  # costs an append while a run of messages of one shape lasts
                    if origins.writes_each != each or origins.increments_each != 1 - each or journal != origins.journal:
                        origins.run(journal, len(out) - each, len(incs) - 1 + each, each, 1 - each)
                    origins.offsets.append(offset)
                if len(out) + len(incs) >= self.size:
                    self.flush()
                return
        n_out, n_incs = len(out), len(incs)
        j = 0
        for w in writes:
            kind = type(w)
            if kind is Insert or kind is Delete or isinstance(w, Insert | Delete):  # exact types are cheap
                out.append(w)
                if _UNTRACK is not None:
                    _UNTRACK(w)
            elif isinstance(w, Incr | Count):
                if not self.source or commit < 0:
                    raise MapperError(
                        f"mapper returned {w!r} for {_where(journal, offset)}: increments need a fenced source "
                        "(the exactly-once applier gives one; a writer of plain rows cannot)"
                    )
                incs.append(((self.base + commit, offset, j), w))
                j += 1
            elif isinstance(w, tuple) and len(w) == 3:
                out.append(Insert(*w))
            else:
                raise MapperError(
                    f"mapper returned {w!r} for {_where(journal, offset)}: expected Insert, Delete, Incr, Count "
                    "or KeyScoreMember (a Publish needs a journal store to publish to: Consumer(..., publish=store), "
                    "ZClusterSink(..., publish=url) or PositionedSink(..., publish=url))"
                )
        origins = self.origins
        if journal or origins.journal:
            n = len(out) - n_out
            if n != origins.writes_each or j != origins.increments_each or journal != origins.journal:
                origins.run(journal, n_out, n_incs, n, j)
            origins.offsets.append(offset)
        if len(out) + len(incs) >= self.size:
            self.flush()

    def flush(self) -> None:
        pending, self.writes = self.writes, []
        increments, self.increments = self.increments, []
        origins, self.origins = self.origins, _Origins()
        if pending:
            inserts = list(map(type, pending)).count(Insert)  # in C: this runs over every write
            self.stats.inserts += inserts
            self.stats.deletes += len(pending) - inserts
            self._send(pending, lambda batch: self.cluster.apply(batch, raise_on_error=False), origins, 0)
        if increments:
            self.stats.increments += len(increments)
            self._send(
                increments, lambda batch: self.cluster.increment(self.source, batch, raise_on_error=False), origins, 1
            )

    def _send(self, pending: list[Any], send: Callable[[list[Any]], WriteResult], origins: _Origins, at: int) -> None:
        """Send ``pending`` with ``send``, resending the unconfirmed ones (in order); ``at``: which index of
        an origin entry counts ``pending`` (0: writes, 1: increments)."""
        first = True
        for attempt in range(self.retries + 1):
            try:
                result = send(pending)
            except InvalidTupleError as exc:
                raise self._located(exc, exc.index, exc.value, exc.reason, origins, at, first) from exc
            refused = result.refused
            if refused is not None:
                raise self._located(
                    refused, refused.index, refused.value, refused.reason, origins, at, first
                ) from refused
            self.stats.applied += result.applied_count
            if at == 1:  # an increment neither applied nor failed was at or below its fence
                self.stats.fenced += len(pending) - result.applied_count - len(result.failed_indices)
            if result.ok:
                return
            if attempt == self.retries or waited_out(result.failures):
                raise PartialWriteError(result)
            log.warning(
                "retrying %d unconfirmed write(s): %s",
                len(result.failed_indices),
                "; ".join(str(f) for f in result.failures),
            )
            pending = [pending[i] for i in result.failed_indices]
            first = False
            time.sleep(backoff(attempt))

    @staticmethod
    def _located(
        exc: Exception, index: int, value: Any, reason: str, origins: _Origins, at: int, first: bool
    ) -> Exception:
        """A :class:`MapperError` naming the message write ``index`` came from (the error itself where that is
        unknown: a resend holds a subset, whose indices are others; no origin: the writer's rows)."""
        where = origins.find(index, at) if first else None
        if where is None:
            return exc
        journal, offset = where
        return MapperError(f"mapper returned a refused write for {_where(journal, offset)}: {value!r}: {reason}")


class _Origins:
    """Which message each write of a :class:`WriteBuffer` came from, kept in runs: consecutive messages of one
    journal with the same shape (writes and increments per message) are one run, so a message costs one
    append of its offset (the applier's messages are mostly of one shape). Only a refused write asks."""

    __slots__ = ("increments_each", "journal", "journals", "offsets", "runs", "writes_each")

    def __init__(self) -> None:
        self.offsets: list[int] = []  # per message: its offset
        # Per run: its first message, where its writes and its increments start, how many each message has.
        self.runs: list[tuple[int, int, int, int, int]] = []
        self.journals: list[tuple[int, str]] = []  # (first message, journal), where the journal changes
        self.journal = ""
        self.writes_each = self.increments_each = -1  # of the current run

    def run(self, journal: str, writes_at: int, increments_at: int, writes_each: int, increments_each: int) -> None:
        """A new run starts with the next message."""
        self.runs.append((len(self.offsets), writes_at, increments_at, writes_each, increments_each))
        self.writes_each, self.increments_each = writes_each, increments_each
        if journal != self.journal:
            self.journal = journal
            self.journals.append((len(self.offsets), journal))

    def find(self, index: int, at: int) -> tuple[str, int] | None:
        """(journal, offset) of the message whose write ``index`` is (``at`` 0: of the writes, 1: of the
        increments); None when unknown (no journal named)."""
        r = bisect.bisect_right([run[1 + at] for run in self.runs], index) - 1
        if r < 0:
            return None
        first, start, each = self.runs[r][0], self.runs[r][1 + at], self.runs[r][3 + at]
        if each == 0:
            return None
        k = first + (index - start) // each
        end = self.runs[r + 1][0] if r + 1 < len(self.runs) else len(self.offsets)
        if k >= end:
            return None
        journal = self.journals[bisect.bisect_right([j[0] for j in self.journals], k) - 1][1]
        return (journal, self.offsets[k]) if journal else None


def _where(journal: str, offset: int) -> str:
    return f"journal {journal} offset {offset}" if journal else "the writer"
