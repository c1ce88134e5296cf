from __future__ import annotations

import pytest
from message_helpers import decode_all, summary

from zcluster.message import (
    CsvRecord,
    DecodeError,
    DesyncError,
    Frame,
    FramingError,
    JsonMessage,
    UnexpectedEndError,
    UnknownContentTypeError,
    framing_for,
)
from zcluster.message.framing import Decoder, Framing, register_framing

WORD = b"\x66\x33\x93\x36"
FIXED = framing_for("application/x-protobuf-fixed")
JSON = framing_for("application/x-ndjson")
CSV = framing_for("text/csv")


class Payload:
    def __init__(self, data: bytes) -> None:
        self.data = data

    def to_bytes(self) -> bytes:
        return self.data


def test_registry() -> None:
    assert {JSON.content_type, CSV.content_type, FIXED.content_type} == {
        "application/x-ndjson",
        "text/csv",
        "application/x-protobuf-fixed",
    }
    with pytest.raises(UnknownContentTypeError, match=r"unrecognized content-type \(application/x-recovery-log\)"):
        framing_for("application/x-recovery-log")

    class Upper(Framing):
        content_type = "text/x-upper"

        def marshal(self, msg: object) -> bytes:
            return str(msg).upper().encode()

        def decoder(self, offset: int = 0) -> Decoder:
            return JSON.decoder(offset)

    register_framing(Upper())
    assert framing_for("text/x-upper").marshal("hi") == b"HI"


def test_fixed_marshal_fixtures() -> None:
    assert FIXED.marshal(Payload(b"test message content")) == WORD + b"\x14\0\0\0test message content"
    assert FIXED.marshal(Payload(b"foo")) == WORD + b"\x03\0\0\0foo"
    with pytest.raises(TypeError, match="not fixed-frameable"):
        FIXED.marshal("nope")


FRAME = WORD + b"\x14\0\0\0test message content"


@pytest.mark.parametrize("chunk", [1, 3, 16, 1000])
def test_fixed_decode_with_desync_and_truncation(chunk: int) -> None:
    data = b"foobar" + FRAME + b"x" * 21 + FRAME + WORD + b"\x05\0\0"
    assert summary(decode_all(FIXED, data, chunk, offset=1000)) == [
        ("DesyncError", 1000, 1006, None),
        ("Frame", 1006, 1034, b"test message content"),
        ("DesyncError", 1034, 1055, None),  # Reported once, whatever the chunking.
        ("Frame", 1055, 1083, b"test message content"),
        ("UnexpectedEndError", 1083, 1090, None),
    ]


@pytest.mark.parametrize(
    ("data", "expect"),
    [
        (b"", []),
        (FRAME + b"\n", [("Frame", 0, 28, b"test message content")]),  # A lone trailing newline is tolerated.
        (FRAME[:7], [("UnexpectedEndError", 0, 7, None)]),  # Partway through the header.
        (FRAME[:8], [("UnexpectedEndError", 0, 8, None)]),  # Just after the header.
        (FRAME[:19], [("UnexpectedEndError", 0, 19, None)]),  # Partway through the payload.
        (b"foo" + FRAME[:4], [("UnexpectedEndError", 0, 7, None)]),  # Partway through a desynced header.
        (b"foobarbazqux", [("DesyncError", 0, 12, None)]),  # Garbage to the end: skipped, reported.
        (WORD + b"\0\0\0\0", [("Frame", 0, 8, b"")]),
    ],
)
def test_fixed_incomplete_and_edge_cases(data: bytes, expect: list[object]) -> None:
    for chunk in (1, 5, 100):
        assert summary(decode_all(FIXED, data, chunk)) == expect


def test_json_round_trip_and_bad_line() -> None:
    m = JsonMessage({"UUID": "0000000a-0000-1000-8001-010203040506", "n": 1, "s": "é\n"})
    line = JSON.marshal(m)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    data = line + b"{not json}\n" + b"[1,2]\n" + b'{"cut":'
    for chunk in (1, 7, 1000):
        items = decode_all(JSON, data, chunk)
        assert summary(items)[0] == ("Frame", 0, len(line), m.doc)
        bad = items[1]
        assert isinstance(bad, DecodeError)
        assert (bad.begin, bad.end) == (len(line), len(line) + 11)  # Exactly that line.
        assert f"offset {len(line)}" in str(bad)
        assert summary(items)[2:] == [
            ("Frame", len(line) + 11, len(line) + 17, [1, 2]),
            ("UnexpectedEndError", len(line) + 17, len(data), None),
        ]
    with pytest.raises(TypeError, match="not JSON-frameable"):
        JSON.marshal(object())


def test_json_invalid_utf8_is_a_decode_error() -> None:
    items = decode_all(JSON, b'"\xff"\n{}\n', 2)
    assert isinstance(items[0], DecodeError) and (items[0].begin, items[0].end) == (0, 4)
    assert items[1] == Frame(4, 7, {})


def test_csv_rfc4180_and_field_count() -> None:
    rec = CsvRecord(["0000000a-0000-1000-8001-010203040506", 'a "quoted", value', "multi\nline", " lead", ""])
    line = CSV.marshal(rec)
    assert line == (b'0000000a-0000-1000-8001-010203040506,"a ""quoted"", value","multi\nline"," lead",\n')
    data = line + b"\n" + b"x,y\n" + b'1,"bad"quote,3,4,5\n' + b"a,b,c,d,e\r\n" + b"tail"
    for chunk in (1, 4, 1000):
        items = decode_all(CSV, data, chunk)
        assert isinstance(items[0], Frame) and items[0].record == rec.fields
        assert isinstance(items[1], DecodeError) and "has 2 fields, expected 5" in str(items[1])
        assert (items[1].begin, items[1].end) == (len(line) + 1, len(line) + 5)  # Blank line skipped.
        assert isinstance(items[2], DecodeError)
        assert isinstance(items[3], Frame) and items[3].record == ["a", "b", "c", "d", "e"]
        assert isinstance(items[4], UnexpectedEndError) and items[4].end == len(data)


def test_framing_errors_share_a_base() -> None:
    assert issubclass(DecodeError, FramingError) and issubclass(DesyncError, FramingError)
    assert issubclass(UnexpectedEndError, FramingError)
