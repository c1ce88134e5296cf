"""Retries of idempotent state calls while a shard fails, with the backoff they and resent writes share."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

from zcluster.errors import DurabilityError, PartialReadError, PartialWriteError
from zcluster.types import ShardFailure

__all__ = ["backoff", "retrying", "waited_out"]

log = logging.getLogger(__name__)

T = TypeVar("T")


def backoff(attempt: int) -> float:
    """Seconds to wait before retry ``attempt`` (0-based): 0.2 s doubling, at most 5 s."""
    return float(min(0.2 * 2**attempt, 5.0))


def waited_out(failures: list[ShardFailure]) -> bool:
    """Whether a failure is a :class:`DurabilityError`: its call asked for the confirmation until
    ``Durability.deadline`` already (or the server refused to give one), so a resend would only wait as
    long again; the failure is raised instead."""
    return any(isinstance(f.error, DurabilityError) for f in failures)


def retrying(call: Callable[[], T], retries: int, what: str) -> T:
    """``call()``, again after a backoff while a shard fails, at most ``retries`` more times (for state
    reads and writes, which are idempotent); then the last :class:`ShardError` propagates (at once when
    :func:`waited_out`)."""
    attempt = 0
    while True:
        try:
            return call()
        except (PartialReadError, PartialWriteError) as exc:
            if attempt == retries or waited_out(exc.failures):
                raise
            log.warning("%s: retrying after a shard failure: %s", what, exc)
            time.sleep(backoff(attempt))
            attempt += 1
