"""The positioned sink when Spark splits one partition's rows of a batch over several tasks (issue 27).

Spark's file sources pack a batch's files into tasks, and Kafka's ``minPartitions`` cuts a topic-partition's
offset range into several: each task then holds some of a partition's offsets. Increments are fenced per
(key, ``<query_name>/<topic>/<partition>``), so a task applying later offsets moved the fence past the other
task's rows, which were refused as duplicates: totals short, silently. The sink must be exact however Spark
cuts a batch, and its history must say what was applied and what a fence refused.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any

import pytest

from zcluster import Cluster, Count, Incr
from zcluster.spark.positioned import PositionedSink
from zcluster.testing import LocalShards

pytestmark = pytest.mark.spark
_ids = itertools.count()
ROWS, USERS = 240, 6


def points(row: dict[str, Any]) -> list[Any]:
    return [Incr("points", row["user"], row["points"]), Count("rows", row["partition"], 1)]


def split_batch(spark: Any) -> Any:
    """A batch of ``ROWS`` rows of two partitions read as two Spark tasks, each holding every other offset of
    both partitions (task 0 the even ones, task 1 the odd ones): whatever the order the tasks run in, a task
    fencing its own offsets of a partition skips the other's. Only DataFrame calls Spark Connect has."""
    half = ROWS // 2
    return spark.range(0, ROWS, 1, 2).selectExpr(  # ids 0..half-1 in task 0, the rest in task 1
        "CASE WHEN id % 2 = 0 THEN 'p0' ELSE 'p1' END AS partition",
        f"(id % {half}) * 2 + CAST(id >= {half} AS INT) AS offset",
        f"concat('u', CAST(id % {USERS} AS STRING)) AS user",
        "id % 7 + 1 AS points",
    )


def model() -> tuple[dict[str, float], dict[str, int]]:
    totals: dict[str, float] = {}
    rows: dict[str, int] = {}
    for i in range(ROWS):
        user = f"u{i % USERS}"
        totals[user] = totals.get(user, 0.0) + i % 7 + 1
        part = "p0" if i % 2 == 0 else "p1"
        rows[part] = rows.get(part, 0) + 1
    return totals, rows


def state(cluster: Cluster) -> tuple[dict[str, float], dict[str, int]]:
    totals = {str(e.member): e.score for e in cluster.select(["points"], limit=1000)["points"]}
    return totals, {str(k): v for k, v in cluster.counters(["rows"])["rows"].items()}


def test_a_partition_split_over_two_tasks_counts_every_row_once(spark: Any, shards: LocalShards) -> None:
    df = split_batch(spark)
    parts = df.selectExpr("spark_partition_id() AS task", "partition").distinct().collect()
    assert sorted((r.task, r.partition) for r in parts) == [(0, "p0"), (0, "p1"), (1, "p0"), (1, "p1")]
    prefix = f"split{next(_ids)}:"
    sink = PositionedSink(shards.urls, points, f"split{next(_ids)}", prefix=prefix, flush=16)
    sink(df, 0)
    with Cluster.from_urls(shards.urls, prefix=prefix) as cluster:
        assert state(cluster) == model()
        first = sink.history[0]
        assert (first.delivered, first.increments, first.applied, first.fenced) == (ROWS, 2 * ROWS, 2 * ROWS, 0)
        sink(split_batch(spark), 0)  # the batch again (a lost Spark commit): every increment refused
        assert state(cluster) == model()
        again = sink.history[1]
        assert (again.delivered, again.increments, again.applied, again.fenced) == (ROWS, 2 * ROWS, 0, 2 * ROWS)
    renamed = split_batch(spark).withColumnRenamed("partition", "part").withColumnRenamed("offset", "pos")
    prefix = f"split{next(_ids)}:"

    def by_part(row: dict[str, Any]) -> list[Any]:
        return points({**row, "partition": row["part"]})

    named = PositionedSink(shards.urls, by_part, f"split{next(_ids)}", partition="part", offset="pos", prefix=prefix)
    named(renamed, 0)  # the columns named by the sink's options are the ones that bring rows together
    with Cluster.from_urls(shards.urls, prefix=prefix) as cluster:
        assert state(cluster) == model()
        assert (named.history[0].applied, named.history[0].fenced) == (2 * ROWS, 0)


