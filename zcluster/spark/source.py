"""``spark.readStream.format("zcluster-journal")``: journals as a Spark streaming source.

(Batch reads, ``spark.read``, and the data source class itself: :mod:`zcluster.spark.batch_source`.)

Spark's offsets are the journals' byte offsets (``{journal: offset}``), so its checkpoint records exactly
where each journal was read to; a micro-batch's partitions hold one journal's byte range each (or several,
with ``numPartitions``), and each range's rows come in offset order, ranges one after the other. Each row
is one frame: ``journal``, ``begin``, ``end``, ``content_type``, ``data`` (the frame's bytes) and ``error``
(non-null for bytes that did not frame: a desync or a torn frame, reported with its range instead of being
dropped silently). Rows are produced as Arrow record batches.

With ``rows`` set to ``ranges``, a row is a journal range instead (:data:`RANGES_SCHEMA`: ``journal``,
``content_type``, ``begin``, ``end``), and whoever consumes it reads the bytes from the store itself, as
:class:`zcluster.spark.ZClusterSink` does: the frames never travel through the JVM, and a batch Spark runs
again reads only what lies past the stored checkpoints.

Options:

* ``journals`` (required): a journal store URL (:func:`zcluster.journal.urls.open_store`);
* ``selector``: a label selector (default: every journal);
* ``rows``: ``frames`` (default: a row per frame) or ``ranges`` (a row per journal range);
* ``numPartitions``: at most this many partitions per micro-batch (default: one per journal). Ranges are
  packed by size (the largest first, each into the partition with the fewest bytes so far), so a batch of
  many journals runs as that many even tasks: with as many as the cores, none waits and none idles at
  the end. :func:`zcluster.spark.run_available_now` sets it to the session's default parallelism;
* ``maxBytesPerTrigger`` / ``maxFramesPerTrigger``: a bound per micro-batch, so that a backlog does not
  become one giant batch. Journals are taken in name order until the bound is spent; batches end at frame
  boundaries, and each journal a batch touches advances by at least one frame (so a frame larger than
  the bound still gets through, and every batch makes progress); a lost range counts as one frame of no
  bytes;
* ``failOnDataLoss`` (``true`` by default, as Spark's Kafka source): with ``rows=frames``, a lost range of
  a file journal (:mod:`zcluster.state.lost`) fails the read task; ``false`` gives it one row instead
  (``data`` null, ``error`` starting ``lost range:``, ``begin``/``end`` the range) and reads on after it:
  :class:`zcluster.spark.ZClusterSink` then checkpoints everything before it and stops there (its own
  ``fail_on_data_loss``, by default; ``zcluster consumers APP skip-lost`` goes past) or skips it (with
  ``fail_on_data_loss=False``). With ``rows=ranges`` the source reads no bytes: the sink's
  ``fail_on_data_loss`` alone decides.

``trigger(availableNow=True)`` reads everything the journals held when the query started (the source
records their ends then), in batches of the bounds above, including after a batch that Spark runs again
because its commit was lost.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from zcluster.errors import ConfigError
from zcluster.journal.frames import (
    LOST_ROW,
    LineBlocks,
    RawFrame,
    lost_row,
    read_frames,
    read_range,
    read_range_frames,
    stop_at_lost,
)
from zcluster.journal.store import JournalStore, close_store
from zcluster.journal.urls import open_store
from zcluster.message.errors import OffsetOutOfRangeError
from zcluster.message.framing import CONTENT_TYPE_NDJSON, framing_for
from zcluster.spark.workers import freeze_heap

SCHEMA = "journal string, begin long, end long, content_type string, data binary, error string"
ARROW_SCHEMA = pa.schema(
    [
        ("journal", pa.string()),
        ("begin", pa.int64()),
        ("end", pa.int64()),
        ("content_type", pa.string()),
        ("data", pa.binary()),
        ("error", pa.string()),
    ]
)
RANGES_SCHEMA = "journal string, content_type string, begin long, end long"
RANGE_COLUMNS = ("journal", "content_type", "begin", "end")
"""The columns of :data:`RANGES_SCHEMA`, in order."""
MESSAGES_SCHEMA = (
    "journal string, begin long, end long, committed long, producer string, clock long, uuid string, "
    "message string, error string"
)
"""A batch read's committed messages (``rows=messages``, :mod:`zcluster.spark.batch_source`)."""
_ROWS_PER_BATCH = 65536
_COALESCE = 1 << 20


