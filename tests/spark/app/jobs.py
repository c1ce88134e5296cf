"""The user's mapper, in a module of its own next to the driver script (not installed, on no worker's path)."""

from __future__ import annotations

from typing import Any

from jobhelpers import pause, record

from zcluster.testing.traffic import timeline_mapper


class TimelineJob:
    """The demo's timelines, ``seconds`` per message; with ``deliveries``, one line per delivered message."""

    def __init__(self, seconds: float = 0.0, deliveries: str | None = None) -> None:
        self.seconds = seconds
        self.deliveries = deliveries

    def __call__(self, message: Any) -> list[Any]:
        pause(self.seconds)
        record(self.deliveries)
        return timeline_mapper(message)
