"""A journal's byte range as raw frames: the unit the exactly-once applier and the Spark source share.

A :class:`RawFrame` is one frame's bytes and offsets, not yet decoded into a message, or an error row for
bytes that did not frame (a desync or a torn frame, reported with its range instead of being dropped).
ndjson is only split at newlines here (the applier parses each line once and reports a line that is not
JSON with its offsets); other content types go through their framing's decoder.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

from zcluster.message.errors import FramingError
from zcluster.message.framing import CONTENT_TYPE_NDJSON, Frame, framing_for
from zcluster.message.journals import JournalReader

__all__ = ["RawFrame", "read_frames"]


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


def _clipped(chunks: Iterator[tuple[int, bytes]], end: int) -> Iterator[tuple[int, bytes]]:
    for begin, chunk in chunks:
        if begin >= end:
            return
        yield begin, chunk[: end - begin]
        if begin + len(chunk) >= end:
            return


def _lines(journal: str, ctype: str, begin: int, chunks: Iterator[tuple[int, bytes]], limit: int) -> Iterator[RawFrame]:
    pending, base = b"", begin  # bytes not yet framed; `data` below starts at offset `base`
    skip_from: int | None = None  # start of a line longer than `limit`, whose bytes are dropped as they come
    for _, chunk in chunks:
        data = pending + chunk if pending else chunk
        start = 0
        while (nl := data.find(b"\n", start)) >= 0:
            if skip_from is not None:
                reason = f"line longer than the maximum frame size ({limit} bytes)"
                yield RawFrame(journal, skip_from, base + nl + 1, ctype, None, reason)
                skip_from = None
            else:
                yield RawFrame(journal, base + start, base + nl + 1, ctype, data[start : nl + 1], None)
            start = nl + 1
        if skip_from is None and len(data) - start > limit:
            skip_from = base + start
        if skip_from is not None:
            pending, base = b"", base + len(data)
        else:
            pending, base = data[start:], base + start
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
