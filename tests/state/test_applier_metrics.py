"""ApplierMetrics (the metrics extra) on the plain Consumer: each poll's figures as Prometheus metrics."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

pytest.importorskip("prometheus_client")
from prometheus_client import CollectorRegistry

from zcluster import Cluster, PollError
from zcluster.journal import FileJournals
from zcluster.journal._filefmt import find_fragment
from zcluster.metrics import ApplierMetrics
from zcluster.state import BatchStats, Consumer
from zcluster.testing import LocalShards
from zcluster.testing.traffic import Traffic, create_journals, publish, timeline_mapper


def test_a_consumers_polls_become_counters_a_histogram_and_lag_gauges(shards: LocalShards, tmp_path: Path) -> None:
    store = FileJournals(tmp_path / "journals")
    names = ["a", "b"]
    create_journals(store, names)
    traffic = publish(store, Traffic(names), producers=3, messages=120, seed=3)
    registry = CollectorRegistry()
    metrics = ApplierMetrics(registry)
    app = f"met{uuid.uuid4().hex[:8]}"

    def value(name: str, **labels: str) -> float:
        return registry.get_sample_value(f"zcluster_applier_{name}", {"app": app, **labels}) or 0.0

    with Cluster.from_urls(shards.urls, prefix=f"met{uuid.uuid4().hex[:8]}:") as cluster:
        consumer = Consumer(cluster, store, timeline_mapper, app, metrics=metrics)
        first = consumer.poll()
        second = consumer.poll()
        total = BatchStats()
        for stats in (first, second):
            total.add(stats.counters())
        assert value("batches_total") == 2 and value("batch_seconds_count") == 2
        assert value("batch_seconds_sum") == pytest.approx(first.seconds + second.seconds)
        assert value("delivered_total") == total.delivered == traffic.committed
        assert value("duplicates_total") == total.duplicates > 0
        assert value("rollbacks_total") == total.rollbacks > 0
        assert value("frames_total") == total.frames and value("applied_total") == total.applied > 0
        assert all(value("lag_bytes", journal=n) == 0 for n in names)

        # A journal that stays behind (a lost range, here) reports its lag on every poll.
        with FileJournals(tmp_path / "journals", fragment_bytes=1) as fj:
            fj.roll("a")
            r = fj.append("a", b'{"x": 1}\n')  # a fragment file of its own
            fj.append("a", b'{"x": 2}\n')
        path = tmp_path / "journals" / "a" / find_fragment(tmp_path / "journals" / "a", r.begin, r.end)
        path.write_bytes(path.read_bytes()[:-2])
        damaged = FileJournals(tmp_path / "journals")
        behind = Consumer(cluster, damaged, timeline_mapper, app, metrics=metrics)
        with pytest.raises(PollError):
            behind.poll()
        assert value("batches_total") == 3 and value("lag_bytes", journal="a") == damaged.end("a") - r.begin
