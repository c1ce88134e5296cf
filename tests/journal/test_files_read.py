"""The file journals' read path: open-fragment records checked a buffer at a time, whole buffers handed out,
scans resumed from record boundaries already seen rather than from the header.

No timings: what is checked is the bytes (exactly the journal's, at their offsets, from any offset and with
any chunk size), how many pieces they come in and how many file bytes a read has to go through.
"""

from __future__ import annotations

import os
import random
import struct
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from journal_helpers import ndjson, read_all

from zcluster.journal import FileJournals, _marks
from zcluster.journal._filefmt import HEADER, OPEN_NAME, RECORD, pack_record, scan_payloads, scan_records
from zcluster.message import OffsetOutOfRangeError


def lines(n: int, seed: int = 0) -> list[bytes]:
    rng = random.Random(seed)
    return [b'{"i":%d,"pad":"%s"}\n' % (i, b"x" * rng.randrange(0, 60)) for i in range(n)]


def _reference_scan(buf: bytes) -> tuple[list[bytes], int]:
    """The record scan as the format defines it, one record at a time (what scan_payloads must match)."""
    out, pos = [], 0
    while len(buf) - pos >= RECORD.size:
        size, crc = RECORD.unpack_from(buf, pos)
        start = pos + RECORD.size
        if len(buf) - start < size or not size or zlib.crc32(buf[start : start + size]) != crc:
            break
        out.append(buf[start : start + size])
        pos = start + size
    return out, pos


@pytest.mark.parametrize("seed", range(40))
def test_scan_payloads_matches_the_record_by_record_scan_on_damaged_buffers(seed: int) -> None:
    rng = random.Random(seed)
    buf = bytearray(b"".join(pack_record(rng.randbytes(rng.randrange(1, 50))) for _ in range(rng.randrange(0, 30))))
    for _ in range(rng.randrange(0, 3)):  # flipped bytes, zeroed spans, a cut tail
        if buf:
            what, at = rng.randrange(3), rng.randrange(len(buf))
            if what == 0:
                buf[at] ^= 1 << rng.randrange(8)
            elif what == 1:
                buf[at : at + rng.randrange(1, 12)] = bytes(min(len(buf) - at, 11))
            else:
                del buf[at:]
    data = bytes(buf)
    want, used = _reference_scan(data)
    for form in (data, memoryview(data), bytearray(data)):
        scan = scan_payloads(form)
        assert (scan.payload, scan.records, scan.used) == (b"".join(want), len(want), used)
        assert scan.size == len(b"".join(want))
        assert scan_payloads(form, collect=False) == (len(want), used, None)
    records, rec_used = scan_records(data, 100)
    assert rec_used == used and [data[r.pos - 100 : r.pos - 100 + r.size] for r in records] == want


