"""Following a Redis Cluster while it changes: redirects, failovers, a cluster briefly down.

The transport sends a shard's commands through :func:`follow`; each command's redirect goes through
:func:`redirected`. Resending is always safe: every command the cluster sends is a read or an idempotent
write (a 2P-set write; a floor that only rises; an exactly-once checkpoint, a record scored by its position
and fenced by a floor), so a command that may or may not have run before its node died runs again on the
node that took over.

* **A node that refuses connections or times out** (a killed master, a replaced node): the topology drops
  its idle connections and reloads the slot map from a node still reachable, rate-limited (see
  :class:`zcluster._topology.ClusterTopology`). Once the map moved its slots elsewhere (a replica
  promoted by failover, slots resharded away), the commands go there at once; while it still owns them
  (the cluster has not failed it over yet), they are retried with backoff (50 ms doubling, at most 0.5 s)
  until ``failover_timeout`` seconds after the first failure, then the call reports the shard failed
  (:class:`ShardError` naming ``host:port``). A master that no replica can replace (the map lists none)
  is reported at once, as on standalone shards.
* **A master that became a replica** (it was failed over and came back before the client noticed): its
  ``READONLY`` replies, or a ``WAIT`` it refuses as a replica, make the transport raise a
  ``redis.ConnectionError`` saying so, which is followed as an unreachable node (the map is reloaded and the
  commands go to the node now serving its slots).
* **CLUSTERDOWN** (a master failed and its replica is not promoted yet: the whole cluster refuses
  commands for about a second, with ``cluster-require-full-coverage yes``): those commands are resent
  with the same backoff, within the same deadline.
* **MOVED** (a manual ``CLUSTER FAILOVER``, resharding): the slot's owner is updated, the command goes
  there, and the whole map is reloaded (rate-limited); **ASK** sends ``ASKING`` and the command to the
  importing node; **TRYAGAIN** (a multi-key call whose keys the migration has split, or whose missing keys the
  importing node cannot tell apart from keys not moved yet) backs off and resends to the same node for up to
  ``failover_timeout`` seconds: a slot's migration can take that long.

Standalone shards have ``failover_timeout`` 0: a failed shard is reported at once, as always.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import redis
from redis.exceptions import (
    AskError,
    AuthenticationError,
    AuthorizationError,
    ClusterDownError,
    MaxConnectionsError,
    MovedError,
    NoScriptError,
    ReadOnlyError,
    TryAgainError,
)

from zcluster._topology import Shard, Topology
from zcluster.errors import RedirectLoopError, ShardError
from zcluster.types import ShardFailure

__all__ = ["MAX_REDIRECTS", "demoted", "follow", "node_down", "redirected"]

log = logging.getLogger("zcluster")

MAX_REDIRECTS = 32
Command = tuple[Any, ...]
Send = Callable[[Shard, list[Command]], list[Any]]
"""Pipelines commands to a node: their replies (or per-command errors) in order."""

_UNREACHABLE = (redis.ConnectionError, redis.TimeoutError, OSError)
# ConnectionErrors that another node cannot cure: wrong credentials, a full client-side pool
_NOT_A_NODE_FAILURE = (AuthenticationError, AuthorizationError, MaxConnectionsError)


def demoted(reply: Any) -> bool:
    """A ``READONLY`` reply: the node is a replica now."""
    return isinstance(reply, ReadOnlyError)


def node_down(error: BaseException) -> bool:
    """Whether ``error`` means the node could not be reached (refused, reset, timed out)."""
    return isinstance(error, _UNREACHABLE) and not isinstance(error, _NOT_A_NODE_FAILURE)


def cluster_down(reply: Any) -> bool:
    """A CLUSTERDOWN reply, or the write script's error when Redis refused its commands for that reason."""
    return isinstance(reply, redis.ResponseError) and (
        isinstance(reply, ClusterDownError) or "cluster is down" in str(reply).lower()
    )


def backoff(attempt: int) -> float:
    """Seconds before retry ``attempt`` (0-based) of a node that has not failed over yet."""
    return float(min(0.05 * 2**attempt, 0.5))


