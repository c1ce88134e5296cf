"""File journals whose fragment files were removed or changed on disk: a gap is a lost range, a sealed
fragment failing the checksum in its name is one, and one journal's damage never closes the others.

Real files, damaged with ordinary file operations (unlink, an in-place write of one byte).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from journal_helpers import ndjson, read_all

from zcluster.journal import FileJournals
from zcluster.journal._filefmt import OPEN_NAME, find_fragment, fragment_name, pack_header, parse_fragment_name
from zcluster.message import OffsetOutOfRangeError

LINES = [b'{"i":%2d}\n' % i for i in range(50)]  # 9 bytes each


def per_append(root: Path, n: int = 20) -> list[tuple[int, int]]:
    """Journal "j" with one fragment file per append of the first `n` LINES; each append's range."""
    with FileJournals(root, fragment_bytes=1) as fj:
        fj.create(ndjson("j"))
        return [(r.begin, r.end) for r in (fj.append("j", line) for line in LINES[:n])]


def read_upto_error(fj: FileJournals, journal: str, offset: int) -> tuple[bytes, OffsetOutOfRangeError | None]:
    got = b""
    try:
        for _, chunk in fj.read(journal, offset):
            got += chunk
    except OffsetOutOfRangeError as exc:
        return got, exc
    return got, None


def test_a_deleted_middle_fragment_is_a_lost_range_at_once_and_recovery_records_it(tmp_path: Path) -> None:
    root = tmp_path / "root"
    ranges = per_append(root)
    b, e = ranges[7]
    with FileJournals(root, fragment_bytes=1) as fj:
        end = fj.end("j")
        (root / "j" / find_fragment(root / "j", b, e)).unlink()
        # Seen by a store opened before the removal: no recovery needed to see the hole.
        (lost,) = fj.lost_ranges("j")
        assert (lost.begin, lost.end) == (b, e) and "fragment file was removed" in lost.reason
        got, err = read_upto_error(fj, "j", 0)
        assert got == b"".join(LINES[:7])  # everything before the hole
        assert err is not None and err.lost == (b, e) and err.resume_offset == e
        with pytest.raises(OffsetOutOfRangeError) as inside:
            fj.read("j", b + 3)
        assert inside.value.lost == (b, e)
        assert read_all(fj, "j", e) == b"".join(LINES[8:20]) and fj.end("j") == end
    with FileJournals(root, fragment_bytes=1) as fj:
        assert [r.lost for r in fj.recovered] == [((b, e),)]  # recovery writes its marker
        (lost,) = fj.lost_ranges("j")
        assert (lost.begin, lost.end, lost.quarantined) == (b, e, None) and lost.found_at is not None
        assert fj.append("j", b"new\n") == (end, end + 4)  # offsets never reused


def test_deleted_first_fragments_are_a_lost_range_from_offset_zero(tmp_path: Path) -> None:
    root = tmp_path / "root"
    ranges = per_append(root, 5)
    for r in ranges[:2]:
        (root / "j" / find_fragment(root / "j", *r)).unlink()
    with FileJournals(root, fragment_bytes=1) as fj:
        assert [(r.begin, r.end) for r in fj.lost_ranges("j")] == [(0, ranges[1][1])]
        assert read_upto_error(fj, "j", 0)[1] is not None


def test_a_deleted_last_sealed_fragment_breaks_neither_opening_nor_other_journals(tmp_path: Path) -> None:
    root = tmp_path / "root"
    with FileJournals(root) as fj:
        for name in ("j", "k"):
            fj.create(ndjson(name))
            for line in LINES[:10]:
                fj.append(name, line)
            fj.roll(name)
            for line in LINES[10:15]:
                fj.append(name, line)  # in the open fragment, after the last sealed one
    (frag,) = [n for n in os.listdir(root / "j") if parse_fragment_name(n)]
    b, e = int(frag[:20]), int(frag[21:41])
    (root / "j" / frag).unlink()
    with FileJournals(root) as fj:  # used to fail for every journal: "gap between fragments ... and open"
        assert fj.unrecovered == {}
        assert [r.lost for r in fj.recovered] == [((b, e),)] and [(r.begin, r.end) for r in fj.lost_ranges("j")] == [
            (b, e)
        ]
        got, err = read_upto_error(fj, "j", 0)
        assert got == b"" and err is not None and err.lost == (b, e)
        assert read_all(fj, "j", e) == b"".join(LINES[10:15])
        assert read_all(fj, "k") == b"".join(LINES[:15])
        assert fj.append("j", b"x\n").begin == e + 45


