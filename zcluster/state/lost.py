"""Lost ranges of journals, and the explicit ways past them.

A file journal whose bytes were damaged on disk keeps the damage as a *lost range* (bytes [begin, end) that
were appended but can no longer be read; :meth:`zcluster.journal.FileJournals.lost_ranges`); a Redis Streams
journal's bytes trimmed by retention are one too (:meth:`zcluster.journal.RedisJournals.lost_ranges`). Nothing skips
one silently: the applier delivers every frame before it, checkpoints there (at the range's begin), and
raises :class:`zcluster.message.OffsetOutOfRangeError` naming the range (``lost_begin``, ``lost_end``,
``resume_offset``), on every poll or batch, until one of:

* an operator skips it: ``zcluster consumers APP skip-lost JOURNAL`` or
  :meth:`zcluster.state.StateStore.skip_lost`, which moves the checkpoint from the range (its begin, or
  inside it) to its end and nothing else: the range must be exactly one the journal store reports, and the
  checkpoint must lie at it (refused before the consumer has applied everything up to it, or once past it); a
  publishing application's checkpoint is moved fenced (a claim: a running applier's next save is refused);
* the application was started with ``fail_on_data_loss=False`` (:class:`zcluster.state.Consumer`,
  :class:`zcluster.spark.ZClusterSink`; Spark's ``failOnDataLoss`` option of the source for ``rows=frames``):
  the applier skips each lost range it reaches by itself, logs it at WARNING and counts it
  (``BatchStats.lost_skipped``, ``lost_bytes``).

Either way the skip is recorded in the application's audit log (:meth:`StateStore.audit`: the range, the
offset skipped from, the reason, when, and who: ``operator`` or ``applier``), which ``zcluster consumers APP``
shows.

Producer states are kept as they are across a skip. What that means for a transaction spanning the range:
its messages before and after the range are delivered when its commit ACK is read (the replay of its span
steps over the lost range); the messages inside the range are gone. When the ACK itself was in the range,
the span stays open and the producer's next commit ACK in the journal commits it (had the lost ACK been a
rollback, those messages are then delivered: the journal no longer says they were rolled back); a
producer that never acknowledges again leaves it open until it is pruned (``prune_horizon``).
"""

from __future__ import annotations

from zcluster.message.errors import OffsetOutOfRangeError
from zcluster.state.store import StateStore

__all__ = ["audit_skip", "stays_before"]


def audit_skip(
    state: StateStore, journal: str, offset: int, lost: OffsetOutOfRangeError, base: int, journal_id: str
) -> None:
    """Record the applier's automatic skip of ``lost`` from checkpoint ``offset`` (``fail_on_data_loss=False``)."""
    begin, end = lost.lost_begin or 0, lost.lost_end or 0
    reason = f"fail_on_data_loss=False: {lost}"
    state.record_skip(journal, begin, end, offset, reason, by="applier", base=base, journal_id=journal_id)


def stays_before(app: str, journal: str, offset: int, lost: OffsetOutOfRangeError) -> OffsetOutOfRangeError:
    """``lost`` (the same attributes) saying where application ``app`` stays and the ways past it."""
    return OffsetOutOfRangeError(
        f"{lost}; application {app} delivered everything before it and stays at offset {offset}. To go past it: "
        f"zcluster consumers {app} skip-lost {journal} (StateStore.skip_lost), or run with fail_on_data_loss=False",
        journal=journal,
        lost_begin=lost.lost_begin,
        lost_end=lost.lost_end,
        resume_offset=lost.resume_offset,
        reason=lost.reason,
    )
