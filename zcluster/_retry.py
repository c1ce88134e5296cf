"""Retries of idempotent state calls while a shard fails, with the backoff they and resent writes share."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

from zcluster.errors import PartialReadError, PartialWriteError

__all__ = ["backoff", "retrying"]

log = logging.getLogger(__name__)

T = TypeVar("T")


def backoff(attempt: int) -> float:
    """Seconds to wait before retry ``attempt`` (0-based): 0.2 s doubling, at most 5 s."""
    return float(min(0.2 * 2**attempt, 5.0))


def retrying(call: Callable[[], T], retries: int, what: str) -> T:
    """``call()``, again after a backoff while a shard fails, at most ``retries`` more times (for state
    reads and writes, which are idempotent); then the last :class:`ShardError` propagates."""
    attempt = 0
    while True:
        try:
            return call()
        except (PartialReadError, PartialWriteError) as exc:
            if attempt == retries:
                raise
            log.warning("%s: retrying after a shard failure: %s", what, exc)
            time.sleep(backoff(attempt))
            attempt += 1
