"""A journal's byte range as raw frames: the unit the exactly-once applier and the Spark source share.

A :class:`RawFrame` is one frame's bytes and offsets, not yet decoded into a message, or an error row for
bytes that did not frame (a desync or a torn frame, reported with its range instead of being dropped).
ndjson is only split at newlines here (the applier parses each line once and reports a line that is not
JSON with its offsets); other content types go through their framing's decoder.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

from zcluster.message.errors import FramingError, JournalError
from zcluster.message.framing import CONTENT_TYPE_NDJSON, Frame, framing_for
from zcluster.message.journals import JournalReader

__all__ = ["RawFrame", "read_frames", "read_range", "read_range_frames"]


class RawFrame(NamedTuple):
    """Bytes [begin, end) of ``journal``: one frame (``data``) or bytes that did not frame (``error``)."""

    journal: str
    begin: int
    end: int
    content_type: str
    data: bytes | None
    error: str | None


def read_frames(store: JournalReader, journal: str, content_type: str, begin: int, end: int) -> Iterator[RawFrame]:
    """The frames of bytes [begin, end) of ``journal``, in offset order; ``begin`` and ``end`` must be
    frame boundaries (journal ends and checkpoint offsets are)."""
    chunks = _clipped(store.read(journal, begin), end)
    if content_type == CONTENT_TYPE_NDJSON:
        return _lines(journal, content_type, begin, chunks, framing_for(content_type).max_frame_bytes)
    return _decoded(journal, content_type, begin, chunks)


def read_range_frames(
    store: JournalReader, journal: str, content_type: str, begin: int, end: int
) -> Iterator[RawFrame]:
    """As :func:`read_frames`, over a range planned earlier: all its bytes or an error, never fewer
    (see :func:`read_range`)."""
    return read_frames(_RangeReader(store, end), journal, content_type, begin, end)


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


def _lines(journal: str, ctype: str, begin: int, chunks: Iterator[tuple[int, bytes]], limit: int) -> Iterator[RawFrame]:
    make = tuple.__new__  # a RawFrame without its Python-level __new__: this loop runs once per frame
    pending, base = b"", begin  # bytes not yet framed; `data` below starts at offset `base`
    skip_from: int | None = None  # start of a line longer than `limit`, whose bytes are dropped as they come
    for _, chunk in chunks:
        data = pending + chunk if pending else chunk
        lines = data.split(b"\n")
        tail = lines.pop()
        pos = base
        for line in lines:
            end = pos + len(line) + 1
            if skip_from is not None:
                reason = f"line longer than the maximum frame size ({limit} bytes)"
                yield make(RawFrame, (journal, skip_from, end, ctype, None, reason))
                skip_from = None
            else:
                yield make(RawFrame, (journal, pos, end, ctype, line + b"\n", None))
            pos = end
        if skip_from is None and len(tail) > limit:
            skip_from = pos
        if skip_from is not None:
            pending, base = b"", pos + len(tail)
        else:
            pending, base = tail, pos
    if skip_from is not None:
        yield RawFrame(journal, skip_from, base, ctype, None, f"unexpected end: no newline after offset {skip_from}")
    elif pending:
        yield RawFrame(
            journal, base, base + len(pending), ctype, None, f"unexpected end: no newline after offset {base}"
        )


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
