"""What one batch of the exactly-once path does: its figures, its write buffer, the mapper's error.

Shared by the applier (journal messages -> writes) and the Spark writer (rows -> writes).
"""

from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from typing import Any

from zcluster.errors import InvalidTupleError, PartialWriteError, ZClusterError
from zcluster.state.retry import backoff
from zcluster.types import Delete, Insert, Store, Write

__all__ = ["BatchStats", "MapperError", "WriteBuffer"]

log = logging.getLogger("zcluster.state")


class MapperError(ZClusterError):
    """The mapper raised or returned something that is not a write; names the journal, offset and message
    kind. Nothing of that journal's batch was checkpointed, so it is read again (the writes that were
    already sent are idempotent)."""


@dataclass
class BatchStats:
    """What one batch did (summed over journals and tasks): frames read, messages seen, delivered and
    dropped, writes sent and applied; lost ranges skipped (``fail_on_data_loss=False``: how many, how many
    bytes); ``lag``: per journal, the bytes between its checkpoint after the batch and its end then (for the
    journals the batch measured: those it read from a journal store)."""

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
    applied: int = 0
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


_COUNTERS = frozenset(f.name for f in fields(BatchStats) if f.type == "int" and f.name != "batch_id")


class WriteBuffer:
    """Buffers writes and sends them in batches of ``size``; unconfirmed tuples are resent (idempotent)
    up to ``retries`` times, then :class:`PartialWriteError` propagates. A write the cluster refuses as
    invalid (:class:`zcluster.InvalidTupleError`, e.g. a NaN score) raises :class:`MapperError` naming the
    journal and offset of the message it came from; nothing of that flush was sent."""

    def __init__(self, cluster: Store, size: int, retries: int, stats: BatchStats) -> None:
        self.cluster, self.size, self.retries, self.stats = cluster, size, retries, stats
        self.writes: list[Write] = []
        # Where each message's writes start in `writes`: (index, journal, offset), one entry per add() of a journal.
        self.origins: list[tuple[int, str, int]] = []

    def add(self, writes: Iterable[Any], journal: str = "", offset: int = -1) -> None:
        """Queue ``writes`` (Insert, Delete, or an insert as KeyScoreMember / 3-tuple); ``journal`` and
        ``offset`` name their origin for a :class:`MapperError` on anything else."""
        out = self.writes
        if journal:
            self.origins.append((len(out), journal, offset))
        for w in writes:
            kind = type(w)
            if kind is Insert or kind is Delete or isinstance(w, Insert | Delete):  # exact types are cheap
                out.append(w)
            elif isinstance(w, tuple) and len(w) == 3:
                out.append(Insert(*w))
            else:
                raise MapperError(
                    f"mapper returned {w!r} for {_where(journal, offset)}: expected Insert, Delete or KeyScoreMember"
                )
        if len(out) >= self.size:
            self.flush()

    def flush(self) -> None:
        pending, self.writes = self.writes, []
        origins, self.origins = self.origins, []
        if not pending:
            return
        inserts = sum(1 for w in pending if type(w) is Insert)
        self.stats.inserts += inserts
        self.stats.deletes += len(pending) - inserts
        for attempt in range(self.retries + 1):
            try:
                result = self.cluster.apply(pending, raise_on_error=False)
            except InvalidTupleError as exc:
                at = bisect.bisect_right(origins, (exc.index, "\uffff")) - 1
                if attempt or at < 0:  # a resend holds a subset (its indices are others); no origin: the writer's
                    raise
                _, journal, offset = origins[at]
                raise MapperError(
                    f"mapper returned an invalid write for {_where(journal, offset)}: {exc.value!r}: {exc.reason}"
                ) from exc
            self.stats.applied += result.applied_count
            if result.ok:
                return
            if attempt == self.retries:
                raise PartialWriteError(result)
            log.warning(
                "retrying %d unconfirmed write(s): %s",
                len(result.failed_indices),
                "; ".join(str(f) for f in result.failures),
            )
            pending = [pending[i] for i in result.failed_indices]
            time.sleep(backoff(attempt))


def _where(journal: str, offset: int) -> str:
    return f"journal {journal} offset {offset}" if journal else "the writer"
