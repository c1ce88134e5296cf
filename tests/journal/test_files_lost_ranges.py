"""What a lost range looks like to readers: the error's attributes, the store's list, a row per range."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
from journal_helpers import ndjson

from zcluster.journal import FileJournals
from zcluster.journal._filefmt import find_fragment
from zcluster.journal.frames import LOST_ROW, lost_error, read_frames, read_range_frames
from zcluster.message import OffsetOutOfRangeError
from zcluster.message.framing import CONTENT_TYPE_NDJSON

LINES = [b'{"n":%2d}\n' % i for i in range(8)]  # 9 bytes each


def damaged(root: Path, lost: int) -> tuple[FileJournals, tuple[int, int]]:
    with FileJournals(root, fragment_bytes=1) as fj:  # one fragment file per append
        fj.create(ndjson("j"))
        ranges = [(r.begin, r.end) for r in (fj.append("j", line) for line in LINES)]
    path = root / "j" / find_fragment(root / "j", *ranges[lost])
    path.write_bytes(path.read_bytes()[:4])
    return FileJournals(root, fragment_bytes=1), ranges[lost]


def test_the_error_names_the_lost_range_and_where_to_go_on(tmp_path: Path) -> None:
    fj, (b, e) = damaged(tmp_path / "root", 3)
    with fj:
        (lost,) = fj.lost_ranges("j")
        assert (lost.begin, lost.end) == (b, e) and "held 4 of 9 bytes" in lost.reason and lost.quarantined
        assert lost.found_at is not None
        with pytest.raises(OffsetOutOfRangeError) as info:
            b"".join(c for _, c in fj.read("j", 0))
        error = info.value
        assert (error.journal, error.lost_begin, error.lost_end, error.resume_offset, error.lost) == (
            "j",
            b,
            e,
            e,
            (b, e),
        )
        assert error.reason == lost.reason
        again = pickle.loads(pickle.dumps(error))  # e.g. carried out of a worker process
        assert (again.lost, again.resume_offset, str(again)) == ((b, e), e, str(error))
        with pytest.raises(OffsetOutOfRangeError) as inside:
            fj.read("j", b + 1)  # from inside the range: at once
        assert inside.value.lost == (b, e)
        with pytest.raises(OffsetOutOfRangeError) as outside:
            fj.read("j", fj.end("j") + 1)
        assert outside.value.lost is None and outside.value.resume_offset is None


def test_frames_with_lost_rows_give_one_row_per_range_and_read_on(tmp_path: Path) -> None:
    fj, (b, e) = damaged(tmp_path / "root", 5)
    with fj:
        with pytest.raises(OffsetOutOfRangeError):
            list(read_frames(fj, "j", CONTENT_TYPE_NDJSON, 0, fj.end("j")))
        for read in (read_frames, read_range_frames):
            rows = list(read(fj, "j", CONTENT_TYPE_NDJSON, 0, fj.end("j"), lost_rows=True))
            assert [r.data for r in rows if r.error is None] == LINES[:5] + LINES[6:]
            (row,) = [r for r in rows if r.error is not None]
            assert (row.begin, row.end, row.data) == (b, e, None) and row.error.startswith(LOST_ROW)
            error = lost_error(row)
            assert error is not None and (error.journal, error.lost, error.resume_offset) == ("j", (b, e), e)
        inside = list(read_frames(fj, "j", CONTENT_TYPE_NDJSON, b + 2, fj.end("j"), lost_rows=True))
        assert lost_error(inside[0]) is not None and [r.data for r in inside[1:]] == LINES[6:]
        assert lost_error(next(read_frames(fj, "j", CONTENT_TYPE_NDJSON, 0, 9))) is None
