"""Value types: cursors (roshi's string form), encoding round trips, validation errors."""

from __future__ import annotations

import math
import struct

import pytest

from zcluster import Cursor, InvalidTupleError, KeyScoreMember
from zcluster._encode import score as _score
from zcluster.types import from_bytes, to_bytes


@pytest.mark.parametrize(
    "cursor",
    [
        Cursor(0.0, " "),
        Cursor(1.1, "%20"),
        Cursor(123.456, "abc"),
        Cursor(0.00001, "foo\x00bar"),
        Cursor(-2.5, b"\xff\xfe".decode("utf-8", "surrogateescape")),
    ],
)
def test_cursor_round_trip(cursor: Cursor) -> None:
    assert Cursor.parse(str(cursor)) == cursor


def test_cursor_string_is_roshis_format() -> None:
    # decimal of the IEEE-754 bits, "A", URL-safe base64 of the member
    bits = struct.unpack(">Q", struct.pack(">d", 1.5))[0]
    assert str(Cursor(1.5, "abc")) == f"{bits}AYWJj"
    # URL-safe alphabet: '-' and '_' instead of '+' and '/'
    assert str(Cursor(0.0, b"\xfb\xff".decode("utf-8", "surrogateescape"))).endswith("A-_8=")


@pytest.mark.parametrize("text", ["", "A", "12", "xAabc", "1A!!!", str(1 << 64) + "Aabc"])
def test_cursor_parse_rejects_garbage(text: str) -> None:
    with pytest.raises(ValueError, match="invalid cursor"):
        Cursor.parse(text)


def test_raw_bytes_round_trip_through_str() -> None:
    raw = bytes(range(256))
    assert to_bytes(from_bytes(raw)) == raw


@pytest.mark.parametrize(
    ("score", "reason"),
    [
        (math.nan, "finite"),
        (math.inf, "finite"),
        (-math.inf, "finite"),
        ("1.0", "int or float"),
        (None, "int or float"),
        (True, "int or float"),
        ((1 << 53) + 1, "not exact"),
        (2**1024, "range of a double"),
    ],
)
def test_bad_scores_are_rejected_with_reason(score: object, reason: str) -> None:
    with pytest.raises(InvalidTupleError, match=reason) as info:
        _score(score, 7, KeyScoreMember("k", 0.0, "m"))
    assert info.value.index == 7


def test_exact_large_integers_are_accepted() -> None:
    assert _score(1 << 60, 0, None) == float(1 << 60)  # a power of two is exact
    assert _score(-(1 << 53), 0, None) == -float(1 << 53)
