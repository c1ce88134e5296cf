"""Shard I/O: commands pipelined per shard, shards in parallel, script reloads; cluster redirects and
failovers are followed by :mod:`zcluster._follow`.

Nothing here knows about sorted sets: the cluster hands over lists of commands per shard and gets replies
(or per-command errors) back. Resending is always safe because every command the cluster sends is either
a read or an idempotent write.

Durability (:class:`zcluster.Durability`): every pipeline that carries writes ends with ``WAIT`` and/or
``WAITAOF`` on its own connection (they cover only the writes of the connection that sends them; a
pooled connection picked separately would wait for nothing). Whether a server has WAITAOF is read from
its reply ("unknown command" before Redis 7.2), every time: the command travels in the same round trip
as the writes, so this costs nothing, and a server upgraded in place is never misjudged from a cache.
A confirmation that falls short is asked for again on the same connection (holding it), until
``Durability.deadline``: after a failover the promoted replica has no replica of its own until the old
master rejoins as one, and a durable write waits for that instead of failing after one ``timeout``. Only
the waits are sent again, never the writes, so nothing is applied twice (increments included).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import redis
from redis.exceptions import AskError, MovedError, NoScriptError, TryAgainError

from zcluster._follow import demoted, follow, node_down, redirected
from zcluster._scripts import Script
from zcluster._topology import Shard, Topology
from zcluster.errors import DurabilityError, ShardError
from zcluster.types import Durability, ReadResult, ShardFailure

log = logging.getLogger("zcluster")

T = TypeVar("T")
R = TypeVar("R")

SHARD_ERRORS = (redis.RedisError, OSError, ShardError, DurabilityError)
"""Errors that mean "this shard could not do it"; anything else is a bug and propagates."""

Command = tuple[Any, ...]

_pack_command: Callable[[Command], bytes] | None
try:  # a dependency of redis[hiredis]; without it, redis-py's packer
    from hiredis import pack_command as _pack_command
except ImportError:  # pragma: no cover
    _pack_command = None


class Transport:
    """Runs commands on the shards of ``topology``; reloads ``scripts`` where the server lost them."""

    def __init__(self, topology: Topology, scripts: Sequence[Script], pipeline_calls: int) -> None:
        self.topology = topology
        self.scripts = scripts
        self.pipeline_calls = pipeline_calls
        self.refused: set[str] = set()  # names of optional scripts a server refused to load
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()

    def close(self) -> None:
        """Close every connection, then stop the worker threads: a call still waiting on a reply (a hung
        server) fails at once instead of holding the close up for its socket timeout."""
        self.topology.close()
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)
        self.topology.close()  # what such a call may have reconnected meanwhile

    def fanout(self, work: dict[int, T], fn: Callable[[Shard, T], R]) -> dict[int, R | BaseException]:
        """Run ``fn(shard, work)`` for every shard, in parallel threads; shard errors become values."""
        shards = self.topology.shards

        def guarded(idx: int) -> R | BaseException:
            try:
                return self.node_call(shards[idx], lambda: fn(shards[idx], work[idx]))
            except SHARD_ERRORS as exc:
                return exc

        if len(work) <= 1:
            return {idx: guarded(idx) for idx in work}
        pool = self.executor()
        futures = {idx: pool.submit(guarded, idx) for idx in work}
        return {idx: f.result() for idx, f in futures.items()}

    def executor(self) -> ThreadPoolExecutor:
        """:meth:`fanout`'s threads, also for work overlapping the caller's (never work that waits on them)."""
        with self._pool_lock:
            if self._pool is None:  # started on first use: importing or building a Cluster starts no thread
                self._pool = ThreadPoolExecutor(max_workers=32, thread_name_prefix="zcluster")
            return self._pool

    def load_scripts(self, shard: Shard) -> None:
        """Load every script on ``shard``. An optional script the server refuses (Redis < 7 does
        not know script flags) is logged and left out: its calls answer NOSCRIPT, which their sender handles."""
        for script in self.scripts:
            try:
                shard.client.script_load(script.source)
            except redis.ResponseError as exc:
                if not script.optional:
                    raise
                self.refused.add(script.name)
                log.warning("%s refused the optional script %s: %s", shard.name, script.name, exc)

    def writes(self, shard: Shard, commands: list[Command], durability: Durability | None = None) -> list[Any]:
        """:meth:`commands` with the pipeline streamed (write-script calls, whose replies are plain)."""
        return self.commands(shard, commands, streamed=True, durability=durability)

    def commands(
        self, shard: Shard, commands: list[Command], streamed: bool = False, durability: Durability | None = None
    ) -> list[Any]:
        """Pipeline ``commands`` to ``shard``; replies (or per-command errors) in order.

        NOSCRIPT (restart, failover, SCRIPT FLUSH) reloads the scripts and resends; MOVED/ASK/TRYAGAIN
        follow the cluster, and so do a node that cannot be reached and CLUSTERDOWN (:mod:`zcluster._follow`).
        ``streamed`` overlaps the client's packing with the server's work. ``durability``: each pipeline
        ends with its waits (see the module), asked again until ``durability.deadline`` while they fall
        short; then raises :class:`DurabilityError` naming the server, after every command was sent and
        answered. With ``durability``, replies are raw (no redis-py response callbacks): it is for writes.
        """
        waits = _Waits(durability)  # one per call: its deadline spans the call's resends to other nodes
        return follow(self.topology, shard, commands, lambda node, todo: self._once(node, todo, streamed, waits))

    def _once(self, shard: Shard, commands: list[Command], streamed: bool, waits: _Waits) -> list[Any]:
        waits.begin()
        step = self.pipeline_calls
        chunks: list[list[Command]]
        if isinstance(commands, SharedCommands):
            chunks = list(commands.chunks(step))
        else:
            chunks = [commands[lo : lo + step] for lo in range(0, len(commands), step)]
        if streamed:
            replies = waits.streamed(shard, chunks)
        else:
            replies = [r for chunk in chunks for r in waits.pipeline(shard, chunk)]
        failed = [j for j, r in enumerate(replies) if isinstance(r, BaseException)]
        if self.topology.failover_timeout and (waits.on_replica or any(demoted(replies[j]) for j in failed)):
            raise redis.ConnectionError(f"{shard.name} answered as a replica: it was failed over")
        missing = [j for j in failed if isinstance(replies[j], NoScriptError)]
        if missing:
            self.load_scripts(shard)
            for j, r in zip(missing, waits.pipeline(shard, [commands[j] for j in missing]), strict=True):
                replies[j] = r
        for j in failed:
            r = replies[j]
            if isinstance(r, MovedError | AskError | TryAgainError):
                replies[j] = redirected(self.topology, shard, commands[j], r, waits.pipeline, self.load_scripts)
        waits.check()
        return replies

    def node_call(self, shard: Shard, call: Callable[[], T]) -> T:
        """``call()`` (a command on ``shard``'s own client, e.g. a SCAN step, whose cursor belongs to that
        node); when the node cannot be reached, the topology hears of it before the error propagates."""
        seen = self.topology.generation
        try:
            return call()
        except SHARD_ERRORS as exc:
            if node_down(exc):
                self.topology.unreachable(shard, seen)
            raise


class _Waits:
    """The durability waits of one shard call: appended to each of its pipelines, judged per reply.

    With ``local_aof``: ``WAITAOF 1 0 <ms>`` (the master's own fsync); with ``replicas``: ``WAIT <n> <ms>``
    (replicas that received the writes). ``WAITAOF <n>`` is not used for replicas: it counts only replicas
    that fsynced to an AOF of their own, so replicas with ``appendonly no`` would never count (tested:
    Valkey answers ``[1, 0]`` where WAIT says 1), and the same Durability would mean something else
    before Redis 7.2. A shortfall the server did not refuse is asked again on the same connection until
    the deadline (counted from the call's first waits, across its resends); the last shortfall is kept
    and raised by :meth:`check` once the call is done, so every reply of the call is read first and each
    connection goes back to its pool clean.
    """

    def __init__(self, durability: Durability | None) -> None:
        self.durability = durability
        self.commands: list[Command] = []
        if durability is not None:
            ms = durability.timeout_ms
            if durability.local_aof:
                self.commands.append(("WAITAOF", 1, 0, ms))
            if durability.replicas:
                self.commands.append(("WAIT", durability.replicas, ms))
        self.until: float | None = None  # when asking again stops (set when the call first sends its waits)
        self.shortfall: DurabilityError | None = None
        self.on_replica = False  # a WAIT refused because the node is a replica (a failed-over master)
        self.asked_again = False  # logged once per call

    def begin(self) -> None:
        """Forget what an earlier attempt of the call (on a node since replaced) judged; keep the deadline."""
        self.shortfall = None
        self.on_replica = False

    def pipeline(self, node: Shard, commands: list[Command]) -> list[Any]:
        """:func:`pipeline` of ``commands`` (with waits: one raw round trip, the connection held while the
        waits are asked again); the commands' replies."""
        if not self.commands:
            return pipeline(node.client, commands)
        return self.streamed(node, [commands])

    def streamed(self, node: Shard, chunks: list[list[Command]]) -> list[Any]:
        """:func:`_streamed` with the waits sent after the last chunk on the same connection."""
        if not self.commands or not chunks:
            return _streamed(node.client, chunks)
        asked = self.durability
        assert asked is not None
        if self.until is None:
            self.until = time.monotonic() + asked.waits_for
        n = len(self.commands)

        def settle(conn: Any, replies: list[Any]) -> None:
            if self.shortfall is not None:  # an earlier pipeline of the call fell short for good
                return
            self._judge(node.name, replies[-n:])
            while self._again():
                self._judge(node.name, self._ask(conn))

        replies = _streamed(node.client, [*chunks[:-1], [*chunks[-1], *self.commands]], settle)
        return replies[:-n]

    def _again(self) -> bool:
        """Whether to ask again: a shortfall the server did not refuse (a refusal stays one), time left."""
        short = self.shortfall
        if short is None or short.reason or self.until is None:
            return False
        left = self.until - time.monotonic()
        if left <= 0:
            return False
        if not self.asked_again:
            self.asked_again = True
            log.warning(
                "%s: %s; asking again for up to %.1f s (Durability.deadline)", short.shard, short.shortfall, left
            )
        self.shortfall = None
        return True

    def _ask(self, conn: Any) -> list[Any]:
        """The waits again on ``conn`` (they cover its writes), none blocking past the deadline."""
        assert self.until is not None and self.durability is not None
        ms = max(1, min(self.durability.timeout_ms, round((self.until - time.monotonic()) * 1000)))
        commands = [(*c[:-1], ms) for c in self.commands]
        conn.send_packed_command(conn.pack_commands(commands))
        replies: list[Any] = []
        for _ in commands:
            try:
                replies.append(conn.read_response())
            except redis.ResponseError as exc:
                replies.append(exc)
        return replies

    def _judge(self, name: str, replies: list[Any]) -> None:
        asked = self.durability
        if asked is None or self.shortfall is not None:
            return
        local: bool | None = None
        replicas: int | None = None
        reasons: list[str] = []
        for command, reply in zip(self.commands, replies, strict=True):
            if isinstance(reply, BaseException):
                text = str(reply).strip()
                self.on_replica |= "replica" in text.lower()
                if command[0] == "WAITAOF" and "unknown command" in text.lower():
                    reasons.append("the server has no WAITAOF (Redis < 7.2): its AOF fsync cannot be confirmed")
                else:
                    reasons.append(f"{command[0]} refused: {text}")
                if command[0] == "WAITAOF":
                    local = False
            elif command[0] == "WAITAOF":
                local = int(reply[0]) >= 1
            else:
                replicas = int(reply)
        if (asked.local_aof and not local) or (replicas or 0) < asked.replicas or reasons:
            self.shortfall = DurabilityError(name, asked, replicas, local, "; ".join(reasons))

    def check(self) -> None:
        """Raise the shortfall seen, if any."""
        if self.shortfall is not None:
            raise self.shortfall


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


def _hiredis_packed(commands: list[Command]) -> list[bytes]:
    """The RESP bytes of ``commands`` (whose arguments are str, bytes, int or float, as every command
    built here), one hiredis call each: redis-py's own packer first walks every argument in Python,
    which took about a fifth of the client's profiled time for calls of many small arguments."""
    assert _pack_command is not None
    return [b"".join([_pack_command(command) for command in commands])]


def _streamed(
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
    packer = conn.pack_commands if _pack_command is None else _hiredis_packed

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
            for _ in chunk:
                try:
                    replies.append(conn.read_response())
                except redis.ResponseError as exc:
                    replies.append(exc)
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
    return in_order(items, answers)


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
    return in_order(items, answers)


def in_order(items: Sequence[Any], answers: list[Any]) -> ReadResult[Any, Any]:
    """A ReadResult keyed by ``items`` in the caller's order; ShardFailure answers go to ``errors``."""
    result: ReadResult[Any, Any] = ReadResult()
    for item, answer in zip(items, answers, strict=True):
        if isinstance(answer, ShardFailure):
            result.errors[item] = answer
        else:
            result[item] = answer
    return result
