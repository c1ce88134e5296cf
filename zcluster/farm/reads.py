"""Read strategies: which replicas a read asks, which answer it returns, and how it finds repairs.

The strategies are roshi's, with its flaws fixed: the merge has no bias toward adds (a member's winner
is decided with the tombstones of every replica that answered, see :mod:`zcluster.farm._merge`), and a
rate limit refills.
"""

from __future__ import annotations

from dataclasses import dataclass

from zcluster.errors import ConfigError


@dataclass(frozen=True)
class SendOneReadOne:
    """Ask one replica (round robin); keys it fails are asked of the next one. No merge, no repair."""


@dataclass(frozen=True)
class SendAllReadAll:
    """Ask every replica and answer with the merge of all answers; repair every difference found.

    ``select`` merges exactly: a member's winner is decided with every answering replica's record of it
    (a replica's tombstone is looked up when its window did not show the member), and windows are
    widened until the merged page is exact.
    """


@dataclass(frozen=True)
class SendAllReadFirstLinger:
    """Ask every replica, answer with the first complete answer; gather the rest in the background
    and repair the differences (the answer may be one replica's stale view)."""


@dataclass(frozen=True)
class SendVarReadFirstLinger:
    """Broadcast like :class:`SendAllReadFirstLinger` up to ``per_second`` reads per second (bursts of
    ``burst``); past that rate ask one replica, and broadcast to the others too when it has not answered
    within ``threshold`` seconds."""

    per_second: float = 100.0
    threshold: float = 0.05
    burst: float | None = None


ReadStrategy = SendOneReadOne | SendAllReadAll | SendAllReadFirstLinger | SendVarReadFirstLinger


def read_strategy(value: ReadStrategy | str) -> ReadStrategy:
    """A strategy from itself or its short name: ``"one"``, ``"all"``, ``"first-linger"``, ``"var"``."""
    if isinstance(value, SendOneReadOne | SendAllReadAll | SendAllReadFirstLinger | SendVarReadFirstLinger):
        if isinstance(value, SendVarReadFirstLinger) and not (value.per_second > 0 and value.threshold >= 0):
            raise ConfigError("SendVarReadFirstLinger needs per_second > 0 and threshold >= 0")
        return value
    named: dict[str, ReadStrategy] = {
        "one": SendOneReadOne(),
        "all": SendAllReadAll(),
        "first-linger": SendAllReadFirstLinger(),
        "var": SendVarReadFirstLinger(),
    }
    if isinstance(value, str) and value in named:
        return named[value]
    raise ConfigError(f"unknown read strategy {value!r}: use {', '.join(named)} or a strategy object")
