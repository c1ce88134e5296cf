"""zcluster: CRDT sorted sets (a last-writer-wins 2P-set) across Redis servers, with exactly-once messages.

The names below load lazily, so ``import zcluster.message`` pulls in no Redis client, and the package
root imports no optional dependency (PySpark and prometheus-client are extras).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from zcluster.cluster import Cluster, ReadResult
    from zcluster.instrumentation import OpEvent
    from zcluster.types import (
        ConfigError,
        Cursor,
        InvalidTupleError,
        KeyMember,
        KeyScoreMember,
        PartialReadError,
        PartialWriteError,
        Presence,
        ShardFailure,
        WriteResult,
        ZClusterError,
    )

_WHERE = {
    "Cluster": "zcluster.cluster",
    "ReadResult": "zcluster.cluster",
    "OpEvent": "zcluster.instrumentation",
    **dict.fromkeys(
        [
            "ConfigError",
            "Cursor",
            "InvalidTupleError",
            "KeyMember",
            "KeyScoreMember",
            "PartialReadError",
            "PartialWriteError",
            "Presence",
            "ShardFailure",
            "WriteResult",
            "ZClusterError",
        ],
        "zcluster.types",
    ),
}

__all__ = [
    "Cluster",
    "ConfigError",
    "Cursor",
    "InvalidTupleError",
    "KeyMember",
    "KeyScoreMember",
    "OpEvent",
    "PartialReadError",
    "PartialWriteError",
    "Presence",
    "ReadResult",
    "ShardFailure",
    "WriteResult",
    "ZClusterError",
]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'zcluster' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
