"""Bad input never loses what follows it: CSV quoting errors and corrupt fixed-frame lengths (regressions)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from message_helpers import decode_all, summary

from zcluster.message import (
    DecodeError,
    DesyncError,
    Frame,
    FrameTooLargeError,
    InMemoryJournals,
    JournalSpec,
    Publisher,
    UnexpectedEndError,
    framing_for,
)
from zcluster.message.framing import (
    DEFAULT_MAX_FRAME_BYTES,
    FIXED_FRAME_WORD,
    CsvFraming,
    Decoded,
    FixedFraming,
    Framing,
    JsonFraming,
    register_framing,
)

CSV = framing_for("text/csv")
FIXED = framing_for("application/x-protobuf-fixed")
WORD = FIXED_FRAME_WORD


def every_chunking(framing: Framing, data: bytes, offset: int = 0) -> list[tuple[str, int, int, object]]:
    """The decoded summary, checked to be the same whatever the chunk size."""
    whole = summary(decode_all(framing, data, max(len(data), 1), offset))
    for chunk in (1, 2, 3, 7, 64):
        assert summary(decode_all(framing, data, chunk, offset)) == whole, chunk
    return whole


def fixed(payload: bytes) -> bytes:
    return WORD + len(payload).to_bytes(4, "little") + payload


# -- CSV: a bad quote is one record, and the records after it are delivered ------------------------------


def test_csv_bare_quote_is_one_bad_record() -> None:
    data = b'a,1\nx"y,1\nb,2\n'
    assert every_chunking(CSV, data, offset=100) == [
        ("Frame", 100, 104, ["a", "1"]),
        ("DecodeError", 104, 110, None),
        ("Frame", 110, 114, ["b", "2"]),
    ]


def test_csv_a_blank_line_after_a_bad_record_stays_blank() -> None:
    # Found by the fuzz tier: the bad record's quote paired with one on a later line, and the parse's
    # newline cache then hid the blank line, which became the start of the next record's first field.
    data = b'00,"\n\n0,",a"\n'
    assert every_chunking(CSV, data, offset=0) == [
        ("DecodeError", 0, 5, None),
        ("Frame", 6, 13, ["0", ",a"]),
    ]


def test_csv_unterminated_quote_is_cut_at_the_next_newline() -> None:
    data = b'a,1\n"x,1\nb,2\nc,3\n'
    assert every_chunking(CSV, data) == [
        ("Frame", 0, 4, ["a", "1"]),
        ("DecodeError", 4, 9, None),
        ("Frame", 9, 13, ["b", "2"]),
        ("Frame", 13, 17, ["c", "3"]),
    ]


def test_csv_unterminated_quote_followed_by_a_later_quoted_field() -> None:
    # The stray quote pairs with the next quote, which is followed by "c": that cannot close a field.
    data = b'a,1\n"x,1\nb,2\n"c",3\nd,"e,f"\n'
    assert every_chunking(CSV, data) == [
        ("Frame", 0, 4, ["a", "1"]),
        ("DecodeError", 4, 9, None),
        ("Frame", 9, 13, ["b", "2"]),
        ("Frame", 13, 19, ["c", "3"]),
        ("Frame", 19, 27, ["d", "e,f"]),
    ]


def test_csv_junk_after_a_closing_quote_and_quoted_newlines() -> None:
    good = b'1,"multi\nline ""q"""\n'
    data = good + b'2,"bad"x\n' + good + b'3,"open'
    assert every_chunking(CSV, data) == [
        ("Frame", 0, 21, ["1", 'multi\nline "q"']),
        ("DecodeError", 21, 30, None),
        ("Frame", 30, 51, ["1", 'multi\nline "q"']),
        ("UnexpectedEndError", 51, 58, None),  # A quoted field cut off by the end of the stream.
    ]
    [bad] = [i for i in decode_all(CSV, data, 5) if isinstance(i, DecodeError)]
    assert "quote" in bad.reason and "offset 21" in str(bad)


def test_csv_follows_go_encoding_csv() -> None:
    data = b'a\rb,"c\r\nd"\r\n\r\n" x",""\n'
    assert every_chunking(CSV, data) == [
        ("Frame", 0, 12, ["a\rb", "c\nd"]),  # \r\n ends a line, in a quoted field too; a lone \r is data
        ("Frame", 14, 22, [" x", ""]),  # the blank \r\n line is skipped
    ]
    assert summary(decode_all(CSV, b'a, "b"\n', 100)) == [("DecodeError", 0, 7, None)]  # bare quote, as in Go


def test_csv_record_longer_than_the_maximum_is_skipped_without_buffering_it() -> None:
    framing = CsvFraming(max_frame_bytes=16)
    data = b"a,1\n" + b"b," + b"x" * 100 + b"\nc,3\n" + b'"' + b"y" * 20 + b'",1\nd,4\n'
    assert every_chunking(framing, data) == [
        ("Frame", 0, 4, ["a", "1"]),
        ("DecodeError", 4, 107, None),
        ("Frame", 107, 111, ["c", "3"]),
        ("DecodeError", 111, 136, None),
        ("Frame", 136, 140, ["d", "4"]),
    ]
    d = framing.decoder()
    for i in range(0, len(data), 3):
        d.feed(data[i : i + 3])
        assert d.pending <= 16 + 3


# -- ndjson: the same bound -------------------------------------------------------------------------------


