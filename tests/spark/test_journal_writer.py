"""``writeStream.format("zcluster-journal")``: rows into journals exactly once per micro-batch (classic local
Spark, a real redis-server, file journals). A batch Spark runs again (its commit log entry removed, as when the
driver dies before writing it) publishes its rows again, uncommitted; only the recorded attempt's ACKs are
appended: read-committed, each row is there once."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from zcluster.journal import FileJournals
from zcluster.message.framing import CONTENT_TYPE_NDJSON
from zcluster.message.journals import JournalSpec
from zcluster.message.readers import ReadCommittedIter, ReadUncommittedIter
from zcluster.message.sequencer import Sequencer

pytestmark = pytest.mark.spark
_ids = itertools.count()
OUT = ["w/0", "w/1"]


def rows_file(folder: Path, name: str, first: int, n: int) -> None:
    lines = [json.dumps({"journal": OUT[i % 2], "message": json.dumps({"id": i})}) for i in range(first, first + n)]
    (folder / name).write_text("\n".join(lines) + "\n")


def ids(store: FileJournals, committed: bool) -> list[int]:
    out = []
    for j in OUT:
        spec = JournalSpec(j, {"content-type": CONTENT_TYPE_NDJSON})
        it = ReadCommittedIter(store, spec, Sequencer()) if committed else ReadUncommittedIter(store, spec)
        out += [e.message.doc["id"] for e in it if not e.is_ack]
    return sorted(out)


def run(spark: Any, src: Path, ckpt: Path, url: str, shards: Any, app: str) -> None:
    df = spark.readStream.format("json").schema("journal string, message string").option("maxFilesPerTrigger", 1)
    query = (
        df.load(str(src))
        .writeStream.format("zcluster-journal")
        .option("journals", url)
        .option("app", app)
        .option("urls", ",".join(shards.urls))
        .option("prefix", f"jw{next(_ids)}:")
        .option("checkpointLocation", str(ckpt))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()


def test_rows_are_published_once_per_batch_and_a_rerun_batch_never_commits_twice(
    spark: Any, tmp_path: Path, shards: Any
) -> None:
    root, src, ckpt = tmp_path / "journals", tmp_path / "src", tmp_path / "ckpt"
    src.mkdir()
    store = FileJournals(root)
    for j in OUT:
        store.create(JournalSpec(j, {"content-type": CONTENT_TYPE_NDJSON}))
    url, app = f"file://{root}", f"jw{next(_ids)}"
    rows_file(src, "a.json", 0, 20)
    rows_file(src, "b.json", 20, 15)
    run(spark, src, ckpt, url, shards, app)
    assert ids(store, committed=True) == list(range(35))
    # Spark runs the last batch again (its commit log entry lost): its rows are published again, uncommitted.
    last = max(int(p.name) for p in (ckpt / "commits").iterdir() if p.name.isdigit())
    (ckpt / "commits" / str(last)).unlink()
    (ckpt / "commits" / f".{last}.crc").unlink(missing_ok=True)
    run(spark, src, ckpt, url, shards, app)
    assert len(ids(store, committed=False)) == 35 + 15  # the re-run's copies are in the journals
    assert ids(store, committed=True) == list(range(35))  # never committed
    rows_file(src, "c.json", 35, 5)
    run(spark, src, ckpt, url, shards, app)
    assert ids(store, committed=True) == list(range(40))
    store.close()
