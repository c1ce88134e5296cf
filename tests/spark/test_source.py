"""The journal source's framing of byte ranges into rows (no Spark session needed)."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from zcluster.errors import ConfigError
from zcluster.journal import frames
from zcluster.journal.files import FileJournals
from zcluster.journal.frames import read_frames
from zcluster.message.framing import CONTENT_TYPE_NDJSON, CONTENT_TYPE_PROTO_FIXED
from zcluster.message.journals import JournalSpec
from zcluster.spark.batch_source import JournalDataSource
from zcluster.spark.sink import _check_columns
from zcluster.spark.source import (
    RANGES_SCHEMA,
    SCHEMA,
    JournalRange,
    JournalStreamReader,
    pack,
    read_batches,
    read_partition,
)


def test_ndjson_rows_are_exact_frames_and_a_torn_tail_is_reported(tmp_path: Path) -> None:
    store = FileJournals(tmp_path, chunk_size=7)  # tiny chunks: lines span chunk boundaries
    store.create(JournalSpec("j", {"content-type": CONTENT_TYPE_NDJSON}))
    lines = [b'{"a":1}\n', b"\n", b'{"b":"' + b"x" * 30 + b'"}\n', b"not json\n"]
    for line in lines:
        store.append("j", line)
    store.append("j", b'{"torn":')
    end = store.end("j")
    rows = list(read_partition(f"file://{tmp_path}", JournalRange("j", CONTENT_TYPE_NDJSON, 0, end)))
    assert [r[4] for r in rows[:-1]] == lines  # bad JSON is still a frame: the sink reports it with offsets
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))
    assert [(r[1], r[2]) for r in rows[:-1]] == list(itertools.pairwise(offsets))
    assert rows[-1][1:3] == (offsets[-1], end) and rows[-1][4] is None and "unexpected end" in rows[-1][5]
    # a range that starts mid-journal and stops before the end
    part = list(read_partition(f"file://{tmp_path}", JournalRange("j", CONTENT_TYPE_NDJSON, offsets[1], offsets[3])))
    assert [r[4] for r in part] == lines[1:3]


def test_other_framings_go_through_their_decoder(tmp_path: Path) -> None:
    store = FileJournals(tmp_path, chunk_size=5)
    store.create(JournalSpec("p", {"content-type": CONTENT_TYPE_PROTO_FIXED}))
    magic = bytes([0x66, 0x33, 0x93, 0x36])
    frames = [magic + len(p).to_bytes(4, "little") + p for p in (b"one", b"", b"three!")]
    for f in frames:
        store.append("p", f)
    store.append("p", b"garbage")
    store.append("p", frames[0])
    rows = list(read_partition(f"file://{tmp_path}", JournalRange("p", CONTENT_TYPE_PROTO_FIXED, 0, store.end("p"))))
    good = [r[4] for r in rows if r[5] is None]
    assert good == [*frames, frames[0]]
    errors = [r for r in rows if r[5] is not None]
    assert len(errors) == 1 and errors[0][2] - errors[0][1] == len(b"garbage")


def _as_rows(batches: Any) -> list[tuple[Any, ...]]:
    return [tuple(r.values()) for b in batches for r in b.to_pylist()]


@pytest.mark.parametrize("chunk", [3, 7, 64, 1 << 20])
def test_arrow_batches_equal_the_rows(tmp_path: Path, chunk: int) -> None:
    store = FileJournals(tmp_path, chunk_size=chunk)
    store.create(JournalSpec("j", {"content-type": CONTENT_TYPE_NDJSON}))
    for i in range(300):
        store.append("j", b'{"i":%d,"pad":"%s"}\n' % (i, b"x" * (i % 17)))
    store.append("j", b'{"torn":')
    url, end = f"file://{tmp_path}", store.end("j")
    for begin, stop in [(0, end), (0, 600), (19, end)]:  # rounded to the frame boundaries at or after them
        lines = list(read_partition(url, JournalRange("j", CONTENT_TYPE_NDJSON, 0, end)))
        begin = next(r.begin for r in lines if r.begin >= begin)
        stop = next((r.end for r in lines if r.end >= stop), end)
        part = JournalRange("j", CONTENT_TYPE_NDJSON, begin, stop)
        expected = [tuple(r) for r in read_partition(url, part)]
        assert _as_rows(read_batches(url, part)) == expected


def _reader(tmp_path: Path, **options: str) -> JournalStreamReader:
    return JournalStreamReader({"journals": f"file://{tmp_path}", **options})


def test_admission_control_bounds_each_batch_at_frame_boundaries(tmp_path: Path) -> None:
    store = FileJournals(tmp_path)
    for name in ("a", "b"):
        store.create(JournalSpec(name, {"content-type": CONTENT_TYPE_NDJSON}))
        for i in range(10):
            store.append(name, b'{"i":%d}\n' % i)  # 8 bytes each up to i=9
    reader = _reader(tmp_path, maxFramesPerTrigger="4")
    limit = reader.getDefaultReadLimit()
    assert isinstance(limit, ReadMaxRows) and limit.max_rows == 4
    start = reader.initialOffset()
    seen = 0
    while True:
        end = reader.latestOffset(start, limit)
        if end == start:
            break
        parts = reader.partitions(start, end)
        frames = sum(len(list(read_partition(reader.url, r))) for p in parts for r in p.ranges)
        assert 1 <= frames <= 4
        seen += frames
        start = end
    assert seen == 20 and start == {"a": store.end("a"), "b": store.end("b")}
    # a frame larger than the byte bound still gets through, one per batch
    big = _reader(tmp_path, maxBytesPerTrigger="3")
    end = big.latestOffset({"a": 0, "b": 0}, big.getDefaultReadLimit())
    assert end == {"a": 8, "b": 0}
    # ReadAllAvailable (what Spark passes for availableNow's last batch) ignores the options
    assert big.latestOffset({"a": 0, "b": 0}, ReadAllAvailable()) == {"a": store.end("a"), "b": store.end("b")}
    with pytest.raises(ConfigError, match="maxBytesPerTrigger"):
        _reader(tmp_path, maxBytesPerTrigger="lots")


def test_available_now_reads_up_to_the_ends_when_it_started(tmp_path: Path) -> None:
    store = FileJournals(tmp_path)
    store.create(JournalSpec("a", {"content-type": CONTENT_TYPE_NDJSON}))
    store.append("a", b"{}\n")
    reader = _reader(tmp_path)
    reader.prepareForTriggerAvailableNow()
    store.append("a", b"{}\n")
    assert reader.latestOffset({"a": 0}, ReadAllAvailable()) == {"a": 3}


def test_a_line_longer_than_the_maximum_is_one_error_row_and_memory_stays_bounded(tmp_path: Path) -> None:
    store = FileJournals(tmp_path, chunk_size=100)
    store.create(JournalSpec("j", {"content-type": CONTENT_TYPE_NDJSON}))
    lines = [b'{"a":1}\n', b"x" * 5000 + b"\n", b'{"b":2}\n', b"y" * 3000]
    for line in lines:
        store.append("j", line)
    rows = list(read_frames(store, "j", CONTENT_TYPE_NDJSON, 0, store.end("j")))
    # with the default maximum (64 MiB) everything frames as before
    assert [r.data for r in rows[:3]] == lines[:3] and rows[3].error is not None
    small = list(frames._lines("j", CONTENT_TYPE_NDJSON, 0, store.read("j", 0), 1000))
    assert [(r.begin, r.end, r.data is None) for r in small] == [
        (0, 8, False),
        (8, 5009, True),
        (5009, 5017, False),
        (5017, 8017, True),
    ]
    assert "longer than the maximum" in (small[1].error or "") and "unexpected end" in (small[3].error or "")


def test_range_rows_name_each_partition_and_bad_options_are_refused(tmp_path: Path) -> None:
    store = FileJournals(tmp_path)
    for name in ("a", "b"):
        store.create(JournalSpec(name, {"content-type": CONTENT_TYPE_NDJSON}))
        store.append(name, b"{}\n{}\n")
    reader = _reader(tmp_path, rows="ranges")
    parts = reader.partitions({"a": 3}, reader.latestOffset({"a": 3}, ReadAllAvailable()))
    rows = [row for p in parts for batch in reader.read(p) for row in zip(*batch.to_pydict().values(), strict=True)]
    assert rows == [("a", CONTENT_TYPE_NDJSON, 3, 6), ("b", CONTENT_TYPE_NDJSON, 0, 6)]
    source = JournalDataSource({"journals": f"file://{tmp_path}", "rows": "ranges"})
    assert source.schema() == RANGES_SCHEMA
    assert JournalDataSource({"journals": f"file://{tmp_path}"}).schema() == SCHEMA
    with pytest.raises(ConfigError, match="rows must be 'frames' or 'ranges'"):
        _reader(tmp_path, rows="lines")


def test_the_sink_needs_the_journal_store_to_read_ranges() -> None:
    _check_columns(["journal", "begin", "end", "content_type", "data", "error"], None)  # frames: fine
    _check_columns(["journal", "content_type", "begin", "end"], "file:///j")
    with pytest.raises(ConfigError, match="give it journals="):
        _check_columns(["journal", "content_type", "begin", "end"], None)
    with pytest.raises(ConfigError, match="zcluster-journal source's rows"):
        _check_columns(["value"], "file:///j")


@given(st.lists(st.integers(1, 10**6), max_size=12), st.integers(1, 6))
def test_packing_keeps_every_range_once_in_name_order_and_evens_the_bytes(sizes: list[int], most: int) -> None:
    ranges = [JournalRange(f"j{i:02d}", CONTENT_TYPE_NDJSON, 10, 10 + n) for i, n in enumerate(sizes)]
    parts = pack(ranges, most)
    assert len(parts) == min(most, len(ranges))
    names = [[r.journal for r in p.ranges] for p in parts]
    assert sorted(itertools.chain(*names)) == [r.journal for r in ranges]  # each range once
    assert all(n == sorted(n) for n in names)
    assert [[r.journal for r in p.ranges] for p in pack(ranges, most)] == names  # deterministic
    if sizes:  # greedy by size: no partition more than an even share plus the largest range
        loads = [sum(r.end - r.begin for r in p.ranges) for p in parts]
        assert max(loads) <= sum(sizes) / len(parts) + max(sizes)


def test_packing_puts_the_largest_ranges_apart() -> None:
    sizes = {"a": 4, "b": 3, "c": 3, "d": 2, "e": 2, "f": 2}
    ranges = [JournalRange(name, CONTENT_TYPE_NDJSON, 0, n) for name, n in sizes.items()]
    assert [[r.journal for r in p.ranges] for p in pack(ranges, 2)] == [["a", "d", "e"], ["b", "c", "f"]]
    assert [[r.journal for r in p.ranges] for p in pack(ranges, None)] == [[name] for name in sizes]


def test_a_partition_of_several_journals_reads_each_range_in_turn(tmp_path: Path) -> None:
    store = FileJournals(tmp_path)
    for name in ("a", "b", "c"):
        store.create(JournalSpec(name, {"content-type": CONTENT_TYPE_NDJSON}))
        for i in range(3):
            store.append(name, b'{"i":%d}\n' % i)
    start, end = {"b": 8}, {n: store.end(n) for n in ("a", "b", "c")}
    ranged = _reader(tmp_path, rows="ranges", numPartitions="1")
    (part,) = ranged.partitions(start, end)
    rows = [row for batch in ranged.read(part) for row in zip(*batch.to_pydict().values(), strict=True)]
    assert rows == [
        ("a", CONTENT_TYPE_NDJSON, 0, 24),
        ("b", CONTENT_TYPE_NDJSON, 8, 24),
        ("c", CONTENT_TYPE_NDJSON, 0, 24),
    ]
    framed = _reader(tmp_path, numPartitions="1")
    (part,) = framed.partitions(start, end)
    got = _as_rows(framed.read(part))
    assert [(r[0], r[1]) for r in got] == [(n, b) for n in "abc" for b in (0, 8, 16) if (n, b) != ("b", 0)]
    assert len(_reader(tmp_path).partitions(start, end)) == 3  # default: a partition per journal
    with pytest.raises(ConfigError, match="numPartitions must be a positive integer"):
        _reader(tmp_path, numPartitions="0")
