"""zcluster: CRDT sorted sets (a last-writer-wins 2P-set) across Redis servers, with exactly-once messages.

The package root imports no optional dependency (PySpark, prometheus-client are extras).
"""

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
