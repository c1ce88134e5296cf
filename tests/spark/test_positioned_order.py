"""The positioned sink when a source hands a later batch lower offsets than an earlier one (issue 39, item 1).

Spark's JSON file source takes files in modification-time order; files sharing one mtime tie and come in
listing order, so a batch can hold lower offsets of a partition than one applied before. The fence refused
those rows as applied before: every total short, the loss only in ``BatchStats.fenced``. Now the sink's ledger
tells them (never applied) from a replay: by default the batch fails naming the partition, the offsets and
the fence; with ``out_of_order="apply"`` they are applied exactly once.
"""

from __future__ import annotations

import itertools
import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from zcluster import Cluster, Count, Incr
from zcluster.spark.positioned import PositionedSink
from zcluster.testing import LocalShards

pytestmark = pytest.mark.spark
_ids = itertools.count()
FILES, ROWS, PARTS, USERS = 24, 200, 3, 30
MTIME = 1_700_000_000


def points(row: dict[str, Any]) -> list[Any]:
    return [Incr("points", row["user"], row["points"]), Count("rows", row["partition"], 1)]


def tied_files(src: Path) -> tuple[dict[str, float], dict[str, int]]:
    """``FILES`` files of ``ROWS`` rows ``{partition, offset, user, points}``, offsets growing per partition
    in the order the files are written, every file given one mtime (deterministic, not a race of fast writes).
    Names run backwards (the file with the lowest offsets sorts last) and files are written in offset order,
    so neither name order nor creation order nor a hash order hands the source the offsets in order. Returns
    the model: totals per user, rows per partition."""
    src.mkdir()
    totals: dict[str, float] = {}
    rows: dict[str, int] = {}
    offsets = dict.fromkeys((f"p{p}" for p in range(PARTS)), 0)
    n = 0
    for f in range(FILES):
        lines = []
        for i in range(ROWS):
            part = f"p{i % PARTS}"
            user, amount = f"u{n % USERS}", n % 5 + 1
            lines.append(json.dumps({"partition": part, "offset": offsets[part], "user": user, "points": amount}))
            offsets[part] += 1
            totals[user] = totals.get(user, 0.0) + amount
            rows[part] = rows.get(part, 0) + 1
            n += 1
        path = src / f"part-{FILES - 1 - f:03d}.json"
        path.write_text("\n".join(lines) + "\n")
    for path in src.iterdir():
        os.utime(path, (MTIME, MTIME))
    return totals, rows


def state(cluster: Cluster) -> tuple[dict[str, float], dict[str, int]]:
    totals = {str(e.member): e.score for e in cluster.select(["points"], limit=1000)["points"]}
    return totals, {str(k): v for k, v in cluster.counters(["rows"])["rows"].items()}


def start(spark: Any, src: Path, sink: PositionedSink, checkpoint: Path) -> Any:
    return (
        spark.readStream.schema("partition STRING, offset LONG, user STRING, points LONG")
        .option("maxFilesPerTrigger", "6")
        .json(str(src))
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )


def test_rows_below_the_fence_never_applied_fail_the_batch_naming_partition_offsets_and_fence(
    spark: Any, shards: LocalShards, tmp_path: Path
) -> None:
    """By default: the first batch holding rows below a partition's fence that were never applied fails,
    naming them; nothing of that partition's rows of the batch is written. Before the ledger the query finished
    with every total short and no error."""
    tied_files(tmp_path / "src")
    prefix = f"order{next(_ids)}:"
    sink = PositionedSink(shards.urls, points, f"order{next(_ids)}", prefix=prefix, flush=64)
    query = start(spark, tmp_path / "src", sink, tmp_path / "ckpt")
    with pytest.raises(Exception) as info:  # Spark wraps it: a StreamingQueryException
        query.awaitTermination(300)
    text = str(info.value)
    assert "ConfigError" in text, text
    found = re.search(
        r"PositionedSink order\d+, partition -/(p\d): offsets ([\d., ]+) \((\d+) rows\) arrived after offsets up to "
        r"(\d+) were applied, and were never applied",
        text,
    )
    assert found, text
    spans = [tuple(int(x) for x in span.split("..")) for span in found[2].split(", ")]
    count, fence = int(found[3]), int(found[4])
    assert sum(span[-1] - span[0] + 1 for span in spans) == count and all(span[-1] < fence for span in spans)
    assert "out_of_order='apply'" in text
    with Cluster.from_urls(shards.urls, prefix=prefix) as cluster:
        _, rows = state(cluster)
    assert rows.get(found[1], 0) <= fence + 1 - count  # none of the late rows written


def test_rows_below_the_fence_apply_exactly_once_with_out_of_order_apply(
    spark: Any, shards: LocalShards, tmp_path: Path
) -> None:
    """``out_of_order="apply"``: every total exact; a new checkpoint directory reading every file again (a
    replay, in yet another order) changes nothing, its rows skipped as applied before."""
    model = tied_files(tmp_path / "src")
    prefix = f"order{next(_ids)}:"
    name = f"order{next(_ids)}"
    sink = PositionedSink(shards.urls, points, name, prefix=prefix, flush=64, out_of_order="apply")
    query = start(spark, tmp_path / "src", sink, tmp_path / "ckpt")
    assert query.awaitTermination(300), "the query never finished"
    assert query.exception() is None
    assert len(sink.history) == FILES // 6
    assert sum(s.delivered for s in sink.history) == FILES * ROWS
    assert sum(s.fenced for s in sink.history) == 0
    with Cluster.from_urls(shards.urls, prefix=prefix) as cluster:
        assert state(cluster) == model
        again = PositionedSink(shards.urls, points, name, prefix=prefix, out_of_order="apply")
        query = start(spark, tmp_path / "src", again, tmp_path / "ckpt2")
        assert query.awaitTermination(300), "the replay never finished"
        assert query.exception() is None
        assert state(cluster) == model
        assert sum(s.seen for s in again.history) == FILES * ROWS
        assert sum(s.delivered for s in again.history) == 0
