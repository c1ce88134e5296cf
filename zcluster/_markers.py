"""The layout marker of :mod:`zcluster._guard`: its key, its JSON fields, the raw connections the guard
reads and creates it on (never pooled: no connection that did not pass the check carries a command), and the
sample of an unmarked store's keys that comes before adopting it."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import redis

from zcluster._keys import KeyLayout
from zcluster.errors import LayoutMismatchError

MARKER = b"}layout"

SAMPLE = 256
"""Keys of the prefix sampled per shard before an unmarked store is adopted."""
SCAN_COUNT = 1000
SCAN_STEPS = 8
"""SCAN steps (``COUNT`` :data:`SCAN_COUNT`) at most per shard while sampling: adoption stays cheap on a
shard holding many other keys."""

# Create-if-absent, atomically: concurrent clients all get the first one's marker back.
CREATE = (
    "local v = redis.call('GET', KEYS[1]) if v then return v end redis.call('SET', KEYS[1], ARGV[1]) return ARGV[1]"
)

# Compare-and-delete: a marker is deleted only while it holds the value given (the guard's rollback of its own).
DROP = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"


def marker_key(layout: KeyLayout) -> bytes:
    """The Redis key of ``layout``'s marker: ``{<prefix>}layout``."""
    return layout.head + MARKER


class Peer:
    """A connection of its own to a client's server, for the guard only: never pooled, so that no connection
    that did not pass the check can carry a command (it skips the connect hook: it is the check)."""

    def __init__(self, client: redis.Redis) -> None:
        pool = client.connection_pool
        options = {k: v for k, v in pool.connection_kwargs.items() if k != "redis_connect_func"}
        self.conn: Any = pool.connection_class(**options)

    def send_command(self, *command: Any) -> None:
        self.conn.send_command(*command)

    def read_response(self) -> Any:
        return self.conn.read_response()

    def close(self) -> None:
        self.conn.disconnect()


def run(target: Any, *command: Any) -> Any:
    """``command`` on a guard connection or on a connection being set up: its raw reply; an error reply raises."""
    target.send_command(*command)
    return target.read_response()


def parse(name: str, raw: Any) -> dict[str, Any]:
    try:
        fields = json.loads(raw)
        if not isinstance(fields, dict) or not isinstance(fields.get("id"), str):
            raise ValueError("not a layout marker")
    except ValueError as exc:
        raise LayoutMismatchError(
            f"{name}: the layout marker holds {raw[:200]!r}, not a marker this release reads ({exc}): a newer "
            "release or a foreign write; nothing was done"
        ) from None
    return fields


def listing(stored: dict[str, Any]) -> str:
    return f"{len(stored.get('shards', []))} shard(s) [{', '.join(stored.get('shards', []))}]"


def when(stored: dict[str, Any]) -> str:
    created = stored.get("created")
    if not isinstance(created, int | float):
        return "at an unknown time"
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(created))


def sample(
    layout: KeyLayout, shard_of: Callable[[bytes, int], int], names: list[str], j: int, target: Any, store: str
) -> int:
    """How many keys of ``layout``'s prefix were sampled on shard ``j`` (``target``: a connection to it);
    raises :class:`LayoutMismatchError` if one is not routed to ``j`` by ``shard_of`` (the list ``names``)."""
    pattern = layout.scan_pattern(None, include_removed=True)
    cursor, seen, misplaced = 0, 0, []
    for _ in range(SCAN_STEPS):
        reply = run(target, "SCAN", cursor, "MATCH", pattern, "COUNT", SCAN_COUNT)
        cursor = int(reply[0])
        for raw in reply[1]:
            split = layout.logical(raw)
            if split is None or seen >= SAMPLE:
                continue
            seen += 1
            owner = shard_of(split[0], layout.slot(split[0]))
            if owner != j:
                misplaced.append((split[0], owner))
        if cursor == 0 or seen >= SAMPLE:
            break
    if misplaced:
        key, owner = misplaced[0]
        raise LayoutMismatchError(
            f"{store} has no layout marker (written before this release) and cannot be adopted with this list of "
            f"{len(names)} shard(s) [{', '.join(names)}]: {len(misplaced)} of {seen} key(s) sampled on {names[j]} "
            f"are routed elsewhere by it (e.g. {key!r} goes to {names[owner]}), so it is not the list the store "
            "was written with (a shard added, removed or reordered, or another routing). Open it with the list and "
            "routing it was written with; nothing was marked"
        )
    return seen


def not_cluster_node(name: str, target: Any) -> None:
    """Raise :class:`LayoutMismatchError` when the server ``name`` (``target``: a connection to it) is a node
    of a Redis Cluster: listed as a standalone shard, it would hold only some slots' keys."""
    if b"cluster_enabled:1" in run(target, "INFO", "cluster"):
        raise LayoutMismatchError(
            f"{name} is a node of a Redis Cluster, listed as a standalone shard: open the store with a "
            "redis+cluster:// seed URL (Cluster.from_cluster_url); nothing was marked"
        )
