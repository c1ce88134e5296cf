"""Helpers of the farm tests: farms over real servers, a Python model of the 2P-set, replica snapshots."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from typing import Any

from zcluster import Cluster, Delete, Insert, KeyScoreMember
from zcluster.farm import Farm
from zcluster.instrumentation import OpEvent
from zcluster.types import Write, to_bytes

Record = tuple[str, bool, float]  # member, inserted, score
FAST = {"socket_connect_timeout": 0.5, "socket_timeout": 5.0}


def farm_of(replicas: Sequence[str | Sequence[str]], prefix: str = "zc:", **options: Any) -> Farm:
    """A farm of one cluster per element of ``replicas`` (a URL, or a list of shard URLs)."""
    clusters = [
        Cluster.from_urls([r] if isinstance(r, str) else list(r), prefix=prefix, connection=FAST) for r in replicas
    ]
    return Farm(clusters, **options)


def put(cluster: Cluster, writes: Iterable[Write]) -> None:
    """Apply ``writes`` on one replica only, behind the farm's back."""
    cluster.apply(list(writes))


def held(cluster: Cluster, keys: Sequence[str]) -> dict[str, set[Record]]:
    """What one replica holds for ``keys``: every record (members and tombstones)."""
    got = cluster.records(keys)
    return {k: {(str(w.member), isinstance(w, Insert), w.score) for w in got[k]} for k in keys}


def all_keys(cluster: Cluster) -> list[str]:
    """Every logical key one replica holds, tombstone-only keys included."""
    return sorted({str(k) for batch in cluster.keys(include_removed=True) for k in batch})


class Model:
    """The 2P-set of one logical store: per (key, member) the highest score wins, a delete wins ties."""

    def __init__(self) -> None:
        self.records: dict[str, dict[str, tuple[bool, float]]] = {}

    def apply(self, write: Write) -> None:
        inserted = isinstance(write, Insert)
        members = self.records.setdefault(str(write.key), {})
        held = members.get(str(write.member))
        rank = (write.score, not inserted)
        if held is None or rank > (held[1], not held[0]):
            members[str(write.member)] = (inserted, write.score)

    def held(self, key: str) -> set[Record]:
        return {(m, ins, s) for m, (ins, s) in self.records.get(key, {}).items()}

    def visible(self, key: str) -> list[tuple[str, float]]:
        """Select order: score descending, then member bytes descending."""
        out = [(m, s) for m, (ins, s) in self.records.get(key, {}).items() if ins]
        out.sort(key=lambda e: (e[1], to_bytes(e[0])), reverse=True)
        return out


def pairs(entries: Iterable[KeyScoreMember]) -> list[tuple[str, float]]:
    return [(str(e.member), e.score) for e in entries]


def writes_of(key: str, spec: dict[str, tuple[bool, float]]) -> list[Write]:
    """Writes that leave exactly ``spec`` (member -> (inserted, score)) on an empty replica."""
    return [Insert(key, s, m) if ins else Delete(key, s, m) for m, (ins, s) in spec.items()]


class Events:
    """Instrumentation that keeps every event (thread-safe: repairs report from background threads)."""

    def __init__(self) -> None:
        self.events: list[OpEvent] = []
        self._lock = threading.Lock()

    def __call__(self, event: OpEvent) -> None:
        with self._lock:
            self.events.append(event)

    def named(self, op: str) -> list[OpEvent]:
        with self._lock:
            return [e for e in self.events if e.op == op]

    def total(self, op: str, field: str = "records") -> int:
        return sum(int(getattr(e, field)) for e in self.named(op))
