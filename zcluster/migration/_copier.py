"""The mover's two tools: a listener that learns which keys of a source shard changed (keyspace
notifications), and the copy of keys from a source shard to where the target layout routes them (DUMP on the
source, RESTORE REPLACE on the target; a key gone from the source is deleted on the target).

Why notifications: every write to the source, whoever sends it (a Cluster, a script, an operator's
redis-cli), publishes its key before its reply is sent, so a listener subscribed before the copy pass
learns of every change the pass may have missed; a PING on its connection answers after every
notification published before it (what the cut-over waits for). What it cannot do: tell what changed
while no listener was subscribed (a mover killed and resumed copies everything again), and survive its
connection being closed (the server's pubsub output buffer limit, a restart): then ``lost`` is set and
the mover copies everything again.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any

import redis
from redis.crc import key_slot

from zcluster._keys import glob_escape
from zcluster._markers import Peer
from zcluster._pipelines import streamed
from zcluster._topology import ClusterTopology, Shard, Topology
from zcluster._transport import Transport
from zcluster.errors import MigrationError
from zcluster.migration._fence import Fence

log = logging.getLogger("zcluster")

CHUNK = 512
"""Commands per chunk of a streamed pipeline, either way."""

GROUP = 64
"""Keys a fenced copy call carries to a standalone server."""

EVENTS = "KA"
"""Keyspace events (``K``) of every class (``A``: generic, string, list, set, hash, zset, stream, expired,
evicted) that the listener needs on: added to the server's ``notify-keyspace-events`` while it runs."""


def patterns(db: int, namespaces: Iterable[str]) -> list[bytes]:
    """The PSUBSCRIBE patterns of the keyspace channels of every key of ``namespaces`` in database ``db``."""
    return [f"__keyspace@{db}__:".encode() + glob_escape(b"{" + ns.encode()) + b"*" for ns in namespaces]


def db_of(shard: Shard) -> int:
    return int(shard.client.connection_pool.connection_kwargs.get("db", 0) or 0)


def settings(call: Callable[..., Any]) -> str:
    """A server's ``notify-keyspace-events`` (``call`` runs a command on it)."""
    value = call("CONFIG", "GET", "notify-keyspace-events")
    return str((value[1] if isinstance(value, list) else value.get(b"notify-keyspace-events", b"")).decode())


def notifying(value: str) -> bool:
    """Whether a ``notify-keyspace-events`` value publishes what a listener needs (see :data:`EVENTS`)."""
    return "K" in value and ("A" in value or all(c in value for c in "g$lshzxet"))


def restore(name: str, call: Callable[..., Any], before: str) -> None:
    """Put a server's ``notify-keyspace-events`` back to ``before`` (a failure is logged: nothing is lost)."""
    try:
        call("CONFIG", "SET", "notify-keyspace-events", before)
    except redis.RedisError as exc:
        log.warning("migration: %s: notify-keyspace-events not restored to %r: %s", name, before, exc)


class Listener:
    """Keyspace notifications of one source shard, collected as a set of keys (see the module).

    Read on a raw connection of its own (hiredis-parsed replies, no redis-py PubSub): a writer's every tuple
    is one notification, and PubSub's per-message work made the listener fall behind a busy writer, which
    the cut-over then waited for. It never reconnects by itself: a cut subscription sets ``lost``."""

    def __init__(self, shard: Shard, namespaces: Iterable[str]) -> None:
        self.shard = shard
        self._patterns = patterns(db_of(shard), namespaces)
        self._cut = len(f"__keyspace@{db_of(shard)}__:")
        self._lock = threading.Lock()
        self._keys: set[bytes] = set()
        self.lost = False  # set when the subscription dropped: changes may have been missed
        self._stop = threading.Event()
        self._ping = threading.Event()
        self._pong = threading.Event()
        self._peer = Peer(shard.client)
        conn = self._peer.conn
        conn.connect()
        conn.send_command("PSUBSCRIBE", *self._patterns)
        for _ in self._patterns:  # the confirmations: notifications flow from here
            conn.read_response(push_request=True)
        self._thread = threading.Thread(target=self._run, name=f"zcluster-listen-{shard.name}", daemon=True)
        self._thread.start()

    def take(self) -> set[bytes]:
        """The keys changed since the last take."""
        with self._lock:
            keys, self._keys = self._keys, set()
        return keys

    def ping(self) -> None:
        """Ask for a PING on the subscription: :meth:`drain` then waits for its answer."""
        self._pong.clear()
        self._ping.set()

    def drain(self, timeout: float = 30.0) -> None:
        """Return once every notification the server published before the last :meth:`ping` was collected (or
        the subscription was lost: ``lost`` says so)."""
        if not self._pong.wait(timeout):
            raise MigrationError(f"{self.shard.name}: the keyspace listener did not answer a PING in {timeout:.0f} s")

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._peer.close()

    def _run(self) -> None:
        conn, cut, lock = self._peer.conn, self._cut, self._lock
        try:
            while not self._stop.is_set():
                if self._ping.is_set():
                    self._ping.clear()
                    conn.send_command("PING")
                if not conn.can_read(timeout=0.005):  # a ping asked for waits at most this
                    continue
                reply = conn.read_response(push_request=True)  # RESP3 sends notifications as pushes
                if isinstance(reply, list) and reply[0] == b"pmessage":
                    with lock:
                        self._keys.add(reply[2][cut:])
                elif reply == b"PONG" or (isinstance(reply, list) and reply[0] == b"pong"):  # RESP3 / RESP2
                    self._pong.set()
        except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
            if not self._stop.is_set():
                log.warning("migration: %s: the keyspace listener lost its subscription (%s)", self.shard.name, exc)
                self.lost = True
                self._pong.set()  # a drain waiting on it learns of the loss


