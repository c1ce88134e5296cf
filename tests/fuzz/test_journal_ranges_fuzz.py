"""Fuzz tier (hypothesis) for the journal batch reader's offsets: random cut points anywhere (inside frames,
inside transactions, on boundaries), and the consecutive ranges they make, each planned as a batch read
plans it (:func:`zcluster.spark.batch_source.plan_range`), read back to back, must equal one whole read:

* ``rows=messages`` (:func:`read_committed`): each committed message exactly once, in delivery order, no
  error row (the journals hold none): a range holds the messages whose committing frame begins in it;
* ``rows=frames`` (:func:`read_batches`): each frame exactly once with its bytes, no error row and no
  fragment of a frame.

Real file journals (several fragment files each): an ndjson journal of synthetic traffic (committed
messages, transactions, rollbacks, duplicated appends) and a CSV journal whose records hold quoted
newlines (its frame boundaries are found by decoding from the start). No Spark session: the reading layer
alone. ``ZC_FUZZ_EXAMPLES`` raises the example count.
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zcluster.journal import AsyncPublisher, FileJournals
from zcluster.message import CsvRecord
from zcluster.message.framing import CONTENT_TYPE_CSV, CONTENT_TYPE_NDJSON
from zcluster.message.journals import JournalSpec
from zcluster.spark.batch_source import plan_range, read_committed
from zcluster.spark.source import ARROW_SCHEMA, read_batches
from zcluster.testing.traffic import Traffic, create_journals, publish

FUZZ = settings(
    max_examples=int(os.environ.get("ZC_FUZZ_EXAMPLES", "60")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
NDJSON, CSV = "timelines/part-000", "csv/part-000"
TYPES = {NDJSON: CONTENT_TYPE_NDJSON, CSV: CONTENT_TYPE_CSV}


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> str:
    root: Path = tmp_path_factory.mktemp("journals")
    with FileJournals(root, fragment_bytes=2048) as store:
        create_journals(store, [NDJSON])
        publish(store, Traffic([NDJSON]), producers=3, messages=25, seed=3)
        store.create(JournalSpec(CSV, {"content-type": CONTENT_TYPE_CSV}))
        with AsyncPublisher(store) as pub:
            to_csv = lambda m: (CSV, CONTENT_TYPE_CSV)  # noqa: E731
            for i in range(60):
                record = CsvRecord(["", f"line {i}\nof record {i}", f'quote "{i}"'])
                if i % 5 in (1, 2):
                    pub.publish_uncommitted(to_csv, record)
                    if i % 5 == 2:
                        pub.commit() if i % 3 else pub.rollback()
                else:
                    pub.publish_committed(to_csv, record)
    return f"file://{root}"


def _ranges(url: str, journal: str, cuts: list[int]) -> list[Any]:
    store = FileJournals(url.removeprefix("file://"))
    try:
        end = store.end(journal)
        points = [0, *sorted(c * end >> 16 for c in cuts), end]  # cuts: fractions of the journal
        return [plan_range(store, journal, TYPES[journal], a, b, end) for a, b in itertools.pairwise(points)]
    finally:
        store.close()


def _frames(url: str, part: Any) -> list[tuple[Any, ...]]:
    table = pa.Table.from_batches(list(read_batches(url, part)), ARROW_SCHEMA)
    return list(zip(*(table.column(c).to_pylist() for c in ("begin", "end", "data", "error")), strict=True))


cuts = st.lists(st.integers(0, 1 << 16), max_size=8)


@FUZZ
@given(journal=st.sampled_from([NDJSON, CSV]), cuts=cuts)
def test_consecutive_message_ranges_hold_each_committed_message_once(url: str, journal: str, cuts: list[int]) -> None:
    (whole,) = _ranges(url, journal, [])
    everything = list(read_committed(url, whole))
    assert everything and all(r[8] is None for r in everything)
    pieces = [row for part in _ranges(url, journal, cuts) for row in read_committed(url, part)]
    assert pieces == everything


@FUZZ
@given(journal=st.sampled_from([NDJSON, CSV]), cuts=cuts)
def test_consecutive_frame_ranges_hold_each_frame_once(url: str, journal: str, cuts: list[int]) -> None:
    (whole,) = _ranges(url, journal, [])
    everything = _frames(url, whole)
    assert everything and all(r[3] is None for r in everything)
    parts = _ranges(url, journal, cuts)
    assert all(p.begin in {r[0] for r in everything} | {whole.end} for p in parts)  # starts at a frame
    assert [row for part in parts for row in _frames(url, part)] == everything
