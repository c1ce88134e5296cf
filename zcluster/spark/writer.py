"""``df.write.format("zcluster")`` / ``writeStream.format("zcluster")``: KeyScoreMember rows into the cluster.

Rows need ``key``, ``score`` and ``member`` columns and may have ``op`` (``"insert"``, the default, or
``"delete"``). Options: ``urls`` (comma-separated shard URLs) or ``cluster_url`` (a Redis Cluster seed),
``prefix``, ``max_size``, ``batch`` (tuples per write call). Every write is a CRDT write, so a retried task
or a replayed micro-batch rewrites the same tuples harmlessly: the writer is idempotent. Shard failures
fail the task (after the cluster reported which tuples it could not confirm), and Spark retries it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceStreamWriter, DataSourceWriter, WriterCommitMessage

from zcluster.spark.config import ClusterConfig


@dataclass
class Written(WriterCommitMessage):
    """Per task: tuples sent and tuples that took effect."""

    sent: int
    applied: int


def _config(options: dict[str, str]) -> ClusterConfig:
    extra: dict[str, Any] = {"prefix": options.get("prefix", "zc:")}
    if options.get("max_size"):
        extra["max_size"] = int(options["max_size"])
    if options.get("cluster_url"):
        return ClusterConfig(cluster_url=options["cluster_url"], **extra)
    if not options.get("urls"):
        raise ValueError("the zcluster data source needs the 'urls' or 'cluster_url' option")
    return ClusterConfig(urls=tuple(u.strip() for u in options["urls"].split(",") if u.strip()), **extra)


def write_rows(config: ClusterConfig, rows: Iterator[Any], batch: int) -> Written:
    """Send rows in batches; raises on an unknown op (naming it) or a shard failure."""
    cluster = config.connect()
    inserts: list[tuple[Any, Any, Any]] = []
    deletes: list[tuple[Any, Any, Any]] = []
    sent = applied = 0

    def flush() -> None:
        nonlocal sent, applied, inserts, deletes
        for items, write in ((inserts, cluster.insert), (deletes, cluster.delete)):
            if items:
                applied += write(items).applied_count
                sent += len(items)
        inserts, deletes = [], []

    for row in rows:
        op = row.asDict().get("op", "insert")
        item = (row["key"], row["score"], row["member"])
        if op in (None, "insert"):
            inserts.append(item)
        elif op == "delete":
            deletes.append(item)
        else:
            raise ValueError(f"row {row!r}: op must be 'insert' or 'delete', not {op!r}")
        if len(inserts) + len(deletes) >= batch:
            flush()
    flush()
    return Written(sent, applied)


class _RowSender:
    """The part both writers share: options parsed once, rows sent in batches by each task."""

    def __init__(self, options: dict[str, str]) -> None:
        self.config = _config(options)
        self.batch = int(options.get("batch", "4096"))

    def write(self, iterator: Iterator[Any]) -> Written:
        return write_rows(self.config, iterator, self.batch)


class TupleWriter(_RowSender, DataSourceWriter):
    """Batch writer: ``df.write.format("zcluster")``."""


class TupleStreamWriter(_RowSender, DataSourceStreamWriter):
    """Streaming writer: ``writeStream.format("zcluster")``."""

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing to finish: each task's writes are already durable and idempotent."""

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing to undo: CRDT writes that landed are the same ones the retry will make."""


class TupleDataSource(DataSource):
    """Registered as ``zcluster``."""

    @classmethod
    def name(cls) -> str:
        return "zcluster"

    def schema(self) -> str:
        return "key string, score double, member string, op string"

    def writer(self, schema: Any, overwrite: bool) -> TupleWriter:
        return TupleWriter(dict(self.options))

    def streamWriter(self, schema: Any, overwrite: bool) -> TupleStreamWriter:
        return TupleStreamWriter(dict(self.options))
