"""The mover's side of the layout markers (:mod:`zcluster._moves` is the clients'): reading and checking the
source's and the target's before anything moves, writing the target's, moving the source's from state to
state with a compare-and-set; and the plumbing every step shares (SCAN of the namespaces, retried calls)."""

from __future__ import annotations

import functools
import json
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import redis
from redis.crc import key_slot

from zcluster._markers import parse
from zcluster._pipelines import streamed
from zcluster._topology import ClusterTopology, Shard, StandaloneTopology, Topology
from zcluster.config import ClusterConfig
from zcluster.errors import ConfigError, LayoutMismatchError, MigrationError
from zcluster.migration._checks import (
    check_followers,
    check_overlaps,
    check_shared_state,
    follower_targets,
    other_stores,
    theirs,
)
from zcluster.migration._copier import CHUNK
from zcluster.migration._fence import Fence, FenceRearmed, is_fence

log = logging.getLogger("zcluster")


class Marking:
    """A mixin of :class:`zcluster.migration.Migration` (its attributes are set there)."""

    source: ClusterConfig
    target: ClusterConfig
    src: StandaloneTopology
    dst: Topology
    key: bytes
    namespaces: list[str]
    urls: list[str]
    batch: int
    retry_for: float
    others: list[bytes]
    keep_others: bool
    own_namespaces: bool
    connection: dict[str, Any]
    _seen: list[dict[str, Any]]
    source_id: str
    _notify: list[str]
    fence: Fence

    # -- markers ------------------------------------------------------------------------------------------

    def _source_markers(self) -> list[bytes]:
        """Every source shard's marker, raw; parsed into ``_seen``. Refused unless they hold one layout of this
        list, a shard of both layouts possibly already holding the target's final marker (a mover killed in
        the last writes of its cut-over: every other marker is then in its cut-over or ``done``)."""
        raws = [self._call(shard, "GET", self.key) for shard in self.src.shards]
        if any(r is None for r in raws):  # settle or adopt the layout the way any client does
            with self.source.open() as cluster:
                cluster.ping()
                cluster.stats(scan=False)
            raws = [self._call(shard, "GET", self.key) for shard in self.src.shards]
        self._seen = [parse(shard.name, r) for shard, r in zip(self.src.shards, raws, strict=True)]
        names = self.names(self.src)
        finals = [m for m in self._seen if self._final(m)]
        rest = [m for m in self._seen if not self._final(m)]
        ids = {m["id"] for m in rest} | {m["from"].get("id") for m in finals}
        if len(ids) != 1 or len({m["id"] for m in finals}) > 1 or any(m.get("shards") != names for m in rest):
            raise LayoutMismatchError(
                f"the source shards do not hold one layout of [{', '.join(names)}]: open the store "
                "with this list first (the layout guard says what differs)"
            )
        for m in rest if finals else ():
            move = m.get("move")
            if not isinstance(move, dict) or move.get("state") not in ("cutting", "done"):
                raise LayoutMismatchError(
                    f"a source shard holds the target layout {finals[0]['id']} of a cut-over while another is in "
                    f"state {move.get('state') if isinstance(move, dict) else None!r}: not a state a mover leaves; "
                    f"inspect each source shard's layout marker (GET {self.key.decode()!r}) before moving anything"
                )
        self.source_id = str(ids.pop())
        return [bytes(r) for r in raws]

    def _final(self, marker: dict[str, Any]) -> bool:
        """Whether a source shard's ``marker`` is the target's final one (this list's store moved on). One with
        a ``move`` is not: a later migration (from the layout this one made) keeps ``from`` in its source's."""
        origin = marker.get("from")
        names = self.names(self.src)
        moved_on = isinstance(origin, dict) and origin.get("shards") == names and marker.get("shards") != names
        return moved_on and "move" not in marker

    def _under_way(self) -> tuple[dict[str, Any] | None, bool]:
        """The move the source's markers hold (None: no migration under way), and whether its cut-over must be finished:
        a mover was killed after its first final write that a source shard shows (a shard of both layouts re-marked with
        the target's marker, or a source marker set to ``done``) and before its last. Its ``state`` is the least
        advanced of the markers'."""
        moves = [m["move"] for m in self._seen if isinstance(m.get("move"), dict)]
        finals = [m for m in self._seen if self._final(m)]
        if not moves and not finals:
            return None, False
        if moves:
            move = dict(moves[0])
        else:  # every source shard is of the target: its markers say where the store went
            origin = finals[0]["from"]
            move = {
                "id": str(origin.get("migration", finals[0]["id"])),
                "to": {"urls": finals[0].get("urls", []), "id": finals[0]["id"]},
                "notify": origin.get("notify"),
            }
        states = {str(m.get("state")) for m in moves} | ({"done"} if finals else set())
        for state in ("copying", "cutting", "done"):
            if state in states:
                move["state"] = state
                break
        return move, "done" in states and move["state"] == "cutting"

    def _check_resume(self, move: dict[str, Any]) -> None:
        urls = list(move.get("to", {}).get("urls", []))
        if urls != self.urls and move.get("state") == "done":
            raise LayoutMismatchError(
                f"this store already moved to [{', '.join(urls)}] (migration {move.get('id')}): to move it again, "
                "name those shards as the source"
            )
        if urls != self.urls:
            raise LayoutMismatchError(
                f"migration {move.get('id')} of this store to [{', '.join(urls)}] is under way; finish it (run it "
                f"again with that target) before moving the store to [{', '.join(self.urls)}]"
            )
        log.warning("migration %s: resumed in state %s", move.get("id"), move.get("state"))

    def _check_others(self) -> None:
        """Refuse, before anything moves, what lives on the source besides this store and would be harmed
        (:mod:`zcluster.migration._checks`): a namespace overlapping another store's prefix; zcluster-looking
        keys (``{...``) of no namespace and no other store (a state store under another namespace would be left
        behind), unless ``keep_others``; namespaces besides the prefix (state) from servers that also hold
        another store, unless ``own_namespaces``."""
        stores = other_stores(self.src.shards, self._call, self.key, self.batch)
        check_overlaps(stores, self.source.prefix, self.namespaces)
        self.others = []
        for shard in self.src.shards:
            for _ in self._scan(shard):
                pass
        strays = [k for k in self.others if not theirs(k, stores)]  # another store's keys stay, as always
        if strays and not self.keep_others:
            heads = sorted({k.partition(b"}")[0][1:].decode("utf-8", "replace")[:40] for k in strays[:1000]})
            raise LayoutMismatchError(
                f"the source holds {len(strays)} key(s) of no namespace in {self.namespaces} and of no other store "
                f"(e.g. {strays[0]!r}; hash tags starting {heads[:5]}): a state store or dedup under another "
                "namespace would stay behind (its consumers, not finding their checkpoints after the cut-over, "
                "would deliver again). Name every namespace of the store (--namespace, repeatable), or "
                "keep_others=True (--keep-others) if they are not this store's; nothing was moved"
            )
        check_shared_state(stores, strays, self.source.prefix, self.namespaces, self.own_namespaces)
        self.others = []

    def _check_target(self) -> None:
        self._check_others()
        src_names = self.names(self.src)
        if isinstance(self.dst, ClusterTopology):
            shared = set(self.dst.nodes()) & set(src_names)
            if shared:
                raise LayoutMismatchError(f"{', '.join(sorted(shared))} is a source shard and a Redis Cluster node")
        else:
            dst_names = self.names(self.dst)
            if dst_names == src_names:
                raise ConfigError("the target lists the same shards in the same order: nothing to move")
            for j, name in enumerate(dst_names):
                if name in src_names and src_names.index(name) != j:
                    raise LayoutMismatchError(
                        f"{name} is place {src_names.index(name)} of the source but place {j} of the target: a "
                        "server of both layouts keeps its place (append new shards, remove from the end)"
                    )
        holder = self.dst.shards[self.dst.shard_of(self.key, key_slot(self.key))]
        for shard in self._target_only():
            cluster_node = isinstance(self.dst, ClusterTopology) and shard is not holder  # the marker is elsewhere
            stored = None if cluster_node else self._call(shard, "GET", self.key)
            other = None if stored is None else parse(shard.name, stored)
            if other is not None and other.get("incoming", {}).get("from") != src_names:  # not an aborted start's
                move = other.get("move")
                if isinstance(move, dict) and move.get("state") == "done":  # retired by an earlier migration
                    raise LayoutMismatchError(
                        f"target {shard.name} was retired from {self.source.prefix!r} by migration {move.get('id')} "
                        f"(layout {other.get('id')}) and still holds its marker: once it holds no key of the "
                        "prefix, `zcluster markers reset --retired` deletes it; nothing was moved"
                    )
                raise LayoutMismatchError(
                    f"target {shard.name} holds another layout of {self.source.prefix!r} (layout {other['id']}): "
                    "a shard of another store; nothing was moved"
                )
            found = next((keys for keys in self._scan(shard) if keys), None)
            if found:
                raise LayoutMismatchError(
                    f"target {shard.name} already holds keys of the namespaces {self.namespaces} (e.g. {found[0]!r}) "
                    "that no migration put there: another store's? Empty it or choose another server; nothing moved"
                )
        source = self.source.urls[0]
        targets = follower_targets(self.dst, self.urls, source, self.key)
        check_followers(targets, source, self.key, self.connection, lambda shard: self._call(shard, "PING"))

    def _mark_target(self, mig: str, target_id: str) -> None:
        incoming = {"id": mig, "from": self.names(self.src)}
        for shard, value in self._target_markers(target_id, {"incoming": incoming}, only_new=True):
            self._set(shard, value)

    def _target_markers(self, target_id: str, extra: dict[str, Any], only_new: bool) -> list[tuple[Shard, str]]:
        base: dict[str, Any] = {"id": target_id}
        common = {
            "prefix": repr(self.source.prefix),
            "max_size": self.source.max_size,
            "created": round(time.time(), 3),
            "urls": self.urls,
            **extra,
        }
        if isinstance(self.dst, ClusterTopology):
            shard = self.dst.shards[self.dst.shard_of(self.key, key_slot(self.key))]
            return [(shard, json.dumps(base | {"routing": "cluster"} | common))]
        names = self.names(self.dst)
        src_names = set(self.names(self.src))
        out = []
        for j, shard in enumerate(self.dst.shards):
            if only_new and shard.name in src_names:
                continue
            out.append((shard, json.dumps(base | {"routing": "jump", "shards": names, "index": j} | common)))
        return out

    def _set_state(self, raw: list[bytes], mig: str, target_id: str, state: str, from_state: str | None) -> list[bytes]:
        """Every source marker's move state set to ``state`` (compare-and-set from ``raw``); the new raws."""
        out = []
        to = {"routing": "cluster" if self.target.cluster_url else "jump", "urls": self.urls, "id": target_id}
        for shard, old, marker in zip(self.src.shards, raw, self._seen, strict=True):
            move = {"id": mig, "state": state, "to": to, "namespaces": self.namespaces, "notify": self._notify}
            value = json.dumps(marker | {"move": move})
            if value.encode() != old:
                self._cas(shard, old, value)
            out.append(value.encode())
        if from_state == "cutting" and state == "copying":
            log.warning("migration %s: was killed in its cut-over: back to copying (waiting clients go on)", mig)
        return out

    def _set(self, shard: Shard, value: str) -> None:
        """Set a target server's marker (fenced)."""
        self._fenced(shard, self.dst, "set", [self.key], value)

    def _cas(self, shard: Shard, old: bytes, value: str) -> None:
        """Compare-and-set of a source marker (fenced): the mover changes a marker only from the value it read."""
        if not self._fenced(shard, self.src, "cas", [self.key], old, value):
            raise LayoutMismatchError(
                f"{shard.name}: the layout marker changed under the mover (another mover, or a client re-marking "
                "it): stop the other one; run this one again to resume"
            )

    # -- plumbing -----------------------------------------------------------------------------------------

    def _fenced(self, shard: Shard, topology: Topology, mode: str, keys: list[bytes], *args: Any) -> Any:
        """One fenced write (see :mod:`zcluster.migration._fence`) of ``keys`` on ``shard`` of ``topology``,
        retried while the server cannot be reached; its reply. A refusal other than the fence's raises
        :class:`zcluster.MigrationError` naming the server."""
        fence = self.fence
        command = fence.command(mode, fence.key_for(topology, keys[0]), *keys, args=args)
        reply = self._retrying(lambda: fence.run(shard, [command]))[0]
        if isinstance(reply, redis.ResponseError):
            raise MigrationError(f"migration: {shard.name} refused {mode} of {keys[0]!r}: {reply}")
        return reply

    def _scan(self, shard: Shard) -> Iterator[list[bytes]]:
        """The keys of every namespace on ``shard`` (markers left out), a SCAN step at a time (one SCAN of the
        whole keyspace, filtered here: a MATCH per namespace would walk it once per namespace). Keys laid out
        as zcluster lays them out (``{...``) in none of the namespaces, markers aside, go to ``others``."""
        heads = tuple(b"{" + ns.encode() for ns in self.namespaces)
        cursor = 0
        while True:
            cursor, keys = self._call(shard, "SCAN", cursor, "COUNT", self.batch)
            cursor = int(cursor)
            ours = [bytes(k) for k in keys if k.startswith(heads) and k != self.key and not is_fence(k)]
            if len(ours) < len(keys):
                self.others.extend(
                    bytes(k)
                    for k in keys
                    if k.startswith(b"{") and not k.startswith(heads) and not k.endswith(b"}layout") and not is_fence(k)
                )
            yield ours
            if cursor == 0:
                break

    def _delete(self, shard: Shard, topology: Topology, keys: list[bytes]) -> None:
        """Delete ``keys`` on ``shard`` of ``topology``, fenced, streamed in chunks of one key a command (a Redis
        Cluster node refuses a multi-key command across slots)."""
        fence = self.fence
        if isinstance(topology, ClusterTopology):
            commands = [fence.command("del", fence.key_for(topology, key), key) for key in keys]
        else:  # one fence for the whole server: many keys a command
            guard = fence.key_for(topology, b"")
            commands = [fence.command("del", guard, *keys[lo : lo + 100]) for lo in range(0, len(keys), 100)]
        for lo in range(0, len(commands), CHUNK):
            chunk = commands[lo : lo + CHUNK]
            for command, reply in zip(chunk, self._retrying(functools.partial(fence.run, shard, chunk)), strict=True):
                if isinstance(reply, redis.ResponseError):
                    raise MigrationError(f"migration: {shard.name} refused to delete {command[4]!r}: {reply}")

    def _each(self, shard: Shard, command: str, keys: list[bytes]) -> list[Any]:
        """``command key`` for each of ``keys`` on ``shard``, streamed in chunks (one key a command: a Redis
        Cluster node refuses a multi-key command across slots), retried while the server cannot be reached;
        the replies. An error reply raises :class:`MigrationError`."""
        commands = [(command, key) for key in keys]
        chunks = [commands[lo : lo + CHUNK] for lo in range(0, len(commands), CHUNK)]
        replies: list[Any] = self._retrying(lambda: streamed(shard.client, chunks)) if chunks else []
        for key, reply in zip(keys, replies, strict=True):
            if isinstance(reply, BaseException):
                raise MigrationError(f"migration: {shard.name} refused {command} of {key!r}: {reply}")
        return replies

    def _on(self, shard: Shard) -> Callable[..., Any]:
        return functools.partial(self._call, shard)

    def _call(self, shard: Shard, *command: Any) -> Any:
        return self._retrying(lambda: shard.client.execute_command(*command))

    def _retrying(self, call: Callable[[], Any]) -> Any:
        """``call()``, retried while a server cannot be reached (or had lost its fence: raised again), for
        ``retry_for`` seconds (logged)."""
        deadline = time.monotonic() + self.retry_for
        delay = 0.1
        while True:
            try:
                return call()
            except (redis.ConnectionError, redis.TimeoutError, FenceRearmed) as exc:
                if time.monotonic() > deadline:
                    raise
                log.warning("migration: a server failed (%s): retrying in %.1f s", exc, delay)
                time.sleep(delay)
                delay = min(delay * 2, 2.0)

    def _target_only(self) -> list[Shard]:
        src = set(self.names(self.src))
        return [s for s in self.dst.masters() if s.name not in src]

    @staticmethod
    def names(topology: Topology) -> list[str]:
        return [s.name for s in topology.masters()]
