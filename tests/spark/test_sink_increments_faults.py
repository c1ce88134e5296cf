"""Zombie sink tasks and exactly-once increments, in local classic Spark (``local[2,4]``, loopback only): a task
that applies a micro-batch's increments late, after that batch was applied (and committed) by another attempt
and later batches followed. The totals equal a model computed here, and the late task's increments are shown
to be refused by the fences, not by some other guard.

Spark's own speculation cannot make such a zombie in local mode (a speculative copy never runs on the host of
the running attempt, and local mode has one host), so the tests make the late attempt explicitly:

* the :class:`ZClusterSink`: a query's task stalls in its mapper after loading its journals' checkpoints and
  applying its first flushes; a second query with the same query name (a restarted driver, with its own
  Spark checkpoint) applies and commits the same messages meanwhile; the stalled task then wakes and applies
  the rest of its range: every one of those increments comes again, below the fences;
* the :class:`PositionedSink` (no journal checkpoints at all: the fences are its only guard): the sink's task
  function runs again, as a Spark task, over the rows of the query's first micro-batch, after every later
  batch was applied.
"""

from __future__ import annotations

import itertools
import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from zcluster import Cluster, Count, Incr
from zcluster.journal.files import FileJournals
from zcluster.journal.publishing import AsyncPublisher
from zcluster.message.journals import JournalSpec
from zcluster.message.mapping import modulo_mapping
from zcluster.message.readers import ReadCommittedIter
from zcluster.message.records import JsonMessage
from zcluster.message.sequencer import Sequencer
from zcluster.spark import ZClusterSink, run_available_now
from zcluster.spark.observe import TASK_SCHEMA, add_rows
from zcluster.spark.positioned import PositionedSink
from zcluster.state import BatchStats, StateStore
from zcluster.testing import LocalShards
from zcluster.testing.traffic import Traffic, create_journals, publish

pytestmark = pytest.mark.spark
_ids = itertools.count()
CT = "application/x-ndjson"
Totals = tuple[dict[str, int], dict[str, float]]


def counting(message: Any) -> list[Incr | Count]:
    doc = message.doc
    return [Count("events", doc["user"], 1), Incr("points", doc["user"], 0.5 if doc["op"] == "add" else -1.0)]


def model(store: FileJournals, names: list[str]) -> Totals:
    """Counts and points of every committed message, by the message layer's own read-committed reader."""
    events: dict[str, int] = {}
    points: dict[str, float] = {}
    for name in names:
        for env in ReadCommittedIter(store, JournalSpec(name, {"content-type": CT}), Sequencer(buffer=256)):
            if env.is_ack:
                continue
            for w in counting(env.message):
                if isinstance(w, Count):
                    events[str(w.field)] = events.get(str(w.field), 0) + w.delta
                else:
                    points[str(w.member)] = points.get(str(w.member), 0.0) + w.delta
    return events, points


def totals(cluster: Cluster) -> Totals:
    points = {str(e.member): e.score for e in cluster.select(["points"], limit=10_000)["points"]}
    return {str(f): n for f, n in cluster.counters(["events"])["events"].items()}, points


