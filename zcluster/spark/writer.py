"""``df.write.format("zcluster")`` / ``writeStream.format("zcluster")``: KeyScoreMember rows into the cluster.
(``spark.read.format("zcluster")``, the same data source's reader, is :mod:`zcluster.spark.reader`.)

Rows need ``key``, ``score`` and ``member`` columns and may have ``op`` (``"insert"``, the default, or
``"delete"``). Options: ``urls`` (comma-separated shard URLs) or ``cluster_url`` (a Redis Cluster seed,
with ``failover_timeout``: :func:`zcluster.spark.options.config_from_options`, the reader's parser too),
``prefix``, ``max_size``, ``routing``, ``batch`` (tuples per write call). Every write is a CRDT write, so a
retried task or a replayed micro-batch rewrites the same tuples harmlessly: the writer is idempotent. Unconfirmed
tuples are resent as the sink's are (same buffer, 5 retries with backoff); a shard that keeps failing
fails the task, which Spark retries up to ``spark.task.maxFailures`` times (4 on a cluster, once in
``local[n]``); then the write fails, and a streaming query ends (start it again from its checkpoint: the
batch is written again, harmlessly).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    WriterCommitMessage,
)

from zcluster.config import StoreConfig
from zcluster.errors import ConfigError
from zcluster.spark.options import config_from_options
from zcluster.spark.reader import TupleReader, read_schema
from zcluster.state.batch import BatchStats, WriteBuffer
from zcluster.types import Delete, Insert


@dataclass
class Written(WriterCommitMessage):
    """Per task: tuples sent and tuples that took effect."""

    sent: int
    applied: int


def write_rows(config: StoreConfig, rows: Iterator[Any], batch: int, retries: int = 5) -> Written:
    """Send rows as Insert/Delete writes in batches, resending unconfirmed ones (the applier's
    :class:`WriteBuffer`); raises on an unknown op (naming the row) or a shard that keeps failing."""
    stats = BatchStats()
    buffer = WriteBuffer(config.shared(), batch, retries, stats)
    for row in rows:
        op = row.asDict().get("op", "insert")
        if op in (None, "insert"):
            write: Insert | Delete = Insert(row["key"], row["score"], row["member"])
        elif op == "delete":
            write = Delete(row["key"], row["score"], row["member"])
        else:
            raise ConfigError(f"row {row!r}: op must be 'insert' or 'delete', not {op!r}")
        buffer.add((write,))
    buffer.flush()
    return Written(stats.inserts + stats.deletes, stats.applied)


class _RowSender:
    """The part both writers share: options parsed once, rows sent in batches by each task."""

    def __init__(self, options: dict[str, str]) -> None:
        self.config = config_from_options(options)
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
    """Registered as ``zcluster``: this module's writers and the reader of :mod:`zcluster.spark.reader`."""

    @classmethod
    def name(cls) -> str:
        return "zcluster"

    def schema(self) -> str:
        """What a read gives (:mod:`zcluster.spark.reader`); a write takes its DataFrame's columns."""

        return read_schema(dict(self.options))

    def reader(self, schema: Any) -> DataSourceReader:
        """``spark.read.format("zcluster")``: :class:`zcluster.spark.reader.TupleReader`."""

        return TupleReader(dict(self.options))

    def writer(self, schema: Any, overwrite: bool) -> TupleWriter:
        return TupleWriter(dict(self.options))

    def streamWriter(self, schema: Any, overwrite: bool) -> TupleStreamWriter:
        return TupleStreamWriter(dict(self.options))
