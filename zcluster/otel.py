"""OpenTelemetry bridges (need the ``otel`` extra: opentelemetry-api, and an SDK to export; imported only when
one is made, never by ``import zcluster``), the counterparts of :mod:`zcluster.metrics`' Prometheus adapters:

* :class:`OTelInstrumentation`, an instrumentation hook (:mod:`zcluster.instrumentation`) for a
  :class:`zcluster.Cluster` or a Farm: per call, metrics ``zcluster.calls``, ``zcluster.records``,
  ``zcluster.applied`` (counters), ``zcluster.call.duration`` (histogram, seconds),
  ``zcluster.shard_errors`` (counter, one per failed shard) and ``zcluster.call_errors`` (calls that raised
  before any shard answered), and one span ``zcluster.<op>`` per call. The error counters have their points
  at 0 before the first error, as the Prometheus adapter's series (every shard the cluster knows, and
  :data:`zcluster.instrumentation.CALL_ERRORS`, from an operation's first call on).
* :class:`OTelApplierMetrics`, the applier's ``metrics=`` hook (a :class:`zcluster.state.Consumer`'s polls, a
  :class:`zcluster.spark.ZClusterSink`'s micro-batches): per batch, counters ``zcluster.applier.batches``,
  ``zcluster.applier.<count>`` (frames, delivered, duplicates, rollbacks, replays, malformed, lost_skipped,
  lost_bytes, applied), ``zcluster.applier.batch.duration`` (histogram, seconds),
  ``zcluster.applier.lag`` (gauge, bytes; attributes ``app`` and ``journal``) and one span
  ``zcluster.batch``.

Attributes, what an operator filters by: ``op``; ``shard`` (``host:port``, or ``replica/host:port`` on a
farm) on shard errors; ``error`` (the exception's class) on call errors; ``prefix`` (the store's, when given
to the bridge: one bridge per store); ``app`` on the applier's. A span's status is ERROR when the call
raised or a shard failed; its ``zcluster.failed_shards`` attribute lists those shards, and the exception
is recorded on it. The hook runs after the call on the calling thread, so the span is a child of the
caller's current span and is given the call's measured start and end.
"""

from __future__ import annotations

import time
from typing import Any

from zcluster.instrumentation import CALL_ERRORS, OpEvent
from zcluster.state.batch import APPLIER_COUNTS

__all__ = ["OTelApplierMetrics", "OTelInstrumentation"]

_NS = "zcluster"  # the instruments' names, spans' names and attributes start with it (and the scope is it)


def _providers(meter_provider: Any, tracer_provider: Any) -> tuple[Any, Any]:
    from opentelemetry import metrics, trace

    meter = (meter_provider or metrics.get_meter_provider()).get_meter(_NS)
    tracer = (tracer_provider or trace.get_tracer_provider()).get_tracer(_NS)
    return meter, tracer


def _span(tracer: Any, name: str, seconds: float, attributes: dict[str, Any], error: BaseException | None) -> Any:
    """A span that ended now and lasted ``seconds``, ERROR with ``error`` recorded if given."""
    from opentelemetry.trace import Status, StatusCode

    end = time.time_ns()
    span = tracer.start_span(name, start_time=end - int(seconds * 1e9), attributes=attributes)
    if error is not None:
        span.record_exception(error)
        span.set_status(Status(StatusCode.ERROR, type(error).__name__))
    return span, end


