"""Journals: append-only byte streams with byte offsets, in files (embedded) or Redis Streams.

* Backends: :class:`FileJournals` (fragment files, no server) and :class:`RedisJournals` (one Redis stream
  per journal) implement the message layer's journal SPI plus :class:`JournalStore` (management, batched
  appends, durable consumer-group positions).
* :class:`Channels`: Milvus-style channel operations (create/destroy/describe, produce, broadcast,
  consume/ack/nack/seek in groups, time-tick ``consume_until``).
* Typed messages (:class:`KindRegistry`, :class:`TypedMessage`, :class:`TypedReader`), a
  :class:`Dispatcher` of commands and events, and a :class:`WorkerPool` consumer with dead letters.
* :class:`AsyncPublisher`: futures per message, batched appends, a write barrier, transient retries.

Importing this package never imports PySpark.
"""

from zcluster.journal.channels import ChannelInfo, Channels
from zcluster.journal.dispatch import Context, Dispatcher, Handler, NoHandlerError
from zcluster.journal.files import FileJournals, RecoveryReport
from zcluster.journal.publishing import TRANSIENT_ERRORS, AsyncPublisher
from zcluster.journal.store import JournalExistsError, JournalInfo, JournalStore
from zcluster.journal.streams import ClaimResult, RedisJournals, StreamEntry
from zcluster.journal.typed import (
    Category,
    Kind,
    KindRegistry,
    TypedMessage,
    TypedReader,
    UndecodableMessageError,
    UnknownKindError,
)
from zcluster.journal.workers import WorkerPool

__all__ = [
    "TRANSIENT_ERRORS",
    "AsyncPublisher",
    "Category",
    "ChannelInfo",
    "Channels",
    "ClaimResult",
    "Context",
    "Dispatcher",
    "FileJournals",
    "Handler",
    "JournalExistsError",
    "JournalInfo",
    "JournalStore",
    "Kind",
    "KindRegistry",
    "NoHandlerError",
    "RecoveryReport",
    "RedisJournals",
    "StreamEntry",
    "TypedMessage",
    "TypedReader",
    "UndecodableMessageError",
    "UnknownKindError",
    "WorkerPool",
]
