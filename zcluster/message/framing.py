"""Framings: how messages are laid out in a journal's bytes, chosen by the journal's content type.

Why this module is long: it holds the three framings and their incremental decoders, and the CSV decoder
is a resumable RFC 4180 parser (Go ``encoding/csv`` rules) that must bound the damage of a bad quote.

Each Framing marshals one message into one frame, and makes incremental Decoders that split a byte
stream (fed in chunks that may cut frames anywhere) into frames. A decoded frame carries its exact
byte range and a *record*: the parsed JSON value (ndjson), the list of fields (csv) or the payload
bytes (protobuf-fixed). Turning records into message objects is the reader's job, with a decode
function it is given or the framing's default one (registered by :mod:`zcluster.message.records`, which
sits above this module, for ndjson and csv).

Every framing has a maximum frame size, ``max_frame_bytes`` (default :data:`DEFAULT_MAX_FRAME_BYTES`,
64 MiB; the frame's bytes with its newline or header): ``marshal`` refuses a bigger frame (ValueError,
nothing is appended), and a decoder never buffers more than that for one frame, whatever the input.

Malformed input never loses what follows it. Decoders report problems as FramingError values, in
stream order among the frames, each naming the byte range it covers. The outcome does not depend on
how the stream is cut into chunks.

* DecodeError: a complete frame whose content is invalid (a bad JSON line, a bad CSV record) or that
  is longer than the maximum. Exactly that frame is consumed; decoding resumes after it.
* DesyncError: bytes that are not a frame (garbage in a protobuf-fixed stream, or a header whose length
  exceeds the maximum). They are skipped through to the next magic word, and reported once as one
  contiguous range.
* UnexpectedEndError: the stream ended (``close()``) inside a frame: never silently dropped.

What "a frame" is when the input is bad:

* ndjson: a line. A line longer than the maximum is one DecodeError (its bytes are not buffered).
* csv: a record, delimited by RFC 4180 quoting as Go's ``encoding/csv`` reads it: a quote inside an
  unquoted field or a quoted field's closing quote followed by anything but ``,`` or the line end is bad
  quoting. A record with bad quoting ends at the first newline at or after the start of the field whose
  quoting broke (for an unterminated quote: the first newline after it), so a stray quote costs its own
  line and never the records after it. A record still unresolved after ``max_frame_bytes`` (e.g. a quote
  that never closes) is bad the same way; a quoted field still open when the stream ends is bad too if a
  newline follows its opening quote (otherwise the stream was merely cut: UnexpectedEndError). A record
  with invalid UTF-8 or the wrong field count is one DecodeError covering the whole record.
* protobuf-fixed: magic word and length. A length over the maximum makes the header garbage (skipped up
  to the next magic word). A frame whose length runs past the end of the stream (``close()``) while a
  magic word follows its header is taken for a corrupt header too: skipped up to that magic word, and
  decoding goes on there; without a later magic word it is an UnexpectedEndError. A corrupt length that
  is within the maximum and the stream cannot be told from a real one (the format has no checksum): that
  frame then covers the bytes it claims, and decoding resynchronises after it.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, ClassVar, NamedTuple

from zcluster.errors import ConfigError
from zcluster.message.envelope import Message
from zcluster.message.errors import (
    DecodeError,
    DesyncError,
    FrameTooLargeError,
    FramingError,
    UnexpectedEndError,
    UnknownContentTypeError,
)

__all__ = [
    "CONTENT_TYPE_CSV",
    "CONTENT_TYPE_NDJSON",
    "CONTENT_TYPE_PROTO_FIXED",
    "DEFAULT_MAX_FRAME_BYTES",
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

DEFAULT_MAX_FRAME_BYTES = 64 << 20
"""The default largest frame (bytes, newline or header included) a framing writes or decodes."""


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
        """Stream offset of the first byte still buffered: every byte before it was decoded, reported,
        or skipped as part of a bad frame that is reported once its end is found."""
        return self._base

    @property
    def pending(self) -> int:
        """Bytes fed but not yet part of a complete frame (never much more than the maximum frame size)."""
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
    """A message framing, registered by content type. `max_frame_bytes` bounds the frames it writes and
    decodes (see the module docstring); a value too small for any frame is a ConfigError."""

    content_type: ClassVar[str]
    min_frame_bytes: ClassVar[int] = 1

    def __init__(self, *, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        if max_frame_bytes < self.min_frame_bytes:
            raise ConfigError(f"max_frame_bytes must be at least {self.min_frame_bytes}, got {max_frame_bytes}")
        self.max_frame_bytes = max_frame_bytes

    def default_decode(self) -> DecodeFunc | None:
        """The record-to-message function readers use when given none (None: they must be given one):
        the one registered for this content type with :func:`register_default_decode`."""
        return _default_decoders.get(self.content_type)

    @abstractmethod
    def marshal(self, msg: Message) -> bytes:
        """Return `msg` as exactly one frame. Raises TypeError if `msg` lacks this framing's method, and
        ValueError if the frame would exceed ``max_frame_bytes``."""

    @abstractmethod
    def decoder(self, offset: int = 0) -> Decoder:
        """Return a Decoder for a stream whose first byte is at `offset`."""

    def _bounded(self, frame: bytes) -> bytes:
        self._check_size(len(frame))
        return frame

    def _check_size(self, size: int) -> None:
        if size > self.max_frame_bytes:
            raise FrameTooLargeError(
                f"{self.content_type} frame of {size} bytes exceeds max_frame_bytes ({self.max_frame_bytes}); "
                "nothing was appended"
            )


# -- ndjson ------------------------------------------------------------------------------------------


class _JsonDecoder(Decoder):
    def __init__(self, offset: int, max_bytes: int) -> None:
        super().__init__(offset)
        self._max = max_bytes
        self._scan = 0  # Bytes of self._buf already searched for a newline.
        self._skip = -1  # Stream offset of an over-long line whose newline is awaited (its bytes are dropped).

    def feed(self, chunk: bytes) -> list[Decoded]:
        out: list[Decoded] = []
        if self._skip >= 0:
            nl = chunk.find(b"\n")
            if nl < 0:
                self._base += len(chunk)
                return out
            self._base += nl + 1
            out.append(self._too_long(self._skip, self._base))
            self._skip = -1
            chunk = chunk[nl + 1 :]
        buf = self._buf
        buf += chunk
        pos, maxb = 0, self._max
        while (nl := buf.find(b"\n", max(pos, self._scan))) >= 0:
            self._scan = 0
            begin = self._base + pos
            if nl + 1 - pos > maxb:
                out.append(self._too_long(begin, begin + nl + 1 - pos))
            else:
                line = bytes(buf[pos : nl + 1])
                try:
                    out.append(Frame(begin, begin + len(line), json.loads(line)))
                except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors.
                    out.append(DecodeError(begin, begin + len(line), f"invalid JSON line at offset {begin}: {exc}"))
            pos = nl + 1
        if len(buf) - pos >= maxb:  # A line that cannot fit: drop its bytes, report it at its newline.
            self._skip = self._base + pos
            self._base += len(buf)
            buf.clear()
            self._scan = 0
            return out
        if pos:
            del buf[:pos]
            self._base += pos
        self._scan = len(buf)
        return out

    def _too_long(self, begin: int, end: int) -> DecodeError:
        return DecodeError(begin, end, f"line at offset {begin} is longer than max_frame_bytes ({self._max})")

    def close(self) -> list[Decoded]:
        if self._skip >= 0:
            begin, self._skip = self._skip, -1
            reason = f"line at offset {begin} is longer than max_frame_bytes ({self._max}), cut off"
            return [DecodeError(begin, self._base, reason)]
        return super().close()


class JsonFraming(Framing):
    """``application/x-ndjson``: one compact JSON document per line. Messages provide ``to_json()``."""

    content_type = CONTENT_TYPE_NDJSON

    def marshal(self, msg: Message) -> bytes:
        to_json = getattr(msg, "to_json", None)
        if to_json is None:
            raise TypeError(f"{msg!r} is not JSON-frameable (no to_json method)")
        return self._bounded(json.dumps(to_json(), separators=(",", ":"), ensure_ascii=False).encode() + b"\n")

    def decoder(self, offset: int = 0) -> Decoder:
        return _JsonDecoder(offset, self.max_frame_bytes)


# -- csv ---------------------------------------------------------------------------------------------

_QUOTE, _COMMA, _LF, _CR = 0x22, 0x2C, 0x0A, 0x0D
_BAD_QUOTE = 'extraneous or missing " in quoted field'
_BARE_QUOTE = 'bare " in non-quoted field'


class _CsvDecoder(Decoder):
    """A resumable parser of one record at a time (buffer index ``_rs``), keeping its progress across feeds."""

    def __init__(self, offset: int, max_bytes: int) -> None:
        super().__init__(offset)
        self._max = max_bytes
        self._width: int | None = None
        self._skip: tuple[int, str] | None = None  # (stream begin, reason) of a bad record awaiting its newline
        self._rs = 0  # Buffer index where the current record starts.
        self._eol = -1  # Buffer index of a known newline (valid while >= the parse position).
        self._eol_scan = 0  # Buffer index up to which no newline follows the parse position.
        self._start_record()

    def _start_record(self) -> None:
        self._fields: list[bytes] = []
        self._pos = self._rs  # Start of the field being parsed (its opening quote, if quoted).
        self._fscan = self._rs  # How far the unquoted field at _pos was searched (no comma, quote or newline).
        self._quoted: list[bytes] | None = None  # Content pieces of the open quoted field.
        self._qpos = 0  # Where the search for its closing quote resumes.

    def feed(self, chunk: bytes) -> list[Decoded]:
        out: list[Decoded] = []
        if self._skip is not None:
            nl = chunk.find(b"\n")
            if nl < 0:
                self._base += len(chunk)
                return out
            self._base += nl + 1
            begin, reason = self._skip
            self._skip = None
            out.append(DecodeError(begin, self._base, f"invalid CSV record at offset {begin}: {reason}"))
            chunk = chunk[nl + 1 :]
        self._buf += chunk
        self._run(out, final=False)
        return out

    def close(self) -> list[Decoded]:
        out: list[Decoded] = []
        if self._skip is not None:
            begin, reason = self._skip
            self._skip = None
            out.append(DecodeError(begin, self._base, f"invalid CSV record at offset {begin}: {reason}, cut off"))
            return out
        self._run(out, final=True)
        return out + super().close()

    def _run(self, out: list[Decoded], final: bool) -> None:
        buf = self._buf
        while (step := self._step(final)) is not None:
            rs = self._rs
            begin = self._base + rs
            item: Decoded | None = None
            if isinstance(step, int):  # a well-quoted record, or a blank line (no fields)
                end = step
                if self._fields:
                    item = self._record(begin, self._base + end)
            elif step:  # bad quoting: the record ends at its first newline
                end = buf.find(b"\n", rs) + 1
                if not end and not final:  # its newline is yet to come: drop its bytes until then
                    self._skip = (begin, step)
                    self._base += len(buf)
                    buf.clear()
                    self._rs, self._eol, self._eol_scan = 0, -1, 0
                    self._start_record()
                    return
                end = end or len(buf)
                item = DecodeError(begin, self._base + end, f"invalid CSV record at offset {begin}: {step}")
            else:  # the stream ended inside a record not known to be bad
                end = len(buf)
                item = UnexpectedEndError(begin, self._base + end, "unexpected end of stream inside a frame")
            if isinstance(item, DecodeError) and (nl := buf.find(b"\n", rs, end - 1)) >= 0:
                # A bad record spanning lines (its quotes may pair a stray quote with a later one) is cut
                # at its first newline too: the lines after it are decoded as records.
                end = nl + 1
                item = DecodeError(begin, self._base + end, item.reason)
            if item is not None:
                out.append(item)
            if isinstance(item, DecodeError):
                self._eol, self._eol_scan = -1, end  # the parse may have gone past a bad record's end
            self._rs = end
            self._start_record()
        rs = self._rs
        if rs:
            del buf[:rs]
            self._base += rs
            self._rs = 0
            self._pos -= rs
            self._fscan -= rs
            self._qpos -= rs
            self._eol -= rs
            self._eol_scan = max(self._eol_scan - rs, 0)

    def _record(self, begin: int, end: int) -> Decoded:
        try:
            fields = [f.decode() for f in self._fields]
        except UnicodeDecodeError as exc:
            return DecodeError(begin, end, f"invalid CSV record at offset {begin}: {exc}")
        if self._width is None:
            self._width = len(fields)
        elif len(fields) != self._width:
            return DecodeError(
                begin, end, f"CSV record at offset {begin} has {len(fields)} fields, expected {self._width}"
            )
        return Frame(begin, end, fields)

    def _step(self, final: bool) -> int | str | None:
        """Parse on from the saved state. None: more bytes are needed. An int: a well-quoted record (or a
        blank line) ends at that buffer index. A str: the record's quoting is bad, for that reason (""
        if the stream merely ended inside the record)."""
        buf = self._buf
        rs = self._rs
        if rs >= len(buf) and not self._fields and self._quoted is None:
            return None  # nothing of a record buffered
        hi = min(len(buf), rs + self._max)  # A record resolves within its first max bytes, or it is bad.
        limited = hi == rs + self._max
        while True:
            p = self._pos
            if self._quoted is None:
                if p >= hi:
                    return self._unresolved(limited, final, False)
                if buf[p] == _QUOTE:
                    self._quoted, self._qpos = [], p + 1
                    continue
                nl = self._newline(p, hi)
                stop = nl if nl >= 0 else hi
                start = max(p, self._fscan)
                comma = buf.find(b",", start, stop)
                if buf.find(b'"', start, stop if comma < 0 else comma) >= 0:
                    return _BARE_QUOTE
                if comma >= 0:
                    self._fields.append(bytes(buf[p:comma]))
                    self._pos = self._fscan = comma + 1
                    continue
                if nl < 0:
                    self._fscan = hi
                    return self._unresolved(limited, final, False)
                field = bytes(buf[p : nl - 1] if nl > p and buf[nl - 1] == _CR else buf[p:nl])
                if field or self._fields or p != rs:  # a line holding only "\n" or "\r\n" is blank: skipped
                    self._fields.append(field)
                return nl + 1
            k = buf.find(b'"', self._qpos, hi)
            if k < 0:
                self._quoted.append(bytes(buf[self._qpos : hi]))
                self._qpos = hi
                return self._unresolved(limited, final, True)
            if k + 1 >= hi:  # at the end of the stream, a closing quote: the record only lacks its newline
                return self._unresolved(limited, final, False)
            nxt = buf[k + 1]
            if nxt == _QUOTE:
                self._quoted += (bytes(buf[self._qpos : k]), b'"')
                self._qpos = k + 2
                continue
            if nxt == _CR:
                if k + 2 >= hi:
                    return self._unresolved(limited, final, False)
                nxt = _LF if buf[k + 2] == _LF else _CR
            if nxt not in (_COMMA, _LF):
                return _BAD_QUOTE
            self._quoted.append(bytes(buf[self._qpos : k]))
            self._fields.append(b"".join(self._quoted).replace(b"\r\n", b"\n"))  # Go normalises line ends
            self._quoted = None
            if nxt == _COMMA:
                self._pos = self._fscan = k + 2
                continue
            return k + 2 if buf[k + 1] == _LF else k + 3

    def _unresolved(self, limited: bool, final: bool, quoted: bool) -> str | None:
        if limited:
            return f"record longer than max_frame_bytes ({self._max})"
        if not final:
            return None
        if quoted and self._buf.find(b"\n", self._pos) >= 0:
            return "quoted field not closed before the end of the stream"
        return ""

    def _newline(self, p: int, hi: int) -> int:
        """Index of the first newline in [p, hi), or -1; remembers how far it looked."""
        if self._eol >= p:
            return self._eol if self._eol < hi else -1
        nl = self._buf.find(b"\n", max(p, self._eol_scan), hi)
        if nl < 0:
            self._eol_scan = hi
        else:
            self._eol = nl
        return nl


def _csv_field(field: str) -> str:
    # Quote exactly when Go's encoding/csv Writer does, so both produce the same bytes.
    if field == "":
        return field
    if field == "\\." or any(c in field for c in ',"\r\n') or field[0].isspace():
        return '"' + field.replace('"', '""') + '"'
    return field


class CsvFraming(Framing):
    """``text/csv``: RFC 4180 records ending in "\\n", read as Go's ``encoding/csv`` reads them. The field
    count of a stream is fixed by the first record a decoder sees. Messages provide ``to_csv() -> list[str]``."""

    content_type = CONTENT_TYPE_CSV

    def marshal(self, msg: Message) -> bytes:
        to_csv = getattr(msg, "to_csv", None)
        if to_csv is None:
            raise TypeError(f"{msg!r} is not CSV-frameable (no to_csv method)")
        return self._bounded((",".join(_csv_field(f) for f in to_csv()) + "\n").encode())

    def decoder(self, offset: int = 0) -> Decoder:
        return _CsvDecoder(offset, self.max_frame_bytes)


# -- protobuf-fixed ----------------------------------------------------------------------------------


class _FixedDecoder(Decoder):
    def __init__(self, offset: int, max_bytes: int) -> None:
        super().__init__(offset)
        self._max_payload = max_bytes - FIXED_FRAME_HEADER_LENGTH
        self._desync_begin = -1  # Stream offset where skipped bytes began, or -1.

    def feed(self, chunk: bytes) -> list[Decoded]:
        self._buf += chunk
        out: list[Decoded] = []
        self._decode(out)
        return out

    def _decode(self, out: list[Decoded]) -> None:
        buf = self._buf
        pos, n, base, maxp = 0, len(buf), self._base, self._max_payload
        while n - pos >= FIXED_FRAME_HEADER_LENGTH:
            if buf[pos : pos + 4] != FIXED_FRAME_WORD or int.from_bytes(buf[pos + 4 : pos + 8], "little") > maxp:
                # Not a frame header (garbage, or a length over the maximum): skip to the next magic word.
                if self._desync_begin < 0:
                    self._desync_begin = base + pos
                j = buf.find(FIXED_FRAME_WORD, pos + 1)
                pos = max(pos + 1, n - 3) if j < 0 else j  # Keep a possible partial magic word.
                continue
            if self._desync_begin >= 0:
                out.append(DesyncError(self._desync_begin, base + pos, "skipped bytes between frames"))
                self._desync_begin = -1
            end = pos + FIXED_FRAME_HEADER_LENGTH + int.from_bytes(buf[pos + 4 : pos + 8], "little")
            if end > n:
                break
            out.append(Frame(base + pos, base + end, bytes(buf[pos + FIXED_FRAME_HEADER_LENGTH : end])))
            pos = end
        if pos:
            del buf[:pos]
            self._base += pos

    def close(self) -> list[Decoded]:
        out: list[Decoded] = []
        buf = self._buf
        # The stream ends inside a frame whose header is whole: if a magic word follows the header, the
        # length was corrupt; skip to that word and decode on (the header starts the buffer here).
        while len(buf) >= FIXED_FRAME_HEADER_LENGTH and self._desync_begin < 0:
            j = buf.find(FIXED_FRAME_WORD, 1)
            if j < 0:
                break
            self._desync_begin = self._base
            del buf[:j]
            self._base += j
            self._decode(out)
        if self._desync_begin >= 0:
            begin, end = self._desync_begin, self._base + len(buf)
            self._desync_begin = -1
            buf.clear()
            self._base = end
            return [*out, DesyncError(begin, end, "skipped bytes at the end of the stream")]
        if buf == b"\n":
            # A lone trailing newline is tolerated, as Gazette does (a relic of line-oriented tools).
            buf.clear()
            self._base += 1
            return out
        return out + super().close()


class FixedFraming(Framing):
    """``application/x-protobuf-fixed``: magic word 66 33 93 36, payload length as 4 bytes little-endian,
    payload. Messages provide ``to_bytes()`` (e.g. a serialized protobuf)."""

    content_type = CONTENT_TYPE_PROTO_FIXED
    min_frame_bytes = FIXED_FRAME_HEADER_LENGTH

    def __init__(self, *, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        super().__init__(max_frame_bytes=max_frame_bytes)
        if max_frame_bytes > FIXED_FRAME_HEADER_LENGTH + 0xFFFFFFFF:
            raise ConfigError(f"max_frame_bytes {max_frame_bytes} exceeds what a 4-byte frame length can say")

    def marshal(self, msg: Message) -> bytes:
        to_bytes = getattr(msg, "to_bytes", None)
        if to_bytes is None:
            raise TypeError(f"{msg!r} is not fixed-frameable (no to_bytes method)")
        payload: bytes = to_bytes()
        self._check_size(FIXED_FRAME_HEADER_LENGTH + len(payload))
        return FIXED_FRAME_WORD + len(payload).to_bytes(4, "little") + payload

    def decoder(self, offset: int = 0) -> Decoder:
        return _FixedDecoder(offset, self.max_frame_bytes)


_registry: dict[str, Framing] = {}
_default_decoders: dict[str, DecodeFunc] = {}


def register_framing(framing: Framing) -> None:
    """Register `framing` under its content type, replacing any earlier one (e.g. to change the maximum
    frame size of a content type: ``register_framing(FixedFraming(max_frame_bytes=256 << 20))``)."""
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
