"""zcluster.message._uuidhex (C, in the compiled build) accepts exactly the texts the pure parse accepts, with
the same bytes; the decoder and parse_uuid use it whenever the build is current."""

from __future__ import annotations

import random
import uuid as std

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zcluster.message import uuid

native = pytest.importorskip(
    "zcluster.message._uuidhex", reason="no current compiled build here (python -m zcluster._native_build)"
)


def _same(text: str) -> None:
    assert native.bytes16(text) == uuid._bytes16(text), repr(text)


def test_every_position_changed_to_every_kind_of_character_is_decided_alike() -> None:
    """Canonical texts of random case, each position replaced by a digit, a letter past f, a dash, a space,
    a tab, a non-ASCII digit and an astral character; and lengths around 36."""
    rng = random.Random(40)
    for _ in range(200):
        text = "".join(c.upper() if rng.random() < 0.5 else c for c in str(std.UUID(bytes=rng.randbytes(16))))
        _same(text)
        assert native.bytes16(text) == std.UUID(text).bytes
        for i in range(36):
            for c in ("7", "F", "g", "-", " ", "\t", "\u0661", "\U0001f600"):
                _same(text[:i] + c + text[i + 1 :])
        for cut in (text[:35], text + "0", text[:-1] + " ", " " + text[1:], text.replace("-", "")):
            _same(cut)


@settings(max_examples=500, deadline=None)
@given(st.text(alphabet="0123456789abcdefABCDEF- g\u00e9", min_size=30, max_size=40))
def test_random_texts_are_decided_alike(text: str) -> None:
    _same(text)


def test_the_module_uses_it_and_what_is_not_a_str_is_a_type_error() -> None:
    assert uuid.bytes16 is native.bytes16
    with pytest.raises(TypeError, match="takes a str, got bytes"):
        native.bytes16(b"01234567-89ab-cdef-0123-456789abcdef")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="invalid UUID"):
        uuid.parse_uuid("01234567-89ab-cdef-0123-456789abcdeg")
