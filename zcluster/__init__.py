"""zcluster: CRDT sorted sets (a last-writer-wins 2P-set) across Redis servers, with exactly-once messages.

The public surface is flat: everything a user of the store needs is a name of this package (below).
Layers with their own audience are subpackages: :mod:`zcluster.message` (Gazette-compatible message
semantics), :mod:`zcluster.journal` (journal storage), :mod:`zcluster.channels` (an at-least-once
runtime), :mod:`zcluster.state` (checkpoints, dedup, the exactly-once applier), :mod:`zcluster.spark`
(the ``spark`` extra), :mod:`zcluster.testing` (local servers for tests). Modules whose names start with
``_`` are internals.

Names load lazily: ``import zcluster`` imports no Redis client until a name that needs one is used, and
never PySpark, click, rich or prometheus-client (optional extras).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from zcluster import _lazy, _native

_native.install()  # under ZCLUSTER_PURE, before any compiled module can load

if TYPE_CHECKING:
    from zcluster.cluster import Cluster
    from zcluster.config import ClusterConfig, connect
    from zcluster.errors import (
        ConfigError,
        DurabilityError,
        FencedError,
        InconsistentDataError,
        InvalidTupleError,
        JournalMismatchError,
        KeyKindError,
        LayoutMismatchError,
        LayoutMovedError,
        MapperError,
        MigrationError,
        MigrationFencedError,
        NoHandlerError,
        NotUtf8Error,
        PartialReadError,
        PartialScanError,
        PartialWriteError,
        PollError,
        QuorumError,
        RedirectLoopError,
        ReplicaBusy,
        ReplicaLate,
        ServerNotFound,
        ShardError,
        TlsUnsupported,
        UndecodableMessageError,
        UnknownKindError,
        WriteRefusedError,
        ZClusterError,
    )
    from zcluster.instrumentation import Instrumentation, OpEvent
    from zcluster.types import (
        Blob,
        Count,
        Cursor,
        Delete,
        Durability,
        Fence,
        Incr,
        Increment,
        Insert,
        KeyMember,
        KeyScoreMember,
        Presence,
        Publish,
        ReadResult,
        ShardFailure,
        ShardStats,
        Store,
        Write,
        WriteResult,
    )

_WHERE = {
    "Cluster": "zcluster.cluster",
    "ClusterConfig": "zcluster.config",
    "connect": "zcluster.config",
    **dict.fromkeys(["Instrumentation", "OpEvent"], "zcluster.instrumentation"),
    **dict.fromkeys(
        [
            "ConfigError",
            "DurabilityError",
            "InconsistentDataError",
            "KeyKindError",
            "InvalidTupleError",
            "FencedError",
            "JournalMismatchError",
            "LayoutMismatchError",
            "LayoutMovedError",
            "LayoutMovedError",
            "MapperError",
            "MigrationError",
            "MigrationFencedError",
            "NotUtf8Error",
            "NoHandlerError",
            "PartialReadError",
            "PartialScanError",
            "PartialWriteError",
            "PollError",
            "QuorumError",
            "RedirectLoopError",
            "ReplicaBusy",
            "ReplicaLate",
            "ServerNotFound",
            "ShardError",
            "TlsUnsupported",
            "UndecodableMessageError",
            "UnknownKindError",
            "WriteRefusedError",
            "ZClusterError",
        ],
        "zcluster.errors",
    ),
    **dict.fromkeys(
        [
            "Blob",
            "Count",
            "Cursor",
            "Delete",
            "Durability",
            "Fence",
            "Incr",
            "Increment",
            "Insert",
            "KeyMember",
            "KeyScoreMember",
            "Presence",
            "Publish",
            "ReadResult",
            "ShardFailure",
            "ShardStats",
            "Store",
            "Write",
            "WriteResult",
        ],
        "zcluster.types",
    ),
}

__all__ = [
    "Blob",
    "Cluster",
    "ClusterConfig",
    "ConfigError",
    "Count",
    "Cursor",
    "Delete",
    "Durability",
    "DurabilityError",
    "Fence",
    "FencedError",
    "InconsistentDataError",
    "Incr",
    "Increment",
    "Insert",
    "Instrumentation",
    "InvalidTupleError",
    "JournalMismatchError",
    "KeyKindError",
    "KeyMember",
    "KeyScoreMember",
    "LayoutMismatchError",
    "LayoutMovedError",
    "MapperError",
    "MigrationError",
    "MigrationFencedError",
    "NoHandlerError",
    "NotUtf8Error",
    "OpEvent",
    "PartialReadError",
    "PartialScanError",
    "PartialWriteError",
    "PollError",
    "Presence",
    "Publish",
    "QuorumError",
    "ReadResult",
    "RedirectLoopError",
    "ReplicaBusy",
    "ReplicaLate",
    "ServerNotFound",
    "ShardError",
    "ShardFailure",
    "ShardStats",
    "Store",
    "TlsUnsupported",
    "UndecodableMessageError",
    "UnknownKindError",
    "Write",
    "WriteRefusedError",
    "WriteResult",
    "ZClusterError",
    "connect",
]
__version__ = "0.1.0"

__getattr__, __dir__ = _lazy.exports(__name__, _WHERE, __all__)
