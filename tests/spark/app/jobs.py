"""The user's mapper, in a module of its own next to the driver script (not installed, on no worker's path)."""

from __future__ import annotations

from typing import Any

from jobhelpers import hold, pause, record

from zcluster.testing.traffic import timeline_mapper


class TimelineJob:
    """The demo's timelines, ``seconds`` per message; with ``deliveries``, one line per delivered message; with
    ``hold_at`` and ``markers``, a task holds before its ``hold_at``-th message (:func:`jobhelpers.hold`)."""

    def __init__(
        self, seconds: float = 0.0, deliveries: str | None = None, hold_at: int = 0, markers: str | None = None
    ) -> None:
        self.seconds = seconds
        self.deliveries = deliveries
        self.hold_at, self.markers, self.seen = hold_at, markers, 0

    def __call__(self, message: Any) -> list[Any]:
        self.seen += 1
        if self.markers and self.seen == self.hold_at:
            hold(self.markers)
        pause(self.seconds)
        record(self.deliveries)
        return timeline_mapper(message)
