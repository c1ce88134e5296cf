"""One event per public call, for :class:`zcluster.Cluster` and :class:`zcluster.farm.Farm` alike (the
events are :class:`zcluster.instrumentation.OpEvent`; see that module for the contract)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Iterator
from typing import Any

from zcluster.errors import PartialReadError
from zcluster.instrumentation import Instrumentation, OpEvent
from zcluster.types import ReadResult


class Reporting:
    """Mixin: ``_report`` sends the event of a call to ``self.instrumentation``; ``_reporting`` reports a call
    that raised inside its ``with`` block (the normal end reports itself; a call a migration's cut-over cut off
    is not reported: it runs again on the store's new layout, which reports it); ``_finish`` reports a read and
    raises :class:`PartialReadError` for a strict one with errors."""

    instrumentation: Instrumentation

    def _report(
        self,
        op: str,
        records: int,
        started: float,
        applied: int = 0,
        shards: Iterable[str] = (),
        error: BaseException | None = None,
    ) -> None:
        seconds = time.perf_counter() - started if started else 0.0
        failed = tuple(sorted(set(shards)))
        self.instrumentation(OpEvent(op, records, seconds, applied, failed, error, self._known_shards()))

    def _known_shards(self) -> tuple[str, ...]:
        """The servers this caller knows (``OpEvent.known_shards``); none unless the class says."""
        return ()

    @contextlib.contextmanager
    def _reporting(self, op: str, started: float) -> Iterator[None]:
        try:
            yield
        except BaseException as exc:
            if not getattr(exc, "runs_again", False):  # StoreMoved: the call runs again where the store moved
                self._report(op, 0, started, error=exc)
            raise

    def _finish(
        self, op: str, result: ReadResult[Any, Any], records: int, started: float, strict: bool
    ) -> ReadResult[Any, Any]:
        self._report(op, records, started, shards=[f.shard for f in result.errors.values()])
        if strict and result.errors:
            raise PartialReadError(dict(result), dict(result.errors))
        return result
