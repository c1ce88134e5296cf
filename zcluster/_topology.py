"""Which Redis server owns a key: standalone shards (client-side routing) or a native Redis Cluster.

Both topologies route by the hash slot of the key's Redis keys (see :mod:`zcluster._keys`), except roshi's
routing, which hashes the logical key with murmur3 for compatibility with existing roshi deployments.
:class:`Topology` is the protocol the cluster and the transport see; the two classes implement it.

Why this module is long: the Redis Cluster's slot map is most of it (reloads from any known node, rate
limits, successors of failed masters, seed nodes), and both topologies are kept side by side so that the
one protocol they share reads in one place; following a changing cluster is :mod:`zcluster._follow`.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol
from urllib.parse import urlsplit

import mmh3
import redis

from zcluster._keys import SLOTS
from zcluster._urls import client_from_url, safe_name, with_host
from zcluster.errors import ConfigError, ShardError
from zcluster.types import ShardFailure

Routing = Literal["jump", "roshi"]

FAILOVER_TIMEOUT = 20.0
"""Seconds a call keeps following a Redis Cluster node that cannot be reached (default): Redis's own
failover takes ``cluster-node-timeout`` (15 s by default) plus about a second for the election."""


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
    failover_timeout: float
    """Seconds a call keeps waiting for an unreachable node's slots to move elsewhere (0: none)."""
    generation: int
    """Changes whenever the key -> server map is reloaded."""

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
        """Reload the key -> server map now."""
        ...

    def moved(self, slot: int, host: str, port: int) -> Shard:
        """The shard a MOVED names, now the owner of ``slot``; the whole map is reloaded soon."""
        ...

    def route(self, shard: Shard) -> Shard:
        """The shard that serves what ``shard`` served: itself, unless the map moved every slot it had."""
        ...

    def unreachable(self, shard: Shard, seen: int) -> Shard | None:
        """``shard`` refused a connection or timed out (the map was at generation ``seen``): drop its idle
        connections and reload the map (rate-limited). Returns the shard now serving its slots, ``shard``
        itself while they have not moved yet, or None when nothing can take them over."""
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
    failover_timeout = 0.0
    generation = 0

    def __init__(self, urls: Sequence[str], routing: Routing = "jump", **options: Any) -> None:
        if not urls:
            raise ConfigError("at least one shard URL is needed")
        if routing not in ("jump", "roshi"):
            raise ConfigError(f"unknown routing {routing!r}: use 'jump' or 'roshi'")
        self.routing = routing
        self.urls, self.options = list(urls), options  # what a client following a migration reconnects with
        places: dict[tuple[str, str], int] = {}
        for i, url in enumerate(urls):  # one server twice would hold two places' keys: refused before connecting
            where = (safe_name(url), urlsplit(url).path.strip("/") or "0")
            if where in places:
                raise ConfigError(
                    f"shard {where[0]} (db {where[1]}) is listed twice, at places {places[where]} and {i}: "
                    "list each shard once"
                )
            places[where] = i
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

    def moved(self, slot: int, host: str, port: int) -> Shard:
        return self.redirect(host, port)

    def route(self, shard: Shard) -> Shard:
        return shard

    def unreachable(self, shard: Shard, seen: int) -> Shard | None:
        """A standalone shard's keys live nowhere else: the failure is reported at once."""
        return None

    def close(self) -> None:
        for s in self.shards:
            s.client.close()