class _Deadline:
    """``seconds`` from the first trouble of a call (started by the first :meth:`expired`)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.at: float | None = None
        self.attempt = 0

    def expired(self) -> bool:
        now = time.monotonic()
        if self.at is None:
            self.at = now + self.seconds
        return now >= self.at

    def sleep(self) -> None:
        assert self.at is not None
        time.sleep(max(0.0, min(backoff(self.attempt), self.at - time.monotonic())))
        self.attempt += 1


def follow(topology: Topology, shard: Shard, commands: list[Command], send: Send) -> list[Any]:
    """``send(shard, commands)``, following the cluster when the node is unreachable or the cluster is
    down (see the module docstring); the replies in order, or raises what the last attempt raised."""
    if not topology.failover_timeout:
        return send(shard, commands)
    node = topology.route(shard)
    deadline = _Deadline(topology.failover_timeout)
    replies: list[Any] | None = None
    pending: list[int] = []
    todo = commands
    while True:
        seen = topology.generation
        try:
            got = send(node, todo)
        except _UNREACHABLE as exc:
            if not node_down(exc):
                raise
            successor = topology.unreachable(node, seen)
            if successor is None:
                raise
            if deadline.expired():
                raise ShardError(
                    f"{node.name} unreachable ({type(exc).__name__}: {exc}); the Redis Cluster did not move its "
                    f"slots to another node within {topology.failover_timeout:g}s (failover_timeout)",
                    [ShardFailure(node.name, exc, ())],
                ) from exc
            if successor is node:
                deadline.sleep()
            else:
                log.info("%s unreachable: its slots are now served by %s", node.name, successor.name)
            node = successor
            continue
        if replies is None:
            replies, pending = got, list(range(len(got)))
        else:
            for j, reply in zip(pending, got, strict=True):
                replies[j] = reply
        pending = [j for j in pending if cluster_down(replies[j])]
        if not pending or deadline.expired():
            return replies
        deadline.sleep()
        todo = [commands[j] for j in pending]
        node = topology.route(node)


def redirected(
    topology: Topology,
    shard: Shard,
    command: Command,
    error: Exception,
    send: Send,
    load_scripts: Callable[[Shard], None],
) -> Any:
    """The reply of ``command`` after following the redirect ``error`` (MOVED, ASK or TRYAGAIN) that
    ``shard`` answered, and any further ones; a :class:`RedirectLoopError` value after ``MAX_REDIRECTS``
    MOVED/ASK hops, or once TRYAGAIN lasted ``failover_timeout`` seconds.

    TRYAGAIN is bounded by time, not by a count: it lasts as long as the slot's migration (a slot of many or
    large keys takes seconds; one left open by a redis-cli that died lasts until ``redis-cli --cluster fix``)."""
    node, asking = shard, False
    hops, tries, waited_since = 0, 0, time.monotonic()
    while True:
        if isinstance(error, MovedError | AskError):
            hops += 1
            if hops > MAX_REDIRECTS:
                return RedirectLoopError(f"gave up after {MAX_REDIRECTS} cluster redirects (last: {error})")
            if isinstance(error, MovedError):
                node, asking = topology.moved(int(error.slot_id), error.host, int(error.port)), False
            else:
                node, asking = topology.redirect(error.host, int(error.port)), True
            tries, waited_since = 0, time.monotonic()
        else:  # TRYAGAIN: keys of the slot are split between two nodes mid-migration; same node, same way
            budget = topology.failover_timeout
            over = time.monotonic() - waited_since >= budget if budget else tries >= MAX_REDIRECTS
            if over:
                limit = f"{budget:g}s (failover_timeout)" if budget else f"{MAX_REDIRECTS} tries"
                return RedirectLoopError(
                    f"the call's keys stayed split between two nodes by a slot migration for {limit} (last: "
                    f"{error}); a migration left open (redis-cli died) is closed by redis-cli --cluster fix"
                )
            time.sleep(min(0.005 * (tries + 1), 0.1))
            tries += 1
        cmds = [("ASKING",), command] if asking else [command]
        reply = send(node, cmds)[-1]
        if isinstance(reply, NoScriptError):
            load_scripts(node)
            reply = send(node, cmds)[-1]
        if not isinstance(reply, MovedError | AskError | TryAgainError):
            return reply
        error = reply
