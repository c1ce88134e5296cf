"""The exactly-once sink on Spark Connect (``SparkSession.builder.remote("local[2]")``), end to end.

Each run is a driver process (``driver_job.py --connect``) that starts a local Spark Connect server; the
mapper counts its deliveries in a file, since under Connect the sink's history stays in the server's
foreachBatch process.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from zcluster import Cluster
from zcluster.journal.files import FileJournals
from zcluster.journal.frames import read_frames
from zcluster.message.framing import CONTENT_TYPE_NDJSON
from zcluster.testing import LocalShards
from zcluster.testing.traffic import Traffic, create_journals, publish

pytestmark = pytest.mark.spark
DRIVER = Path(__file__).with_name("driver_job.py")


def run(cmd: list[str], checkpoint: Path, deliveries: Path, *extra: str) -> int:
    """One availableNow run on Connect; returns the messages it delivered to the mapper."""
    before = len(deliveries.read_text().split()) if deliveries.exists() else 0
    done = subprocess.run(
        [*cmd, "--checkpoint", str(checkpoint), "--deliveries", str(deliveries), "--connect", *extra],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return len(deliveries.read_text().split()) - before if deliveries.exists() else 0


def state_of(cluster: Cluster, keys: list[str]) -> dict[str, Any]:
    return {k: [(t.member, t.score) for t in v] for k, v in cluster.select(keys, limit=100000).items()}


def test_exactly_once_on_spark_connect_across_runs_and_a_new_checkpoint(shards: LocalShards, tmp_path: Path) -> None:
    store = FileJournals(tmp_path / "journals")
    names = [f"timelines/part-{i:03d}" for i in range(3)]
    create_journals(store, names)
    traffic = Traffic(names)
    prefix = f"cx{uuid.uuid4().hex[:8]}:"
    cmd = [sys.executable, str(DRIVER), "--journals", f"file://{tmp_path / 'journals'}", "--urls", *shards.urls]
    cmd += ["--query-name", f"q{uuid.uuid4().hex[:8]}", "--prefix", prefix]
    deliveries = tmp_path / "deliveries.txt"
    delivered = 0
    for seed in range(2):  # publish, run, publish more, run again from the same checkpoint
        publish(store, traffic, producers=3, messages=80, seed=seed)
        delivered += run(cmd, tmp_path / "ckpt", deliveries)
    assert traffic.duplicates > 0 and traffic.rolled_back > 0
    assert delivered == traffic.committed  # every committed message mapped once, nothing rolled back
    with Cluster.from_urls(shards.urls, prefix=prefix) as cluster:
        expected = traffic.expected()
        assert state_of(cluster, list(expected)) == expected
        # A new checkpoint directory re-reads every journal from 0 and delivers nothing again.
        assert run(cmd, tmp_path / "fresh-ckpt", deliveries) == 0
        assert state_of(cluster, list(expected)) == expected


def test_a_frame_bound_splits_a_run_into_bounded_batches_on_spark_connect(shards: LocalShards, tmp_path: Path) -> None:
    store = FileJournals(tmp_path / "journals")
    names = [f"timelines/part-{i:03d}" for i in range(3)]
    create_journals(store, names)
    traffic = publish(store, Traffic(names), producers=3, messages=60, seed=5)
    cmd = [sys.executable, str(DRIVER), "--journals", f"file://{tmp_path / 'journals'}", "--urls", *shards.urls]
    cmd += ["--query-name", f"q{uuid.uuid4().hex[:8]}", "--prefix", f"cx{uuid.uuid4().hex[:8]}:"]
    progress, observed = tmp_path / "progress.json", tmp_path / "observed.json"
    bound = ("--max-frames", "40", "--progress", str(progress), "--observed", str(observed))
    delivered = run(cmd, tmp_path / "ckpt", tmp_path / "deliveries.txt", *bound)
    frames = sum(len(list(read_frames(store, n, CONTENT_TYPE_NDJSON, 0, store.end(n)))) for n in names)
    rows = json.loads(progress.read_text())  # rows=ranges: a batch's rows are its ranges, at most one a journal
    assert delivered == traffic.committed and frames > 120
    assert len(rows) >= frames // 40 and max(rows) <= len(names)
    # The sink's figures reach the query's progress on Connect too (observed metrics, ZClusterSink.observe).
    figures = [f for f in json.loads(observed.read_text()) if f is not None]
    assert len(figures) >= frames // 40 and sum(f["delivered"] for f in figures) == delivered
    assert sum(f["frames"] for f in figures) == frames and figures[-1]["lag_bytes"] == 0
