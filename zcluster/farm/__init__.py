"""Replicas that heal themselves: a farm of independent clusters (roshi's ``farm``).

A :class:`Farm` has the :class:`zcluster.Cluster` API over several clusters holding the same sets:
writes go to all of them and are confirmed at a quorum, reads follow a strategy and merge by the 2P-set
rules, differences are repaired, and a :class:`Walker` sweeps the keyspace to repair what reads never
touch. ``docs/architecture.md`` (Replicas) has the guarantees.

Every public name is imported from here (``from zcluster.farm import Farm, SendAllReadAll, RepairAll``):
the read strategies (``ReadStrategy`` is any of them), the repair strategies (``RepairStrategy``) and
their counts, and what :meth:`Farm.diff` returns (``KeyDiff``, ``Merged``). The modules whose names start
with ``_`` are the farm's implementation.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from zcluster import _lazy

if TYPE_CHECKING:
    from zcluster.farm._merge import KeyDiff, Merged
    from zcluster.farm._quorum import FarmWriteResult, parse_quorum
    from zcluster.farm._repair import (
        NonBlockingRepair,
        NoRepair,
        RateLimitedRepair,
        RepairAll,
        RepairCounts,
        RepairStrategy,
    )
    from zcluster.farm._replicas import LateCounts
    from zcluster.farm.config import FarmConfig
    from zcluster.farm.farm import Farm
    from zcluster.farm.reads import (
        ReadStrategy,
        SendAllReadAll,
        SendAllReadFirstLinger,
        SendOneReadOne,
        SendVarReadFirstLinger,
    )
    from zcluster.farm.walker import Walker, WalkReport

_WHERE = {
    **dict.fromkeys(["KeyDiff", "Merged"], "zcluster.farm._merge"),
    "LateCounts": "zcluster.farm._replicas",
    "FarmConfig": "zcluster.farm.config",
    "Farm": "zcluster.farm.farm",
    **dict.fromkeys(["FarmWriteResult", "parse_quorum"], "zcluster.farm._quorum"),
    **dict.fromkeys(
        ["ReadStrategy", "SendAllReadAll", "SendAllReadFirstLinger", "SendOneReadOne", "SendVarReadFirstLinger"],
        "zcluster.farm.reads",
    ),
    **dict.fromkeys(
        ["NonBlockingRepair", "NoRepair", "RateLimitedRepair", "RepairAll", "RepairCounts", "RepairStrategy"],
        "zcluster.farm._repair",
    ),
    **dict.fromkeys(["Walker", "WalkReport"], "zcluster.farm.walker"),
}

__all__ = [
    "Farm",
    "FarmConfig",
    "FarmWriteResult",
    "KeyDiff",
    "LateCounts",
    "Merged",
    "NoRepair",
    "NonBlockingRepair",
    "RateLimitedRepair",
    "ReadStrategy",
    "RepairAll",
    "RepairCounts",
    "RepairStrategy",
    "SendAllReadAll",
    "SendAllReadFirstLinger",
    "SendOneReadOne",
    "SendVarReadFirstLinger",
    "WalkReport",
    "Walker",
    "parse_quorum",
]

__getattr__, __dir__ = _lazy.exports(__name__, _WHERE, __all__)
