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

from zcluster.journal.urls import open_store
from zcluster.message.framing import CONTENT_TYPE_NDJSON, FramingError, framing_for

SCHEMA = "journal string, begin long, end long, content_type string, data binary, error string"


class JournalRange(InputPartition):
    """Bytes [begin, end) of one journal."""

    def __init__(self, journal: str, content_type: str, begin: int, end: int) -> None:
        self.journal, self.content_type, self.begin, self.end = journal, content_type, begin, end


def read_frames(url: str, part: JournalRange) -> Iterator[tuple[Any, ...]]:
    """The frames of ``part`` as rows of :data:`SCHEMA`; bytes that do not frame become error rows.

    ndjson is only split at newlines here (the sink parses each line once, and reports a line that is not
    JSON with its offsets); other content types go through their framing's decoder.
    """
    store = open_store(url)
    try:
        chunks = _clipped(store.read(part.journal, part.begin), part.end)
        if part.content_type == CONTENT_TYPE_NDJSON:
            yield from _lines(part, chunks)
        else:
            yield from _decoded(part, chunks)
    finally:
        _close(store)


def _clipped(chunks: Iterator[tuple[int, bytes]], end: int) -> Iterator[tuple[int, bytes]]:
    for begin, chunk in chunks:
        if begin >= end:
            return
        yield begin, chunk[: end - begin]
        if begin + len(chunk) >= end:
            return


def _lines(part: JournalRange, chunks: Iterator[tuple[int, bytes]]) -> Iterator[tuple[Any, ...]]:
    journal, ctype = part.journal, part.content_type
    pending, base = b"", part.begin  # bytes not yet framed, starting at offset `base`
    for _, chunk in chunks:
        data = pending + chunk if pending else chunk
        start = 0
        while (nl := data.find(b"\n", start)) >= 0:
            yield (journal, base + start, base + nl + 1, ctype, data[start : nl + 1], None)
            start = nl + 1
        pending, base = data[start:], base + start
    if pending:
        yield (journal, base, base + len(pending), ctype, None, f"unexpected end: no newline after offset {base}")


def _decoded(part: JournalRange, chunks: Iterator[tuple[int, bytes]]) -> Iterator[tuple[Any, ...]]:
    decoder = framing_for(part.content_type).decoder(part.begin)
    buf, base = bytearray(), part.begin  # raw bytes from offset `base`, to slice each frame's bytes out of
    for _, chunk in chunks:
        buf += chunk
        for item in decoder.feed(chunk):
            yield _row(part, item, buf, base)
        # Frames never start before the last one reported: drop what lies behind it.
        done = max(0, min(len(buf), decoder.offset - base))
        if done:
            del buf[:done]
            base += done
    for item in decoder.close():
        yield _row(part, item, buf, base)


def _row(part: JournalRange, item: Any, buf: bytearray, base: int) -> tuple[Any, ...]:
    if isinstance(item, FramingError):
        return (part.journal, item.begin, item.end, part.content_type, None, str(item))
    data = bytes(buf[item.begin - base : item.end - base])
    return (part.journal, item.begin, item.end, part.content_type, data, None)


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

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, JournalRange)
        return read_frames(self.url, partition)

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