class ClusterTopology:
    """A native Redis Cluster, routed by zcluster itself from ``CLUSTER SLOTS``.

    Script calls carry keys of one hash slot only (Redis Cluster refuses cross-slot calls). MOVED
    updates that slot's owner and asks for a reload of the whole map; ASK sends ``ASKING`` and the
    command to the importing node.

    The map follows failovers, resharding and replaced nodes (:mod:`zcluster._follow` drives it): a node
    that refuses connections or times out is :meth:`unreachable`, which drops its idle connections and
    reloads the map from a node still reachable (masters first, then replicas, then the seed; nodes that
    failed recently last). Reloads are rate-limited, so a dead node never causes a storm: at most one is
    in flight (a caller arriving meanwhile waits for it and uses its map), and after a failure-driven
    reload the next waits at least ``REFRESH_MIN`` seconds, doubling up to ``REFRESH_MAX`` while the map
    does not change. ``refreshes`` counts the ``CLUSTER SLOTS`` calls made.
    """

    single_slot_calls = True
    connect_hook: Callable[[redis.Redis], None] | None = None
    """Applied to every client made from now on (the layout guard's, see :mod:`zcluster._guard`)."""
    REFRESH_MIN = 0.1
    REFRESH_MAX = 1.0
    SUSPECT_FOR = 60.0

    def __init__(
        self, url: str, failover_timeout: float = FAILOVER_TIMEOUT, seeds: Sequence[str] = (), **options: Any
    ) -> None:
        self.failover_timeout = checked_failover_timeout(failover_timeout)
        self._options = options
        self._seed_url = url
        # Other nodes ("host:port") asked for the map after the seed: a process started while the seed is
        # down (a Spark executor's new worker during a failover) still finds the cluster.
        self._seeds = [safe_name(with_host(url, *_host_port(name))) for name in seeds]
        self._lock = threading.Lock()  # shards, _index, _probes
        self._refresh_lock = threading.Lock()  # one reload in flight
        self.shards: list[Shard] = []
        self._index: dict[str, int] = {}
        self._slots: list[int] = [-1] * SLOTS
        self._owned: dict[int, list[tuple[int, int]]] = {}  # slot ranges of each shard when it last had any
        self._successor: dict[str, int] = {}  # a shard that lost every slot -> the shard holding most of them
        self._replicas: dict[int, list[str]] = {}  # per shard, the replicas the last map listed
        self._probes: dict[str, redis.Redis] = {}  # clients of replicas and the seed, for reloads only
        self._suspects: dict[str, float] = {}  # node name -> when it last failed: asked last
        self._ids: dict[int, str] = {}  # per shard, its node id
        self._standby: dict[int, int] = {}  # per failed master, replicas that could take over (when checked)
        self._stale = False
        self._last = -math.inf  # when the last reload ended (monotonic)
        self._interval = self.REFRESH_MIN
        self.generation = 0  # reloads that got a map
        self.refreshes = 0  # CLUSTER SLOTS calls made
        self.refresh()

    def _shard_for(self, host: str, port: int) -> int:
        name = f"{host}:{port}"
        with self._lock:
            idx = self._index.get(name)
            if idx is None:
                client = client_from_url(with_host(self._seed_url, host, port), **self._options)
                if self.connect_hook is not None:
                    self.connect_hook(client)
                self.shards.append(Shard(name, client))
                idx = self._index[name] = len(self.shards) - 1
            return idx

    def _probe(self, name: str) -> redis.Redis:
        with self._lock:
            idx = self._index.get(name)
            if idx is not None:
                return self.shards[idx].client
            client = self._probes.get(name)
            if client is None:
                if name == safe_name(self._seed_url):
                    client = client_from_url(self._seed_url, **self._options)
                else:
                    host, _, port = name.rpartition(":")
                    client = client_from_url(with_host(self._seed_url, host, int(port)), **self._options)
                self._probes[name] = client
            return client

    def _candidates(self) -> list[str]:
        """Nodes to ask for the map, in order: masters, their replicas, other known nodes, the seed;
        nodes that failed recently last (oldest failure first)."""
        owners = sorted({i for i in self._slots if i >= 0})
        names = [self.shards[i].name for i in owners]
        names += [r for i in owners for r in self._replicas.get(i, ())]
        names += [s.name for s in self.shards] + [safe_name(self._seed_url), *self._seeds]
        unique = list(dict.fromkeys(names))
        return sorted(unique, key=lambda n: (self._suspected(n), self._suspects.get(n, 0.0)))

    def nodes(self) -> list[str]:
        """Every node the last map listed ("host:port"): masters, then their replicas."""
        with self._lock:
            owners = sorted({i for i in self._slots if i >= 0})
            names = [self.shards[i].name for i in owners] + [r for i in owners for r in self._replicas.get(i, ())]
        return list(dict.fromkeys(names))

    def _suspected(self, name: str) -> bool:
        """Whether node ``name`` failed in the last ``SUSPECT_FOR`` seconds."""
        failed = self._suspects.get(name)
        return failed is not None and time.monotonic() - failed < self.SUSPECT_FOR

    def refresh(self) -> None:
        """Reload the slot map now from the first node that answers; raises :class:`ShardError` if none does."""
        with self._refresh_lock:
            self._reload()

    def refresh_soon(self, seen: int | None = None) -> None:
        """Reload the map unless one ended since generation ``seen``, or less than the current interval
        ago (the rate limit; the map then stays marked stale). A caller arriving while a reload runs waits
        for it. Raises :class:`ShardError` when no node answered."""
        with self._refresh_lock:
            if seen is not None and seen != self.generation:
                return
            since = time.monotonic() - self._last
            if since > 10 * self.REFRESH_MAX:  # quiet for a while: the next trouble starts fast again
                self._interval = self.REFRESH_MIN
            if since < self._interval:
                return
            self._reload()

    def _reload(self) -> None:
        failures: list[ShardFailure] = []
        for name in self._candidates():
            self.refreshes += 1
            try:
                ranges = self._probe(name).execute_command("CLUSTER", "SLOTS")
            except (redis.RedisError, OSError) as exc:
                failures.append(ShardFailure(name, exc, ()))
                self._suspects[name] = time.monotonic()
                continue
            self._suspects.pop(name, None)
            self._install(ranges)
            self._count_standbys(name)
            return
        self._last = time.monotonic()
        self._interval = min(self._interval * 2, self.REFRESH_MAX)
        detail = "; ".join(f"{f.shard} ({type(f.error).__name__}: {f.error})" for f in failures)
        raise ShardError(f"no Redis Cluster node answered CLUSTER SLOTS: {detail}", failures)

    def _count_standbys(self, name: str) -> None:
        """For each master that failed recently and still owns slots: how many nodes (not failed) could
        take over, from ``CLUSTER NODES`` of node ``name`` (``CLUSTER SLOTS`` leaves out replicas that have
        not reported a replication offset yet): its replicas, and any other master already serving one of its
        slots. That node may have learned of a promotion between our ``CLUSTER SLOTS`` and this call: the
        promoted replica is then a master, no longer the dead one's replica, and counting replicas alone
        took the failover under way for one that cannot come (seen under load). Unknown when that fails."""
        owners = {i for i in self._slots if i >= 0}
        dead = {i: self._ids[i] for i in owners if self._suspected(self.shards[i].name) and i in self._ids}
        if not dead:
            return
        try:
            text = self._probe(name).execute_command("CLUSTER", "NODES")
        except (redis.RedisError, OSError):
            return
        rows = [r for r in (line.split() for line in _text(text).splitlines()) if len(r) > 7]
        for idx, node_id in dead.items():
            slot = self._slots.index(idx)
            alive = [
                r
                for r in rows
                if "fail" not in r[2].split(",")
                and (r[3] == node_id or (r[0] != node_id and "master" in r[2].split(",") and _serves(r[8:], slot)))
            ]
            self._standby[idx] = len(alive)

    def _install(self, ranges: Any) -> None:
        table = [-1] * SLOTS
        owned: dict[int, list[tuple[int, int]]] = {}
        replicas: dict[int, list[str]] = {}
        for row in ranges:
            start, end, master = int(row[0]), int(row[1]), row[2]
            idx = self._shard_for(_host(master[0]), int(master[1]))
            if len(master) > 2:
                self._ids[idx] = _text(master[2])
            table[start : end + 1] = [idx] * (end - start + 1)
            owned.setdefault(idx, []).append((start, end))
            replicas.setdefault(idx, []).extend(f"{_host(r[0])}:{int(r[1])}" for r in row[3:])
        changed = table != self._slots
        self._owned.update(owned)
        successor: dict[str, int] = {}
        for idx, spans in self._owned.items():
            if idx not in owned:  # lost every slot (failed over, resharded away): who holds most of them now
                counts = Counter(table[s] for start, end in spans for s in range(start, end + 1))
                counts.pop(-1, None)
                if counts:
                    successor[self.shards[idx].name] = counts.most_common(1)[0][0]
        self._slots, self._successor, self._replicas = table, successor, replicas
        self._stale = False
        self.generation += 1
        self._last = time.monotonic()
        self._interval = self.REFRESH_MIN if changed else min(self._interval * 2, self.REFRESH_MAX)

    def shard_of(self, key: bytes, slot: int) -> int:
        idx = self._slots[slot]
        if idx < 0:
            raise ShardError(f"hash slot {slot} is not served by any node of the Redis Cluster", [])
        return idx

    def masters(self) -> list[Shard]:
        if self._stale:
            with contextlib.suppress(ShardError):
                self.refresh_soon()
        owners = sorted({i for i in self._slots if i >= 0})
        return [self.shards[i] for i in owners]

    def slots_by_master(self) -> dict[str, list[int]]:
        """Each master's hash slots in the slot map now ("host:port" -> slots, ascending); slots no node
        serves are left out. The map as last loaded or corrected by redirects: not asked of the nodes."""
        out: dict[str, list[int]] = {}
        for slot, idx in enumerate(self._slots):
            if idx >= 0:
                out.setdefault(self.shards[idx].name, []).append(slot)
        return out

    def redirect(self, host: str, port: int) -> Shard:
        return self.shards[self._shard_for(host, port)]

    def moved(self, slot: int, host: str, port: int) -> Shard:
        idx = self._shard_for(host, port)
        self._slots[slot] = idx
        self._stale = True
        with contextlib.suppress(ShardError):
            self.refresh_soon()
        if self._slots[slot] != idx:  # the node asked had not heard of the move yet: this MOVED is newer
            self._slots[slot] = idx
            self._stale = True  # reloaded again once the rate limit allows
        return self.shards[idx]

    def route(self, shard: Shard) -> Shard:
        idx = self._successor.get(shard.name)
        return shard if idx is None else self.shards[idx]

    def unreachable(self, shard: Shard, seen: int) -> Shard | None:
        self._suspects[shard.name] = time.monotonic()
        self._stale = True
        shard.client.connection_pool.disconnect(inuse_connections=False)
        with contextlib.suppress(ShardError):  # no node answered: keep the map, try again later
            self.refresh_soon(seen)
        successor = self.route(shard)
        if successor is not shard:
            return successor
        if self._standby.get(self._index.get(shard.name, -1)) == 0:
            return None  # it still owns its slots and no replica could take them over
        return shard

    def close(self) -> None:
        for s in self.shards:
            s.client.close()
        for client in self._probes.values():
            client.close()


def checked_failover_timeout(value: Any) -> float:
    """``value`` as a ``failover_timeout`` (seconds, 0 <= value < 10**6); a :class:`ConfigError` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"failover_timeout must be a number of seconds, got {value!r}")
    if not 0 <= value < 1e6:
        raise ConfigError(f"failover_timeout must be >= 0 seconds (and below 10**6), got {value!r}")
    return float(value)


def _serves(spans: list[str], slot: int) -> bool:
    """Whether ``CLUSTER NODES`` slot fields ``spans`` (``5``, ``0-5460``; ``[...]`` migrations left out)
    include ``slot``."""
    for span in spans:
        if not span.startswith("["):
            lo, _, hi = span.partition("-")
            if int(lo) <= slot <= int(hi or lo):
                return True
    return False


def _text(raw: Any) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)


def _host(raw: Any) -> str:
    return _text(raw) or "127.0.0.1"


def _host_port(name: str) -> tuple[str, int]:
    """``host:port`` split; a :class:`ConfigError` naming it otherwise."""
    host, _, port = name.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(f"a seed node must be 'host:port', got {name!r}")
    return host, int(port)
