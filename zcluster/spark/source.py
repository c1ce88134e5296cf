"""``spark.readStream.format("zcluster-journal")``: journals as a Spark streaming source.

Options: ``journals`` (a journal store URL, see :func:`zcluster.journal.urls.open_store`) and ``selector``
(a label selector, default every journal). Each micro-batch reads every journal up to its end.
Spark's offsets are the journals' byte offsets (``{journal: offset}``), so its checkpoint records exactly
where each journal was read to. Each row is one frame: ``journal``, ``begin``, ``end``, ``content_type``,
``data`` (the frame's bytes) and ``error`` (non-null for bytes that did not frame: a desync or a torn
frame, reported with its range instead of being dropped silently).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

from zcluster.journal.frames import RawFrame, read_frames
from zcluster.journal.urls import open_store

SCHEMA = "journal string, begin long, end long, content_type string, data binary, error string"


class JournalRange(InputPartition):
    """Bytes [begin, end) of one journal."""

    def __init__(self, journal: str, content_type: str, begin: int, end: int) -> None:
        self.journal, self.content_type, self.begin, self.end = journal, content_type, begin, end


def read_partition(url: str, part: JournalRange) -> Iterator[RawFrame]:
    """The frames of ``part`` as rows of :data:`SCHEMA` (see :func:`zcluster.journal.frames.read_frames`)."""
    store = open_store(url)
    try:
        yield from read_frames(store, part.journal, part.content_type, part.begin, part.end)
    finally:
        _close(store)


def _close(store: object) -> None:
    close = getattr(store, "close", None)
    if close is not None:
        close()


class JournalStreamReader(DataSourceStreamReader):
    def __init__(self, options: dict[str, str]) -> None:
        if "journals" not in options:
            raise ValueError("zcluster-journal needs the 'journals' option (a journal store URL)")
        self.url = options["journals"]
        self.selector = options.get("selector", "")

    def _specs(self) -> dict[str, str]:
        store = open_store(self.url)
        try:
            return {s.name: s.labels["content-type"] for s in store.list(self.selector)}
        finally:
            _close(store)

    def initialOffset(self) -> dict[str, int]:
        return dict.fromkeys(self._specs(), 0)

    def latestOffset(self, start: dict[str, int] | None = None, limit: Any = None) -> dict[str, int]:
        """Every journal's current end (PySpark >= 4.2 passes ``start`` and a read limit; all are read)."""
        names = self._specs()
        store = open_store(self.url)
        try:
            return {name: store.end(name) for name in names}  # appends are whole frames: ends are boundaries
        finally:
            _close(store)

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[JournalRange]:
        types = self._specs()
        return [
            JournalRange(name, types[name], start.get(name, 0), stop)
            for name, stop in sorted(end.items())
            if stop > start.get(name, 0) and name in types
        ]

    def read(self, partition: InputPartition) -> Iterator[RawFrame]:
        assert isinstance(partition, JournalRange)
        return read_partition(self.url, partition)

    def commit(self, end: dict[str, int]) -> None:
        """Nothing to release: journals keep their data (retention is the store's business)."""


class JournalDataSource(DataSource):
    """Registered as ``zcluster-journal``."""

    @classmethod
    def name(cls) -> str:
        return "zcluster-journal"

    def schema(self) -> str:
        return SCHEMA

    def streamReader(self, schema: Any) -> JournalStreamReader:
        return JournalStreamReader(dict(self.options))
