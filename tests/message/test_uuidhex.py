"""zcluster.message._uuidhex (C, in the compiled build) accepts exactly the texts the pure parse accepts, with
the same bytes; the decoder and parse_uuid use it whenever the build is current."""

from __future__ import annotations

import random
import uuid as std

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zcluster.message import decoding, uuid

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


def _ack_lines() -> list[bytes]:
    """Acknowledgement-shaped lines and near misses: every byte of an exact one changed to a quote, a
    backslash, a space, a non-ASCII byte and a letter past f; one byte more or less; other keys."""
    rng = random.Random(41)
    text = str(std.UUID(bytes=rng.randbytes(16)))
    exact = b'{"UUID":"' + text.encode() + b'"}'
    lines = [exact, exact.upper(), exact[:-1], exact + b" ", b" " + exact[1:], exact.replace(b"UUID", b"uuid")]
    for i in range(len(exact)):
        for c in (b'"', b"\\", b" ", b"\xc3", b"g", b"0"):
            lines.append(exact[:i] + c + exact[i + 1 :])
    lines.append(b'{"UUID":"\\u0030' + text.encode()[6:] + b'"}')  # an escape: JSON reads another text
    return lines


def test_acknowledgement_lines_are_recognised_alike() -> None:
    for line in _ack_lines():
        assert native.ack_text(line) == decoding._ack_text(line), line
    with pytest.raises(TypeError):
        native.ack_text("text")  # type: ignore[arg-type]


def test_the_decoder_makes_of_acknowledgement_lines_what_parsing_them_makes() -> None:
    """lines() takes an acknowledgement's UUID without parsing JSON: every envelope (or None) is frame()'s,
    which parses, message and UUID included."""
    lines = _ack_lines()
    decoder = decoding.FrameDecoder("j", "application/x-ndjson", None)
    got = decoder.lines(0, lines)
    pos = 0
    for line, env in zip(lines, got, strict=True):
        want = decoder.frame(pos, pos + len(line) + 1, line + b"\n")
        assert (env is None) == (want is None), line
        if env is not None and want is not None:
            assert (env.begin, env.end, env.uuid, env.message.doc) == (
                want.begin,
                want.end,
                want.uuid,
                want.message.doc,
            )
        pos += len(line) + 1
    assert sum(env is not None for env in got) >= 3  # the exact line, upper case, and a byte still hex
