"""The sink's figures in the query's progress (observed metrics, as a StreamingQueryListener sees them), and
lost ranges of file journals through Spark: the query stops before one until skip-lost, or skips it with
fail_on_data_loss (rows=ranges) / the source's failOnDataLoss=false (rows=frames)."""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from zcluster import Cluster
from zcluster.journal._filefmt import find_fragment
from zcluster.journal.files import FileJournals
from zcluster.spark import ZClusterSink, run_available_now
from zcluster.spark.observe import figures
from zcluster.state import StateStore
from zcluster.testing import LocalShards
from zcluster.testing.traffic import Traffic, create_journals, publish, timeline_mapper

pytestmark = pytest.mark.spark


def test_each_batchs_figures_reach_the_querys_progress_and_listeners(
    spark: Any, shards: LocalShards, tmp_path: Path
) -> None:
    from pyspark.sql.streaming import StreamingQueryListener

    store = FileJournals(tmp_path / "journals")
    names = ["a", "b"]
    create_journals(store, names)
    traffic = publish(store, Traffic(names), producers=3, messages=150, seed=11)
    prefix = f"sp{uuid.uuid4().hex[:8]}:"
    CollectorRegistry = pytest.importorskip("prometheus_client").CollectorRegistry
    from zcluster.metrics import ApplierMetrics

    registry = CollectorRegistry()
    app = f"q{uuid.uuid4().hex[:8]}"
    sink = ZClusterSink(
        shards.urls,
        timeline_mapper,
        app,
        journals=f"file://{tmp_path / 'journals'}",
        prefix=prefix,
        metrics=ApplierMetrics(registry),
    )
    heard: list[Any] = []
    done = threading.Event()

    class Listener(StreamingQueryListener):
        def onQueryStarted(self, event: Any) -> None:
            pass

        def onQueryProgress(self, event: Any) -> None:
            heard.append(event.progress)

        def onQueryIdle(self, event: Any) -> None:
            pass

        def onQueryTerminated(self, event: Any) -> None:
            done.set()

    listener = Listener()
    spark.streams.addListener(listener)
    try:
        query = run_available_now(
            spark, sink, f"file://{tmp_path / 'journals'}", tmp_path / "ckpt", maxFramesPerTrigger=120
        )
        assert done.wait(240), "the query never terminated"  # a bound: Spark is slow on a loaded machine
        deadline = time.monotonic() + 120
        while len(heard) < len(query.recentProgress):  # the listener's events arrive after the termination
            assert time.monotonic() < deadline, f"the listener heard {len(heard)} of the query's progress events"
            time.sleep(0.1)
    finally:
        spark.streams.removeListener(listener)
    observed = [f for f in map(figures, query.recentProgress) if f is not None]
    batches = [b for b in sink.history if not b.skipped]
    assert len(observed) == len(batches) >= 2  # a bounded backlog: several batches, each observed
    for batch, stats in zip(observed, batches, strict=True):
        for name in ("frames", "delivered", "duplicates", "rollbacks", "replays", "applied", "lost_skipped"):
            assert batch[name] == getattr(stats, name), name
        assert {r["journal"]: r["lag_bytes"] for r in batch["lag"]} == stats.lag
        assert batch["lag_bytes"] == sum(stats.lag.values())
    assert sum(f["delivered"] for f in observed) == traffic.committed
    assert sum(f["duplicates"] for f in observed) > 0 and sum(f["rollbacks"] for f in observed) > 0
    assert observed[0]["lag_bytes"] > 0 and observed[-1]["lag_bytes"] == 0  # the backlog, read down to nothing
    # The driver's Prometheus metrics (ApplierMetrics) saw the same batches.
    assert registry.get_sample_value("zcluster_applier_delivered_total", {"app": app}) == traffic.committed
    assert registry.get_sample_value("zcluster_applier_batches_total", {"app": app}) == len(sink.history)
    for journal, lag in batches[-1].lag.items():
        assert registry.get_sample_value("zcluster_applier_lag_bytes", {"app": app, "journal": journal}) == lag
    listened = [f for f in map(figures, heard) if f is not None]
    assert [f["delivered"] for f in listened] == [f["delivered"] for f in observed]


def _damaged(root: Path) -> tuple[FileJournals, tuple[int, int]]:
    """Journal "timelines" with some traffic, one of its appends (in a fragment file of its own) lost."""
    traffic = Traffic(["timelines"])
    with FileJournals(root) as fj:
        create_journals(fj, ["timelines"])
        publish(fj, traffic, producers=1, messages=30, seed=4)
        fj.roll("timelines")
    with FileJournals(root, fragment_bytes=1) as fj:
        r = fj.append("timelines", b'{"lost": true}\n')
    with FileJournals(root) as fj:
        publish(fj, traffic, producers=1, messages=30, seed=5)
    path = root / "timelines" / find_fragment(root / "timelines", r.begin, r.end)
    path.write_bytes(path.read_bytes()[:-3])
    store = FileJournals(root)
    assert [(x.begin, x.end) for x in store.lost_ranges("timelines")] == [(r.begin, r.end)]
    return store, (r.begin, r.end)


def test_a_lost_range_stops_the_query_until_skip_lost_and_fail_on_data_loss_skips_it(
    spark: Any, shards: LocalShards, tmp_path: Path
) -> None:
    store, (b, e) = _damaged(tmp_path / "journals")
    url = f"file://{tmp_path / 'journals'}"
    prefix = f"sp{uuid.uuid4().hex[:8]}:"
    app = f"q{uuid.uuid4().hex[:8]}"
    sink = ZClusterSink(shards.urls, timeline_mapper, app, journals=url, prefix=prefix)
    with pytest.raises(Exception, match=f"{b}..{e}"):
        run_available_now(spark, sink, url, tmp_path / "ckpt")
    state = StateStore(Cluster.from_urls(shards.urls, prefix=prefix), app)
    assert state.load_journal("timelines").offset == b  # everything before it delivered and checkpointed
    state.skip_lost(store, "timelines", b, e, reason="test")
    run_available_now(spark, sink, url, tmp_path / "ckpt")  # Spark runs the failed batch again: it goes on
    assert state.load_journal("timelines").offset == store.end("timelines")

    # fail_on_data_loss=False (rows=ranges: the sink reads), and the source's failOnDataLoss=false (rows=frames)
    for rows, options in (("ranges", {}), ("frames", {"failOnDataLoss": "false"})):
        other = f"q{uuid.uuid4().hex[:8]}"
        skipping = ZClusterSink(
            shards.urls, timeline_mapper, other, journals=url, prefix=prefix, fail_on_data_loss=False
        )
        query = run_available_now(spark, skipping, url, tmp_path / f"ckpt-{rows}", rows=rows, **options)
        assert sum(s.lost_skipped for s in skipping.history) == 1
        assert sum(f["lost_skipped"] for f in map(figures, query.recentProgress) if f is not None) == 1
        (entry,) = StateStore(Cluster.from_urls(shards.urls, prefix=prefix), other).audit()
        assert (entry["begin"], entry["end"], entry["by"]) == (b, e, "applier")
