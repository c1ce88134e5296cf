"""The layout marker of :mod:`zcluster._guard`: its key, its JSON fields, and the raw connections the guard
reads and creates it on (never pooled: no connection that did not pass the check carries a command)."""

from __future__ import annotations

import json
import time
from typing import Any

import redis

from zcluster._keys import KeyLayout
from zcluster.errors import LayoutMismatchError

MARKER = b"}layout"

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