@pytest.mark.parametrize("chunk", [1, 5, 64, 1000, 1 << 20])
def test_reads_from_every_kind_of_offset_return_the_journal_bytes(tmp_path: Path, chunk: int) -> None:
    data = lines(300)
    with FileJournals(tmp_path, chunk_size=chunk) as fj:
        fj.create(ndjson("j"))
        for d in data:
            fj.append("j", d)
        whole = b"".join(data)
        offsets = sorted({0, 1, len(data[0]), len(whole) // 3, len(whole) - 1, len(whole), *range(0, len(whole), 997)})
        for fresh in (True, False):  # a store that never scanned the open fragment, then one that did
            with FileJournals(tmp_path, chunk_size=chunk, recover=False) as reader:
                if not fresh:
                    reader.end("j")
                for off in offsets if fresh else reversed(offsets):  # backwards: scans restart behind the last
                    chunks = list(reader.read("j", off))
                    assert b"".join(c for _, c in chunks) == whole[off:], off
                    assert all(0 < len(c) <= chunk for _, c in chunks)
                    pos = off
                    for begin, c in chunks:  # contiguous, each chunk at its offset
                        assert begin == pos
                        pos += len(c)
                with pytest.raises(OffsetOutOfRangeError, match="outside"):
                    reader.read("j", len(whole) + 1)


def test_open_fragment_reads_come_in_large_chunks_not_one_per_append(tmp_path: Path) -> None:
    data = lines(2000)
    with FileJournals(tmp_path) as fj:  # default chunk size, 1 MiB
        fj.create(ndjson("j"))
        for d in data:
            fj.append("j", d)
        chunks = list(fj.read("j", 0))
        assert b"".join(c for _, c in chunks) == b"".join(data)
        assert len(chunks) <= 2  # 2000 records, ~100 KB: a first buffer of 64 KiB, then one of twice that


class _PreadCounter:
    """Counts the bytes read with os.pread (how the open fragment is read)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.bytes = 0
        real = os.pread

        def pread(fd: int, n: int, pos: int) -> bytes:
            out = real(fd, n, pos)
            self.bytes += len(out)
            return out

        monkeypatch.setattr(os, "pread", pread)


def _file_position(data: list[bytes], off: int) -> int:
    """Where the record holding journal offset ``off`` starts in the open fragment (one record per line)."""
    pos, fpos = 0, HEADER.size
    for d in data:
        if pos + len(d) > off:
            return fpos
        pos, fpos = pos + len(d), fpos + RECORD.size + len(d)
    return fpos


def _appended(root: Path, n: int, chunk: int) -> tuple[list[bytes], int]:
    """``n`` lines appended to journal "j", as if by another process: this one remembers no boundary."""
    data = lines(n)
    with FileJournals(root, chunk_size=chunk) as fj:
        fj.create(ndjson("j"))
        for d in data:
            fj.append("j", d)
    _marks._marks.clear()
    return data, (root / "j" / OPEN_NAME).stat().st_size


def test_a_read_past_the_sealed_pieces_resumes_from_a_record_boundary_already_seen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    chunk = 4096
    data, size = _appended(tmp_path, 20000, chunk)
    whole = b"".join(data)
    near = _marks.SPACING + 4 * chunk  # how far before an offset a scan may have to start
    counter = _PreadCounter(monkeypatch)
    with FileJournals(tmp_path, chunk_size=chunk, recover=False) as fj:
        assert fj.end("j") == len(whole)
        assert size <= counter.bytes <= size + 4 * chunk  # the end: one scan of the open fragment
        for off in (len(whole) - 100, len(whole) // 2, len(whole) // 3):
            counter.bytes = 0
            assert read_all(fj, "j", off) == whole[off:]
            assert counter.bytes <= size - off + near  # not another scan from the header


def test_the_end_after_a_read_resumes_from_where_the_read_got_to(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The applier measures a journal's lag with end() right after reading it, on a store opened for the
    task: that end must not scan the open fragment again from its header, and must stay exact."""
    chunk = 4096
    data, _ = _appended(tmp_path, 20000, chunk)
    whole = b"".join(data)
    near = _marks.SPACING + 4 * chunk
    counter = _PreadCounter(monkeypatch)
    with FileJournals(tmp_path, chunk_size=chunk, recover=False) as fj, FileJournals(tmp_path) as writer:
        assert read_all(fj, "j", 0) == whole  # from the open fragment's begin: no end() before the read
        counter.bytes = 0
        assert fj.end("j") == len(whole)
        assert counter.bytes <= near
        more = lines(300, seed=1)
        for d in more:
            writer.append("j", d)
        counter.bytes = 0
        assert fj.end("j") == len(whole) + len(b"".join(more))  # appends since: scanned, only they
        assert counter.bytes <= near + sum(RECORD.size + len(d) for d in more)
    with FileJournals(tmp_path, chunk_size=chunk, recover=False) as fj:  # a fresh store: exact
        assert fj.end("j") == len(whole) + len(b"".join(more))


def test_recovery_scan_is_shared_with_readers_of_the_same_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    chunk = 4096
    data, size = _appended(tmp_path, 20000, chunk)
    whole = b"".join(data)
    counter = _PreadCounter(monkeypatch)
    with FileJournals(tmp_path, chunk_size=chunk) as fj:  # recovery checks every record once
        assert size <= counter.bytes <= size + 4 * chunk
        counter.bytes = 0
        assert fj.end("j") == len(whole)
        assert counter.bytes <= 2 * HEADER.size  # the end: from where recovery got to
        off = len(whole) // 2
        assert read_all(fj, "j", off) == whole[off:]
        assert counter.bytes <= size - off + _marks.SPACING + 4 * chunk
        fj.append("j", b'{"more":1}\n')  # appends go on, and are seen
        assert read_all(fj, "j", len(whole)) == b'{"more":1}\n'


def test_a_damaged_record_stops_readers_of_an_unrecovered_store_at_it(tmp_path: Path) -> None:
    data, _ = _appended(tmp_path, 50, 1 << 20)
    path = tmp_path / "j" / OPEN_NAME
    raw = bytearray(path.read_bytes())
    third = HEADER.size + sum(RECORD.size + len(d) for d in data[:2])
    raw[third + RECORD.size] ^= 0xFF  # the third record's payload
    path.write_bytes(bytes(raw))
    with FileJournals(tmp_path, recover=False) as fj:
        assert read_all(fj, "j", 0) == b"".join(data[:2])  # never past a record that fails its CRC
        assert fj.end("j") == len(b"".join(data[:2]))
    with FileJournals(tmp_path) as fj:  # recovery seals it as a lost range
        [report] = fj.recovered
        assert report.lost == ((len(b"".join(data[:2])), len(b"".join(data[:3]))),)


def test_a_record_length_claiming_more_than_the_file_is_not_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data, _ = _appended(tmp_path, 20, 64)
    with open(tmp_path / "j" / OPEN_NAME, "ab") as f:  # a torn record whose length says 3 GB
        f.write(struct.pack(">II", 3 << 30, 0) + b"partial")
    sizes: list[int] = []
    real = os.pread

    def pread(fd: int, n: int, pos: int) -> bytes:
        sizes.append(n)
        return real(fd, n, pos)

    monkeypatch.setattr(os, "pread", pread)
    with FileJournals(tmp_path, chunk_size=64, recover=False) as fj:
        assert read_all(fj, "j", 0) == b"".join(data)
    assert max(sizes) < 1 << 20  # no buffer sized by the damaged length


def test_reads_follow_a_roll_over_and_appends_of_another_store(tmp_path: Path) -> None:
    data = lines(400)
    with FileJournals(tmp_path, chunk_size=256) as writer, FileJournals(tmp_path, chunk_size=256) as reader:
        writer.create(ndjson("j"))
        for d in data[:200]:
            writer.append("j", d)
        it: Iterator[tuple[int, bytes]] = reader.read("j", 0, block=True, timeout=120)  # ends when all is read
        got = b""
        for _, c in it:
            got += c
            if len(got) >= len(b"".join(data[:100])):
                break
        writer.roll("j")
        for d in data[200:]:
            writer.append("j", d)
        for _, c in it:
            got += c
            if len(got) >= len(b"".join(data)):
                break
        assert got == b"".join(data)


def test_a_store_opened_later_in_the_process_starts_its_read_near_the_offset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Spark sink's task opens the journal store, reads one range of each journal and closes it; the next
    task of the same worker must not scan the open fragment from its header again (a cost that grew with
    the fragment until it rolled)."""
    data, size = _appended(tmp_path, 20000, 1 << 20)
    whole = b"".join(data)
    counter = _PreadCounter(monkeypatch)
    with FileJournals(tmp_path, recover=False) as first:
        assert first.end("j") == len(whole)
        assert counter.bytes >= size - HEADER.size  # the first in the process: a whole scan
    for off in (len(whole) - 100, len(whole) // 2, len(whole) // 5, 7):
        counter.bytes = 0
        with FileJournals(tmp_path, recover=False) as later:
            assert read_all(later, "j", off) == whole[off:]
            assert later.end("j") == len(whole)
        # The read's check that `off` is readable scans for the end, from the last boundary remembered (at
        # most one checking buffer, 64 KiB, before it); the read itself from the one before the record
        # holding `off`; its end() after the read costs a stat.
        assert counter.bytes <= size - _file_position(data, off) + 2 * _marks.SPACING + 4096


def test_a_short_read_in_a_large_open_fragment_reads_about_its_own_length(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A streaming batch reads a few KB near the end: it must not check a whole read chunk (1 MiB) past them."""
    data, size = _appended(tmp_path, 60000, 1 << 20)
    whole = b"".join(data)
    assert size > 3 << 20
    counter = _PreadCounter(monkeypatch)
    with FileJournals(tmp_path, recover=False) as fj:
        fj.end("j")
        for off in range(len(whole) // 8, len(whole), len(whole) // 40):
            counter.bytes = 0
            begin, chunk = next(iter(fj.read("j", off)))
            assert begin == off and whole.startswith(chunk, off) and chunk
            # A boundary <= 64 KiB before, then a 64 KiB buffer (and, should its payloads end short of
            # `off`, one of 128 KiB): never the 1 MiB read chunk.
            assert counter.bytes <= 4 * _marks.SPACING, off


def test_the_remembered_boundaries_stay_bounded(tmp_path: Path) -> None:
    """Memory stays flat: a process reading ever more journals keeps the boundaries of the latest ones."""
    with FileJournals(tmp_path, chunk_size=16) as fj:  # a buffer per record: each boundary a chance to note
        for i in range(_marks.JOURNALS + 20):
            fj.create(ndjson(f"j{i}"))
            fj.append(f"j{i}", b'{"i":1}\n')
            fj.append(f"j{i}", b'{"i":2}\n')  # a boundary a whole record follows: one to remember
            assert read_all(fj, f"j{i}", 0) == b'{"i":1}\n{"i":2}\n'
    assert len(_marks._marks) == _marks.JOURNALS
    assert str(tmp_path / f"j{_marks.JOURNALS + 19}") in _marks._marks


def test_an_append_taken_back_leaves_no_boundary_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A record another store object of this process read while its append was failing (fsync: EIO) is cut
    back, and later appends of another shape cover its place: no store opened later may start a scan at the
    boundary that record ended at (it would hand out the journal's bytes at the wrong offsets)."""
    real_fsync = os.fsync
    failing: list[Callable[[], None]] = []

    def fsync(fd: int) -> None:
        if failing:
            failing.pop()()
            raise OSError(5, "EIO (simulated)")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    with FileJournals(tmp_path, fsync=True) as writer:
        writer.create(ndjson("j"))
        for i in range(2000):
            writer.append("j", b'{"i":%05d,"pad":"%s"}\n' % (i, b"x" * 40))

        def read_meanwhile() -> None:
            with FileJournals(tmp_path, recover=False) as reader:
                read_all(reader, "j", 0)

        failing.append(read_meanwhile)
        with pytest.raises(OSError, match="EIO"):
            writer.append("j", b"A" * 1999 + b"\n")  # 2,008 file bytes, taken back
        for line in (b"B" * 995 + b"\n", b"C" * 995 + b"\n", b'{"after":1}\n'):  # the same file bytes, 2 records
            writer.append("j", line)
        whole = read_all(writer, "j", 0)
    assert b"A" not in whole
    with FileJournals(tmp_path, recover=False) as fresh:
        assert fresh.end("j") == len(whole)
        for off in (len(whole) - 4, len(whole) - 12, len(whole) - 2000):
            assert read_all(fresh, "j", off) == whole[off:]
