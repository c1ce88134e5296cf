"""Instrumentation hook: one event per public cluster call, in the spirit of roshi's instrumentation.

An instrumentation is any callable taking an :class:`OpEvent`. It runs on the calling thread once per
public call of :class:`zcluster.Cluster` (insert, delete, apply, select, select_range, score, keys,
forget), after the call completed or failed (for ``keys``, when the iteration ends); it must be fast and
must not raise. :mod:`zcluster.metrics` turns the events into Prometheus metrics.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class OpEvent:
    """``op`` handled ``records`` tuples or keys in ``seconds``; ``applied`` counts writes that took effect;
    ``failed_shards`` names shards that failed; ``error`` is what the call raised before any shard
    answered (invalid input, a bug), or None. ``known_shards`` names every server the caller knew when the
    call ended (a Cluster's standalone shards, or the Redis Cluster nodes it has addressed), failed or not,
    so that a metrics adapter can export its per-shard error series at 0 before the first error (empty
    where the caller does not say: a farm's repair events)."""

    op: str
    records: int
    seconds: float
    applied: int = 0
    failed_shards: tuple[str, ...] = ()
    error: BaseException | None = None
    known_shards: tuple[str, ...] = ()


Instrumentation = Callable[[OpEvent], None]

CALL_ERRORS = ("ConfigError", "InvalidTupleError")
"""The error classes a call raises before anything is sent (:mod:`zcluster.errors`): the metrics adapters
(:mod:`zcluster.metrics`, :mod:`zcluster.otel`) export their call-error series at 0 for every operation
called, so that the first one is seen; another class gets its series at its first occurrence."""


def nop(event: OpEvent) -> None:
    """The default instrumentation: records nothing."""