def test_json_line_longer_than_the_maximum_is_one_decode_error() -> None:
    framing = JsonFraming(max_frame_bytes=10)
    data = b"[1]\n" + b'"' + b"z" * 50 + b'"\n' + b"{}\n"
    assert every_chunking(framing, data) == [
        ("Frame", 0, 4, [1]),
        ("DecodeError", 4, 57, None),
        ("Frame", 57, 60, {}),
    ]
    with pytest.raises(FrameTooLargeError, match="max_frame_bytes"):
        framing.marshal(_Json({"k": "v" * 20}))


class _Json:
    def __init__(self, doc: object) -> None:
        self.doc = doc

    def to_json(self) -> object:
        return self.doc


# -- protobuf-fixed: a corrupt length does not swallow the stream -----------------------------------------


def test_fixed_corrupt_huge_length_resyncs_and_delivers_every_later_frame() -> None:
    frames = [fixed(b"payload %d" % i) for i in range(1000)]
    data = WORD + (2 << 30).to_bytes(4, "little") + b"".join(frames)
    d = FIXED.decoder(5000)
    out: list[Decoded] = []
    for i in range(0, len(data), 4096):
        out += d.feed(data[i : i + 4096])
        assert d.pending <= 4096 + 8  # never buffers toward the claimed 2 GB
    out += d.close()
    assert summary(out[:1]) == [("DesyncError", 5000, 5008, None)]
    got = [(i.begin, i.end, i.record) for i in out[1:] if isinstance(i, Frame)]
    offset, want = 5008, []
    for i, f in enumerate(frames):
        want.append((offset, offset + len(f), b"payload %d" % i))
        offset += len(f)
    assert got == want and len(out) == 1001


def test_fixed_length_over_a_configured_maximum_is_skipped_with_the_garbage_around_it() -> None:
    framing = FixedFraming(max_frame_bytes=8 + 16)
    ok = fixed(b"x" * 16)
    bad = fixed(b"y" * 17)
    data = ok + b"junk" + bad + ok
    assert every_chunking(framing, data) == [
        ("Frame", 0, 24, b"x" * 16),
        ("DesyncError", 24, 24 + 4 + 25, None),  # garbage and the oversized frame: one skipped range
        ("Frame", 53, 77, b"x" * 16),
    ]


def test_fixed_length_past_the_end_of_the_stream_resyncs_at_close() -> None:
    frames = fixed(b"a") + fixed(b"bc") + fixed(b"")
    data = WORD + (1000).to_bytes(4, "little") + frames  # within the maximum, but the stream ends first
    assert every_chunking(FIXED, data) == [
        ("DesyncError", 0, 8, None),
        ("Frame", 8, 17, b"a"),
        ("Frame", 17, 27, b"bc"),
        ("Frame", 27, 35, b""),
    ]
    # A frame that is merely cut off by the end of the stream (no frame after it) stays an UnexpectedEndError.
    assert every_chunking(FIXED, frames + fixed(b"cut")[:-1]) == [
        ("Frame", 0, 9, b"a"),
        ("Frame", 9, 19, b"bc"),
        ("Frame", 19, 27, b""),
        ("UnexpectedEndError", 27, 37, None),
    ]


def test_framings_validate_their_maximum() -> None:
    assert FixedFraming().max_frame_bytes == DEFAULT_MAX_FRAME_BYTES == 64 << 20
    with pytest.raises(ValueError, match="max_frame_bytes"):
        FixedFraming(max_frame_bytes=7)
    with pytest.raises(ValueError, match="max_frame_bytes"):
        CsvFraming(max_frame_bytes=0)


class _Payload:
    def __init__(self, data: bytes) -> None:
        self.data, self.uuid = data, bytes(16)

    def to_bytes(self) -> bytes:
        return self.uuid + self.data

    def get_uuid(self) -> bytes:
        return self.uuid

    def set_uuid(self, uuid: bytes) -> None:
        self.uuid = uuid

    def new_acknowledgement(self, journal: str) -> _Payload:
        return _Payload(b"")


@pytest.fixture
def small_fixed_framing() -> Iterator[FixedFraming]:
    framing = FixedFraming(max_frame_bytes=64)
    register_framing(framing)
    yield framing
    register_framing(FixedFraming())


def test_publisher_refuses_a_frame_over_the_maximum(small_fixed_framing: FixedFraming) -> None:
    spec = JournalSpec("j", {"content-type": "application/x-protobuf-fixed"})
    journals = InMemoryJournals([spec])
    pub = Publisher(journals)
    mapping = lambda m: ("j", spec.labels["content-type"])  # noqa: E731
    assert pub.publish_committed(mapping, _Payload(b"x" * 40)) == (0, 64)  # 8 + 16 + 40: exactly the maximum
    with pytest.raises(ValueError, match="max_frame_bytes"):
        pub.publish_committed(mapping, _Payload(b"x" * 41))
    assert len(b"".join(c for _, c in journals.read("j", 0))) == 64  # nothing of the refused frame
    with pytest.raises(ValueError, match="max_frame_bytes"):
        small_fixed_framing.marshal(_Payload(b"x" * 41))


def test_decoders_report_in_stream_order_with_unexpected_end_last() -> None:
    items = decode_all(CSV, b'a,1\n"x,1\nb', 2)
    assert [type(i) for i in items] == [Frame, DecodeError, UnexpectedEndError]
    items = decode_all(FIXED, b"zz" + fixed(b"q"), 1)
    assert [type(i) for i in items] == [DesyncError, Frame]