def wait_for(path: Path, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: {path} never appeared")
        time.sleep(0.05)


class StallsOnce:
    """:func:`counting`, but the first task to reach its ``at``-th message (after some flushes) writes
    ``stalled`` and waits for ``resume`` (marker files: Spark's Python workers are other processes)."""

    def __init__(self, markers: Path, at: int) -> None:
        self.markers, self.at, self.seen = markers, at, 0

    def __call__(self, message: Any) -> list[Incr | Count]:
        self.seen += 1
        stalled = self.markers / "stalled"
        if self.seen == self.at and not stalled.exists():
            stalled.touch()
            wait_for(self.markers / "resume", 180, "the stalled task was never resumed")
        return counting(message)


def test_a_sink_task_finishing_late_after_its_batch_was_applied_again_counts_nothing_twice(
    spark: Any, shards: LocalShards, tmp_path: Path
) -> None:
    """Query A's only task (both journals, ``numPartitions`` 1) loads the first journal's checkpoint, applies
    its first flushes, then stalls in its mapper. Query B, the same query name with a Spark checkpoint of its
    own (a driver restarted while the old one's task still runs), runs the same batch meanwhile from the same
    checkpoints: the increments A applied are refused by the fences, B applies the rest and saves the
    checkpoints. A then wakes and finishes its range of the first journal with the checkpoint it loaded
    before: it delivers all of that journal's messages again and each of their increments is refused (its
    checkpoint, older than the stored one, is not saved). Its second journal it starts only then, past B's
    checkpoint: nothing read. Between them each increment is applied exactly once; the totals are the
    model's."""
    root = tmp_path / "journals"
    store = FileJournals(root)
    names = [f"late/part-{i}" for i in range(2)]
    create_journals(store, names)
    traffic = publish(store, Traffic(names), producers=2, messages=30, seed=23)
    expected = model(store, names)
    in_first = sum(model(store, names[:1])[0].values())  # messages committed in the first journal
    assert in_first > 20
    url, prefix, query_name = f"file://{root}", f"late{next(_ids)}:", f"late{uuid.uuid4().hex[:8]}"
    markers = tmp_path / "markers"
    markers.mkdir()
    late = ZClusterSink(shards.urls, StallsOnce(markers, at=20), query_name, journals=url, prefix=prefix, flush=8)
    again = ZClusterSink(shards.urls, counting, query_name, journals=url, prefix=prefix, flush=8)
    query = (
        spark.readStream.format("zcluster-journal")
        .option("journals", url)
        .option("rows", "ranges")
        .option("numPartitions", "1")
        .load()
        .writeStream.foreachBatch(late)
        .option("checkpointLocation", str(tmp_path / "ckpt-late"))
        .trigger(availableNow=True)
        .start()
    )
    try:
        deadline = time.monotonic() + 120
        while not (markers / "stalled").exists():
            assert query.exception() is None, query.exception()
            assert time.monotonic() < deadline, "query A's task never reached its stall"
            time.sleep(0.05)
        with Cluster.from_urls(shards.urls, prefix=prefix) as cluster:
            assert totals(cluster) != ({}, {})  # A applied its first flushes before stalling
            run_available_now(spark, again, url, tmp_path / "ckpt-again", partitions=1)
            assert totals(cluster) == expected  # B alone completed the batch
            (markers / "resume").touch()
            assert query.awaitTermination(120), "query A never finished"
            assert query.exception() is None
            assert totals(cluster) == expected
            state = StateStore(cluster, query_name)
            assert [state.load_journal(n).offset for n in names] == [store.end(n) for n in names]
    finally:
        (markers / "resume").touch()
        if query.isActive:
            query.stop()
    (a,) = [b for b in late.history if b.delivered]
    (b,) = [b for b in again.history if b.delivered]
    assert b.delivered == traffic.committed and a.delivered == in_first  # A: its first journal, all of it...
    assert a.increments == 2 * in_first and b.increments == 2 * traffic.committed
    assert 0 < a.applied < a.increments and 0 < b.applied < b.increments
    assert a.applied + b.applied == 2 * traffic.committed  # ...and each increment applied by one of them


def clicks(row: dict[str, Any]) -> list[Incr | Count]:
    doc = json.loads(row["data"])
    return [Count("events", doc["user"], 1), Incr("points", doc["user"], doc["amount"])]


class Capturing:
    """A ``foreachBatch`` function: the positioned sink, keeping each batch's rows (to run a task again later)."""

    def __init__(self, sink: PositionedSink) -> None:
        self.sink = sink
        self.rows: dict[int, tuple[Any, list[Any]]] = {}

    def __call__(self, df: Any, batch_id: int) -> None:
        self.rows[batch_id] = (df.schema, df.collect())
        self.sink(df, batch_id)


def test_a_positioned_sink_task_run_again_after_later_batches_changes_nothing(
    spark: Any, shards: LocalShards, tmp_path: Path
) -> None:
    """The positioned sink keeps no checkpoints: a task that runs a batch's rows again relies on the fences
    alone. Rows of (partition, offset) are applied in several micro-batches; then the sink's own task function
    runs again in Spark over the first batch's rows (a late duplicate of that task's attempt): it sends every
    one of their increments and none applies. The totals stay the model's."""
    root = tmp_path / "journals"
    store = FileJournals(root)
    names = ["clicks/p0", "clicks/p1"]
    create_journals(store, names)
    specs = [JournalSpec(n, {"content-type": CT}) for n in names]
    mapping = modulo_mapping(lambda m: m.doc["user"], lambda: specs)
    events: dict[str, int] = {}
    points: dict[str, float] = {}
    with AsyncPublisher(store) as pub:
        for i in range(240):
            user, amount = f"u{i % 7}", float(i % 5) - 1.5
            pub.publish_committed(mapping, JsonMessage({"id": f"e{i}", "user": user, "amount": amount}))
            events[user] = events.get(user, 0) + 1
            points[user] = points.get(user, 0.0) + amount
    prefix = f"zpos{next(_ids)}:"
    sink = PositionedSink(shards.urls, clicks, f"zpos{next(_ids)}", prefix=prefix, flush=16)
    capturing = Capturing(sink)
    query = (
        spark.readStream.format("zcluster-journal")
        .option("journals", f"file://{root}")
        .option("maxFramesPerTrigger", "60")
        .load()
        .withColumnRenamed("journal", "partition")
        .withColumnRenamed("begin", "offset")
        .writeStream.foreachBatch(capturing)
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(180), "the query never finished"
    assert query.exception() is None
    assert len(sink.history) >= 3  # later batches followed the first
    with Cluster.from_urls(shards.urls, prefix=prefix) as cluster:
        assert totals(cluster) == (events, points)
        schema, rows = capturing.rows[0]
        first = BatchStats()
        add_rows(first, spark.createDataFrame(rows, schema).mapInArrow(sink.job.run, TASK_SCHEMA).collect())
        assert totals(cluster) == (events, points)
        assert first.delivered == len(rows) > 0
        assert first.increments == first.fenced == 2 * len(rows) and first.applied == 0  # all refused by fences
        assert sink.history[0].applied == first.increments  # the same increments, applied the first time
