"""The OpenTelemetry bridges (the otel extra) on real servers: a Cluster's calls and a Consumer's polls become
OTel metrics and spans, read back with the SDK's in-memory reader and exporter."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk")
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from zcluster import Cluster, InvalidTupleError, KeyScoreMember
from zcluster.journal import FileJournals
from zcluster.otel import OTelApplierMetrics, OTelInstrumentation
from zcluster.state import Consumer
from zcluster.testing import LocalShards
from zcluster.testing.traffic import Traffic, create_journals, publish, timeline_mapper


class OTel:
    """Providers with in-memory readers, and the points read back as {(metric, attributes): value}."""

    def __init__(self) -> None:
        self.reader = InMemoryMetricReader()
        self.meters = MeterProvider(metric_readers=[self.reader])
        self.spans = InMemorySpanExporter()
        self.tracers = TracerProvider()
        self.tracers.add_span_processor(SimpleSpanProcessor(self.spans))

    def points(self) -> dict[tuple[str, frozenset[tuple[str, Any]]], Any]:
        out: dict[tuple[str, frozenset[tuple[str, Any]]], Any] = {}
        data = self.reader.get_metrics_data()
        for resource in data.resource_metrics if data else ():
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    for point in metric.data.data_points:
                        value = point.count if hasattr(point, "bucket_counts") else point.value
                        out[metric.name, frozenset(point.attributes.items())] = value
        return out


@pytest.fixture
def otel() -> Iterator[OTel]:
    o = OTel()
    yield o
    o.meters.shutdown()
    o.tracers.shutdown()


def key(name: str, **attrs: Any) -> tuple[str, frozenset[tuple[str, Any]]]:
    return name, frozenset(attrs.items())


def test_calls_become_metrics_and_spans_with_op_shard_prefix_and_error(
    shards: LocalShards, otel: OTel, dead_port: int
) -> None:
    prefix = f"ot{uuid.uuid4().hex[:8]}:"
    hook = OTelInstrumentation(otel.meters, otel.tracers, prefix=prefix)
    dead = f"127.0.0.1:{dead_port}"
    with Cluster.from_urls(shards.urls, prefix=prefix, instrumentation=hook) as cluster:
        cluster.insert([KeyScoreMember(f"k{i}", 1.0, "m") for i in range(5)])
        cluster.select(["k0", "k1"])
    with Cluster.from_urls([shards.urls[0], f"redis://{dead}"], prefix=prefix, instrumentation=hook) as broken:
        result = broken.insert([KeyScoreMember(f"k{i}", 2.0, "m") for i in range(20)], raise_on_error=False)
        assert [f.shard for f in result.failures] == [dead]
        with pytest.raises(InvalidTupleError):
            broken.insert([KeyScoreMember("", 1.0, "m")])

    points = otel.points()
    # Issue 39, item 7: the error points exist before any error, at 0: every shard, the errors raised before
    # anything is sent, for each op called (the select saw no error at all).
    for shard in (u.rpartition("/")[2] for u in shards.urls):
        assert points[key("zcluster.shard_errors", prefix=prefix, op="select", shard=shard)] == 0
    for error in ("ConfigError", "InvalidTupleError"):
        assert points[key("zcluster.call_errors", prefix=prefix, op="select", error=error)] == 0
    assert points[key("zcluster.calls", prefix=prefix, op="insert")] == 3
    assert points[key("zcluster.records", prefix=prefix, op="insert")] == 5 + 20 + 1
    assert points[key("zcluster.applied", prefix=prefix, op="insert")] == 5 + result.applied_count
    assert points[key("zcluster.calls", prefix=prefix, op="select")] == 1
    assert points[key("zcluster.call.duration", prefix=prefix, op="insert")] == 3  # histogram count
    assert points[key("zcluster.shard_errors", prefix=prefix, op="insert", shard=dead)] == 1
    assert points[key("zcluster.call_errors", prefix=prefix, op="insert", error="InvalidTupleError")] == 1

    spans = otel.spans.get_finished_spans()
    assert [s.name for s in spans] == ["zcluster.insert", "zcluster.select", "zcluster.insert", "zcluster.insert"]
    ok, _, partial, raised = spans
    assert ok.attributes["op"] == "insert" and ok.attributes["prefix"] == prefix
    assert ok.attributes["zcluster.records"] == 5 and ok.status.status_code == StatusCode.UNSET
    assert ok.end_time > ok.start_time
    assert partial.status.status_code == StatusCode.ERROR and list(partial.attributes["zcluster.failed_shards"]) == [
        dead
    ]
    assert raised.status.status_code == StatusCode.ERROR and raised.attributes["error"] == "InvalidTupleError"
    assert [e.name for e in raised.events] == ["exception"]


def test_a_consumers_polls_become_metrics_and_batch_spans(shards: LocalShards, otel: OTel, tmp_path: Path) -> None:
    store = FileJournals(tmp_path / "journals")
    create_journals(store, ["a", "b"])
    traffic = publish(store, Traffic(["a", "b"]), producers=2, messages=60, seed=7)
    app = f"ot{uuid.uuid4().hex[:8]}"
    with Cluster.from_urls(shards.urls, prefix=f"ot{uuid.uuid4().hex[:8]}:") as cluster:
        consumer = Consumer(cluster, store, timeline_mapper, app, metrics=OTelApplierMetrics(otel.meters, otel.tracers))
        stats = consumer.poll()
    points = otel.points()
    assert points[key("zcluster.applier.batches", app=app)] == 1
    assert points[key("zcluster.applier.delivered", app=app)] == stats.delivered == traffic.committed
    assert points[key("zcluster.applier.duplicates", app=app)] == stats.duplicates > 0
    assert points[key("zcluster.applier.lost_skipped", app=app)] == 0  # the series exists from the first batch
    assert points[key("zcluster.applier.batch.duration", app=app)] == 1
    assert points[key("zcluster.applier.lag", app=app, journal="a")] == 0
    (span,) = otel.spans.get_finished_spans()
    assert span.name == "zcluster.batch" and span.attributes["app"] == app
    assert span.attributes["zcluster.delivered"] == stats.delivered