def test_one_journal_that_cannot_be_recovered_leaves_the_others_open(tmp_path: Path) -> None:
    root = tmp_path / "root"
    per_append(root, 4)
    with FileJournals(root) as fj:
        fj.create(ndjson("k"))
        fj.append("k", b"ok\n")
    # An open fragment beginning inside a sealed fragment: nothing tells which bytes are whose.
    (root / "j" / OPEN_NAME).write_bytes(pack_header(4, time.time()))
    with FileJournals(root) as fj:
        assert list(fj.unrecovered) == ["j"] and "inside fragments" in str(fj.unrecovered["j"])
        assert read_all(fj, "k") == b"ok\n" and fj.append("k", b"on\n").begin == 3


# -- checksums of sealed fragments ---------------------------------------------------------------------------


def flip_digit(path: Path, old: bytes, new: bytes) -> None:
    """Overwrite one byte in place (same length, as bit rot or a stray write would)."""
    data = path.read_bytes()
    pos = data.index(old)
    with open(path, "r+b") as f:
        f.seek(pos + len(old) - 1)
        f.write(new[-1:])


def test_a_flipped_digit_in_a_sealed_fragment_is_a_lost_range_not_data(tmp_path: Path) -> None:
    root = tmp_path / "root"
    with FileJournals(root, fragment_bytes=90) as fj:  # 10 lines per fragment
        fj.create(ndjson("j"))
        for line in LINES:
            fj.append("j", line)
        end = fj.end("j")
        frag = find_fragment(root / "j", 270, 360)
        assert parse_fragment_name(frag) == (270, 360, parse_fragment_name(frag)[2]) and frag != fragment_name(270, 360)
        assert read_all(fj, "j") == b"".join(LINES)  # checked once, intact
        flip_digit(root / "j" / frag, b'"i":30', b'"i":39')
        # A reader of this process checks the changed file again before returning any byte of it.
        got, err = read_upto_error(fj, "j", 0)
        assert got == b"".join(LINES[:30]) and b'"i":39' not in got
        assert err is not None and err.lost == (270, 360) and "checksum" in (err.reason or "")
        (lost,) = fj.lost_ranges("j")  # recorded at once: skippable, and the bytes kept aside
        assert lost.quarantined and (root / "j" / lost.quarantined).read_bytes().startswith(b'{"i":39}\n{"i":31}')
        assert read_all(fj, "j", 360) == b"".join(LINES[40:]) and fj.end("j") == end


def test_recovery_checks_every_sealed_fragment(tmp_path: Path) -> None:
    root = tmp_path / "root"
    ranges = per_append(root, 6)
    flip_digit(root / "j" / find_fragment(root / "j", *ranges[2]), b'"i": 2', b'"i": 7')
    with FileJournals(root, fragment_bytes=1) as fj:
        assert [r.lost for r in fj.recovered] == [(ranges[2],)]
        assert read_upto_error(fj, "j", 0)[0] == b"".join(LINES[:2])


def test_fragments_written_before_checksums_are_read_unchecked(tmp_path: Path) -> None:
    root = tmp_path / "root"
    ranges = per_append(root, 3)
    for r in ranges:  # as an earlier version named them
        name = find_fragment(root / "j", *r)
        os.rename(root / "j" / name, root / "j" / fragment_name(*r))
    flip_digit(root / "j" / fragment_name(*ranges[1]), b'"i": 1', b'"i": 8')
    with FileJournals(root, fragment_bytes=1) as fj:
        assert fj.recovered == [] and fj.lost_ranges("j") == []
        assert read_all(fj, "j") == LINES[0] + b'{"i": 8}\n' + LINES[2]  # nothing can tell
        fj.append("j", LINES[3])
        assert parse_fragment_name(find_fragment(root / "j", *fj.append("j", LINES[4])))[2] is not None
