"""The positioned sink (Kafka's shape: rows with partition and offset, no Gazette UUIDs), end to end in local
Spark: counters equal the rows' model across a retried task, a lost Spark commit and a new checkpoint
directory that reads every offset again. The source is the zcluster-journal source's frame rows (journal as
the partition, byte offset as the offset): a source of Kafka's shape that runs here."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from zcluster import Cluster, Count, Incr, Insert, MapperError
from zcluster.journal.files import FileJournals
from zcluster.journal.publishing import AsyncPublisher
from zcluster.message.journals import JournalSpec
from zcluster.message.mapping import modulo_mapping
from zcluster.message.records import JsonMessage
from zcluster.spark.positioned import PositionedSink
from zcluster.testing import LocalShards
from zcluster.testing.traffic import create_journals

pytestmark = pytest.mark.spark
_ids = itertools.count()


def mapper(row: dict[str, Any]) -> list[Any]:
    doc = json.loads(row["data"])
    return [Count("clicks", doc["user"], 1), Incr("spend", doc["user"], doc["amount"]), Insert("seen", 1.0, doc["id"])]


class FailsOnce:
    def __init__(self, marker: Path, at: int) -> None:
        self.marker, self.at, self.seen = marker, at, 0

    def __call__(self, row: dict[str, Any]) -> list[Any]:
        self.seen += 1
        if self.seen == self.at and not self.marker.exists():
            self.marker.write_text("failed once")
            raise RuntimeError("a task dies after some of its writes were sent")
        return mapper(row)


def query(spark: Any, url: str, sink: Any, checkpoint: Path) -> None:
    q = (
        spark.readStream.format("zcluster-journal")
        .option("journals", url)
        .option("maxFramesPerTrigger", "60")
        .load()
        .withColumnRenamed("journal", "partition")
        .withColumnRenamed("begin", "offset")
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination()


def test_positioned_rows_count_once_through_retries_replays_and_a_new_checkpoint(
    spark: Any, shards: LocalShards, tmp_path: Path
) -> None:
    root = tmp_path / "journals"
    store = FileJournals(root)
    names = ["clicks/p0", "clicks/p1"]
    create_journals(store, names)
    specs = [JournalSpec(n, {"content-type": "application/x-ndjson"}) for n in names]
    mapping = modulo_mapping(lambda m: m.doc["user"], lambda: specs)
    clicks: dict[str, int] = {}
    spend: dict[str, float] = {}
    with AsyncPublisher(store) as pub:
        for i in range(300):
            user, amount = f"u{i % 7}", float(i % 5)
            pub.publish_committed(mapping, JsonMessage({"id": f"e{i}", "user": user, "amount": amount}))
            clicks[user] = clicks.get(user, 0) + 1
            spend[user] = spend.get(user, 0.0) + amount
    prefix = f"pos{next(_ids)}:"
    url = f"file://{root}"
    sink = PositionedSink(shards.urls, FailsOnce(tmp_path / "failed", at=40), "clicks", prefix=prefix, flush=16)
    query(spark, url, sink, tmp_path / "ckpt")
    assert (tmp_path / "failed").exists() and len(sink.history) > 2  # a task failed after flushing; batches
    with Cluster.from_urls(shards.urls, prefix=prefix) as c:

        def state() -> tuple[dict[str, int], dict[str, float], int]:
            totals = {str(e.member): e.score for e in c.select(["spend"], limit=100)["spend"]}
            return c.counters(["clicks"])["clicks"], totals, len(c.select(["seen"], limit=1000)["seen"])

        assert state() == (clicks, spend, 300)
        commits = sorted(
            (p for p in (tmp_path / "ckpt" / "commits").iterdir() if p.name.isdigit()), key=lambda p: int(p.name)
        )
        commits[-1].unlink()  # Spark lost its last commit: the batch runs again
        (commits[-1].parent / f".{commits[-1].name}.crc").unlink(missing_ok=True)
        query(spark, url, PositionedSink(shards.urls, mapper, "clicks", prefix=prefix), tmp_path / "ckpt")
        query(spark, url, PositionedSink(shards.urls, mapper, "clicks", prefix=prefix), tmp_path / "ckpt2")
        assert state() == (clicks, spend, 300)  # every offset read again: fenced


def test_a_positioned_sink_names_a_bad_row(spark: Any, shards: LocalShards, tmp_path: Path) -> None:
    root = tmp_path / "journals"
    store = FileJournals(root)
    create_journals(store, ["bad/p0"])
    store.append("bad/p0", b'{"id": "e1", "user": "u1", "amount": "lots"}\n')
    sink = PositionedSink(shards.urls, mapper, f"bad{next(_ids)}", prefix=f"posb{next(_ids)}:")
    with pytest.raises(Exception, match="offset 0") as info:
        query(spark, f"file://{root}", sink, tmp_path / "ckpt")
    assert MapperError.__name__ in str(info.value)
