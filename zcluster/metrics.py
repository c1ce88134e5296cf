"""Prometheus adapter for the instrumentation hook (needs the ``metrics`` extra: prometheus-client)."""

from __future__ import annotations

from typing import Any

from zcluster.instrumentation import OpEvent


class PrometheusInstrumentation:
    """Counts calls, records, applied writes and shard errors per operation; times calls.

    Metric names: ``zcluster_calls_total``, ``zcluster_records_total``, ``zcluster_applied_total``,
    ``zcluster_shard_errors_total`` (labels ``op``, and ``shard`` for errors), ``zcluster_call_errors_total``
    (calls that raised before any shard answered; labels ``op`` and ``error``, the exception's class) and
    ``zcluster_call_seconds`` (histogram, label ``op``).
    """

    def __init__(self, registry: Any = None, namespace: str = "zcluster") -> None:
        from prometheus_client import REGISTRY, Counter, Histogram

        reg = registry if registry is not None else REGISTRY
        self.calls = Counter(f"{namespace}_calls", "Cluster calls", ["op"], registry=reg)
        self.records = Counter(f"{namespace}_records", "Tuples or keys handled", ["op"], registry=reg)
        self.applied = Counter(f"{namespace}_applied", "Writes that took effect", ["op"], registry=reg)
        self.errors = Counter(f"{namespace}_shard_errors", "Shard failures", ["op", "shard"], registry=reg)
        self.failed = Counter(f"{namespace}_call_errors", "Calls that raised", ["op", "error"], registry=reg)
        self.seconds = Histogram(f"{namespace}_call_seconds", "Call duration", ["op"], registry=reg)

    def __call__(self, event: OpEvent) -> None:
        self.calls.labels(event.op).inc()
        self.records.labels(event.op).inc(event.records)
        if event.applied:
            self.applied.labels(event.op).inc(event.applied)
        for shard in event.failed_shards:
            self.errors.labels(event.op, shard).inc()
        if event.error is not None:
            self.failed.labels(event.op, type(event.error).__name__).inc()
        self.seconds.labels(event.op).observe(event.seconds)
