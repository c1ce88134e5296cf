"""The mover's lease and its fences: one mover at a time holds a migration, and a mover that lost it (a second
run took it over, or it was paused past its lease and another took it) writes nothing more.

The lease: a hash at ``{zcfence:}<prefix>`` on the source's first shard, with ``lease`` (an id made when the hash
is first made), ``gen`` (raised by each mover that takes the lease; never lowered: the hash is kept when a
migration ends, only its holder cleared), ``holder`` (``host:pid:uuid``), ``since`` and ``beat`` (the server's
clock, seconds), ``ttl`` (the holder's ``lease``). The holder beats every ``lease / 6`` seconds. A second run is
refused (:class:`zcluster.MigrationFencedError`, naming the holder and since when) while the lease is live,
unless the holder is a process of this host that no longer runs, or ``take_over`` is asked; a lease without a
beat for its ``ttl`` is stale and the next run takes it (logged).

The fences: the same hash (``lease`` and ``gen`` only) on every server a mover writes to: each source and
standalone target server at ``{zcfence:}<prefix>`` (on the source's first shard it is the lease itself); on a
Redis Cluster target one per hash slot at ``{zcfence:<n>}<prefix>``, ``n`` chosen so that the key lies in that
slot (a script touches only keys of one slot). A mover raises every fence to its generation after taking the
lease, then checks that the lease is still its own (a fence of another lease id is an earlier migration's,
replaced; without this check a mover paused between taking the lease and raising the fences could raise them
back over a newer mover's). Every write it makes is a script that checks the fence and writes in one step
(``lua/fence.lua``): RESTORE, DEL, UNLINK, the markers' SET and compare-and-set. A finished migration drops the
fences but the lease: a mover that wakes after the end finds no fence, and writes nothing.

Not fenced (not allowed in scripts): ``CONFIG SET notify-keyspace-events`` and ``CLIENT KILL``. A mover checks
its lease before it puts a server's notification settings back, and the holder checks that every source still
publishes before its cut-over (it copies every key again otherwise), so a waking mover that turned them off
costs a copy pass, never a change.
"""

from __future__ import annotations

import functools
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from functools import cache
from typing import Any

import redis
from redis.crc import key_slot

from zcluster._keys import SLOTS
from zcluster._scripts import fence_script
from zcluster._topology import ClusterTopology, Shard, Topology
from zcluster.errors import MigrationError, MigrationFencedError

log = logging.getLogger("zcluster")

HEAD = b"{zcfence:"
"""Every fence key starts with this: scans of a store's namespaces leave them out."""

Command = tuple[Any, ...]


class FenceRearmed(MigrationError):
    """Internal: a server had lost its fence (restarted empty) while this mover still holds the lease; its fence
    was raised again, and the write it refused must be sent again (the mover's retry loop does)."""


def is_fence(key: bytes) -> bool:
    return key.startswith(HEAD)


@cache
def _slot_tags() -> tuple[bytes, ...]:
    """For each hash slot, a tag ``n`` such that ``{zcfence:<n>}...`` lies in it (about 170k CRCs, once)."""
    tags: list[bytes | None] = [None] * SLOTS
    left, n = SLOTS, 0
    while left:
        tag = str(n).encode()
        slot = key_slot(HEAD + tag + b"}")
        if tags[slot] is None:
            tags[slot] = tag
            left -= 1
        n += 1
    return tuple(t for t in tags if t is not None)


def fence_key(prefix: bytes, slot: int | None = None) -> bytes:
    """The fence of a standalone server (``slot`` None), or of hash ``slot`` of a Redis Cluster."""
    return HEAD + (b"" if slot is None else _slot_tags()[slot]) + b"}" + prefix


def alive(holder: str) -> bool | None:
    """Whether ``holder`` (``host:pid:uuid``) still runs: None when that cannot be told (another host's)."""
    host, _, rest = holder.partition(":")
    pid = rest.partition(":")[0]
    if host != socket.gethostname() or not pid.isdigit():
        return None
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")  # a defunct process is dead
    except FileNotFoundError:
        return False
    except OSError:
        return None


