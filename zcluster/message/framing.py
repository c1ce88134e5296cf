"""Framings: how messages are laid out in a journal's bytes, chosen by the journal's content type.

Each Framing marshals one message into one frame, and makes incremental Decoders that split a byte
stream (fed in chunks that may cut frames anywhere) into frames. A decoded frame carries its exact
byte range and a *record*: the parsed JSON value (ndjson), the list of fields (csv) or the payload
bytes (protobuf-fixed). Turning records into message objects is the reader's job, with a decode
function it is given or the framing's default one (registered by :mod:`zcluster.message.records`, which
sits above this module, for ndjson and csv).

Malformed input never loses what follows it. Decoders report problems as FramingError values, in
stream order among the frames, each naming the byte range it covers:

* DecodeError: a complete frame whose content is invalid (a bad JSON line, a bad CSV record). Exactly
  that frame is consumed; decoding resumes after it.
* DesyncError: bytes that are not a frame (garbage in a protobuf-fixed stream). They are skipped
  through to the next magic word, and reported once as one contiguous range.
* UnexpectedEndError: the stream ended (``close()``) inside a frame: never silently dropped.
"""

from __future__ import annotations

import csv
import json
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, ClassVar, NamedTuple

from zcluster.message.envelope import Message
from zcluster.message.errors import (
    DecodeError,
    DesyncError,
    FramingError,
    UnexpectedEndError,
    UnknownContentTypeError,
)

__all__ = [
    "CONTENT_TYPE_CSV",
    "CONTENT_TYPE_NDJSON",
    "CONTENT_TYPE_PROTO_FIXED",
    "FIXED_FRAME_HEADER_LENGTH",
    "FIXED_FRAME_WORD",
    "CsvFraming",
    "DecodeError",
    "DecodeFunc",
    "Decoder",
    "DesyncError",
    "FixedFraming",
    "Frame",
    "Framing",
    "FramingError",
    "JsonFraming",
    "UnexpectedEndError",
    "UnknownContentTypeError",
    "framing_for",
    "register_default_decode",
    "register_framing",
]

CONTENT_TYPE_NDJSON = "application/x-ndjson"
CONTENT_TYPE_CSV = "text/csv"
CONTENT_TYPE_PROTO_FIXED = "application/x-protobuf-fixed"

FIXED_FRAME_WORD = b"\x66\x33\x93\x36"
FIXED_FRAME_HEADER_LENGTH = 8  # Magic word, then a 4-byte little-endian payload length.


DecodeFunc = Callable[[Any], Message]
"""Turns a framing's record into a message (e.g. ``JsonMessage.from_json``)."""


class Frame(NamedTuple):
    begin: int  # Stream offset of the frame's first byte.
    end: int  # Stream offset just past its last byte.
    record: Any  # Framing-specific content: JSON value, list of CSV fields, or payload bytes.


Decoded = Frame | FramingError


class Decoder(ABC):
    """Incremental decoder of one byte stream starting at stream offset `offset`."""

    def __init__(self, offset: int = 0) -> None:
        self._buf = bytearray()
        self._base = offset  # Stream offset of self._buf[0].

    @property
    def offset(self) -> int:
        """Stream offset through which all bytes have been decoded or reported."""
        return self._base

    @property
    def pending(self) -> int:
        """Bytes fed but not yet part of a complete frame."""
        return len(self._buf)

    @abstractmethod
    def feed(self, chunk: bytes) -> list[Decoded]:
        """Consume the next `chunk` of the stream; return the frames and errors it completes, in order."""

    def close(self) -> list[Decoded]:
        """Mark the end of the stream: report trailing bytes that do not form a whole frame."""
        if not self._buf:
            return []
        begin, end = self._base, self._base + len(self._buf)
        self._buf.clear()
        self._base = end
        return [UnexpectedEndError(begin, end, "unexpected end of stream inside a frame")]


class Framing(ABC):
    """A message framing, registered by content type."""

    content_type: ClassVar[str]

    def default_decode(self) -> DecodeFunc | None:
        """The record-to-message function readers use when given none (None: they must be given one):
        the one registered for this content type with :func:`register_default_decode`."""
        return _default_decoders.get(self.content_type)

    @abstractmethod
    def marshal(self, msg: Message) -> bytes:
        """Return `msg` as exactly one frame. Raises TypeError if `msg` lacks this framing's method."""

    @abstractmethod
    def decoder(self, offset: int = 0) -> Decoder:
        """Return a Decoder for a stream whose first byte is at `offset`."""


