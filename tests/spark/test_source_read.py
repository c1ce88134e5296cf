"""How a source task reads its journal range (no Spark session needed): every byte of the range or an error,
without recovering (nor locking) the journals it does not read."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from zcluster.journal._filefmt import HEADER, OPEN_NAME, RECORD
from zcluster.journal.files import FileJournals
from zcluster.journal.frames import read_range
from zcluster.message.errors import JournalError, OffsetOutOfRangeError
from zcluster.message.framing import CONTENT_TYPE_NDJSON
from zcluster.message.journals import JournalSpec
from zcluster.spark.source import JournalRange, read_batches, read_partition

SPEC = {"content-type": CONTENT_TYPE_NDJSON}


def _rows(batches: Any) -> list[tuple[Any, ...]]:
    return [tuple(r.values()) for b in batches for r in b.to_pylist()]


def _lines(n: int) -> list[bytes]:
    return [b'{"i":%d,"pad":"%s"}\n' % (i, b"y" * (i % 23)) for i in range(n)]


@pytest.mark.parametrize("chunk", [5, 100, 1 << 20])
def test_rows_across_fragment_files_and_the_open_fragment(tmp_path: Path, chunk: int) -> None:
    data = _lines(500)
    with FileJournals(tmp_path, chunk_size=chunk, fragment_bytes=2000) as fj:
        fj.create(JournalSpec("j", SPEC))
        for d in data:
            fj.append("j", d)
        end = fj.end("j")
    assert any(p.name.endswith(".frag") for p in (tmp_path / "j").iterdir())
    assert (tmp_path / "j" / OPEN_NAME).exists()
    url = f"file://{tmp_path}"
    bounds = [0, *(sum(map(len, data[:k])) for k in (1, 37, 250, 499)), end]
    for begin, stop in zip(bounds, [*bounds[1:], end], strict=True):
        part = JournalRange("j", CONTENT_TYPE_NDJSON, begin, stop)
        rows = _rows(read_batches(url, part))
        assert rows == [tuple(r) for r in read_partition(url, part)]
        assert b"".join(r[4] for r in rows) == b"".join(data)[begin:stop]
        assert [r[1] for r in rows[1:]] == [r[2] for r in rows[:-1]]  # contiguous offsets


def test_a_task_reads_without_recovering_or_locking_other_journals(tmp_path: Path) -> None:
    with FileJournals(tmp_path) as fj:
        for name in ("a", "b"):
            fj.create(JournalSpec(name, SPEC))
            fj.append(name, b'{"x":1}\n')
    torn = tmp_path / "b" / OPEN_NAME
    with open(torn, "ab") as f:
        f.write(b"\x00\x00\x00\x40torn")  # an append in progress in journal b
    before = torn.read_bytes()
    rows = _rows(read_batches(f"file://{tmp_path}", JournalRange("a", CONTENT_TYPE_NDJSON, 0, 8)))
    assert [r[4] for r in rows] == [b'{"x":1}\n']
    assert torn.read_bytes() == before  # left to its writer: a task is no writer


def test_a_record_damaged_after_planning_fails_the_task_naming_the_lost_range(tmp_path: Path) -> None:
    data = _lines(30)
    with FileJournals(tmp_path) as fj:
        fj.create(JournalSpec("j", SPEC))
        for d in data:
            fj.append("j", d)
        end = fj.end("j")  # what the driver planned
    path = tmp_path / "j" / OPEN_NAME
    raw = bytearray(path.read_bytes())
    at = HEADER.size + sum(RECORD.size + len(d) for d in data[:10])
    raw[at + RECORD.size + 2] ^= 0x20  # the 11th record's payload
    path.write_bytes(bytes(raw))
    lost = (sum(map(len, data[:10])), sum(map(len, data[:11])))
    with pytest.raises(OffsetOutOfRangeError, match=f"{lost[0]}..{lost[1]}"):
        _rows(read_batches(f"file://{tmp_path}", JournalRange("j", CONTENT_TYPE_NDJSON, 0, end)))
    # The task's recovery sealed it: the range is lost for every reader now, the rest is kept.
    with FileJournals(tmp_path) as fj:
        assert fj.recovered == []
        assert b"".join(c for _, c in fj.read("j", lost[1])) == b"".join(data[11:])


class _ShortStore:
    """A store whose reads stop before the end they were asked for, with no way to recover."""

    def read(self, journal: str, offset: int, **_: Any) -> Iterator[tuple[int, bytes]]:
        yield offset, b"abc\n"


def test_a_range_the_store_cannot_give_whole_is_an_error_not_fewer_rows() -> None:
    assert list(read_range(_ShortStore(), "j", 0, 4)) == [b"abc\n"]
    assert list(read_range(_ShortStore(), "j", 0, 2)) == [b"ab"]
    with pytest.raises(JournalError, match=r"4\.\.10"):
        list(read_range(_ShortStore(), "j", 0, 10))


def test_a_line_longer_than_the_maximum_frame_is_one_error_row_as_in_read_frames(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from zcluster.message.framing import framing_for

    monkeypatch.setattr(framing_for(CONTENT_TYPE_NDJSON), "max_frame_bytes", 1000)
    long_line = b'{"big":"' + b"z" * (3 << 20) + b'"}\n'  # spans several of the reader's ~1 MiB chunks
    data = [b'{"a":1}\n', long_line, b'{"b":2}\n', b'{"tail":"' + b"t" * 5000]  # the last never ends
    with FileJournals(tmp_path) as fj:
        fj.create(JournalSpec("j", SPEC))
        for d in data:
            fj.append("j", d)
        end = fj.end("j")
    url, part = f"file://{tmp_path}", JournalRange("j", CONTENT_TYPE_NDJSON, 0, end)
    rows = _rows(read_batches(url, part))
    assert rows == [tuple(r) for r in read_partition(url, part)]
    first, second = len(data[0]), len(data[0]) + len(long_line)
    assert [(r[1], r[2], r[4]) for r in rows] == [
        (0, first, data[0]),
        (first, second, None),
        (second, second + len(data[2]), data[2]),
        (second + len(data[2]), end, None),
    ]
    assert "longer than the maximum frame size" in rows[1][5] and "unexpected end" in rows[3][5]
