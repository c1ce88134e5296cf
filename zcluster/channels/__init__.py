"""Channels: an at-least-once message runtime over journal stores (:mod:`zcluster.journal`).

* :class:`Channels` (``channels``): Milvus-style channel operations: create/destroy/describe, produce and
  broadcast (validated, UUID-stamped by the message layer's Producer), consume/ack/nack/seek in groups,
  time-tick ``consume_until``.
* Typed messages (``typed``): :class:`KindRegistry`, :class:`TypedMessage`, :class:`TypedReader`.
* :class:`Dispatcher` (``dispatch``): commands and events routed to handlers, with a :class:`Context`.
* :class:`WorkerPool` (``workers``): threads consuming channels, nack/retry, dead letters, graceful
  shutdown.
* Errors: :class:`UndecodableMessageError` (:class:`UnknownKindError` below it) and
  :class:`NoHandlerError`, re-exported from :mod:`zcluster.errors` (the same classes as ``zcluster.*``).

Delivery is at least once, in channel order; read channels with the message layer's ReadCommittedIter
for exactly-once. Names load lazily; importing this package imports no Redis client (the store you pass
decides) and never PySpark.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from zcluster import _lazy

if TYPE_CHECKING:
    from zcluster.channels.channels import TOPIC_LABEL, ChannelInfo, Channels
    from zcluster.channels.dispatch import Context, Dispatcher, Handler
    from zcluster.channels.typed import (
        Category,
        Kind,
        KindRegistry,
        TypedMessage,
        TypedReader,
    )
    from zcluster.channels.workers import WorkerPool
    from zcluster.errors import NoHandlerError, UndecodableMessageError, UnknownKindError

_WHERE = {
    **dict.fromkeys(["TOPIC_LABEL", "ChannelInfo", "Channels"], "zcluster.channels.channels"),
    **dict.fromkeys(["Context", "Dispatcher", "Handler"], "zcluster.channels.dispatch"),
    # The channels' errors, re-exported: defined in zcluster.errors (the one error tree), also in zcluster.
    **dict.fromkeys(["NoHandlerError", "UndecodableMessageError", "UnknownKindError"], "zcluster.errors"),
    **dict.fromkeys(
        [
            "Category",
            "Kind",
            "KindRegistry",
            "TypedMessage",
            "TypedReader",
        ],
        "zcluster.channels.typed",
    ),
    "WorkerPool": "zcluster.channels.workers",
}

__all__ = [
    "TOPIC_LABEL",
    "Category",
    "ChannelInfo",
    "Channels",
    "Context",
    "Dispatcher",
    "Handler",
    "Kind",
    "KindRegistry",
    "NoHandlerError",
    "TypedMessage",
    "TypedReader",
    "UndecodableMessageError",
    "UnknownKindError",
    "WorkerPool",
]

__getattr__, __dir__ = _lazy.exports(__name__, _WHERE, __all__)
