"""Journals: append-only byte streams with byte offsets, in files (embedded) or Redis Streams. Storage only.

* :class:`JournalStore` (``store``): the contract both backends implement: the message layer's journal
  SPI plus management, batched appends, the end offset, durable consumer-group positions, and
  ``transient_errors`` (what a retry may cure).
* :class:`FileJournals` (``files``, over ``fragments`` and ``filefmt``): fragment files, no server.
* :class:`RedisJournals` (``streams``): one Redis stream per journal, native consumer groups, retention.
* :func:`open_store` (``urls``): a store from a picklable URL. ``frames``: a byte range as raw frames.
* :class:`AsyncPublisher` (``publishing``): futures per message, batched appends, a write barrier,
  transient retries.

The at-least-once runtime over these stores (channels, typed messages, dispatch, worker pools) is
:mod:`zcluster.channels`. Names load lazily: importing this package imports no Redis client (only
:class:`RedisJournals` and :func:`open_store` need one), and never PySpark.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from zcluster import _lazy

if TYPE_CHECKING:
    from zcluster.journal.files import FileJournals, RecoveryReport
    from zcluster.journal.publishing import AsyncPublisher
    from zcluster.journal.store import JournalInfo, JournalStore
    from zcluster.journal.streams import ClaimResult, RedisJournals, StreamEntry
    from zcluster.journal.urls import open_store

_WHERE = {
    "AsyncPublisher": "zcluster.journal.publishing",
    "ClaimResult": "zcluster.journal.streams",
    "FileJournals": "zcluster.journal.files",
    "JournalInfo": "zcluster.journal.store",
    "JournalStore": "zcluster.journal.store",
    "RecoveryReport": "zcluster.journal.files",
    "RedisJournals": "zcluster.journal.streams",
    "StreamEntry": "zcluster.journal.streams",
    "open_store": "zcluster.journal.urls",
}

__all__ = [
    "AsyncPublisher",
    "ClaimResult",
    "FileJournals",
    "JournalInfo",
    "JournalStore",
    "RecoveryReport",
    "RedisJournals",
    "StreamEntry",
    "open_store",
]

__getattr__, __dir__ = _lazy.exports(__name__, _WHERE, __all__)
