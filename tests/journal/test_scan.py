"""zcluster.journal._scan (C, in the compiled build) finds exactly the records the pure scan finds, on
random and damaged open-fragment bytes; the file journals read through it whenever the build is current."""

from __future__ import annotations

import os
import random
import struct
import subprocess
import sys
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zcluster.journal import _filefmt

scan = pytest.importorskip(
    "zcluster.journal._scan", reason="no current compiled build here (python -m zcluster._native_build)"
)


def _record(payload: bytes) -> bytes:
    return struct.pack(">II", len(payload), zlib.crc32(payload)) + payload


def _both(buf: bytes | bytearray | memoryview, collect: bool) -> None:
    want = _filefmt._scan_payloads(buf, collect)
    assert scan.scan_payloads(buf, collect) == tuple(want)
    assert _filefmt.scan_payloads(buf, collect) == want


damage = st.one_of(
    st.none(),
    st.tuples(st.just("flip"), st.integers(0, 10**6), st.integers(1, 255)),  # one byte changed
    st.tuples(st.just("cut"), st.integers(0, 10**6), st.just(0)),  # a torn tail
    st.tuples(st.just("zeros"), st.integers(0, 10**6), st.integers(1, 16)),  # zeroed bytes (an empty record)
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=300), max_size=12), damage, st.integers(0, 9), st.booleans())
def test_the_records_are_the_pure_scans_on_damaged_bytes(
    payloads: list[bytes], harm: tuple[str, int, int] | None, skip: int, collect: bool
) -> None:
    buf = bytearray(b"".join(_record(p) for p in payloads if p))
    if harm is not None and buf:
        kind, at, value = harm
        at %= len(buf)
        if kind == "flip":
            buf[at] ^= value
        elif kind == "cut":
            del buf[at:]
        else:
            buf[at : at + value] = bytes(value)
    for form in (bytes(buf), buf, memoryview(bytes(buf))[skip % (len(buf) + 1) :]):
        _both(form, collect)


SIZES = [*range(1, 201), *range(201, 1200, 13), 4096, 65536 + 7]


def test_checksums_of_every_length_and_alignment_match_zlib() -> None:
    """The CRC runs 64, 16 and 8 bytes at a time (folded by carry-less multiplication where the CPU has it,
    then by table): lengths 1..200 and longer ones at every offset 0..7 of the buffer, valid and with the
    last byte changed (a failing CRC ends the scan)."""
    rng = random.Random(40)
    for size in SIZES:
        payload = rng.randbytes(size)
        for lead in range(8):
            good = _record(payload)
            bad = good[:-1] + bytes([good[-1] ^ 1])
            for body, records in ((good, 1), (bad, 0)):
                buf = memoryview(bytes(lead) + body + _record(b"next"))[lead:]
                assert scan.scan_payloads(buf, True)[0] == records + (records == 1)
                _both(buf, True)


def test_the_table_path_alone_gives_the_same_checksums() -> None:
    """ZCLUSTER_CRC_TABLE=1 (read at import) turns the carry-less path off: a child process checks the table
    path over the same lengths, so both paths are tested on a machine that has the instruction."""
    code = (
        "import random, struct, zlib\n"
        "from zcluster.journal._scan import scan_payloads\n"
        f"rng = random.Random(41)\nfor size in {SIZES!r}:\n"
        "    p = rng.randbytes(size)\n"
        "    good = struct.pack('>II', size, zlib.crc32(p)) + p\n"
        "    assert scan_payloads(good, False)[0] == 1, size\n"
        "    assert scan_payloads(good[:-1] + bytes([good[-1] ^ 1]), False)[0] == 0, size\n"
    )
    env = {**os.environ, "ZCLUSTER_CRC_TABLE": "1"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_what_is_not_a_buffer_is_a_type_error_and_nothing_is_a_scan_of_nothing() -> None:
    with pytest.raises(TypeError):
        scan.scan_payloads("text", True)
    with pytest.raises(TypeError, match="takes 2 arguments"):
        scan.scan_payloads(b"")  # type: ignore[call-arg]
    assert scan.scan_payloads(b"", True) == (0, 0, bytearray())
    assert scan.scan_payloads(b"\x00" * 7, False) == (0, 0, None)
    assert _filefmt._scan is scan


@settings(max_examples=500, deadline=None)
@given(st.lists(st.sampled_from([b"a", b"{}", b"\n", b"\r", b"\x00", b"\xff"]), max_size=40))
def test_split_lines_is_bytes_split_on_newlines(pieces: list[bytes]) -> None:
    data = b"".join(pieces)
    for buf in (data, bytearray(data), memoryview(data), memoryview(b"x" + data)[1:]):
        lines = scan.split_lines(buf)
        assert lines == data.split(b"\n") and all(type(line) is bytes for line in lines)


def test_split_lines_refuses_what_has_no_buffer() -> None:
    for bad in ["a\nb", None, [b"a"]]:
        with pytest.raises(TypeError):
            scan.split_lines(bad)
