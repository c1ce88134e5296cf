"""A journal's byte range as raw frames: the unit the exactly-once applier and the Spark source share.

A :class:`RawFrame` is one frame's bytes and offsets, not yet decoded into a message, or an error row for
bytes that did not frame (a desync or a torn frame, reported with its range instead of being dropped).
ndjson is only split at newlines here (the applier parses each line once and reports a line that is not
JSON with its offsets); other content types go through their framing's decoder.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Final, NamedTuple, TypeVar

from zcluster.message.errors import FramingError, JournalError, OffsetOutOfRangeError
from zcluster.message.framing import CONTENT_TYPE_NDJSON, Frame, framing_for
from zcluster.message.journals import JournalReader

__all__ = [
    "LOST_ROW",
    "LineBlocks",
    "LineRun",
    "RawFrame",
    "frame_start",
    "lost_error",
    "lost_row",
    "read_frames",
    "read_range",
    "read_range_frames",
    "stop_at_lost",
]

T = TypeVar("T")

LOST_ROW = "lost range: "
"""How the ``error`` of a row standing for a lost range starts (see :func:`lost_row`)."""


class RawFrame(NamedTuple):
    """Bytes [begin, end) of ``journal``: one frame (``data``) or bytes that did not frame (``error``)."""

    journal: str
    begin: int
    end: int
    content_type: str
    data: bytes | None
    error: str | None


RUN_LINES = 64
"""The most lines a :class:`LineRun` holds. A reader decodes a run's messages at once, and they live until it
has handled them all: in runs of a whole chunk (thousands of lines), they outlived the garbage collector's
youngest generation and it traversed each again and again as it aged (a tenth of the Consumer's cost per
message); a run of 64 messages' objects stays well below its threshold (700): counted, 64 cost 0.6% fewer
instructions per message than 128 (fewer objects of the run still alive when a collection comes), 24 and 256
more (a run's own cost; more survivors)."""


def _pure_split(block: memoryview) -> list[bytes]:
    return bytes(block).split(b"\n")


def _native_split() -> Callable[[memoryview], list[bytes]]:
    """Built with the compiled hot path (zcluster._native): a block's lines cut in C, with memchr and one copy
    (zcluster/journal/_scan.c); without a build, over a stale one or under ZCLUSTER_PURE, bytes.split."""
    try:
        from zcluster.journal._scan import split_lines
    except ImportError:
        return _pure_split
    return split_lines


_SPLIT: Final = _native_split()


class LineRun(NamedTuple):
    """Consecutive ndjson frames from offset ``begin``: ``lines`` without their newlines (frame k spans
    ``len(lines[k]) + 1`` bytes), at most :data:`RUN_LINES` of them, ending at offset ``end``. What
    :func:`read_runs` yields in place of one :class:`RawFrame` per line."""

    begin: int
    lines: list[bytes]
    end: int


def read_frames(
    store: JournalReader, journal: str, content_type: str, begin: int, end: int, *, lost_rows: bool = False
) -> Iterator[RawFrame]:
    """The frames of bytes [begin, end) of ``journal``, in offset order; ``begin`` and ``end`` must be
    frame boundaries (journal ends and checkpoint offsets are).

    A lost range (a damaged file journal's) raises :class:`OffsetOutOfRangeError` after the frames before
    it; with ``lost_rows`` it becomes one row instead (:func:`lost_row`), bytes before it that do not frame
    an error row as at any end, and the reading goes on after it."""
    if lost_rows:
        return _past_lost(store, journal, content_type, begin, end, runs=False)  # type: ignore[return-value]
    chunks = _clipped(store.read(journal, begin), end)
    if content_type == CONTENT_TYPE_NDJSON:
        return _lines(journal, content_type, begin, chunks, framing_for(content_type).max_frame_bytes)
    return _decoded(journal, content_type, begin, chunks)


def read_range_frames(
    store: JournalReader, journal: str, content_type: str, begin: int, end: int, *, lost_rows: bool = False
) -> Iterator[RawFrame]:
    """As :func:`read_frames`, over a range planned earlier: all its bytes or an error, never fewer
    (see :func:`read_range`); a lost range as :func:`read_frames` says."""
    return read_frames(_RangeReader(store, end), journal, content_type, begin, end, lost_rows=lost_rows)


def read_runs(
    store: JournalReader, journal: str, content_type: str, begin: int, end: int
) -> Iterator[RawFrame | LineRun]:
    """:func:`read_range_frames` with ``lost_rows``, except that an ndjson journal's well-formed lines come
    as :class:`LineRun` items, a run of whole lines each (the rows, in the same order, are what expanding
    every run into one RawFrame per line gives). Other content types: their RawFrames, unchanged. For a
    reader that handles a run of lines at once (the applier): one item per chunk read rather than per frame."""
    return _past_lost(_RangeReader(store, end), journal, content_type, begin, end, runs=True)


def frame_start(store: JournalReader, journal: str, content_type: str, offset: int, end: int) -> int:
    """The begin of the first row that a read of ``journal`` from offset 0 (:func:`read_frames` with
    ``lost_rows``) yields at or after ``offset``, or ``end`` (the journal's end) if none does.

    Rows are frames, bytes that did not frame, and lost ranges; they tile the journal, so for any offsets
    ``a <= b`` the rows beginning in ``[a, b)`` are exactly those of ``read_frames(frame_start(a),
    frame_start(b))``: cut points anywhere give consecutive ranges that hold each row once. An ndjson row
    begins after a newline, at 0, or where a lost range ends: this looks at the byte before ``offset`` and
    scans forward to the next newline. Other framings only know their boundaries from the start: their
    frames are decoded from offset 0 up to ``offset``."""
    if offset <= 0 or offset >= end:
        return min(max(offset, 0), end)
    if content_type != CONTENT_TYPE_NDJSON:
        for row in read_frames(store, journal, content_type, 0, end, lost_rows=True):
            if row.begin >= offset:
                return row.begin
        return end
    try:
        first = next(iter(store.read(journal, offset - 1)), None)
    except OffsetOutOfRangeError as exc:
        if exc.lost is None:
            raise
        return offset if offset >= exc.lost[1] else min(exc.lost[1], end)  # in a lost range: the row after it
    if first is not None and first[1][offset - 1 - first[0] : offset - first[0]] == b"\n":
        return offset
    try:
        for at, chunk in store.read(journal, offset):
            nl = chunk.find(b"\n", max(0, offset - at))
            if nl >= 0:
                return min(at + nl + 1, end)
    except OffsetOutOfRangeError as exc:
        if exc.lost is None:
            raise
        return min(exc.lost[0], end)  # the line is cut by a lost range: the lost range's row comes next
    return end  # a line with no newline up to the end: its (error) row began before `offset`


def lost_row(journal: str, content_type: str, error: OffsetOutOfRangeError) -> RawFrame:
    """The row standing for the lost range ``error`` names: its bytes [lost_begin, lost_end), no data, and
    an ``error`` starting with :data:`LOST_ROW` (:func:`lost_error` turns it back into the error)."""
    if error.lost_begin is None or error.lost_end is None:
        raise ValueError(f"not a lost range: {error}")
    return RawFrame(journal, error.lost_begin, error.lost_end, content_type, None, f"{LOST_ROW}{error}")


def lost_error(row: object) -> OffsetOutOfRangeError | None:
    """The :class:`OffsetOutOfRangeError` of a :func:`lost_row` (a RawFrame or a Spark Row), else None."""
    text = getattr(row, "error", None)
    if not isinstance(text, str) or not text.startswith(LOST_ROW):
        return None
    begin, end, journal = (getattr(row, name) for name in ("begin", "end", "journal"))
    message = text[len(LOST_ROW) :]
    return OffsetOutOfRangeError(
        message, journal=str(journal), lost_begin=int(begin), lost_end=int(end), resume_offset=int(end), reason=message
    )


def stop_at_lost(chunks: Iterator[T], stopped: list[OffsetOutOfRangeError]) -> Iterator[T]:
    """``chunks`` of a lazy read (e.g. :func:`read_range`'s), ending (instead of raising) where a lost range
    begins; its error is appended to ``stopped``. Any other error propagates."""
    try:
        yield from chunks
    except OffsetOutOfRangeError as exc:
        if exc.lost is None:
            raise
        stopped.append(exc)


def _past_lost(
    store: JournalReader, journal: str, content_type: str, begin: int, end: int, runs: bool
) -> Iterator[RawFrame | LineRun]:
    pos = begin
    while pos < end:
        stopped: list[OffsetOutOfRangeError] = []
        if runs and content_type == CONTENT_TYPE_NDJSON:
            chunks = _clipped(_StopAtLost(store, stopped).read(journal, pos), end)
            yield from _line_runs(journal, content_type, pos, chunks, framing_for(content_type).max_frame_bytes)
        else:
            yield from read_frames(_StopAtLost(store, stopped), journal, content_type, pos, end)
        if not stopped:
            return
        yield lost_row(journal, content_type, stopped[0])
        pos = max(pos + 1, stopped[0].lost_end or end)


class _StopAtLost:
    """A JournalReader whose reads end where a lost range begins (see :func:`stop_at_lost`)."""

    def __init__(self, store: JournalReader, stopped: list[OffsetOutOfRangeError]) -> None:
        self.store, self.stopped = store, stopped

    def read(
        self, journal: str, offset: int, *, block: bool = False, timeout: float | None = None
    ) -> Iterator[tuple[int, bytes]]:
        try:
            yield from self.store.read(journal, offset)  # a file journal raises at once from inside a lost range
        except OffsetOutOfRangeError as exc:
            if exc.lost is None:
                raise
            self.stopped.append(exc)


def read_range(store: JournalReader, journal: str, begin: int, end: int) -> Iterator[bytes]:
    """Bytes [begin, end) of ``journal``, in chunks, all of them or an error.

    A file journal stops short where a record of its open fragment is damaged (a reader never returns
    one); the journal is then recovered, which seals the damage as a lost range, and the read goes on: into
    the OffsetOutOfRangeError naming that range, as a reader of a recovered journal gets. Bytes still missing
    after that raise JournalError: a range planned earlier (by a Spark driver, say) is never cut short
    silently.
    """
    pos, recovered = begin, False
    while pos < end:
        for at, chunk in store.read(journal, pos):
            if at + len(chunk) > end:
                chunk = chunk[: end - at]
            yield chunk
            pos = at + len(chunk)
            if pos >= end:
                return
        recover = getattr(store, "recover", None)
        if recovered or recover is None:
            raise JournalError(f"journal {journal!r}: bytes {pos}..{end} could not be read (fewer bytes than planned)")
        recover(journal)
        recovered = True


class _RangeReader:
    """A JournalReader whose reads of any journal stop at `end` and raise rather than come up short."""

    def __init__(self, store: JournalReader, end: int) -> None:
        self.store, self.end = store, end

    def read(
        self, journal: str, offset: int, *, block: bool = False, timeout: float | None = None
    ) -> Iterator[tuple[int, bytes]]:
        pos = offset
        for chunk in read_range(self.store, journal, offset, self.end):
            yield pos, chunk
            pos += len(chunk)


def _clipped(chunks: Iterator[tuple[int, bytes]], end: int) -> Iterator[tuple[int, bytes]]:
    for begin, chunk in chunks:
        if begin >= end:
            return
        yield begin, chunk[: end - begin]
        if begin + len(chunk) >= end:
            return


class LineBlocks:
    """The one rule for cutting ndjson bytes into frames, fed chunk by chunk (the applier's frame reader and
    the Spark source's Arrow path both use it).

    :meth:`feed` yields ``(offset, block)`` for each run of whole lines (a block ends with a newline; zero
    copy where it can), and an error :class:`RawFrame` for a line whose unterminated part grew past
    ``limit`` bytes (its bytes are dropped as they come; the row spans it up to its newline). :meth:`close`
    yields an error row for bytes left without a newline at the end.
    """

    def __init__(self, journal: str, content_type: str, begin: int, limit: int) -> None:
        self.journal, self.content_type, self.limit = journal, content_type, limit
        self.pending: bytes = b""  # bytes not yet framed, starting at offset `base`
        self.base = begin
        self.skip_from: int | None = None  # start of a line longer than `limit`

    def feed(self, data: bytes) -> Iterator[tuple[int, memoryview] | RawFrame]:
        if self.skip_from is not None:
            nl = data.find(b"\n")
            if nl < 0:
                self.base += len(data)
                return
            reason = f"line longer than the maximum frame size ({self.limit} bytes)"
            yield RawFrame(self.journal, self.skip_from, self.base + nl + 1, self.content_type, None, reason)
            data, self.base, self.skip_from = data[nl + 1 :], self.base + nl + 1, None
        if self.pending:
            data = self.pending + data
        framed = data.rfind(b"\n") + 1
        if framed:
            yield self.base, memoryview(data)[:framed]
            self.pending, self.base = data[framed:], self.base + framed
        else:
            self.pending = data
        if len(self.pending) > self.limit:
            self.skip_from, self.base, self.pending = self.base, self.base + len(self.pending), b""

    def close(self) -> Iterator[RawFrame]:
        if self.skip_from is not None:
            error = f"unexpected end: no newline after offset {self.skip_from}"
            yield RawFrame(self.journal, self.skip_from, self.base, self.content_type, None, error)
        elif self.pending:
            error = f"unexpected end: no newline after offset {self.base}"
            yield RawFrame(self.journal, self.base, self.base + len(self.pending), self.content_type, None, error)


def _line_runs(
    journal: str, ctype: str, begin: int, chunks: Iterator[tuple[int, bytes]], limit: int
) -> Iterator[RawFrame | LineRun]:
    blocks = LineBlocks(journal, ctype, begin, limit)
    for _, chunk in chunks:
        for item in blocks.feed(chunk):
            if isinstance(item, RawFrame):
                yield item
                continue
            pos, block = item
            lines = _SPLIT(block)
            lines.pop()  # the empty piece after the block's last newline
            if len(lines) <= RUN_LINES:
                yield LineRun(pos, lines, pos + len(block))
                continue
            for k in range(0, len(lines), RUN_LINES):
                run = lines[k : k + RUN_LINES]
                end = pos + sum(map(len, run)) + len(run)
                yield LineRun(pos, run, end)
                pos = end
    yield from blocks.close()


def _lines(journal: str, ctype: str, begin: int, chunks: Iterator[tuple[int, bytes]], limit: int) -> Iterator[RawFrame]:
    make = tuple.__new__  # a RawFrame without its Python-level __new__: this loop runs once per frame
    for item in _line_runs(journal, ctype, begin, chunks, limit):
        if type(item) is not LineRun:
            yield item  # type: ignore[misc]
            continue
        pos = item.begin
        for line in item.lines:
            end = pos + len(line) + 1
            yield make(RawFrame, (journal, pos, end, ctype, line + b"\n", None))
            pos = end


def _decoded(journal: str, ctype: str, begin: int, chunks: Iterator[tuple[int, bytes]]) -> Iterator[RawFrame]:
    decoder = framing_for(ctype).decoder(begin)
    buf, base = bytearray(), begin  # raw bytes from offset `base`, to slice each frame's bytes out of

    def row(item: Frame | FramingError) -> RawFrame:
        if isinstance(item, FramingError):
            return RawFrame(journal, item.begin, item.end, ctype, None, str(item))
        return RawFrame(journal, item.begin, item.end, ctype, bytes(buf[item.begin - base : item.end - base]), None)

    for _, chunk in chunks:
        buf += chunk
        for item in decoder.feed(chunk):
            yield row(item)
        # Frames never start before the last one reported: drop what lies behind it.
        done = max(0, min(len(buf), decoder.offset - base))
        if done:
            del buf[:done]
            base += done
    for item in decoder.close():
        yield row(item)
