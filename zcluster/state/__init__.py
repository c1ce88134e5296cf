"""Exactly-once state kept in the cluster itself, and the applier that keeps it.

* :class:`Applier`: journal frames -> Sequencer -> mapper -> CRDT writes -> checkpoint (the exactly-once
  logic, shared by the Spark sink and :class:`Consumer`, the plain Python exactly-once consumer).
* :class:`StateStore`: per-journal checkpoints (offset + producer states) and batch progress.
* :class:`DedupStore`: admit each message UUID once, for at-least-once consumers of your own.
* :func:`applications` and :func:`progress`: which applications the cluster holds checkpoints of, and how
  far behind each is per journal (what ``zcluster consumers`` prints; :mod:`zcluster.state.monitor`).
* Lost ranges of file journals and the audited ways past them: :mod:`zcluster.state.lost`.

Every record is ordered by its score, so a stale writer (an older batch, a zombie process) can never move
state backwards: its writes are stale by the CRDT's own rules. Clocks are stored as scores with exact
64-bit ordering (:mod:`zcluster.state.clocks`). Names load lazily.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from zcluster import _lazy

if TYPE_CHECKING:
    from zcluster.state.applier import Applier, Mapper
    from zcluster.state.batch import BatchStats
    from zcluster.state.clocks import clock_to_score, score_to_clock
    from zcluster.state.consumer import Consumer, JournalFailure
    from zcluster.state.dedup import DedupStore
    from zcluster.state.monitor import (
        JournalProgress,
        SkippedRange,
        applications,
        checkpointed_journals,
        checkpoints,
        progress,
    )
    from zcluster.state.store import JournalCheckpoint, StateStore, TimedCheckpoint

_WHERE = {
    "Applier": "zcluster.state.applier",
    "BatchStats": "zcluster.state.batch",
    "Mapper": "zcluster.state.applier",
    "Consumer": "zcluster.state.consumer",
    "JournalFailure": "zcluster.state.consumer",
    "DedupStore": "zcluster.state.dedup",
    "JournalCheckpoint": "zcluster.state.store",
    "StateStore": "zcluster.state.store",
    "TimedCheckpoint": "zcluster.state.store",
    "JournalProgress": "zcluster.state.monitor",
    "SkippedRange": "zcluster.state.monitor",
    "applications": "zcluster.state.monitor",
    "checkpointed_journals": "zcluster.state.monitor",
    "checkpoints": "zcluster.state.monitor",
    "progress": "zcluster.state.monitor",
    "clock_to_score": "zcluster.state.clocks",
    "score_to_clock": "zcluster.state.clocks",
}

__all__ = [
    "Applier",
    "BatchStats",
    "Consumer",
    "DedupStore",
    "JournalCheckpoint",
    "JournalFailure",
    "JournalProgress",
    "Mapper",
    "SkippedRange",
    "StateStore",
    "TimedCheckpoint",
    "applications",
    "checkpointed_journals",
    "checkpoints",
    "clock_to_score",
    "progress",
    "score_to_clock",
]

__getattr__, __dir__ = _lazy.exports(__name__, _WHERE, __all__)