class JournalRange:
    """Bytes [begin, end) of one journal."""

    def __init__(self, journal: str, content_type: str, begin: int, end: int) -> None:
        self.journal, self.content_type, self.begin, self.end = journal, content_type, begin, end


class JournalPartition(InputPartition):
    """A micro-batch partition: journal ranges (of distinct journals), read one after the other."""

    def __init__(self, ranges: list[JournalRange]) -> None:
        self.ranges = ranges


def pack(ranges: list[JournalRange], most: int | None) -> list[JournalPartition]:
    """``ranges`` in at most ``most`` partitions of about equal bytes (None: one partition per range).

    The largest range goes first, each into the partition with the fewest bytes so far (ties: the earlier
    partition), which keeps the largest within 4/3 of the best packing; a partition's ranges stay in
    journal name order.
    """
    if most is None or most >= len(ranges):
        return [JournalPartition([r]) for r in ranges]
    bins: list[tuple[int, int, list[JournalRange]]] = [(0, i, []) for i in range(most)]
    for r in sorted(ranges, key=lambda r: (r.begin - r.end, r.journal)):
        size, i, members = heapq.heappop(bins)
        members.append(r)
        heapq.heappush(bins, (size + r.end - r.begin, i, members))
    return [
        JournalPartition(sorted(members, key=lambda r: r.journal)) for _, _, members in sorted(bins, key=lambda b: b[1])
    ]


def read_partition(url: str, part: JournalRange, fail_on_data_loss: bool = True) -> Iterator[RawFrame]:
    """The frames of ``part`` as rows of :data:`SCHEMA` (see :func:`zcluster.journal.frames.read_frames`);
    a lost range raises, or is a row with ``fail_on_data_loss`` False."""
    store = open_store(url, recover=False)
    try:
        yield from read_range_frames(
            store, part.journal, part.content_type, part.begin, part.end, lost_rows=not fail_on_data_loss
        )
    finally:
        close_store(store)


def read_batches(url: str, part: JournalRange, fail_on_data_loss: bool = True) -> Iterator[pa.RecordBatch]:
    """The frames of ``part`` as Arrow record batches of :data:`ARROW_SCHEMA`; a lost range raises, or is a
    row with ``fail_on_data_loss`` False (see the module).

    ndjson is split at newlines without a Python object per frame (the frames' bytes stay one buffer, read
    a large chunk at a time); other content types go through :func:`read_partition`.
    """
    if part.content_type != CONTENT_TYPE_NDJSON:
        rows: list[RawFrame] = []
        for row in read_partition(url, part, fail_on_data_loss):
            rows.append(row)
            if len(rows) == _ROWS_PER_BATCH:
                yield _rows_batch(rows)
                rows = []
        if rows:
            yield _rows_batch(rows)
        return
    store = open_store(url, recover=False)
    try:
        begin = part.begin
        while begin < part.end:
            stopped: list[OffsetOutOfRangeError] = []
            chunks = read_range(store, part.journal, begin, part.end)
            yield from _ndjson_batches(part, begin, chunks if fail_on_data_loss else stop_at_lost(chunks, stopped))
            if not stopped:
                return
            yield _rows_batch([lost_row(part.journal, part.content_type, stopped[0])])
            begin = max(begin + 1, stopped[0].lost_end or part.end)
    finally:
        close_store(store)


