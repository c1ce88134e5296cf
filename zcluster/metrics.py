"""Prometheus adapters (need the ``metrics`` extra: prometheus-client, imported only when one is made):
:class:`PrometheusInstrumentation` for the cluster's instrumentation hook, :class:`ApplierMetrics` for the
exactly-once applier's batches (the plain Consumer's polls, the Spark sink's micro-batches), and
:class:`ProgressCollector` for the lag of every application in every journal, read from the cluster's
checkpoints on each scrape (:func:`zcluster.state.monitor.progress`, what ``zcluster consumers`` prints).

``deploy/grafana/zcluster.json`` and ``deploy/prometheus/zcluster-rules.yml`` use these metrics (a test
checks that every name and label they use is exported here).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import Any

from zcluster.instrumentation import CALL_ERRORS, OpEvent
from zcluster.state.batch import APPLIER_COUNTS

log = logging.getLogger("zcluster.metrics")


class PrometheusInstrumentation:
    """Counts calls, records, applied writes and shard errors per operation; times calls.

    Metric names: ``zcluster_calls_total``, ``zcluster_records_total``, ``zcluster_applied_total``,
    ``zcluster_shard_errors_total`` (labels ``op``, and ``shard`` for errors), ``zcluster_call_errors_total``
    (calls that raised before any shard answered; labels ``op`` and ``error``, the exception's class) and
    ``zcluster_call_seconds`` (histogram, label ``op``).

    The error series exist before the first error, at 0, so a dashboard panel is not empty and ``increase()``
    sees the first one: from an operation's first call on, ``zcluster_shard_errors_total`` for every shard
    the cluster knows (:attr:`OpEvent.known_shards`) and ``zcluster_call_errors_total`` for the errors a call
    raises before anything is sent (:data:`zcluster.instrumentation.CALL_ERRORS`).
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
        for shard in event.known_shards:
            self.errors.labels(event.op, shard)  # the series, at 0 until an error
        for error in CALL_ERRORS:
            self.failed.labels(event.op, error)
        self.calls.labels(event.op).inc()
        self.records.labels(event.op).inc(event.records)
        if event.applied:
            self.applied.labels(event.op).inc(event.applied)
        for shard in event.failed_shards:
            self.errors.labels(event.op, shard).inc()
        if event.error is not None:
            self.failed.labels(event.op, type(event.error).__name__).inc()
        self.seconds.labels(event.op).observe(event.seconds)


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
    its checkpoint after the last batch that read it). Every counter of an application exists from its first
    batch on (at 0), so alerts on ``increase()`` see the first event. One instance serves any number of
    applications.
    """

    def __init__(self, registry: Any = None, namespace: str = "zcluster") -> None:
        from prometheus_client import REGISTRY, Counter, Gauge, Histogram

        reg = registry if registry is not None else REGISTRY
        name = f"{namespace}_applier"
        self.batches = Counter(f"{name}_batches", "Batches applied (polls, micro-batches)", ["app"], registry=reg)
        self.counts = {field: Counter(f"{name}_{field}", text, ["app"], registry=reg) for field, text in APPLIER_COUNTS}
        self.seconds = Histogram(f"{name}_batch_seconds", "Batch duration", ["app"], registry=reg)
        self.lag = Gauge(
            f"{name}_lag_bytes", "Bytes between a journal's end and its checkpoint", ["app", "journal"], registry=reg
        )

    def __call__(self, app: str, stats: Any) -> None:
        """Record one batch of application ``app`` (``stats``: a :class:`zcluster.state.BatchStats`)."""
        self.batches.labels(app).inc()
        for field, counter in self.counts.items():
            # Every series from the first batch on, at 0 if need be: increase() and rate() see the first
            # lost range skipped (a series born at 1 has no increase to see).
            counter.labels(app).inc(getattr(stats, field, 0))
        self.seconds.labels(app).observe(stats.seconds)
        for journal, lag in stats.lag.items():
            self.lag.labels(app, journal).set(lag)


_PROGRESS_GAUGES = (
    ("lag_bytes", "Bytes between the journal's end and the application's checkpoint", ("app", "journal")),
    ("offset_bytes", "The application's checkpoint in the journal (bytes read through)", ("app", "journal")),
    ("journal_end_bytes", "The journal's end (its write head) when scraped", ("app", "journal")),
    ("checkpoint_timestamp_seconds", "When the checkpoint last moved (Unix time)", ("app", "journal")),
    ("open_transactions", "Producers with a transaction still open (messages awaiting an ACK)", ("app", "journal")),
    ("lost_ranges_ahead", "Lost ranges of the journal at or after the checkpoint", ("app", "journal")),
    ("lost_skipped_ranges", "Lost ranges skipped so far (the state's audit log)", ("app", "journal")),
    ("lost_skipped_bytes", "Bytes of the lost ranges skipped so far", ("app", "journal")),
    (
        "stopped",
        "1 when the application cannot go on in the journal (zcluster consumers APP says why)",
        ("app", "journal"),
    ),
    ("progress_failed", "1 when the application's progress could not be read in this scrape (logged)", ("app",)),
    ("shard_failed", "1: the shard failed while the progress was read in this scrape (logged)", ("shard",)),
)


class ProgressCollector:
    """A prometheus-client collector of where each application stands in each journal, read on every scrape
    with :func:`zcluster.state.monitor.progress` (reads only: a SCAN of the state namespace and a select per
    application, plus each journal's end when ``journals`` is given).

    Register it once: ``registry.register(ProgressCollector(cluster, journals))``. ``apps``: the application
    ids to report (default: every application with checkpoints, found on each scrape). ``verify``: read each
    lag the way the consumer's next poll reads it, so damage it would fail on shows as ``stopped`` (costs
    that read on every scrape; off by default: the ends and lost ranges only).

    Gauges (prefix ``zcluster_consumer_``), labels ``app`` and ``journal``: ``lag_bytes``, ``offset_bytes``,
    ``journal_end_bytes`` (lag and end need ``journals``), ``checkpoint_timestamp_seconds``,
    ``open_transactions``, ``lost_ranges_ahead``, ``lost_skipped_ranges``, ``lost_skipped_bytes`` and
    ``stopped`` (1: the application cannot go on there, see :attr:`JournalProgress.error`). A shard that
    fails does not fail the scrape: it is logged and reported as ``zcluster_consumer_shard_failed{shard}`` =
    1 (every other shard of the cluster at 0), and the journals it holds checkpoints of are missing. An
    application whose progress cannot be read at all (its journal store missing, a bug) is logged with its
    error and reported as ``zcluster_consumer_progress_failed{app}`` = 1; the other applications are
    reported as usual.
    """

    def __init__(
        self,
        cluster: Any,
        journals: Any = None,
        apps: Sequence[str] | None = None,
        *,
        verify: bool = False,
        state_namespace: str = "zcstate:",
        namespace: str = "zcluster",
    ) -> None:
        self.cluster = cluster
        self.journals = journals
        self.apps = list(apps) if apps is not None else None
        self.verify = verify
        self.state_namespace = state_namespace
        self.prefix = f"{namespace}_consumer_"

    def _families(self) -> dict[str, Any]:
        from prometheus_client.core import GaugeMetricFamily

        return {
            name: GaugeMetricFamily(self.prefix + name, text, labels=list(labels))
            for name, text, labels in _PROGRESS_GAUGES
        }

    def describe(self) -> Iterator[Any]:
        """The metric families without samples (so registering does not read the cluster)."""
        yield from self._families().values()

    def collect(self) -> Iterator[Any]:
        """Read every application's progress now (see the class) and yield the gauges."""
        from zcluster.state.monitor import checkpoints, progress

        out = self._families()
        failures: list[Any] = []
        # One SCAN of the state namespace per scrape, whatever the number of applications.
        held = checkpoints(self.cluster, self.state_namespace, failures=failures)
        for app in self.apps if self.apps is not None else held:
            try:
                found = progress(
                    self.cluster,
                    app,
                    self.journals,
                    verify=self.verify,
                    namespace=self.state_namespace,
                    failures=failures,
                    checkpointed=held.get(app, ()),
                )
            except Exception:  # one application's failure must not hide the others' (logged, and exported)
                log.exception("progress of application %s could not be read", app)
                out["progress_failed"].add_metric([app], 1)
                continue
            out["progress_failed"].add_metric([app], 0)
            for p in found:
                labels = [app, p.journal]
                if p.lag_bytes is not None:
                    out["lag_bytes"].add_metric(labels, p.lag_bytes)
                if p.end is not None:
                    out["journal_end_bytes"].add_metric(labels, p.end)
                out["offset_bytes"].add_metric(labels, p.offset)
                if p.last_moved is not None:
                    out["checkpoint_timestamp_seconds"].add_metric(labels, p.last_moved)
                out["open_transactions"].add_metric(labels, p.open_transactions)
                out["lost_ranges_ahead"].add_metric(labels, len(p.lost))
                out["lost_skipped_ranges"].add_metric(labels, len(p.skipped))
                out["lost_skipped_bytes"].add_metric(labels, sum(s.end - s.begin for s in p.skipped))
                out["stopped"].add_metric(labels, p.error is not None)
        failed = {f.shard: f.error for f in failures}
        for shard, error in sorted(failed.items()):
            log.warning("progress: shard %s failed: %s: %s", shard, type(error).__name__, error)
        for shard in sorted({*self.cluster.shards, *failed}):  # every shard, at 0 unless it failed
            out["shard_failed"].add_metric([shard], shard in failed)
        yield from out.values()
