"""Shard I/O: commands pipelined per shard, shards in parallel, script reloads; cluster redirects and
failovers are followed by :mod:`zcluster._follow`.

Nothing here knows about sorted sets: the cluster hands over lists of commands per shard and gets replies
(or per-command errors) back. Resending is always safe because every command the cluster sends is either
a read or an idempotent write.

Pipelines themselves are :mod:`zcluster._pipelines`; the durability waits that end a write's pipeline,
:mod:`zcluster._durability`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import redis
from redis.exceptions import AskError, MovedError, NoPermissionError, NoScriptError, TryAgainError

from zcluster._durability import Waits
from zcluster._follow import demoted, follow, node_down, redirected
from zcluster._moves import Successor
from zcluster._pipelines import Command, SharedCommands
from zcluster._scripts import Script
from zcluster._server_module import PROTOCOL
from zcluster._server_module import version as module_version
from zcluster._topology import Shard, Topology
from zcluster.errors import DurabilityError, ShardError
from zcluster.types import Durability, ReadResult, ShardFailure

log = logging.getLogger("zcluster")

T = TypeVar("T")
R = TypeVar("R")

SHARD_ERRORS = (redis.RedisError, OSError, ShardError, DurabilityError)
"""Errors that mean "this shard could not do it"; anything else is a bug and propagates."""


class Transport:
    """Runs commands on the shards of ``topology``; reloads ``scripts`` where the server lost them."""

    def __init__(self, topology: Topology, scripts: Sequence[Script], pipeline_calls: int) -> None:
        self.topology = topology
        self.scripts = scripts
        self.pipeline_calls = pipeline_calls
        self.refused: set[str] = set()  # names of optional scripts a server refused to load
        self.native: dict[str, bool] = {}  # shard name -> whether it serves the module's commands (natively)
        self.guard: Any = None  # the layout guard of its shards (zcluster._guard), once installed
        self.successor = Successor()  # the transport of the layout a migration moved the store to
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
        if self.successor.value is not None:
            self.successor.value.close()

    def fanout(self, work: dict[int, T], fn: Callable[[Shard, T], R]) -> dict[int, R | BaseException]:
        """Run ``fn(shard, work)`` for every shard, in parallel threads; shard errors become values."""
        shards = self.topology.shards

        def guarded(idx: int) -> R | BaseException:
            try:
                return self.node_call(shards[idx], lambda: fn(shards[idx], work[idx]))
            except SHARD_ERRORS as exc:
                # A migration's cut-over closes every connection to its source: a call it cut off goes again
                # once (idempotent), or raises StoreMoved when the store moved meanwhile (see zcluster._moves).
                if not isinstance(exc, redis.ConnectionError) or self.guard is None or not self.guard.recheck(idx):
                    return exc
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

    def native_writes(self, shard: Shard) -> bool | None:
        """Whether ``shard`` has zcluster's Redis module loaded, speaking this client's :data:`PROTOCOL`
        (:mod:`zcluster._server_module`); None until :meth:`natively` first wrote to it. Asks no server: the
        callers pack calls with it, on the caller's thread."""
        return self.native.get(shard.name)

    def natively(
        self, shard: Shard, commands: list[Command], sha: str, durability: Durability | None = None
    ) -> list[Any]:
        """:meth:`writes` of ``commands``, some of which may be the module's (``ZCLUSTER.WRITE`` or
        ``ZCLUSTER.INCR``: the arguments of the script ``sha`` after its SHA).

        A server not asked yet is asked first, ``ZCLUSTER.VERSION``, once, on this (the shard's sending)
        thread; the answer is remembered for the calls packed next (a server that loads the module later is
        used by clients made later). A call the server answers as an unknown command (restarted without the
        module) or refuses to the user (an ACL changed) is sent again as the script, and the server gets
        the scripts from then on."""
        if shard.name not in self.native:
            # a shard error propagates: the writes would fail alike
            found = self.native[shard.name] = module_version(shard.client) == PROTOCOL
            if found:
                log.info("%s: writes go to its zcluster module", shard.name)
        replies = self.writes(shard, commands, durability)
        gone = [j for j, r in enumerate(replies) if commands[j][0] != "EVALSHA" and _not_served(r)]
        if gone:
            self.native[shard.name] = False
            log.warning("%s no longer serves the zcluster module's commands: its writes go to the scripts", shard.name)
            again = [("EVALSHA", sha, *commands[j][1:]) for j in gone]
            for j, r in zip(gone, self.writes(shard, again, durability), strict=True):
                replies[j] = r
        return replies

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
        waits = Waits(durability)  # one per call: its deadline spans the call's resends to other nodes
        return follow(self.topology, shard, commands, lambda node, todo: self._once(node, todo, streamed, waits))

    def _once(self, shard: Shard, commands: list[Command], streamed: bool, waits: Waits) -> list[Any]:
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


def _not_served(reply: Any) -> bool:
    """A module command's reply saying the server does not run it for this user: no such command, or no
    permission (the scripts may still be allowed)."""
    return isinstance(reply, NoPermissionError) or (
        isinstance(reply, redis.ResponseError) and "unknown command" in str(reply)
    )


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
    streamed: bool = False,
) -> ReadResult[Any, Any]:
    """Pipeline ``build(key, position)`` commands per shard, then ``parse(item, replies)`` per item.

    ``encoded[i]`` is (shard index, encoded key) of ``items[i]``. Items of a failed shard land in the
    result's ``errors``; every other item is answered. ``streamed``: :meth:`Transport.commands`' streamed
    pipelines, whose replies are raw (the connection's protocol's shapes, no redis-py callbacks).
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
    outcome = transport.fanout(commands, lambda shard, cmds: transport.commands(shard, cmds, streamed))
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
