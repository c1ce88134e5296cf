"""Instrumentation hook: one event per public cluster call, in the spirit of roshi's instrumentation.

An instrumentation is any callable taking an :class:`OpEvent`. It runs on the calling thread after the
call completes (also when it failed); it must be fast and must not raise.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class OpEvent:
    """``op`` (insert, delete, select, select_range, score, keys) handled ``records`` tuples or keys in
    ``seconds``; ``applied`` counts writes that took effect; ``failed_shards`` names shards that failed."""

    op: str
    records: int
    seconds: float
    applied: int = 0
    failed_shards: tuple[str, ...] = ()


Instrumentation = Callable[[OpEvent], None]


def nop(event: OpEvent) -> None:
    """The default instrumentation: records nothing."""