class _LineDecoder(Decoder):
    """Splits at newlines; subclasses parse each complete line (which includes its newline)."""

    def __init__(self, offset: int = 0) -> None:
        super().__init__(offset)
        self._scan = 0  # Bytes of self._buf already searched for a terminator.

    def feed(self, chunk: bytes) -> list[Decoded]:
        buf = self._buf
        buf += chunk
        out: list[Decoded] = []
        pos = 0
        while True:
            nl = self._terminator(buf, pos, max(pos, self._scan))
            if nl < 0:
                break
            self._scan = 0
            item = self._parse(bytes(buf[pos : nl + 1]), self._base + pos)
            if item is not None:
                out.append(item)
            pos = nl + 1
        if pos:
            del buf[:pos]
            self._base += pos
        self._scan = len(buf)
        return out

    def _terminator(self, buf: bytearray, start: int, scan: int) -> int:
        return buf.find(b"\n", scan)

    @abstractmethod
    def _parse(self, line: bytes, begin: int) -> Decoded | None: ...


class _JsonDecoder(_LineDecoder):
    def _parse(self, line: bytes, begin: int) -> Decoded | None:
        try:
            return Frame(begin, begin + len(line), json.loads(line))
        except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors.
            return DecodeError(begin, begin + len(line), f"invalid JSON line at offset {begin}: {exc}")


class JsonFraming(Framing):
    """``application/x-ndjson``: one compact JSON document per line. Messages provide ``to_json()``."""

    content_type = CONTENT_TYPE_NDJSON

    def marshal(self, msg: Message) -> bytes:
        to_json = getattr(msg, "to_json", None)
        if to_json is None:
            raise TypeError(f"{msg!r} is not JSON-frameable (no to_json method)")
        return json.dumps(to_json(), separators=(",", ":"), ensure_ascii=False).encode() + b"\n"

    def decoder(self, offset: int = 0) -> Decoder:
        return _JsonDecoder(offset)


class _CsvDecoder(_LineDecoder):
    def __init__(self, offset: int = 0) -> None:
        super().__init__(offset)
        self._width: int | None = None

    def _terminator(self, buf: bytearray, start: int, scan: int) -> int:
        # A newline ends the record only outside quotes: an even count of quotes precedes it
        # (RFC 4180 escapes a quote inside a quoted field by doubling it, which keeps the parity).
        nl = buf.find(b"\n", scan)
        while nl >= 0 and buf.count(b'"', start, nl) % 2:
            nl = buf.find(b"\n", nl + 1)
        return nl

    def _parse(self, line: bytes, begin: int) -> Decoded | None:
        end = begin + len(line)
        if line in (b"\n", b"\r\n"):
            return None  # Blank lines carry no record (as Go's encoding/csv skips them).
        try:
            fields = next(csv.reader([line.decode()], strict=True))
        except (csv.Error, UnicodeDecodeError, StopIteration) as exc:
            return DecodeError(begin, end, f"invalid CSV record at offset {begin}: {exc}")
        if self._width is None:
            self._width = len(fields)
        elif len(fields) != self._width:
            return DecodeError(
                begin, end, f"CSV record at offset {begin} has {len(fields)} fields, expected {self._width}"
            )
        return Frame(begin, end, fields)


def _csv_field(field: str) -> str:
    # Quote exactly when Go's encoding/csv Writer does, so both produce the same bytes.
    if field == "":
        return field
    if field == "\\." or any(c in field for c in ',"\r\n') or field[0].isspace():
        return '"' + field.replace('"', '""') + '"'
    return field


class CsvFraming(Framing):
    """``text/csv``: RFC 4180 records ending in "\\n". The field count of a stream is fixed by the
    first record a decoder sees. Messages provide ``to_csv() -> list[str]``."""

    content_type = CONTENT_TYPE_CSV

    def marshal(self, msg: Message) -> bytes:
        to_csv = getattr(msg, "to_csv", None)
        if to_csv is None:
            raise TypeError(f"{msg!r} is not CSV-frameable (no to_csv method)")
        return (",".join(_csv_field(f) for f in to_csv()) + "\n").encode()

    def decoder(self, offset: int = 0) -> Decoder:
        return _CsvDecoder(offset)


