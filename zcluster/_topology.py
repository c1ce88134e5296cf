"""Which Redis server owns a key: standalone shards (client-side routing) or a native Redis Cluster.

Both topologies route by the hash slot of the key's Redis keys (see :mod:`zcluster._keys`), except roshi's
routing, which hashes the logical key with murmur3 for compatibility with existing roshi deployments.
:class:`Topology` is the protocol the cluster and the transport see; the two classes implement it.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import mmh3
import redis

from zcluster._keys import SLOTS
from zcluster._urls import client_from_url, safe_name, with_host
from zcluster.errors import ConfigError, ShardError
from zcluster.types import ShardFailure

Routing = Literal["jump", "roshi"]


@dataclass(frozen=True)
class Shard:
    """One Redis server. ``name`` is ``host:port``: safe to log, never holds credentials."""

    name: str
    client: redis.Redis


def jump_hash(key: int, buckets: int) -> int:
    """Lamping and Veach's jump consistent hash: growing ``buckets`` by one moves 1/(n+1) of the keys."""
    b, j = -1, 0
    while j < buckets:
        b = j
        key = (key * 2862933555777941757 + 1) & 0xFFFFFFFFFFFFFFFF
        j = int((b + 1) * (float(1 << 31) / float((key >> 33) + 1)))
    return b


def murmur3(data: bytes) -> int:
    """32-bit murmur3 with seed 0, unsigned: roshi's shard hash (``murmur3(b"hello") == 0x248BFA47``)."""
    return int(mmh3.hash(data, 0, signed=False))


class Topology(Protocol):
    """Where each key lives, and a client per server.

    ``shards`` grows only (a Redis Cluster adds nodes it is redirected to); indices into it are stable.
    ``single_slot_calls`` is True where one script call may only carry keys of one hash slot (a Redis
    Cluster), so calls are packed per slot rather than per shard.
    """

    shards: list[Shard]
    single_slot_calls: bool

    def shard_of(self, key: bytes, slot: int) -> int:
        """Index in ``shards`` of the server owning logical ``key`` (whose hash slot is ``slot``)."""
        ...

    def masters(self) -> list[Shard]:
        """The servers that hold data (each once), for scans and stats."""
        ...

    def redirect(self, host: str, port: int) -> Shard:
        """The shard a MOVED/ASK redirect names; standalone shards raise :class:`ConfigError`."""
        ...

    def refresh(self) -> None:
        """Reload the key -> server map (after MOVED)."""
        ...

    def close(self) -> None:
        """Close every client."""
        ...


class StandaloneTopology:
    """Independent Redis servers; the client picks the shard.

    ``routing="jump"`` (default) maps the key's hash slot to a shard with jump consistent hashing, so
    adding a shard at the end moves about 1/n of the keys. ``routing="roshi"`` is roshi's
    ``murmur3(key) % n`` over the logical key (without prefix), for reading data roshi wrote.
    """

    single_slot_calls = False

    def __init__(self, urls: Sequence[str], routing: Routing = "jump", **options: Any) -> None:
        if not urls:
            raise ConfigError("at least one shard URL is needed")
        if routing not in ("jump", "roshi"):
            raise ConfigError(f"unknown routing {routing!r}: use 'jump' or 'roshi'")
        self.routing = routing
        self.shards = [Shard(safe_name(u), client_from_url(u, **options)) for u in urls]
        n = len(self.shards)
        self._table = [jump_hash(slot, n) for slot in range(SLOTS)]

    def shard_of(self, key: bytes, slot: int) -> int:
        if self.routing == "roshi":
            return murmur3(key) % len(self.shards)
        return self._table[slot]

    def masters(self) -> list[Shard]:
        return list(self.shards)

    def redirect(self, host: str, port: int) -> Shard:
        raise ConfigError(f"standalone shard answered with a cluster redirect to {host}:{port}")

    def refresh(self) -> None:
        """Standalone shards have a fixed layout: nothing to refresh."""

    def close(self) -> None:
        for s in self.shards:
            s.client.close()


class ClusterTopology:
    """A native Redis Cluster, routed by zcluster itself from ``CLUSTER SLOTS``.

    Script calls carry keys of one hash slot only (Redis Cluster refuses cross-slot calls). MOVED makes
    the caller refresh the slot map and resend; ASK sends ``ASKING`` and the command to the importing node.
    """

    single_slot_calls = True

    def __init__(self, url: str, **options: Any) -> None:
        self._options = options
        self._seed_url = url
        self._lock = threading.Lock()
        self.shards: list[Shard] = []
        self._index: dict[str, int] = {}
        self._slots: list[int] = [-1] * SLOTS
        self.refresh()

    def _shard_for(self, host: str, port: int) -> int:
        name = f"{host}:{port}"
        idx = self._index.get(name)
        if idx is None:
            self.shards.append(Shard(name, client_from_url(with_host(self._seed_url, host, port), **self._options)))
            idx = self._index[name] = len(self.shards) - 1
        return idx

    def refresh(self) -> None:
        """Reload the slot map from the first node that answers; raises if none does."""
        with self._lock:
            candidates = self.shards or [
                Shard(safe_name(self._seed_url), client_from_url(self._seed_url, **self._options))
            ]
            failures: list[ShardFailure] = []
            for shard in candidates:
                try:
                    ranges = shard.client.execute_command("CLUSTER", "SLOTS")
                except (redis.RedisError, OSError) as exc:
                    failures.append(ShardFailure(shard.name, exc, ()))
                    continue
                table = [-1] * SLOTS
                for row in ranges:
                    start, end, master = int(row[0]), int(row[1]), row[2]
                    host = master[0].decode() if isinstance(master[0], bytes) else str(master[0])
                    idx = self._shard_for(host or "127.0.0.1", int(master[1]))
                    table[start : end + 1] = [idx] * (end - start + 1)
                self._slots = table
                return
            detail = "; ".join(f"{f.shard} ({type(f.error).__name__}: {f.error})" for f in failures)
            raise ShardError(f"no Redis Cluster node answered CLUSTER SLOTS: {detail}", failures)

    def shard_of(self, key: bytes, slot: int) -> int:
        idx = self._slots[slot]
        if idx < 0:
            raise ShardError(f"hash slot {slot} is not served by any node of the Redis Cluster", [])
        return idx

    def masters(self) -> list[Shard]:
        owners = sorted({i for i in self._slots if i >= 0})
        return [self.shards[i] for i in owners]

    def redirect(self, host: str, port: int) -> Shard:
        with self._lock:
            return self.shards[self._shard_for(host, port)]

    def close(self) -> None:
        for s in self.shards:
            s.client.close()