class OTelInstrumentation:
    """An instrumentation hook turning each :class:`OpEvent` into OpenTelemetry metrics and a span (see the
    module). ``meter_provider``/``tracer_provider``: default, the global ones. ``prefix``: the store's
    prefix, set as attribute ``prefix`` on everything (omitted when empty)."""

    def __init__(self, meter_provider: Any = None, tracer_provider: Any = None, *, prefix: str = "") -> None:
        meter, self.tracer = _providers(meter_provider, tracer_provider)
        self.base = {"prefix": prefix} if prefix else {}
        self.calls = meter.create_counter(f"{_NS}.calls", unit="{call}", description="Cluster calls")
        self.records = meter.create_counter(f"{_NS}.records", unit="{record}", description="Tuples or keys")
        self.applied = meter.create_counter(f"{_NS}.applied", unit="{write}", description="Writes that took effect")
        self.shard_errors = meter.create_counter(f"{_NS}.shard_errors", unit="{error}", description="Shard failures")
        self.call_errors = meter.create_counter(f"{_NS}.call_errors", unit="{error}", description="Calls that raised")
        self.duration = meter.create_histogram(f"{_NS}.call.duration", unit="s", description="Call duration")

    def __call__(self, event: OpEvent) -> None:
        attrs = {**self.base, "op": event.op}
        self.calls.add(1, attrs)
        self.records.add(event.records, attrs)
        if event.applied:
            self.applied.add(event.applied, attrs)
        for shard in event.known_shards:  # the error series from the op's first call on, at 0 until an error
            self.shard_errors.add(0, {**attrs, "shard": shard})
        for error in CALL_ERRORS:
            self.call_errors.add(0, {**attrs, "error": error})
        for shard in event.failed_shards:
            self.shard_errors.add(1, {**attrs, "shard": shard})
        if event.error is not None:
            self.call_errors.add(1, {**attrs, "error": type(event.error).__name__})
        self.duration.record(event.seconds, attrs)
        span_attrs: dict[str, Any] = {**attrs, f"{_NS}.records": event.records, f"{_NS}.applied": event.applied}
        if event.failed_shards:
            span_attrs[f"{_NS}.failed_shards"] = list(event.failed_shards)
        if event.error is not None:
            span_attrs["error"] = type(event.error).__name__
        span, end = _span(self.tracer, f"{_NS}.{event.op}", event.seconds, span_attrs, event.error)
        if event.failed_shards and event.error is None:
            from opentelemetry.trace import Status, StatusCode

            span.set_status(Status(StatusCode.ERROR, f"shards failed: {', '.join(event.failed_shards)}"))
        span.end(end_time=end)


class OTelApplierMetrics:
    """The applier's batches as OpenTelemetry metrics and spans (see the module): pass it as ``metrics=`` to a
    :class:`zcluster.state.Consumer` or a :class:`zcluster.spark.ZClusterSink`, like
    :class:`zcluster.metrics.ApplierMetrics`. One instance serves any number of applications."""

    def __init__(self, meter_provider: Any = None, tracer_provider: Any = None, *, prefix: str = "") -> None:
        meter, self.tracer = _providers(meter_provider, tracer_provider)
        self.base = {"prefix": prefix} if prefix else {}
        self.batches = meter.create_counter(f"{_NS}.applier.batches", unit="{batch}", description="Batches applied")
        self.counts = {field: meter.create_counter(f"{_NS}.applier.{field}") for field, _ in APPLIER_COUNTS}
        self.duration = meter.create_histogram(f"{_NS}.applier.batch.duration", unit="s", description="Batch time")
        self.lag = meter.create_gauge(
            f"{_NS}.applier.lag", unit="By", description="Bytes between a journal's end and its checkpoint"
        )

    def __call__(self, app: str, stats: Any) -> None:
        """Record one batch of application ``app`` (``stats``: a :class:`zcluster.state.BatchStats`)."""
        attrs = {**self.base, "app": app}
        self.batches.add(1, attrs)
        for field, counter in self.counts.items():
            counter.add(getattr(stats, field, 0), attrs)  # every series from the first batch (see metrics.py)
        self.duration.record(stats.seconds, attrs)
        for journal, lag in stats.lag.items():
            self.lag.set(lag, {**attrs, "journal": journal})
        counts = {f"{_NS}.{field}": getattr(stats, field, 0) for field, _ in APPLIER_COUNTS}
        span, end = _span(self.tracer, f"{_NS}.batch", stats.seconds, {**attrs, **counts}, None)
        span.end(end_time=end)
