"""Frames into envelopes: the decode step of the exactly-once path (frame bytes -> record -> message ->
:class:`Envelope`), one frame at a time or a run of ndjson lines at once.

A frame that does not decode is logged (with its journal and byte range) and comes out as None: the
stream goes on after it. :meth:`FrameDecoder.lines` gives exactly what :meth:`FrameDecoder.frame` gives for
each line of the run; it only saves the per-message calls when the messages are the default
:class:`JsonMessage` (its checks and its UUID parsing inline, once per line, in one loop).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any, Final

from zcluster.message.envelope import Envelope
from zcluster.message.framing import FramingError, JsonFraming, framing_for
from zcluster.message.records import JsonMessage
from zcluster.message.uuid import ZERO_UUID, bytes16

__all__ = ["FrameDecoder"]

log = logging.getLogger(__name__)

_UNPARSED: Any = object()  # "no record": the framing's decoder parses the frame instead


def _lenient(data: bytes) -> Any:
    """The record by json's rules (where orjson is stricter: NaN, Infinity, 1e400), else _UNPARSED."""
    try:
        return json.loads(data.decode())  # str: json.loads(bytes) sniffs the encoding first
    except ValueError:  # includes UnicodeDecodeError
        return _UNPARSED


def _fastest_loads() -> Callable[[bytes], Any]:
    """orjson's loads (the spark extra), which parses a frame in a third of the time; else _lenient, which
    returns _UNPARSED rather than raise."""
    try:
        from orjson import loads
    except ImportError:
        return _lenient
    return loads


_loads: Final = _fastest_loads()  # Final: compiled (zcluster._native), a C static, not a dict lookup per line

_ACK_HEAD: Final = b'{"UUID":"'


def _ack_text(line: bytes) -> str | None:
    """The 36 characters of ``line`` when it is exactly ``{"UUID":"<36 ASCII characters>"}`` (an
    acknowledgement as a JSON publisher writes it), else None. The reference of the compiled build's C twin
    (:mod:`zcluster.message._uuidhex`), and the path without it."""
    if len(line) != 47 or line[:9] != _ACK_HEAD or line[45:] != b'"}':
        return None
    body = line[9:45]
    return body.decode("ascii") if body.isascii() else None


def _fastest_ack_text() -> Callable[[bytes], str | None]:
    """As uuid.bytes16: the C twin when the compiled build is in use, else the reference."""
    try:
        from zcluster.message._uuidhex import ack_text
    except ImportError:
        return _ack_text
    return ack_text


_ACK_TEXT: Final = _fastest_ack_text()


class FrameDecoder:
    """Decodes frames of ``journal`` (content type ``content_type``) into envelopes with ``decode`` (record ->
    message; None: the framing's default, e.g. ``JsonMessage.from_json`` for ndjson). Frames that do not
    decode are reported on ``logger`` (e.g. the applier's own)."""

    def __init__(
        self, journal: str, content_type: str, decode: Callable[[Any], Any] | None, logger: logging.Logger = log
    ) -> None:
        self.journal, self.content_type, self.log = journal, content_type, logger
        framing = framing_for(content_type)
        self.decode = decode or framing.default_decode()
        # One-line JSON frames are parsed here (the framing's decoder only reports what this cannot parse).
        self.fast = self.decode is not None and type(framing) is JsonFraming
        # Default JsonMessages: built inline by lines() (a subclass's from_json or __init__ may do more).
        self.json_messages = self.fast and self.decode == JsonMessage.from_json

    def frame(self, begin: int, end: int, data: bytes | bytearray | None) -> Envelope | None:
        """The envelope of the frame ``data`` at bytes [begin, end), or None (logged) if it is not exactly one
        decodable frame or its record is not a message (``decode`` raised ValueError or TypeError)."""
        if type(data) is not bytes:
            data = bytes(data or b"")
        record, decode = _UNPARSED, self.decode
        if self.fast and data.find(b"\n") == len(data) - 1:
            # Fast path, same result as the decoder below: exactly one newline-terminated line.
            try:
                record = _loads(data)
            except ValueError:
                record = _lenient(data)
        if record is _UNPARSED or decode is None:  # the decoder reports what the fast path did not parse
            decoder = framing_for(self.content_type).decoder(begin)
            items = decoder.feed(data) + decoder.close()
            frames = [i for i in items if not isinstance(i, FramingError)]
            if len(frames) != 1 or decode is None:
                self.log.error("journal %s bytes %d..%d: not exactly one decodable frame", self.journal, begin, end)
                return None
            record = frames[0].record
        try:
            message = decode(record)
        except (ValueError, TypeError) as exc:  # e.g. an unknown message kind: reported, the stream goes on
            self.log.error("journal %s offset %d: undecodable message: %s", self.journal, begin, exc)
            return None
        return Envelope(self.journal, begin, end, message)

    def lines(self, begin: int, lines: list[bytes]) -> list[Envelope | None]:
        """:meth:`frame` of each of ``lines`` (ndjson frames without their newlines, the first at offset
        ``begin``, each ``len(line) + 1`` bytes long), in order."""
        out: list[Envelope | None] = []
        journal, pos = self.journal, begin  # out.append, not a bound local: a C call once compiled
        if not self.json_messages:
            for line in lines:
                end = pos + len(line) + 1
                out.append(self.frame(pos, end, line + b"\n"))
                pos = end
            return out
        key = JsonMessage.uuid_key
        acks = key == "UUID"  # the acknowledgement line's shape (see _ack_text) names that key
        for line in lines:
            end = pos + len(line) + 1
            # An acknowledgement as a JSON publisher writes it, {"UUID":"<canonical UUID>"}: its record without
            # parsing (a fifth of a transactional journal's lines). Anything else, or a UUID bytes16 refuses
            # (an escape or quote among the characters would be one), is parsed.
            text = _ACK_TEXT(line) if acks and len(line) == 47 else None
            ack = None if text is None else bytes16(text)
            if ack is not None:
                msg = JsonMessage({key: text})
                msg._text, msg._uuid = text, ack
                out.append(Envelope(journal, pos, end, msg, ack))
                pos = end
                continue
            try:
                record = _loads(line)
            except ValueError:
                record = _lenient(line)
            # JsonMessage.from_json and parse_uuid's check (uuid.bytes16), inline (this runs once per message);
            # anything they would refuse, and anything unparsed, takes frame() for the same outcome and report.
            # A typed local (doc): compiled (zcluster._native), its operations are native ones.
            if type(record) is dict:
                doc: dict[str, Any] = record
                u = doc.get(key)
                raw: bytes | None = ZERO_UUID
                if u is not None:
                    raw = None
                    if type(u) is str:
                        raw = bytes16(u)
                if raw is not None:
                    msg = JsonMessage(doc)
                    msg._text, msg._uuid = u, raw
                    out.append(Envelope(journal, pos, end, msg, raw))
                    pos = end
                    continue
            out.append(self.frame(pos, end, line + b"\n"))
            pos = end
        return out
