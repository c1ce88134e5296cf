"""Replicas that heal themselves: a farm of independent clusters (roshi's ``farm``).

A :class:`Farm` has the :class:`zcluster.Cluster` API over several clusters holding the same sets:
writes go to all of them and are confirmed at a quorum, reads follow a strategy and merge by the 2P-set
rules, differences are repaired, and a :class:`Walker` sweeps the keyspace to repair what reads never
touch. ``docs/architecture.md`` (Replicas) has the guarantees.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from zcluster import _lazy

if TYPE_CHECKING:
    from zcluster.farm._replicas import LateCounts, ReplicaBusy, ReplicaLate
    from zcluster.farm.config import FarmConfig
    from zcluster.farm.farm import Farm, FarmWriteResult, QuorumError
    from zcluster.farm.quorum import parse_quorum
    from zcluster.farm.reads import (
        SendAllReadAll,
        SendAllReadFirstLinger,
        SendOneReadOne,
        SendVarReadFirstLinger,
    )
    from zcluster.farm.repair import NonBlockingRepair, NoRepair, RateLimitedRepair, RepairAll, RepairCounts
    from zcluster.farm.walker import Walker, WalkReport

_WHERE = {
    **dict.fromkeys(["LateCounts", "ReplicaBusy", "ReplicaLate"], "zcluster.farm._replicas"),
    "FarmConfig": "zcluster.farm.config",
    **dict.fromkeys(["Farm", "FarmWriteResult", "QuorumError"], "zcluster.farm.farm"),
    "parse_quorum": "zcluster.farm.quorum",
    **dict.fromkeys(
        ["SendAllReadAll", "SendAllReadFirstLinger", "SendOneReadOne", "SendVarReadFirstLinger"], "zcluster.farm.reads"
    ),
    **dict.fromkeys(
        ["NonBlockingRepair", "NoRepair", "RateLimitedRepair", "RepairAll", "RepairCounts"], "zcluster.farm.repair"
    ),
    **dict.fromkeys(["Walker", "WalkReport"], "zcluster.farm.walker"),
}

__all__ = [
    "Farm",
    "FarmConfig",
    "FarmWriteResult",
    "LateCounts",
    "NoRepair",
    "NonBlockingRepair",
    "QuorumError",
    "RateLimitedRepair",
    "RepairAll",
    "RepairCounts",
    "ReplicaBusy",
    "ReplicaLate",
    "SendAllReadAll",
    "SendAllReadFirstLinger",
    "SendOneReadOne",
    "SendVarReadFirstLinger",
    "WalkReport",
    "Walker",
    "parse_quorum",
]

__getattr__, __dir__ = _lazy.exports(__name__, _WHERE, __all__)
