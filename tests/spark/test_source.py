"""The journal source's framing of byte ranges into rows (no Spark session needed)."""

from __future__ import annotations

import itertools
from pathlib import Path

from zcluster.journal.files import FileJournals
from zcluster.message.framing import CONTENT_TYPE_NDJSON, CONTENT_TYPE_PROTO_FIXED
from zcluster.message.journals import JournalSpec
from zcluster.spark.source import JournalRange, read_partition


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