class Copier:
    """Copies keys from the source shards to the target layout (see the module). ``copied``, ``deleted``
    count the keys written and removed on the target.

    Both sides stream their pipelines (:func:`zcluster._pipelines.streamed`: the next chunk is sent before
    the last one's replies are read), and a key's hash slot is computed once: measured, a plain pipeline
    each way and three slot computations per key held the copy to about 40% of a hand-written MIGRATE."""

    def __init__(self, source: Topology, target: Transport, batch: int, fence: Fence) -> None:
        self.source, self.target, self.batch, self.fence = source, target, batch, fence
        self.copied = 0
        self.deleted = 0

    def owner(self, key: bytes) -> int:
        """The source shard whose key this is (under the source's routing)."""
        return self.source.shard_of(key, key_slot(key))

    def destination(self, key: bytes) -> int:
        """The index of the target shard the target layout routes ``key`` to."""
        return self.target.topology.shard_of(key, key_slot(key))

    def moving(self, i: int, keys: Iterable[bytes]) -> list[tuple[bytes, int]]:
        """Of ``keys``, found on source shard ``i``, those that shard owns and the target puts on another
        server, each with its target shard's index. A key another shard owns is a copy left here (a shrink's),
        never copied from here."""
        source, target = self.source, self.target.topology
        here = source.shards[i].name
        out = []
        for key in keys:
            slot = key_slot(key)
            if source.shard_of(key, slot) != i:
                continue
            j = target.shard_of(key, slot)
            if target.shards[j].name != here:
                out.append((key, j))
        return out

    def copy(self, i: int, keys: list[tuple[bytes, int]]) -> None:
        """Copy ``keys`` (from :meth:`moving`) to the target, in batches."""
        for lo in range(0, len(keys), self.batch):
            self._copy_batch(i, keys[lo : lo + self.batch])

    def _copy_batch(self, i: int, keys: list[tuple[bytes, int]]) -> None:
        reads = [command for key, _ in keys for command in (("DUMP", key), ("PTTL", key))]
        replies = streamed(self.source.shards[i].client, [reads[lo : lo + CHUNK] for lo in range(0, len(reads), CHUNK)])
        items: dict[int, list[tuple[bytes, Any, Any]]] = {}  # per target shard: key, ttl ("-": gone), payload
        for n, (key, j) in enumerate(keys):
            value, ttl = replies[2 * n], replies[2 * n + 1]
            if isinstance(value, BaseException) or isinstance(ttl, BaseException):
                raise value if isinstance(value, BaseException) else ttl
            items.setdefault(j, []).append((key, "-", b"") if value is None else (key, max(ttl, 0), value))
        fence, topology = self.fence, self.target.topology
        # The writes run only while this mover holds the lease (see _fence): many keys a call under a standalone
        # server's one fence (measured: one call a key took a third off the copy rate), one a call on a Redis
        # Cluster (a script touches one slot).
        group = 1 if isinstance(topology, ClusterTopology) else GROUP
        work: dict[int, list[tuple[Any, ...]]] = {}
        for j, batch in items.items():
            for lo in range(0, len(batch), group):
                part = batch[lo : lo + group]
                args = tuple(x for _, ttl, payload in part for x in (ttl, payload))
                guard = fence.key_for(topology, part[0][0])
                work.setdefault(j, []).append(fence.command("copy", guard, *(key for key, _, _ in part), args=args))
        outcome = self.target.fanout(work, lambda shard, cmds: self.target.commands(shard, cmds, streamed=True))
        for idx, res in outcome.items():
            name = topology.shards[idx].name
            if isinstance(res, BaseException):
                raise res
            fence.refused(name, res)
            for reply in res:
                if isinstance(reply, BaseException):
                    raise MigrationError(f"migration: target {name} refused a copy: {reply}")
        for batch in items.values():
            gone = sum(1 for _, ttl, _ in batch if ttl == "-")
            self.deleted += gone
            self.copied += len(batch) - gone
