"""The exactly-once sink and the data sources, end to end in local Spark against real Redis servers."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from zcluster import Cluster, KeyScoreMember, MapperError
from zcluster.journal.files import FileJournals
from zcluster.journal.frames import read_frames
from zcluster.journal.publishing import AsyncPublisher
from zcluster.message.framing import CONTENT_TYPE_NDJSON
from zcluster.message.journals import JournalSpec
from zcluster.message.mapping import modulo_mapping
from zcluster.message.records import JsonMessage
from zcluster.spark import ZClusterSink, run_available_now
from zcluster.state import Consumer, StateStore
from zcluster.testing.traffic import Traffic, create_journals, publish, timeline_mapper

pytestmark = pytest.mark.spark
_names = itertools.count()


def state_of(cluster: Cluster, keys: list[str]) -> dict[str, list[tuple[str, float]]]:
    return {k: [(t.member, t.score) for t in v] for k, v in cluster.select(keys, limit=100000).items()}


@pytest.fixture
def setup(tmp_path: Path, shards: Any) -> dict[str, Any]:
    root = tmp_path / "journals"
    store = FileJournals(root)
    names = [f"timelines/part-{i:03d}" for i in range(3)]
    create_journals(store, names)
    prefix = f"sink{next(_names)}:"
    return {
        "store": store,
        "names": names,
        "url": f"file://{root}",
        "prefix": prefix,
        "urls": shards.urls,
        "cluster": Cluster.from_urls(shards.urls, prefix=prefix),
        "query": f"q{next(_names)}",
    }


def sink_for(s: dict[str, Any], mapper: Any = timeline_mapper) -> ZClusterSink:
    return ZClusterSink(s["urls"], mapper, s["query"], journals=s["url"], prefix=s["prefix"])


def test_end_to_end_exactly_once_over_several_runs(spark: Any, setup: dict[str, Any], tmp_path: Path) -> None:
    s = setup
    traffic = Traffic(s["names"])
    sink = sink_for(s)
    for seed in range(2):  # publish, run, publish more, run again from the same checkpoint
        publish(s["store"], traffic, producers=3, messages=120, seed=seed)
        run_available_now(spark, sink, s["url"], tmp_path / "ckpt")
    expected = traffic.expected()
    assert traffic.duplicates > 0 and traffic.rolled_back > 0
    assert state_of(s["cluster"], list(expected)) == expected
    delivered = sum(b.delivered for b in sink.history)
    assert delivered == traffic.committed  # every committed message mapped once, nothing rolled back
    assert sum(b.duplicates for b in sink.history) > 0
    assert all(not b.skipped for b in sink.history)


def test_transactions_spanning_batches_commit_once_and_rollbacks_never_appear(
    spark: Any, setup: dict[str, Any], tmp_path: Path
) -> None:
    s = setup
    specs = [JournalSpec(n, {"content-type": "application/x-ndjson"}) for n in s["names"]]
    mapping = modulo_mapping(lambda m: m.doc["user"], lambda: specs)
    sink = sink_for(s)
    with AsyncPublisher(s["store"]) as keep, AsyncPublisher(s["store"]) as drop:
        for i in range(6):
            keep.publish_uncommitted(
                mapping, JsonMessage({"user": f"u{i}", "event": f"keep{i}", "ts": 10.0 + i, "op": "add"})
            )
            drop.publish_uncommitted(
                mapping, JsonMessage({"user": f"u{i}", "event": f"drop{i}", "ts": 20.0 + i, "op": "add"})
            )
        keep.barrier()
        drop.barrier()
        run_available_now(spark, sink, s["url"], tmp_path / "ckpt")  # batch 0: both transactions still open
        keys = [f"timeline:u{i}" for i in range(6)]
        assert all(v == [] for v in state_of(s["cluster"], keys).values())
        keep.commit()
        drop.rollback()
        keep.barrier()
        drop.barrier()
    run_available_now(spark, sink, s["url"], tmp_path / "ckpt")  # batch 1: the ACKs; the open spans are replayed
    assert state_of(s["cluster"], keys) == {f"timeline:u{i}": [(f"keep{i}", 10.0 + i)] for i in range(6)}
    assert sink.history[-1].replays > 0 and sink.history[-1].rollbacks > 0
    assert sum(b.delivered for b in sink.history) == 6


def test_a_rollback_in_a_later_micro_batch_than_its_messages_is_never_delivered(
    spark: Any, setup: dict[str, Any], tmp_path: Path
) -> None:
    """The issue's history, one micro-batch per step: a transaction's message; its rollback; a new transaction of
    the same producer and its commit. Before checkpoints were one snapshot, the third batch delivered the
    rolled-back message too."""
    s = setup
    specs = [JournalSpec(n, {"content-type": "application/x-ndjson"}) for n in s["names"]]
    mapping = modulo_mapping(lambda m: m.doc["user"], lambda: specs)
    sink = sink_for(s)
    with AsyncPublisher(s["store"]) as producer:
        producer.publish_uncommitted(mapping, JsonMessage({"user": "u1", "event": "dropped", "ts": 1.0, "op": "add"}))
        producer.barrier()
        run_available_now(spark, sink, s["url"], tmp_path / "ckpt")
        producer.rollback()
        producer.barrier()
        run_available_now(spark, sink, s["url"], tmp_path / "ckpt")
        producer.publish_uncommitted(mapping, JsonMessage({"user": "u1", "event": "kept", "ts": 2.0, "op": "add"}))
        producer.commit()
        producer.barrier()
    run_available_now(spark, sink, s["url"], tmp_path / "ckpt")
    assert state_of(s["cluster"], ["timeline:u1"]) == {"timeline:u1": [("kept", 2.0)]}
    assert [b.delivered for b in sink.history] == [0, 0, 1] and sink.history[1].rollbacks == 1


def test_a_batch_runs_as_many_tasks_as_the_session_has_cores(spark: Any, setup: dict[str, Any], tmp_path: Path) -> None:
    from pyspark.sql.functions import spark_partition_id

    s = setup
    publish(s["store"], Traffic(s["names"]), producers=3, messages=60, seed=3)
    seen: list[Any] = []

    def record(df: Any, batch_id: int) -> None:
        seen.extend(df.select(spark_partition_id().alias("task"), "journal", "begin").collect())

    run_available_now(spark, record, s["url"], tmp_path / "ckpt")  # rows=frames: every frame comes to the driver
    tasks: dict[str, set[int]] = {}
    for row in seen:
        tasks.setdefault(row.journal, set()).add(row.task)
    assert sorted(tasks) == s["names"] and all(len(t) == 1 for t in tasks.values())  # a journal is never split
    assert len(set().union(*tasks.values())) == spark.sparkContext.defaultParallelism == 2  # 3 journals, 2 tasks
    for name in s["names"]:  # each journal's rows in offset order
        begins = [row.begin for row in seen if row.journal == name]
        assert begins == sorted(begins) and len(begins) > 1


def test_a_frame_bound_splits_an_available_now_run_into_bounded_batches(
    spark: Any, setup: dict[str, Any], tmp_path: Path
) -> None:
    s = setup
    traffic = publish(s["store"], Traffic(s["names"]), producers=3, messages=60, seed=5)
    sizes: list[int] = []
    query = (
        spark.readStream.format("zcluster-journal")
        .option("journals", s["url"])
        .option("maxFramesPerTrigger", "40")  # as users write it: Spark passes option names lowercased
        .load()
        .writeStream.foreachBatch(lambda df, _: sizes.append(df.count()))
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    store = s["store"]
    frames = sum(len(list(read_frames(store, n, CONTENT_TYPE_NDJSON, 0, store.end(n)))) for n in s["names"])
    assert traffic.committed > 0 and frames > 80
    assert len(sizes) > 1 and max(sizes) <= 40 and sum(sizes) == frames  # every frame once, 40 at most a batch


@pytest.mark.parametrize("rows", ["ranges", "frames"])
def test_replayed_batch_and_new_checkpoint_do_not_repeat_work(
    spark: Any, setup: dict[str, Any], tmp_path: Path, rows: str
) -> None:
    s = setup
    traffic = publish(s["store"], Traffic(s["names"]), producers=2, messages=80, seed=7)
    sink = sink_for(s)
    run_available_now(spark, sink, s["url"], tmp_path / "ckpt", rows=rows)
    expected = traffic.expected()
    assert state_of(s["cluster"], list(expected)) == expected
    # Spark lost its commit marker (a crash before it was written): the same batch id runs again
    markers = (p for p in (tmp_path / "ckpt" / "commits").iterdir() if p.name.isdigit())
    commits = sorted(markers, key=lambda p: int(p.name))
    commits[-1].unlink()
    (commits[-1].parent / f".{commits[-1].name}.crc").unlink(missing_ok=True)  # Hadoop's checksum beside it
    run_available_now(spark, sink, s["url"], tmp_path / "ckpt", rows=rows)
    assert sink.history[-1].skipped and sink.history[-1].batch_id == sink.history[0].batch_id
    # a brand-new checkpoint (new query id, batch ids from 0) re-reads everything: producer states drop it
    run_available_now(spark, sink, s["url"], tmp_path / "ckpt2", rows=rows)
    fresh = sink.history[-1]
    assert not fresh.skipped and fresh.query_id != sink.history[0].query_id
    assert fresh.delivered == 0 and sink.history[0].frames > 0
    if rows == "frames":  # every frame comes again, and is recognised as already sequenced
        assert fresh.frames == sink.history[0].frames and fresh.seen == fresh.frames
    else:  # ranges are read past the stored checkpoints only: nothing at all
        assert fresh.frames == 0
    assert state_of(s["cluster"], list(expected)) == expected
    store = StateStore(s["cluster"], s["query"])
    checkpoints = [store.load_journal(name) for name in s["names"]]
    assert all(ck.offset == s["store"].end(name) for ck, name in zip(checkpoints, s["names"], strict=True))
    assert all(st.begin == -1 for ck in checkpoints for st in ck.states)  # no span left open


def test_mapper_error_names_journal_offset_kind_and_commits_nothing(
    spark: Any, setup: dict[str, Any], tmp_path: Path
) -> None:
    s = setup
    publish(s["store"], Traffic(s["names"]), producers=1, messages=20, seed=3)

    def broken(message: Any) -> list[Any]:
        if message.doc["event"].endswith("e50"):
            raise KeyError("no such field")
        return timeline_mapper(message)

    sink = sink_for(s, broken)
    with pytest.raises(Exception) as info:
        run_available_now(spark, sink, s["url"], tmp_path / "ckpt")
    text = str(info.value)
    assert "MapperError" in text and "timelines/part-" in text and "offset" in text and "JsonMessage" in text
    state = StateStore(s["cluster"], s["query"])
    query_id = json.loads((tmp_path / "ckpt" / "metadata").read_text())["id"]  # Spark's query id
    assert sink.history == [] and state.committed_batch(query_id) is None
    assert MapperError.__mro__[1].__name__ == "ZClusterError"


def test_zcluster_writer_data_source(spark: Any, setup: dict[str, Any]) -> None:
    s = setup
    rows = [("k1", 1.0, "a", "insert"), ("k1", 2.0, "b", None), ("k1", 3.0, "a", "delete"), ("k2", 1.0, "x", "insert")]
    df = spark.createDataFrame(rows, "key string, score double, member string, op string")
    for _ in range(2):  # a second, identical write changes nothing: idempotent
        df.write.format("zcluster").option("urls", ",".join(s["urls"])).option("prefix", s["prefix"]).mode(
            "append"
        ).save()
    assert state_of(s["cluster"], ["k1", "k2"]) == {"k1": [("b", 2.0)], "k2": [("x", 1.0)]}
    bad = spark.createDataFrame([("k", 1.0, "m", "upsert")], "key string, score double, member string, op string")
    with pytest.raises(Exception, match="op must be 'insert' or 'delete'"):
        bad.write.format("zcluster").option("urls", ",".join(s["urls"])).option("prefix", s["prefix"]).mode(
            "append"
        ).save()
    s["cluster"].insert([KeyScoreMember("k3", 1.0, "m")])


def test_redis_streams_journals_into_a_redis_cluster(
    spark: Any, shards: Any, redis_cluster: Any, tmp_path: Path
) -> None:
    from zcluster.journal.urls import open_store

    prefix = f"rs{next(_names)}:"
    journals = f"{shards.urls[0]}?prefix={prefix}j:"
    store = open_store(journals)
    names = [f"timelines/part-{i:03d}" for i in range(3)]
    create_journals(store, names)
    traffic = Traffic(names)
    seed_url = redis_cluster.url.split("://", 1)[1]
    sink = ZClusterSink(
        f"redis+cluster://{seed_url}", timeline_mapper, f"q{next(_names)}", journals=journals, prefix=prefix
    )
    for seed in range(2):
        publish(store, traffic, producers=2, messages=60, seed=seed)
        run_available_now(spark, sink, journals, tmp_path / "ckpt")
    expected = traffic.expected()
    cluster = Cluster.from_cluster_url(redis_cluster.url, prefix=prefix)
    assert state_of(cluster, list(expected)) == expected
    assert sum(b.delivered for b in sink.history) == traffic.committed
    assert traffic.rolled_back > 0 and sum(b.rollbacks for b in sink.history) > 0


def test_the_plain_consumer_and_the_sink_leave_the_same_state(
    spark: Any, setup: dict[str, Any], tmp_path: Path
) -> None:
    s = setup
    traffic = Traffic(s["names"])
    sink = sink_for(s)
    plain = Cluster.from_urls(s["urls"], prefix=f"plain{next(_names)}:")
    app = f"plain{next(_names)}"
    for seed in range(2):  # the same journals, read twice as they grow: by the sink and by the consumer
        publish(s["store"], traffic, producers=3, messages=120, seed=seed)
        run_available_now(spark, sink, s["url"], tmp_path / "ckpt")
        Consumer(plain, s["url"], timeline_mapper, app).poll()
    expected = traffic.expected()
    assert state_of(plain, list(expected)) == state_of(s["cluster"], list(expected)) == expected
    plain.close()


def test_one_available_now_run_reads_everything_after_an_interrupted_batch(
    spark: Any, setup: dict[str, Any], tmp_path: Path
) -> None:
    # A batch whose Spark commit was lost is run again first; the same run must then read what was
    # appended since, not stop after the re-run.
    s = setup
    traffic = Traffic(s["names"])
    sink = sink_for(s)
    ckpt = tmp_path / "ckpt"
    publish(s["store"], traffic, producers=2, messages=60, seed=0)
    run_available_now(spark, sink, s["url"], ckpt)
    last = max(int(p.name) for p in (ckpt / "commits").iterdir() if p.name.isdigit())
    (ckpt / "commits" / str(last)).unlink()
    (ckpt / "commits" / f".{last}.crc").unlink(missing_ok=True)
    publish(s["store"], traffic, producers=2, messages=60, seed=1)
    run_available_now(spark, sink, s["url"], ckpt)
    expected = traffic.expected()
    assert state_of(s["cluster"], list(expected)) == expected


def test_python_workers_import_the_installed_pyspark_not_the_zip(tmp_path: Path) -> None:
    # local_session points Spark at a home without python/lib/pyspark.zip, which every new Python process
    # would otherwise compile anew; its workers then import the installed package. A fresh process: the
    # first session of a process starts the JVM, and with it the workers' environment.
    script = tmp_path / "where.py"
    script.write_text(
        textwrap.dedent(
            """
            import os, pyspark
            from zcluster.spark import local_session

            def where(batches):
                import pyarrow as pa
                import pyspark as worker_pyspark
                for _ in batches:
                    pass
                yield pa.RecordBatch.from_pydict({"file": [worker_pyspark.__file__]})

            os.environ.pop("SPARK_HOME", None)
            spark = local_session("local[1]")
            files = {row.file for row in spark.range(2).mapInArrow(where, "file string").collect()}
            spark.stop()
            print(sorted(files) == [pyspark.__file__], files)
            """
        )
    )
    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_HOME", "PYSPARK_PYTHON")}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("True") and ".zip" not in done.stdout, done.stdout


def test_a_task_pauses_the_collector_and_puts_it_back_as_it_was() -> None:
    import gc

    from zcluster.spark.sink import _collector_paused

    was = gc.isenabled()
    try:
        gc.enable()
        with pytest.raises(RuntimeError), _collector_paused():
            assert not gc.isenabled()
            raise RuntimeError("a failing task")
        assert gc.isenabled()  # back on, even after a failure
        gc.disable()
        with _collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # left off: it was off before
    finally:
        (gc.enable if was else gc.disable)()


def test_a_sink_whose_shard_list_disagrees_with_the_store_fails_the_batch(
    spark: Any, setup: dict[str, Any], tmp_path: Path
) -> None:
    """The layout guard: executors opening the store with its shards reordered refuse before writing."""
    s = setup
    s["cluster"].insert([("laid-out", 1.0, "m")])  # the store's layout is recorded on its shards
    publish(s["store"], Traffic(s["names"]), producers=2, messages=20, seed=1)
    sink = ZClusterSink(s["urls"][::-1], timeline_mapper, s["query"], journals=s["url"], prefix=s["prefix"])
    with pytest.raises(Exception, match="the list was reordered"):
        run_available_now(spark, sink, s["url"], tmp_path / "ckpt")
    assert [k for batch in s["cluster"].keys() for k in batch] == ["laid-out"]  # nothing was written
