"""The sink's batch figures where Spark shows them: the query's progress (observed metrics).

What Spark 4 offers, and what works on classic Spark and Spark Connect alike (checked on 4.3):

* Custom metrics of a Python data source: not offered (``DataSourceStreamReader`` has no metrics hook), and
  the figures (delivered, duplicates...) are the sink's anyway, known only once the applier ran.
* Accumulators: classic only (Spark Connect has no ``SparkContext``), and they reach neither
  ``StreamingQueryProgress`` nor a ``StreamingQueryListener``.
* ``DataFrame.observe`` inside ``foreachBatch``: the metrics reach the batch's own ``Observation`` but not
  the query's progress (Spark reports the observed metrics of the micro-batch's plan, and a ``foreachBatch``
  function runs plans of its own).
* ``DataFrame.observe`` on the streaming DataFrame before ``writeStream``: in the query's progress
  (``StreamingQueryProgress.observedMetrics``, the ``QueryProgressEvent`` of a listener, the UI's progress
  JSON), on classic and Connect. Used here: :meth:`zcluster.spark.ZClusterSink.observe` puts the sink's
  executor tasks (``mapInArrow``) into the query's own plan and observes their figures; ``foreachBatch``
  then only collects the task rows (lazily: a batch the sink skips is never run).

Reading them: :func:`figures` gives one batch's figures as a plain dict from a ``StreamingQueryProgress``.
Classic Spark gives the observed metrics as a ``Row``; PySpark's Connect client (4.3) parses the progress
JSON into a ``Row(values=[...], schema={...})`` instead (its ``fromJson`` expects flat rows), which
:func:`figures` reads as well.

Each task returns :data:`TASK_SCHEMA` rows: one with its figures (``stats``, the whole
:class:`zcluster.state.BatchStats` counters as JSON, and the main counts as columns), then one per journal it
measured (``journal``, ``lag_bytes``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import pyarrow as pa

from zcluster.state.batch import BatchStats

__all__ = ["COUNTS", "METRICS_NAME", "TASK_SCHEMA", "add_rows", "figures", "observed", "task_batch"]

METRICS_NAME = "zcluster"
"""The name of the sink's observed metrics in ``StreamingQueryProgress.observedMetrics``."""

COUNTS = (
    "frames",
    "delivered",
    "duplicates",
    "rollbacks",
    "replays",
    "malformed",
    "lost_skipped",
    "lost_bytes",
    "inserts",
    "deletes",
    "applied",
)
"""The :class:`BatchStats` counts observed, each a column of the task rows and a field of the metrics."""

TASK_SCHEMA = ", ".join(["stats string", *(f"{name} long" for name in COUNTS), "journal string", "lag_bytes long"])
_ARROW = pa.schema(
    [
        ("stats", pa.string()),
        *((name, pa.int64()) for name in COUNTS),
        ("journal", pa.string()),
        ("lag_bytes", pa.int64()),
    ]
)


def task_batch(stats: BatchStats) -> pa.RecordBatch:
    """A task's rows (see the module): its figures, then one row per journal lag it measured."""
    lags = sorted(stats.lag.items())
    n = 1 + len(lags)
    columns: dict[str, list[Any]] = {"stats": [json.dumps(stats.counters())] + [None] * len(lags)}
    for name in COUNTS:
        columns[name] = [getattr(stats, name)] + [None] * len(lags)
    columns["journal"] = [None, *(j for j, _ in lags)]
    columns["lag_bytes"] = [None, *(lag for _, lag in lags)]
    assert all(len(v) == n for v in columns.values())
    return pa.RecordBatch.from_pydict(columns, schema=_ARROW)


def add_rows(stats: BatchStats, rows: Iterable[Any]) -> None:
    """Add the figures of collected task rows to ``stats``."""
    for row in rows:
        if row.stats is not None:
            stats.add(json.loads(row.stats))


_OBSERVED = (
    *(f"coalesce(sum({c}), 0) AS {c}" for c in COUNTS),
    "coalesce(sum(lag_bytes), 0) AS lag_bytes",
    "array_sort(collect_list(CASE WHEN journal IS NOT NULL THEN struct(journal, lag_bytes) END)) AS lag",
)


def observed(df: Any, name: str = METRICS_NAME) -> Any:
    """``df`` (task rows) observed as ``name``: each count summed over the batch's tasks, ``lag_bytes`` the
    sum of the journals' lags, and ``lag`` an array of ``(journal, lag_bytes)`` sorted by journal.

    The expressions are SQL text, one call each: built from ``F.sum``, ``F.coalesce``... they took about 60
    Py4J round trips, some 50-80 ms of every query's start on classic Spark."""
    from pyspark.sql import functions as F

    return df.observe(name, *(F.expr(e) for e in _OBSERVED))


def figures(progress: Any, name: str = METRICS_NAME) -> dict[str, Any] | None:
    """The sink's figures of one batch as a plain dict (counts, ``lag_bytes``, ``lag`` as a list of
    ``{"journal", "lag_bytes"}``), from a ``StreamingQueryProgress`` (``query.lastProgress``, a listener's
    ``event.progress``) or its ``observedMetrics[name]``; None for a batch without them. Reads classic
    Spark's rows and Spark Connect's alike (see the module)."""
    metrics = getattr(progress, "observedMetrics", None)
    row = metrics.get(name) if metrics is not None else progress
    if row is None:
        return None
    plain = _plain(row)
    return plain if isinstance(plain, dict) else None


def _plain(value: Any) -> Any:
    if hasattr(value, "asDict"):
        value = value.asDict()
    if isinstance(value, dict):
        if set(value) == {"values", "schema"} and isinstance(value["schema"], dict):  # Connect's JSON form
            names = [f["name"] for f in value["schema"].get("fields", ())]
            return {n: _plain(v) for n, v in zip(names, value["values"], strict=True)}
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value
