"""Prometheus adapters (need the ``metrics`` extra: prometheus-client, imported only when one is made):
:class:`PrometheusInstrumentation` for the cluster's instrumentation hook, :class:`ApplierMetrics` for the
exactly-once applier's batches (the plain Consumer's polls, the Spark sink's micro-batches)."""

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


_APPLIER_COUNTS = (
    ("frames", "Journal frames read"),
    ("delivered", "Committed messages delivered to the mapper"),
    ("duplicates", "Duplicate messages dropped"),
    ("rollbacks", "Transactions rolled back"),
    ("replays", "Transactions replayed from the journal (their ACK came in a later batch)"),
    ("malformed", "Frames that did not frame or decode (logged)"),
    ("lost_skipped", "Lost ranges of file journals skipped (fail_on_data_loss=False)"),
    ("lost_bytes", "Bytes of the lost ranges skipped"),
    ("applied", "Writes that took effect"),
)


class ApplierMetrics:
    """Prometheus metrics of the exactly-once applier, from each batch's figures
    (:class:`zcluster.state.BatchStats`): pass it as ``metrics=`` to :class:`zcluster.state.Consumer` (one
    batch per poll) or :class:`zcluster.spark.ZClusterSink` (per micro-batch, in the driver process; under
    Spark Connect that is the server's ``foreachBatch`` process).

    Counters (label ``app``): ``zcluster_applier_batches_total``, ``zcluster_applier_frames_total``,
    ``..._delivered_total``, ``..._duplicates_total`` (dropped), ``..._rollbacks_total``,
    ``..._replays_total``, ``..._malformed_total``, ``..._lost_skipped_total``, ``..._lost_bytes_total``,
    ``..._applied_total`` (writes that took effect); ``zcluster_applier_batch_seconds`` (histogram, label
    ``app``); ``zcluster_applier_lag_bytes`` (gauge, labels ``app`` and ``journal``: a journal's end minus
    its checkpoint after the last batch that read it). One instance serves any number of applications.
    """

    def __init__(self, registry: Any = None, namespace: str = "zcluster") -> None:
        from prometheus_client import REGISTRY, Counter, Gauge, Histogram

        reg = registry if registry is not None else REGISTRY
        name = f"{namespace}_applier"
        self.batches = Counter(f"{name}_batches", "Batches applied (polls, micro-batches)", ["app"], registry=reg)
        self.counts = {
            field: Counter(f"{name}_{field}", text, ["app"], registry=reg) for field, text in _APPLIER_COUNTS
        }
        self.seconds = Histogram(f"{name}_batch_seconds", "Batch duration", ["app"], registry=reg)
        self.lag = Gauge(
            f"{name}_lag_bytes", "Bytes between a journal's end and its checkpoint", ["app", "journal"], registry=reg
        )

    def __call__(self, app: str, stats: Any) -> None:
        """Record one batch of application ``app`` (``stats``: a :class:`zcluster.state.BatchStats`)."""
        self.batches.labels(app).inc()
        for field, counter in self.counts.items():
            value = getattr(stats, field, 0)
            if value:
                counter.labels(app).inc(value)
        self.seconds.labels(app).observe(stats.seconds)
        for journal, lag in stats.lag.items():
            self.lag.labels(app, journal).set(lag)
