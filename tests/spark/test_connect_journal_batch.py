"""``spark.read.format("zcluster-journal")`` (the batch read) on Spark Connect: the same committed messages as
on classic Spark, offsets and all.

The read runs in a driver process of its own (a local Spark Connect server, as ``test_connect.py``'s runs), on
real file journals holding committed, rolled-back and duplicated messages (zcluster.testing.traffic)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from zcluster.journal.files import FileJournals
from zcluster.message.framing import CONTENT_TYPE_NDJSON
from zcluster.spark.batch_source import read_committed
from zcluster.spark.source import MESSAGES_SCHEMA, JournalRange
from zcluster.testing.traffic import Traffic, create_journals, publish

pytestmark = pytest.mark.spark
NAMES = ["audit/part-0", "audit/part-1"]
COLUMNS = [c.split()[0] for c in MESSAGES_SCHEMA.split(", ")]

READ = """
import json, sys
from zcluster.spark import local_session
spark = local_session("local[2]", connect=True)
url, start, out = sys.argv[1], sys.argv[2], sys.argv[3]
reader = spark.read.format("zcluster-journal").option("journals", url).option("rows", "messages")
if start != "-":
    reader = reader.option("startingOffsets", start)
df = reader.load()
rows = [list(r) for r in df.collect()]
json.dump({"columns": df.columns, "rows": rows}, open(out, "w"))
spark.stop()
"""


def _read(url: str, out: Path, start: dict[str, int] | None = None) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", READ, url, json.dumps(start) if start else "-", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    document: dict[str, object] = json.loads(out.read_text())
    return document


def test_a_batch_read_of_journals_on_spark_connect(tmp_path: Path) -> None:
    root = tmp_path / "journals"
    with FileJournals(root, fragment_bytes=4096) as store:
        create_journals(store, NAMES)
        model = publish(store, Traffic(list(NAMES)), producers=3, messages=40, seed=11)
        ends = {n: store.end(n) for n in NAMES}
    assert model.duplicates > 0 and model.rolled_back > 0
    url = f"file://{root}"
    expected = sorted(
        tuple(row) for n in NAMES for row in read_committed(url, JournalRange(n, CONTENT_TYPE_NDJSON, 0, ends[n]))
    )

    whole = _read(url, tmp_path / "whole.json")
    assert whole["columns"] == COLUMNS
    rows = sorted(tuple(r) for r in whole["rows"])  # type: ignore[attr-defined]
    assert len(rows) == model.committed and rows == expected  # not the duplicates, rolled-back or ACKs

    # From a committing frame's offset on (per journal): the rows whose commit lies past it, as classic Spark reads.
    cut = {n: sorted({r[3] for r in rows if r[0] == n})[10] for n in NAMES}
    later = _read(url, tmp_path / "later.json", cut)
    tail = sorted(tuple(r) for r in later["rows"])  # type: ignore[attr-defined]
    second = sorted(
        tuple(row) for n in NAMES for row in read_committed(url, JournalRange(n, CONTENT_TYPE_NDJSON, cut[n], ends[n]))
    )
    assert tail == second and 0 < len(tail) < len(rows)
    assert all(r[3] >= cut[r[0]] for r in tail)
