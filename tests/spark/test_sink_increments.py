"""Exactly-once increments through the Spark sink (classic, local[2] with task retries): counters and a
leaderboard equal a model computed by an independent read-committed reader of the same journals, across
bounded micro-batches (transactions spanning them), a lost Spark commit and a new checkpoint directory."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest

from zcluster import Cluster, Count, Incr
from zcluster.journal.files import FileJournals
from zcluster.message.journals import JournalSpec
from zcluster.message.readers import ReadCommittedIter
from zcluster.message.sequencer import Sequencer
from zcluster.spark import ZClusterSink, run_available_now
from zcluster.testing import LocalShards
from zcluster.testing.traffic import Traffic, create_journals, publish

pytestmark = pytest.mark.spark
_ids = itertools.count()


def counting(message: Any) -> list[Incr | Count]:
    doc = message.doc
    return [Count("events", doc["user"], 1), Incr("points", doc["user"], 0.5 if doc["op"] == "add" else -1.0)]


def model(store: FileJournals, names: list[str]) -> tuple[dict[str, int], dict[str, float]]:
    """Counts and points of every committed message, read by the message layer's own read-committed reader."""
    events: dict[str, int] = {}
    points: dict[str, float] = {}
    for name in names:
        spec = JournalSpec(name, {"content-type": "application/x-ndjson"})
        for env in ReadCommittedIter(store, spec, Sequencer(buffer=64)):
            if env.is_ack:
                continue
            for w in counting(env.message):
                if isinstance(w, Count):
                    events[w.field] = events.get(w.field, 0) + w.delta
                else:
                    points[w.member] = points.get(w.member, 0.0) + w.delta
    return events, points


def totals(cluster: Cluster) -> tuple[dict[str, int], dict[str, float]]:
    points = {str(e.member): e.score for e in cluster.select(["points"], limit=10_000)["points"]}
    return cluster.counters(["events"])["events"], points


def test_sink_increments_count_once_through_batches_replays_and_a_new_checkpoint(
    spark: Any, shards: LocalShards, tmp_path: Path
) -> None:
    root = tmp_path / "journals"
    store = FileJournals(root)
    names = [f"counts/part-{i}" for i in range(3)]
    create_journals(store, names)
    traffic = publish(store, Traffic(names), producers=3, messages=60, seed=11)
    prefix, query = f"sinc{next(_ids)}:", f"qinc{next(_ids)}"
    sink = ZClusterSink(shards.urls, counting, query, journals=f"file://{root}", prefix=prefix)
    url = f"file://{root}"
    run_available_now(spark, sink, url, tmp_path / "ckpt", maxFramesPerTrigger=40)
    expected = model(store, names)
    assert traffic.rolled_back > 0 and traffic.duplicates > 0 and len(sink.history) > 2
    assert sum(b.replays for b in sink.history) > 0  # transactions spanned micro-batches
    with Cluster.from_urls(shards.urls, prefix=prefix) as cluster:
        assert totals(cluster) == expected
        # Spark lost its last commit marker: the batch runs again (classic: skipped by batch progress)
        commits = sorted(
            (p for p in (tmp_path / "ckpt" / "commits").iterdir() if p.name.isdigit()), key=lambda p: int(p.name)
        )
        commits[-1].unlink()
        (commits[-1].parent / f".{commits[-1].name}.crc").unlink(missing_ok=True)
        run_available_now(spark, sink, url, tmp_path / "ckpt", maxFramesPerTrigger=40)
        # a new checkpoint directory reads every journal again, in other batch boundaries (rows=frames):
        # the journal checkpoints and the fences keep every increment at one count
        run_available_now(spark, sink, url, tmp_path / "ckpt2", rows="frames", maxFramesPerTrigger=25)
        assert totals(cluster) == expected
        # more traffic, then the first checkpoint again: only the new messages count
        publish(store, Traffic(names), producers=2, messages=30, seed=12)
        run_available_now(spark, sink, url, tmp_path / "ckpt")
        assert totals(cluster) == model(store, names)


class FailsOnce:
    """A mapper whose first attempt at the ``at``-th message of a task fails (a marker file: task retries run
    in other Python workers), after the sink flushed the increments before it."""

    def __init__(self, marker: Path, at: int) -> None:
        self.marker, self.at, self.seen = marker, at, 0

    def __call__(self, message: Any) -> list[Incr | Count]:
        self.seen += 1
        if self.seen == self.at and not self.marker.exists():
            self.marker.write_text("failed once")
            raise RuntimeError("a task dies after some of its increments were written")
        return counting(message)


def test_a_retried_task_does_not_count_its_flushed_increments_twice(
    spark: Any, shards: LocalShards, tmp_path: Path
) -> None:
    root = tmp_path / "journals"
    store = FileJournals(root)
    names = [f"retry/part-{i}" for i in range(2)]
    create_journals(store, names)
    publish(store, Traffic(names), producers=2, messages=40, seed=5)
    prefix = f"sretry{next(_ids)}:"
    mapper = FailsOnce(tmp_path / "failed", at=30)
    sink = ZClusterSink(shards.urls, mapper, f"qr{next(_ids)}", journals=f"file://{root}", prefix=prefix, flush=8)
    run_available_now(spark, sink, f"file://{root}", tmp_path / "ckpt")
    assert (tmp_path / "failed").exists()  # the first attempt did fail, after flushing some increments
    with Cluster.from_urls(shards.urls, prefix=prefix) as cluster:
        assert totals(cluster) == model(store, names)
