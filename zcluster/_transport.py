"""Shard I/O: commands pipelined per shard, shards in parallel, script reloads and cluster redirects.

Nothing here knows about sorted sets: the cluster hands over lists of commands per shard and gets replies
(or per-command errors) back. Resending is always safe because every command the cluster sends is either
a read or an idempotent write.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import redis
from redis.exceptions import AskError, MovedError, NoScriptError, TryAgainError

from zcluster._scripts import Script
from zcluster._topology import Shard, Topology
from zcluster.errors import RedirectLoopError, ShardError
from zcluster.types import ReadResult, ShardFailure

T = TypeVar("T")
R = TypeVar("R")

MAX_REDIRECTS = 32
SHARD_ERRORS = (redis.RedisError, OSError, ShardError)
"""Errors that mean "this shard could not do it"; anything else is a bug and propagates."""

Command = tuple[Any, ...]


class Transport:
    """Runs commands on the shards of ``topology``; reloads ``scripts`` where the server lost them."""

    def __init__(self, topology: Topology, scripts: Sequence[Script], pipeline_calls: int) -> None:
        self.topology = topology
        self.scripts = scripts
        self.pipeline_calls = pipeline_calls
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()

    def close(self) -> None:
        """Stop the worker threads and close every connection."""
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)
        self.topology.close()

    def fanout(self, work: dict[int, T], fn: Callable[[Shard, T], R]) -> dict[int, R | BaseException]:
        """Run ``fn(shard, work)`` for every shard, in parallel threads; shard errors become values."""
        shards = self.topology.shards

        def guarded(idx: int) -> R | BaseException:
            try:
                return fn(shards[idx], work[idx])
            except SHARD_ERRORS as exc:
                return exc

        if len(work) <= 1:
            return {idx: guarded(idx) for idx in work}
        with self._pool_lock:
            if self._pool is None:  # started on first use: importing or building a Cluster starts no thread
                self._pool = ThreadPoolExecutor(max_workers=32, thread_name_prefix="zcluster")
            pool = self._pool
        futures = {idx: pool.submit(guarded, idx) for idx in work}
        return {idx: f.result() for idx, f in futures.items()}

    def load_scripts(self, client: redis.Redis) -> None:
        for script in self.scripts:
            client.script_load(script.source)

    def writes(self, shard: Shard, commands: list[Command]) -> list[Any]:
        """:meth:`commands` with the pipeline streamed (write-script calls, whose replies are plain)."""
        return self.commands(shard, commands, streamed=True)

    def commands(self, shard: Shard, commands: list[Command], streamed: bool = False) -> list[Any]:
        """Pipeline ``commands`` to ``shard``; replies (or per-command errors) in order.

        NOSCRIPT (restart, failover, SCRIPT FLUSH) reloads the scripts and resends; MOVED/ASK/TRYAGAIN
        follow the cluster. ``streamed`` overlaps the client's packing with the server's work.
        """
        step = self.pipeline_calls
        chunks = [commands[lo : lo + step] for lo in range(0, len(commands), step)]
        if streamed:
            replies = _streamed(shard.client, chunks)
        else:
            replies = [r for chunk in chunks for r in pipeline(shard.client, chunk)]
        missing = [j for j, r in enumerate(replies) if isinstance(r, NoScriptError)]
        if missing:
            self.load_scripts(shard.client)
            for j, r in zip(missing, pipeline(shard.client, [commands[j] for j in missing]), strict=True):
                replies[j] = r
        for j, r in enumerate(replies):
            if isinstance(r, MovedError | AskError | TryAgainError):
                replies[j] = self._redirected(shard, commands[j], r)
        return replies

    def _redirected(self, shard: Shard, command: Command, error: Exception) -> Any:
        client = shard.client
        for attempt in range(MAX_REDIRECTS):
            asking = False
            if isinstance(error, MovedError):
                self.topology.refresh()
                client = self.topology.redirect(error.host, int(error.port)).client
            elif isinstance(error, AskError):
                client = self.topology.redirect(error.host, int(error.port)).client
                asking = True
            else:  # TRYAGAIN: keys of the slot are split between two nodes mid-migration
                time.sleep(min(0.005 * (attempt + 1), 0.1))
            cmds = [("ASKING",), command] if asking else [command]
            reply = pipeline(client, cmds)[-1]
            if isinstance(reply, NoScriptError):
                self.load_scripts(client)
                reply = pipeline(client, cmds)[-1]
            if not isinstance(reply, MovedError | AskError | TryAgainError):
                return reply
            error = reply
        return RedirectLoopError(f"gave up after {MAX_REDIRECTS} cluster redirects (last: {error})")


def pipeline(client: redis.Redis, commands: Sequence[Command]) -> list[Any]:
    """One non-transactional pipeline round trip; error replies are values."""
    pipe = client.pipeline(transaction=False)
    for command in commands:
        pipe.execute_command(*command)
    return list(pipe.execute(raise_on_error=False))


def _streamed(client: redis.Redis, chunks: list[list[Command]]) -> list[Any]:
    """Send chunk k+1 before reading chunk k's replies, so the client packs while the server works.

    Replies are raw (no redis-py response callbacks) and in order; error replies are values. A lost
    connection resends every chunk on a fresh one only under a retry policy given in the connection
    options (redis-py's default has none): otherwise the shard's calls are reported unconfirmed and the
    caller decides (the applier resends them; writes are idempotent).
    """
    pool = client.connection_pool
    conn = pool.get_connection()

    def once() -> list[Any]:
        replies: list[Any] = []
        conn.send_packed_command(conn.pack_commands(chunks[0]))
        for i, chunk in enumerate(chunks):
            if i + 1 < len(chunks):
                conn.send_packed_command(conn.pack_commands(chunks[i + 1]))
            for _ in chunk:
                try:
                    replies.append(conn.read_response())
                except redis.ResponseError as exc:
                    replies.append(exc)
        return replies

    try:
        return list(conn.retry.call_with_retry(once, lambda _error: conn.disconnect()))
    except BaseException:
        conn.disconnect()  # replies may be left unread on it: never hand it back in that state
        raise
    finally:
        pool.release(conn)


def _by_shard(encoded: list[tuple[int, bytes]]) -> dict[int, list[int]]:
    work: dict[int, list[int]] = {}
    for pos, (shard_idx, _) in enumerate(encoded):
        work.setdefault(shard_idx, []).append(pos)
    return work


def read(
    transport: Transport,
    items: Sequence[Any],
    encoded: list[tuple[int, bytes]],
    build: Callable[[bytes, int], list[Command]],
    parse: Callable[[Any, list[Any]], Any],
) -> ReadResult[Any, Any]:
    """Pipeline ``build(key, position)`` commands per shard, then ``parse(item, replies)`` per item.

    ``encoded[i]`` is (shard index, encoded key) of ``items[i]``. Items of a failed shard land in the
    result's ``errors``; every other item is answered.
    """
    work = _by_shard(encoded)
    commands: dict[int, list[Command]] = {}
    widths: dict[int, list[int]] = {}
    for shard_idx, positions in work.items():
        cmds: list[Command] = []
        ws: list[int] = []
        for pos in positions:
            built = build(encoded[pos][1], pos)
            cmds.extend(built)
            ws.append(len(built))
        commands[shard_idx], widths[shard_idx] = cmds, ws
    outcome = transport.fanout(commands, transport.commands)
    answers: list[Any] = [None] * len(items)
    for shard_idx, positions in work.items():
        res = outcome[shard_idx]
        name = transport.topology.shards[shard_idx].name
        j = 0
        for pos, width in zip(positions, widths[shard_idx], strict=True):
            if isinstance(res, BaseException):
                answers[pos] = ShardFailure(name, res, (pos,))
                continue
            replies = res[j : j + width]
            j += width
            err = next((r for r in replies if isinstance(r, BaseException)), None)
            answers[pos] = ShardFailure(name, err, (pos,)) if err is not None else parse(items[pos], replies)
    return _in_order(items, answers)


def read_each(
    transport: Transport,
    items: Sequence[Any],
    encoded: list[tuple[int, bytes]],
    fetch: Callable[[Shard, bytes], Any],
    parse: Callable[[Any, Any], Any],
) -> ReadResult[Any, Any]:
    """``fetch(shard, key)`` item by item (for reads that need several round trips per key), shards in
    parallel. The first failure of a shard fails its remaining items at once: a hung shard costs one
    timeout per call, not one per key."""
    work = _by_shard(encoded)

    def run(shard: Shard, positions: list[int]) -> list[Any]:
        out: list[Any] = []
        for pos in positions:
            try:
                out.append(fetch(shard, encoded[pos][1]))
            except SHARD_ERRORS as exc:
                out.extend([exc] * (len(positions) - len(out)))
                break
        return out

    outcome = transport.fanout(work, run)
    answers: list[Any] = [None] * len(items)
    for shard_idx, positions in work.items():
        res = outcome[shard_idx]
        name = transport.topology.shards[shard_idx].name
        for n, pos in enumerate(positions):
            value = res if isinstance(res, BaseException) else res[n]
            if isinstance(value, BaseException):
                answers[pos] = ShardFailure(name, value, (pos,))
            else:
                answers[pos] = parse(items[pos], value)
    return _in_order(items, answers)


def _in_order(items: Sequence[Any], answers: list[Any]) -> ReadResult[Any, Any]:
    """A ReadResult keyed by ``items`` in the caller's order; ShardFailure answers go to ``errors``."""
    result: ReadResult[Any, Any] = ReadResult()
    for item, answer in zip(items, answers, strict=True):
        if isinstance(answer, ShardFailure):
            result.errors[item] = answer
        else:
            result[item] = answer
    return result
