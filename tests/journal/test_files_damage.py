"""File journals whose bytes were damaged on disk: a truncated fragment, flipped bytes in the open fragment.

Real files, damaged with ordinary file operations between two openings of the root. What must hold: the
damage is found, its bytes are moved aside (never deleted), it is reported (``FileJournals.recovered``),
readers get everything else and a clear error naming the lost range, and offsets once handed out are
never reused for other bytes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from journal_helpers import ndjson, read_all

from zcluster.journal import FileJournals
from zcluster.journal._filefmt import HEADER, OPEN_NAME, RECORD, find_fragment
from zcluster.message import (
    DecodeError,
    Frame,
    JournalSpec,
    OffsetOutOfRangeError,
    ReadUncommittedIter,
    UnexpectedEndError,
    framing_for,
)

LINES = [b'{"n":%2d}\n' % i for i in range(40)]  # 9 bytes each


def fill(root: Path, n: int = 40, fragment_bytes: int = 64 << 20) -> list[tuple[int, int]]:
    """Create journal "j" and append the first `n` LINES one by one; return the [begin, end) of each."""
    with FileJournals(root, fragment_bytes=fragment_bytes) as fj:
        fj.create(ndjson("j"))
        return [(r.begin, r.end) for r in (fj.append("j", line) for line in LINES[:n])]


def sealed(root: Path) -> list[tuple[int, int]]:
    names = sorted(p.name for p in (root / "j").glob("*.frag"))
    return [(int(n[:20]), int(n[21:41])) for n in names]


def read_until_error(fj: FileJournals, offset: int) -> tuple[bytes, OffsetOutOfRangeError | None]:
    got = b""
    try:
        for _, chunk in fj.read("j", offset):
            got += chunk
    except OffsetOutOfRangeError as exc:
        return got, exc
    return got, None


# -- a sealed fragment cut short -----------------------------------------------------------------------------


def test_truncated_sealed_fragment_is_quarantined_and_its_offsets_are_never_reused(tmp_path: Path) -> None:
    root = tmp_path / "root"
    ranges = fill(root, n=38, fragment_bytes=64)
    end = ranges[-1][1]
    with FileJournals(root, fragment_bytes=64) as fj:
        assert fj.roll("j")
    b, e = sealed(root)[-1]
    path = root / "j" / find_fragment(root / "j", b, e)
    data = path.read_bytes()
    path.write_bytes(data[:-10])

    with FileJournals(root, fragment_bytes=64) as fj:
        [report] = fj.recovered
        assert report.journal == "j" and report.lost == ((b, e),) and report.truncated_bytes == 0
        assert report.quarantined is not None and report.quarantined.read_bytes() == data[:-10]  # bytes kept
        assert not path.exists() and fj.end("j") == end == e
        # Readers get every byte before the lost range, then an error naming it and where to go on.
        got, err = read_until_error(fj, 0)
        assert got == b"".join(LINES[:38])[:b]
        assert err is not None and f"{b}..{e}" in str(err) and f"offset {e}" in str(err)
        with pytest.raises(OffsetOutOfRangeError, match="lost"):
            fj.read("j", b + 1)
        # New appends go past the lost range: its offsets are never handed out again.
        assert fj.append("j", b"new\n") == (e, e + 4)
        assert read_all(fj, "j", e) == b"new\n"
    with FileJournals(root, fragment_bytes=64) as fj:  # the lost range is remembered, and reported once
        assert fj.recovered == [] and fj.end("j") == e + 4
        assert read_until_error(fj, 0)[1] is not None


def test_message_reader_reports_the_lost_range_and_resumes_after_it(tmp_path: Path) -> None:
    root = tmp_path / "root"
    fill(root, n=20, fragment_bytes=64)
    with FileJournals(root, fragment_bytes=64) as fj:
        fj.roll("j")
    b, e = sealed(root)[1]
    (root / "j" / find_fragment(root / "j", b, e)).write_bytes(b"")  # a fragment emptied
    with FileJournals(root, fragment_bytes=64) as fj:
        spec = JournalSpec("j", ndjson("j").labels)
        it = ReadUncommittedIter(fj, spec, 0)
        first = []
        with pytest.raises(OffsetOutOfRangeError, match=f"{b}..{e}"):
            while True:
                first.append(next(it).message.doc["n"])
        assert first == list(range(b // 9))
        after = [env.message.doc["n"] for env in ReadUncommittedIter(fj, spec, e)]
        assert after == list(range(e // 9, 20))


# -- the open fragment with a flipped byte -----------------------------------------------------------------


def flip(root: Path, pos: int) -> None:
    path = root / "j" / OPEN_NAME
    raw = bytearray(path.read_bytes())
    raw[pos] ^= 0x5A
    path.write_bytes(bytes(raw))


def record_pos(i: int) -> int:
    """File position, in the open fragment, of the i-th record of 9-byte appends."""
    return HEADER.size + i * (RECORD.size + 9)


@pytest.mark.parametrize(
    ("where", "what"),
    [(RECORD.size + 3, "payload"), (1, "length"), (5, "checksum")],
)
def test_flipped_byte_in_the_first_open_record_keeps_the_records_after_it(
    tmp_path: Path, where: int, what: str
) -> None:
    root = tmp_path / "root"
    fill(root, n=5)
    flip(root, record_pos(0) + where)
    damaged = (root / "j" / OPEN_NAME).read_bytes()[record_pos(0) : record_pos(1)]

    with FileJournals(root) as fj:
        [report] = fj.recovered
        assert report.lost == ((0, 9),), what
        assert report.quarantined is not None and report.quarantined.read_bytes() == damaged
        assert fj.end("j") == 45
        with pytest.raises(OffsetOutOfRangeError, match=r"0\.\.9"):
            fj.read("j", 0)
        assert read_all(fj, "j", 9) == b"".join(LINES[1:5])  # the 4 good records, at their offsets
        assert fj.append("j", b"new\n") == (45, 49)  # offsets of appended bytes are never reused
        assert read_all(fj, "j", 9) == b"".join(LINES[1:5]) + b"new\n"
    with FileJournals(root) as fj:
        assert fj.recovered == [] and fj.end("j") == 49


def test_flipped_bytes_in_middle_and_last_open_records(tmp_path: Path) -> None:
    root = tmp_path / "root"
    fill(root, n=6)
    flip(root, record_pos(2) + RECORD.size)  # third record
    flip(root, record_pos(5) + RECORD.size + 8)  # last record: whole, so appended, so its offsets stay taken
    with FileJournals(root) as fj:
        assert sorted(r for rep in fj.recovered for r in rep.lost) == [(18, 27), (45, 54)]
        got, err = read_until_error(fj, 0)
        assert got == b"".join(LINES[:2]) and err is not None
        got, err = read_until_error(fj, 27)
        assert got == b"".join(LINES[3:5]) and err is not None and "45..54" in str(err)
        assert fj.end("j") == 54 and fj.append("j", b"x\n") == (54, 56)


def test_damage_found_at_roll_time_is_sealed_around_too(tmp_path: Path) -> None:
    root = tmp_path / "root"
    with FileJournals(root, fragment_bytes=1 << 20) as fj:
        fj.create(ndjson("j"))
        for line in LINES[:4]:
            fj.append("j", line)
        flip(root, record_pos(1) + RECORD.size + 2)  # rots under a live writer that already validated it
        assert fj.roll("j")
        assert [r.lost for r in fj.recovered] == [((9, 18),)]
        got, err = read_until_error(fj, 0)
        assert got == LINES[0] and err is not None
        assert read_all(fj, "j", 18) == LINES[2] + LINES[3]
        assert fj.append("j", b"y\n") == (36, 38)


def test_open_fragment_truncated_under_a_live_writer_keeps_its_offsets_taken(tmp_path: Path) -> None:
    root = tmp_path / "root"
    with FileJournals(root) as fj:
        fj.create(ndjson("j"))
        for line in LINES[:3]:
            fj.append("j", line)
        path = root / "j" / OPEN_NAME
        path.write_bytes(path.read_bytes()[:-5])  # acknowledged bytes cut off
        assert fj.append("j", b"z\n") == (27, 29)  # not 18: bytes 18..27 were handed out
        assert [r.lost for r in fj.recovered] == [((18, 27),)]
        assert read_until_error(fj, 0)[0] == LINES[0] + LINES[1]
        assert read_all(fj, "j", 27) == b"z\n"


def test_torn_append_is_still_cut_and_its_offsets_reused(tmp_path: Path) -> None:
    root = tmp_path / "root"
    fill(root, n=2)
    path = root / "j" / OPEN_NAME
    path.write_bytes(path.read_bytes() + RECORD.pack(9, 0) + b"{")  # a crashed writer's partial record
    with FileJournals(root) as fj:
        [report] = fj.recovered
        assert report.lost == () and report.truncated_bytes == RECORD.size + 1
        assert fj.append("j", b"w\n") == (18, 20)  # that append never returned: its offsets are free


def test_open_fragment_with_a_damaged_header_is_sealed_not_deleted(tmp_path: Path) -> None:
    root = tmp_path / "root"
    fill(root, n=3)
    flip(root, 0)  # the magic word
    with FileJournals(root) as fj:
        assert [r.quarantined.suffix for r in fj.recovered if r.quarantined] == [".header"]
        assert fj.end("j") == 27 and read_all(fj, "j") == b"".join(LINES[:3])
        assert fj.append("j", b"v\n") == (27, 29)


def test_lost_range_markers_are_hidden_from_file_sources(tmp_path: Path) -> None:
    root = tmp_path / "root"
    fill(root, n=3)
    flip(root, record_pos(0) + RECORD.size)
    with FileJournals(root) as fj:
        assert fj.end("j") == 27
    markers = [p for p in (root / "j").iterdir() if "lost" in p.name]
    assert [p.name[0] for p in markers] == ["_"]
    doc = json.loads(markers[0].read_text())
    assert doc["begin"] == 0 and doc["end"] == 9 and (root / "j" / doc["quarantined"]).is_file()


def test_decoders_see_a_lost_range_as_the_end_of_what_they_read(tmp_path: Path) -> None:
    # ndjson read through the message layer up to the lost range: whole lines only, then the error.
    root = tmp_path / "root"
    fill(root, n=4)
    flip(root, record_pos(3) + RECORD.size)
    with FileJournals(root) as fj:
        d = framing_for("application/x-ndjson").decoder(0)
        got, err = read_until_error(fj, 0)
        items = d.feed(got) + d.close()
        assert all(isinstance(i, Frame) for i in items) and len(items) == 3 and err is not None
        assert not any(isinstance(i, (DecodeError, UnexpectedEndError)) for i in items)


def test_a_seal_interrupted_midway_is_done_again(tmp_path: Path) -> None:
    root = tmp_path / "root"
    fill(root, n=5)
    flip(root, record_pos(2) + RECORD.size)
    open_path = root / "j" / OPEN_NAME
    damaged_open = open_path.read_bytes()
    with FileJournals(root) as fj:
        assert [r.lost for r in fj.recovered] == [((18, 27),)]
    assert sealed(root) == [(0, 18), (27, 45)]
    # As if the sealing process died after renaming the later pieces, before the first and the unlink.
    (root / "j" / find_fragment(root / "j", 0, 18)).unlink()
    open_path.write_bytes(damaged_open)
    with FileJournals(root) as fj:
        assert [r.lost for r in fj.recovered if r.lost] == [((18, 27),)]
        assert not open_path.exists() and sealed(root) == [(0, 18), (27, 45)]
        assert read_until_error(fj, 0)[0] == b"".join(LINES[:2]) and read_all(fj, "j", 27) == b"".join(LINES[3:5])
        assert fj.append("j", b"u\n") == (45, 47)


def test_open_fragment_removed_under_a_live_writer_keeps_its_offsets_taken(tmp_path: Path) -> None:
    root = tmp_path / "root"
    with FileJournals(root) as fj:
        fj.create(ndjson("j"))
        for line in LINES[:3]:
            fj.append("j", line)
        (root / "j" / OPEN_NAME).unlink()
        assert fj.append("j", b"t\n") == (27, 29)
        assert [r.lost for r in fj.recovered] == [((0, 27),)]
        with pytest.raises(OffsetOutOfRangeError, match=r"0\.\.27"):
            fj.read("j", 0)