class _FixedDecoder(Decoder):
    def __init__(self, offset: int = 0) -> None:
        super().__init__(offset)
        self._desync_begin = -1  # Stream offset where skipped bytes began, or -1.

    def feed(self, chunk: bytes) -> list[Decoded]:
        buf = self._buf
        buf += chunk
        out: list[Decoded] = []
        pos = 0
        n = len(buf)
        while n - pos >= FIXED_FRAME_HEADER_LENGTH:
            if buf[pos : pos + 4] != FIXED_FRAME_WORD:
                j = buf.find(FIXED_FRAME_WORD, pos + 1)
                if self._desync_begin < 0:
                    self._desync_begin = self._base + pos
                if j < 0:
                    pos = n - 3  # Keep a possible partial magic word.
                    break
                out.append(DesyncError(self._desync_begin, self._base + j, "skipped bytes between frames"))
                self._desync_begin = -1
                pos = j
                continue
            if self._desync_begin >= 0:
                out.append(DesyncError(self._desync_begin, self._base + pos, "skipped bytes between frames"))
                self._desync_begin = -1
            size = FIXED_FRAME_HEADER_LENGTH + int.from_bytes(buf[pos + 4 : pos + 8], "little")
            if n - pos < size:
                break
            out.append(Frame(self._base + pos, self._base + pos + size, bytes(buf[pos + 8 : pos + size])))
            pos += size
        if pos:
            del buf[:pos]
            self._base += pos
        return out

    def close(self) -> list[Decoded]:
        if self._desync_begin >= 0:
            begin, end = self._desync_begin, self._base + len(self._buf)
            self._desync_begin = -1
            self._buf.clear()
            self._base = end
            return [DesyncError(begin, end, "skipped bytes at the end of the stream")]
        if self._buf == b"\n":
            # A lone trailing newline is tolerated, as Gazette does (a relic of line-oriented tools).
            self._buf.clear()
            self._base += 1
            return []
        return super().close()


class FixedFraming(Framing):
    """``application/x-protobuf-fixed``: magic word 66 33 93 36, payload length as 4 bytes little-endian,
    payload. Messages provide ``to_bytes()`` (e.g. a serialized protobuf)."""

    content_type = CONTENT_TYPE_PROTO_FIXED

    def marshal(self, msg: Message) -> bytes:
        to_bytes = getattr(msg, "to_bytes", None)
        if to_bytes is None:
            raise TypeError(f"{msg!r} is not fixed-frameable (no to_bytes method)")
        payload: bytes = to_bytes()
        if len(payload) > 0xFFFFFFFF:
            raise ValueError(f"payload of {len(payload)} bytes exceeds the 4-byte frame length")
        return FIXED_FRAME_WORD + len(payload).to_bytes(4, "little") + payload

    def decoder(self, offset: int = 0) -> Decoder:
        return _FixedDecoder(offset)


_registry: dict[str, Framing] = {}
_default_decoders: dict[str, DecodeFunc] = {}


def register_framing(framing: Framing) -> None:
    """Register `framing` under its content type, replacing any earlier one."""
    _registry[framing.content_type] = framing


def register_default_decode(content_type: str, decode: DecodeFunc) -> None:
    """Make `decode` the default record-to-message function of `content_type`'s framing, replacing any
    earlier one. :mod:`zcluster.message.records` registers ``JsonMessage.from_json`` (ndjson) and
    ``CsvRecord.from_csv`` (csv) when imported, which importing any module of the package does."""
    _default_decoders[content_type] = decode


def framing_for(content_type: str) -> Framing:
    """Return the Framing of `content_type`; UnknownContentTypeError if none is registered."""
    try:
        return _registry[content_type]
    except KeyError:
        raise UnknownContentTypeError(f"unrecognized content-type ({content_type})") from None


for _f in (JsonFraming(), CsvFraming(), FixedFraming()):
    register_framing(_f)