def test_the_json_file_source_cutting_batches_into_tasks_counts_exactly(
    spark: Any, shards: LocalShards, tmp_path: Path
) -> None:
    """The issue's reproduction: Spark's JSON file source, rows ``{partition, offset, user, points}`` whose
    offsets grow per partition across files, ``maxFilesPerTrigger`` 6 on ``local[2]``: each batch's files are
    packed into two tasks, so each partition's rows of a batch are in both. (Batches must take the files in
    offset order too, as offsets must grow from batch to batch: the source orders them by mtime.)"""
    src = tmp_path / "src"
    src.mkdir()
    totals: dict[str, float] = {}
    rows: dict[str, int] = {}
    offsets = {p: 0 for p in ("p0", "p1", "p2")}
    n = 0
    for f in range(24):
        lines = []
        for i in range(30):
            part = f"p{i % 3}"
            user, amount = f"u{n % 30}", n % 5 + 1
            lines.append(json.dumps({"partition": part, "offset": offsets[part], "user": user, "points": amount}))
            offsets[part] += 1
            totals[user] = totals.get(user, 0.0) + amount
            rows[part] = rows.get(part, 0) + 1
            n += 1
        path = src / f"part-{f:03d}.json"
        path.write_text("\n".join(lines) + "\n")
        os.utime(path, (1_700_000_000 + f, 1_700_000_000 + f))  # the source takes files by mtime: in order
    prefix = f"json{next(_ids)}:"
    sink = PositionedSink(shards.urls, points, f"json{next(_ids)}", prefix=prefix, flush=16)
    query = (
        spark.readStream.schema("partition STRING, offset LONG, user STRING, points LONG")
        .option("maxFilesPerTrigger", "6")
        .json(str(src))
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(300), "the query never finished"
    assert query.exception() is None
    assert len(sink.history) == 4
    with Cluster.from_urls(shards.urls, prefix=prefix) as cluster:
        assert state(cluster) == (totals, rows)
    assert sum(s.delivered for s in sink.history) == n == 720
    assert sum(s.applied for s in sink.history) == sum(s.increments for s in sink.history) == 2 * n
    assert sum(s.fenced for s in sink.history) == 0


CONNECT = textwrap.dedent(
    """
    import json, sys
    sys.path.insert(0, sys.argv[1])
    from test_positioned_split import points, split_batch
    from zcluster.spark import local_session
    from zcluster.spark.positioned import PositionedSink

    spark = local_session("local[2]", connect=True)
    try:
        sink = PositionedSink(sys.argv[3:], points, sys.argv[2], prefix=sys.argv[2] + ":", flush=16)
        sink(split_batch(spark), 0)
        s = sink.history[0]
        print(json.dumps([s.delivered, s.increments, s.applied, s.fenced]))
    finally:
        spark.stop()
    """
)


def test_a_partition_split_over_two_tasks_counts_once_on_spark_connect(shards: LocalShards) -> None:
    """The same split batch through a Spark Connect session (the sink called in the client, so its history
    is the client's): the sink's DataFrame calls are Connect's too."""
    name = f"cx{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path.cwd()), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-c", CONNECT, str(Path(__file__).parent), name, *shards.urls],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [ROWS, 2 * ROWS, 2 * ROWS, 0]
    with Cluster.from_urls(shards.urls, prefix=name + ":") as cluster:
        assert state(cluster) == model()


def two_topics(spark: Any, offsets: dict[str, range]) -> Any:
    """Rows of topics A and B, both with only partition 0 (Kafka's shape: a topic column)."""
    rows = [(topic, 0, o, f"u{o % USERS}", o % 7 + 1) for topic, span in offsets.items() for o in span]
    return spark.createDataFrame(rows, "topic string, partition int, offset long, user string, points long")


def by_topic(row: dict[str, Any]) -> list[Any]:
    return [Count("rows", f"{row['topic']}/{row['partition']}", 1)]


def test_two_topics_sharing_a_partition_number_in_one_task_count_each_row_once(spark: Any, shards: LocalShards) -> None:
    """One shuffle partition puts (A, 0) and (B, 0) into one task: each is its own fence source. Before, the
    task grouped rows by partition only and fenced B's rows under A's source, below A's offsets: refused as
    applied before, B's counts lost."""
    prefix = f"topics{next(_ids)}:"
    sink = PositionedSink(shards.urls, by_topic, f"topics{next(_ids)}", prefix=prefix, flush=16)
    before = spark.conf.get("spark.sql.shuffle.partitions")
    spark.conf.set("spark.sql.shuffle.partitions", "1")
    try:
        sink(two_topics(spark, {"A": range(100, 105)}), 0)
        sink(two_topics(spark, {"A": range(105, 107), "B": range(5)}), 1)
        sink(two_topics(spark, {"A": range(105, 107), "B": range(5)}), 1)  # the batch again: nothing counts
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", before)
    with Cluster.from_urls(shards.urls, prefix=prefix) as cluster:
        assert cluster.counters(["rows"])["rows"] == {"A/0": 7, "B/0": 5}
    assert (sink.history[1].applied, sink.history[1].fenced) == (7, 0)
    assert (sink.history[2].applied, sink.history[2].fenced) == (0, 7)