class Fence:
    """One mover's lease (on ``lease_shard``) and the fenced forms of its writes; see the module."""

    def __init__(
        self,
        prefix: bytes,
        lease_shard: Shard,
        lease: float,
        retrying: Callable[[Callable[[], Any]], Any],
        store: str,
    ) -> None:
        self.prefix, self.lease_shard, self.lease, self.store = prefix, lease_shard, lease, store
        self.retrying = retrying
        self.script = fence_script()
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"
        self.id = ""
        self.gen = ""
        self.lost = threading.Event()  # set when a beat found the lease taken over
        self._stop = threading.Event()
        self._beats: threading.Thread | None = None
        self._armed: tuple[list[Shard], ClusterTopology | None] = ([], None)

    # -- the lease ----------------------------------------------------------------------------------------

    def acquire(self, take_over: bool) -> None:
        """Take the lease (see the module); raises :class:`MigrationFencedError` while another holds it."""
        reply = self._lease("acquire", self.holder, uuid.uuid4().hex, self.lease, "*" if take_over else "")
        if not int(reply[0]):
            holder, since, beat, now, ttl = (r.decode() if isinstance(r, bytes) else str(r) for r in reply[1:6])
            if alive(holder) is False:  # a mover of this host killed: its lease is taken at once
                log.warning("migration: mover %s (a process of this host) no longer runs: its lease is taken", holder)
                reply = self._lease("acquire", self.holder, uuid.uuid4().hex, self.lease, holder)
            if not int(reply[0]):
                raise MigrationFencedError(
                    f"the migration of the store {self.store} is held by mover {holder} (since "
                    f"{_utc(float(since))}, last heartbeat {float(now) - float(beat):.1f} s ago): a second mover is "
                    "refused, nothing was done. If that mover is dead, run again once its lease lapses "
                    f"({float(ttl):g} s without a heartbeat), or now with --take-over (Migration(take_over=True)); "
                    "a mover paused and woken after a take-over writes nothing more",
                    holder=holder,
                )
        self.id, self.gen, _, before = (r.decode() if isinstance(r, bytes) else str(r) for r in reply[1:5])
        if before:  # a dead or stale holder, or one taken over on request: from now on its writes are refused
            log.warning("migration: the lease of the store %s was taken from mover %s", self.store, before)
        log.info("migration: lease of the store %s taken: generation %s (%s)", self.store, self.gen, self.holder)

    def raise_fences(self, servers: Iterable[Shard], cluster: ClusterTopology | None) -> None:
        """Raise the fence of every standalone server in ``servers`` and of every slot of ``cluster`` to this
        mover's generation, then check that the lease is still this mover's."""
        self._armed = (list(servers), cluster)
        for shard, replies in self._each_fence("raise", *self._armed):
            if not all(int(r) for r in replies):
                self._taken(f"{shard.name} holds a newer generation")
        if not self.beat():
            self._taken("its lease changed while it raised its fences")

    def start(self) -> None:
        """Beat from a thread of its own until :meth:`stop`."""
        self._beats = threading.Thread(target=self._beat_loop, name="zcluster-mover-lease", daemon=True)
        self._beats.start()

    def beat(self) -> bool:
        """Stamp the lease's beat; False (and ``lost`` set) when the lease is no longer this mover's."""
        held = bool(int(self._lease("beat")))
        if not held:
            self.lost.set()
        return held

    def check(self) -> None:
        """Raise :class:`MigrationFencedError` when a beat found the lease taken over."""
        if self.lost.is_set():
            self._taken("another mover took its lease")

    def stop(self) -> None:
        self._stop.set()
        if self._beats is not None:
            self._beats.join(timeout=5)

    def release(self) -> None:
        """Free the lease for the next run (when still held); errors are logged: the lease then lapses."""
        self.stop()
        if not self.id:
            return
        try:
            self._lease("release")
        except redis.RedisError as exc:
            log.warning("migration: lease of %s not released (%s): it lapses in %g s", self.store, exc, self.lease)

    def drop(self, servers: Iterable[Shard], cluster: ClusterTopology | None) -> None:
        """After the end: delete every fence this mover raised but the lease (generations only grow)."""
        others = [s for s in servers if s.name != self.lease_shard.name]
        for _ in self._each_fence("drop", others, cluster):
            pass

    def _each_fence(
        self, mode: str, servers: Iterable[Shard], cluster: ClusterTopology | None
    ) -> Iterator[tuple[Shard, list[Any]]]:
        """``mode`` run on the fence of each of ``servers`` and each slot of ``cluster``: each server's replies."""
        work: dict[str, tuple[Shard, list[bytes]]] = {s.name: (s, [fence_key(self.prefix)]) for s in servers}
        if cluster is not None:
            for slot in range(SLOTS):
                key = fence_key(self.prefix, slot)
                owner = cluster.shards[cluster.shard_of(key, slot)]
                work.setdefault(owner.name, (owner, []))[1].append(key)
        for shard, keys in work.values():
            commands = [self.command(mode, key) for key in keys]
            yield shard, self.retrying(functools.partial(self.run, shard, commands))

    # -- fenced writes ------------------------------------------------------------------------------------

    def key_for(self, topology: Topology, key: bytes) -> bytes:
        """The fence guarding a write of ``key`` on ``topology``'s server that holds it."""
        return fence_key(self.prefix, key_slot(key) if isinstance(topology, ClusterTopology) else None)

    def command(self, mode: str, fence: bytes, *keys: bytes, args: tuple[Any, ...] = ()) -> Command:
        """The EVALSHA of ``mode`` under ``fence`` (see ``lua/fence.lua``)."""
        return ("EVALSHA", self.script.sha, 1 + len(keys), fence, *keys, mode, self.id, self.gen, *args)

    def run(self, shard: Shard, commands: list[Command]) -> list[Any]:
        """``commands`` (from :meth:`command`) pipelined to ``shard``, the script loaded first; replies in order,
        a fenced refusal raised as :class:`MigrationFencedError`, another error reply returned as it is."""
        pipe = shard.client.pipeline(transaction=False)
        pipe.execute_command("SCRIPT", "LOAD", self.script.source)
        for command in commands:
            pipe.execute_command(*command)
        replies = pipe.execute(raise_on_error=False)[1:]
        self.refused(shard.name, replies)
        return replies

    def refused(self, name: str, replies: list[Any]) -> None:
        """Raise :class:`MigrationFencedError` if one of ``replies`` is a fenced refusal."""
        for reply in replies:
            if isinstance(reply, redis.ResponseError) and str(reply).startswith("ZCFENCED"):
                if str(reply).startswith("ZCFENCED absent") and self.beat():  # restarted empty: fenced anew
                    log.warning("migration: %s had lost its fence (restarted empty?): raised again", name)
                    self.raise_fences(*self._armed)
                    raise FenceRearmed(name)
                self._taken(f"{name} refused its write ({reply})")

    def _lease(self, mode: str, *args: Any) -> Any:
        """``mode`` on the lease; its reply."""
        command = self.command(mode, fence_key(self.prefix), args=args)
        return self.retrying(lambda: self.run(self.lease_shard, [command]))[0]

    def _taken(self, why: str) -> None:
        self.lost.set()
        raise MigrationFencedError(
            f"this mover (generation {self.gen} of the migration of the store {self.store}) lost its lease: {why}. "
            "Another mover took the migration over; this one stopped, and the write refused was not made",
            holder=None,
        )

    def _beat_loop(self) -> None:
        while not self._stop.wait(self.lease / 6):
            try:
                if not self.beat():
                    log.warning("migration: this mover's lease was taken over: its next write is refused")
                    return
            except redis.RedisError as exc:  # the cut-over's CLIENT KILL, a restart: the next beat tries again
                log.info("migration: a lease beat failed (%s)", exc)


def _utc(seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(seconds))