def _ndjson_batches(part: JournalRange, begin: int, chunks: Iterator[bytes]) -> Iterator[pa.RecordBatch]:
    blocks = LineBlocks(part.journal, part.content_type, begin, framing_for(part.content_type).max_frame_bytes)
    for data in _coalesced(chunks):
        for item in blocks.feed(data):
            if isinstance(item, RawFrame):
                yield _rows_batch([item])
                continue
            base, block = item
            yield _lines_batch(part, base, block, np.flatnonzero(np.frombuffer(block, dtype=np.uint8) == 10))
    for error in blocks.close():
        yield _rows_batch([error])


def _coalesced(chunks: Iterator[bytes]) -> Iterator[bytes]:
    """``chunks`` in pieces of at least about 1 MiB (stores may return one chunk per append: a batch per
    chunk would cost more than the bytes)."""
    parts: list[bytes] = []
    held = 0
    for chunk in chunks:
        if not parts and len(chunk) >= _COALESCE // 4:
            yield chunk  # large already (file journals read about 1 MiB at a time): no copy
            continue
        parts.append(chunk)
        held += len(chunk)
        if held >= _COALESCE:
            yield b"".join(parts)
            parts, held = [], 0
    if parts:
        yield b"".join(parts)


def _lines_batch(
    part: JournalRange, base: int, data: bytes | memoryview, newlines: np.ndarray[Any, Any]
) -> pa.RecordBatch:
    """One row per line of ``data`` (which ends with a newline), zero-copy over its bytes."""
    n = len(newlines)
    offsets = np.empty(n + 1, dtype=np.int32)
    offsets[0] = 0
    offsets[1:] = newlines + 1
    blob = pa.py_buffer(data)
    frames = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), blob])
    begins = offsets[:-1].astype(np.int64) + base
    same = np.zeros(n, dtype=np.int32)
    return pa.RecordBatch.from_arrays(
        [
            pa.array([part.journal], pa.string()).take(same),
            pa.array(begins),
            pa.array(begins + (offsets[1:] - offsets[:-1])),
            pa.array([part.content_type], pa.string()).take(same),
            frames,
            pa.nulls(n, pa.string()),
        ],
        schema=ARROW_SCHEMA,
    )


def _rows_batch(rows: list[RawFrame]) -> pa.RecordBatch:
    columns = list(zip(*rows, strict=True))
    return pa.RecordBatch.from_arrays(
        [pa.array(col, type=field.type) for col, field in zip(columns, ARROW_SCHEMA, strict=True)],
        schema=ARROW_SCHEMA,
    )


def _positive_option(options: dict[str, str], name: str) -> int | None:
    text = options.get(name.lower())
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise ConfigError(f"zcluster-journal option {name} must be a positive integer, got {text!r}")
    return value


def _bool_option(options: dict[str, str], name: str, default: bool) -> bool:
    text = options.get(name.lower())
    if text is None:
        return default
    if text.strip().lower() not in ("true", "false"):
        raise ConfigError(f"zcluster-journal option {name} must be 'true' or 'false', got {text!r}")
    return text.strip().lower() == "true"


def ranges_option(options: dict[str, str]) -> bool:
    """Whether a stream's ``rows`` option asks for ranges (else frames); ConfigError for any other value."""
    rows = options.get("rows", "frames")
    if rows == "messages":
        raise ConfigError("zcluster-journal rows=messages is for batch reads (spark.read), not readStream")
    if rows not in ("frames", "ranges"):
        raise ConfigError(f"zcluster-journal option rows must be 'frames' or 'ranges', got {rows!r}")
    return rows == "ranges"


class JournalStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: dict[str, str]) -> None:
        # Option names are case-insensitive: Spark hands them over lowercased, whatever the user wrote.
        options = {name.lower(): value for name, value in options.items()}
        if "journals" not in options:
            raise ConfigError("zcluster-journal needs the 'journals' option (a journal store URL)")
        self.url = options["journals"]
        self.ranges = ranges_option(options)
        self.selector = options.get("selector", "")
        self.max_bytes = _positive_option(options, "maxBytesPerTrigger")
        self.max_frames = _positive_option(options, "maxFramesPerTrigger")
        self.num_partitions = _positive_option(options, "numPartitions")
        self.fail_on_data_loss = _bool_option(options, "failOnDataLoss", True)
        if self.max_bytes and self.max_frames:
            raise ConfigError("zcluster-journal takes maxBytesPerTrigger or maxFramesPerTrigger, not both")
        self.target: dict[str, int] | None = None  # availableNow: the ends when the query started
        self.store: JournalStore | None = None

    def _store(self) -> JournalStore:
        # One store for the query's life (this reader lives in the driver's source process). Opened without
        # recovery: recovering is a writer's business (it scans and locks every journal, about 60 ms per
        # query here), and ends are whole appends either way.
        if self.store is None:
            self.store = open_store(self.url, recover=False)
        return self.store

    def _specs(self) -> dict[str, str]:
        return {s.name: s.labels["content-type"] for s in self._store().list(self.selector)}

    def _ends(self) -> dict[str, int]:
        store = self._store()
        return {name: store.end(name) for name in self._specs()}  # appends are whole frames: ends are boundaries

    def initialOffset(self) -> dict[str, int]:
        return dict.fromkeys(self._specs(), 0)

    def prepareForTriggerAvailableNow(self) -> None:
        """Record every journal's current end: an availableNow query reads up to there, and no further."""
        self.target = self._ends()

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.max_bytes:
            return ReadMaxBytes(self.max_bytes)
        if self.max_frames:
            return ReadMaxRows(self.max_frames)
        return ReadAllAvailable()

    def latestOffset(self, start: dict[str, int] | None = None, limit: ReadLimit | None = None) -> dict[str, int]:
        """Every journal's end (or its end when an availableNow query started), within ``limit``."""
        ends = dict(self.target) if self.target is not None else self._ends()
        start = start or {}
        for name, at in start.items():  # never behind where the query already is
            ends[name] = max(ends.get(name, at), at)
        if isinstance(limit, ReadMaxBytes | ReadMaxRows):
            return self._bounded(start, ends, limit)
        return ends

    def _bounded(
        self, start: dict[str, int], ends: dict[str, int], limit: ReadMaxBytes | ReadMaxRows
    ) -> dict[str, int]:
        budget = limit.max_bytes if isinstance(limit, ReadMaxBytes) else limit.max_rows
        types = self._specs()
        out = dict(ends)
        store = self._store()
        for name in sorted(ends):
            begin = start.get(name, 0)
            if ends[name] <= begin:
                continue
            stop = begin
            if budget > 0 and name in types:
                for frame in read_frames(store, name, types[name], begin, ends[name], lost_rows=True):
                    if isinstance(limit, ReadMaxRows):
                        cost = 1
                    else:  # a lost range reads nothing
                        cost = 0 if (frame.error or "").startswith(LOST_ROW) else frame.end - frame.begin
                    if stop > begin and cost > budget:
                        break
                    stop, budget = frame.end, budget - cost
            out[name] = stop
        return out

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[JournalPartition]:
        types = self._specs()
        ranges = [
            JournalRange(name, types[name], start.get(name, 0), stop)
            for name, stop in sorted(end.items())
            if stop > start.get(name, 0) and name in types
        ]
        return pack(ranges, self.num_partitions)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, JournalPartition)
        freeze_heap()  # this runs in a reused Python worker: see zcluster.spark.workers
        ranges = partition.ranges
        if self.ranges:
            return iter(
                [pa.RecordBatch.from_pydict({name: [getattr(r, name) for r in ranges] for name in RANGE_COLUMNS})]
            )
        return itertools.chain.from_iterable(read_batches(self.url, r, self.fail_on_data_loss) for r in ranges)

    def commit(self, end: dict[str, int]) -> None:
        """Nothing to release: journals keep their data (retention is the store's business)."""

    def stop(self) -> None:
        if self.store is not None:
            close_store(self.store)
            self.store = None
