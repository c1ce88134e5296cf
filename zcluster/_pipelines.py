"""Pipelines on one server's connection: a plain round trip, and streamed chunks (chunk k+1 sent before
chunk k's replies are read), packed by hiredis once even when several servers receive the same commands.
Error replies are values; nothing here follows redirects or failovers (:mod:`zcluster._transport` does)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import redis

Command = tuple[Any, ...]

_pack_command: Callable[[Command], bytes] | None
try:  # a dependency of redis[hiredis]; without it, redis-py's packer
    from hiredis import pack_command as _pack_command
except ImportError:  # pragma: no cover
    _pack_command = None
try:  # built with the compiled hot path (zcluster._native): hiredis' bytes, packed for a fraction of its cost
    from zcluster import _resp
except ImportError:  # no build, a stale one, or ZCLUSTER_PURE
    _resp = None  # type: ignore[assignment]


class _Chunk(list[Command]):
    """One pipeline's commands and, once packed, their RESP bytes."""

    packed: Any = None


class SharedCommands(list[Command]):
    """Commands that several servers receive alike (a farm's replicas of the same shape): split into
    pipeline chunks and packed into RESP once, by whichever sender gets there first."""

    def __init__(self, commands: Iterable[Command] = ()) -> None:
        super().__init__(commands)
        self._chunks: dict[int, list[_Chunk]] = {}

    def chunks(self, step: int) -> list[_Chunk]:
        got = self._chunks.get(step)
        if got is None:
            got = self._chunks[step] = [_Chunk(self[lo : lo + step]) for lo in range(0, len(self), step)]
        return got


def pipeline(client: redis.Redis, commands: Sequence[Command]) -> list[Any]:
    """One non-transactional pipeline round trip; error replies are values."""
    pipe = client.pipeline(transaction=False)
    for command in commands:
        pipe.execute_command(*command)
    return list(pipe.execute(raise_on_error=False))


def _packed(commands: list[Command]) -> list[bytes]:
    """The RESP bytes of ``commands`` (whose arguments are str, bytes, int or float, as every command
    built here) by zcluster._resp, else one hiredis call each: redis-py's own packer first walks every
    argument in Python, which took about a fifth of the client's profiled time for calls of many small
    arguments, and hiredis' costs about four times zcluster._resp's (bench/README.md)."""
    if _resp is not None:
        return [_resp.pack_commands(commands)]
    assert _pack_command is not None
    return [b"".join([_pack_command(command) for command in commands])]


def streamed(
    client: redis.Redis, chunks: list[list[Command]], then: Callable[[Any, list[Any]], None] | None = None
) -> list[Any]:
    """Send chunk k+1 before reading chunk k's replies, so the client packs while the server works;
    ``then(connection, replies)`` runs before the connection goes back to the pool.

    Replies are raw (no redis-py response callbacks) and in order; error replies are values. A lost
    connection resends every chunk on a fresh one only under a retry policy given in the connection
    options (redis-py's default has none): otherwise the shard's calls are reported unconfirmed and the
    caller decides (the applier resends them; writes are idempotent).
    """
    pool = client.connection_pool
    conn = pool.get_connection()
    packer = conn.pack_commands if _pack_command is None and _resp is None else _packed

    def pack(chunk: list[Command]) -> Any:
        if type(chunk) is not _Chunk:
            return packer(chunk)
        if chunk.packed is None:  # two senders may both pack it: the bytes are the same
            chunk.packed = packer(chunk)
        return chunk.packed

    def once() -> list[Any]:
        replies: list[Any] = []
        conn.send_packed_command(pack(chunks[0]))
        for i, chunk in enumerate(chunks):
            if i + 1 < len(chunks):
                conn.send_packed_command(pack(chunks[i + 1]))
            read_replies(conn, len(chunk), replies)
        return replies

    try:
        replies = list(conn.retry.call_with_retry(once, lambda _error: conn.disconnect()))
        if then is not None:
            then(conn, replies)
        return replies
    except BaseException:
        conn.disconnect()  # replies may be left unread on it: never hand it back in that state
        raise
    finally:
        pool.release(conn)


def read_replies(conn: Any, n: int, into: list[Any]) -> list[Any]:
    """``n`` raw replies read from ``conn`` onto ``into`` (returned), error replies as values."""
    for _ in range(n):
        try:
            into.append(conn.read_response())
        except redis.ResponseError as exc:
            into.append(exc)
    return into
