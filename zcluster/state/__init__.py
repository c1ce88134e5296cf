"""Exactly-once state kept in the cluster itself, as KeyScoreMember tuples written by the 2P-set script.

Every record is ordered by its score, so a stale writer (an older batch, a zombie process) can never move
state backwards: its writes are stale by the CRDT's own rules. Clocks are stored as scores with exact
64-bit ordering (:mod:`zcluster.state.clocks`).
"""

from zcluster.state.clocks import clock_to_score, score_to_clock
from zcluster.state.dedup import DedupStore
from zcluster.state.store import StateStore

__all__ = ["DedupStore", "StateStore", "clock_to_score", "score_to_clock"]
