"""The cluster: 2P-set CRDT sorted sets over a topology of Redis servers.

Writes go through one Lua script (``lua/write.lua``) that applies many tuples per call atomically per
tuple. Tuples are grouped by shard (by hash slot on a Redis Cluster), split into calls of at most
``batch_size`` tuples, pipelined per shard, and the shards run in parallel threads.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import redis
from redis.exceptions import AskError, MovedError, NoScriptError, TryAgainError

from zcluster import scripts
from zcluster.instrumentation import Instrumentation, OpEvent, nop
from zcluster.keys import KeyLayout
from zcluster.topology import ClusterTopology, Routing, Shard, StandaloneTopology, Topology
from zcluster.types import (
    NOT_PRESENT,
    Blob,
    ConfigError,
    Cursor,
    InvalidTupleError,
    KeyMember,
    KeyScoreMember,
    PartialReadError,
    Presence,
    ShardFailure,
    WriteResult,
    ZClusterError,
    check_limit,
    from_bytes,
    to_bytes,
)

T = TypeVar("T")
R = TypeVar("R")
K = TypeVar("K", bound=Hashable)

_MAX_EXACT_INT = 1 << 53
_MAX_REDIRECTS = 32
#: Errors that mean "this shard could not do it"; anything else is a bug and propagates.
_SHARD_ERRORS = (redis.RedisError, OSError)


class ReadResult(dict[K, T]):
    """A dict of answers per key; ``errors`` maps keys whose shard failed to the failure (empty if none).

    Returned by reads with ``strict=False``; with ``strict=True`` (default) a failure raises
    :class:`PartialReadError` instead, carrying the same two parts.
    """

    errors: dict[K, ShardFailure]

    def __init__(self) -> None:
        super().__init__()
        self.errors = {}


def _in_order(items: Sequence[Any], answers: list[Any]) -> ReadResult[Any, Any]:
    """A ReadResult keyed by ``items`` in the caller's order; ShardFailure answers go to ``errors``."""
    result: ReadResult[Any, Any] = ReadResult()
    for item, answer in zip(items, answers, strict=True):
        if isinstance(answer, ShardFailure):
            result.errors[item] = answer
        else:
            result[item] = answer
    return result


@dataclass
class _Call:
    indices: list[int]
    keys: list[bytes]
    argv: list[Any]


def _score_pairs(raw: list[Any]) -> list[tuple[bytes, float]]:
    """(member, score) pairs of a WITHSCORES reply, flat (older redis-py) or already paired (redis-py 8)."""
    if raw and isinstance(raw[0], list | tuple):
        return [(m, float(s)) for m, s in raw]
    return [(raw[j], float(raw[j + 1])) for j in range(0, len(raw), 2)]


def _blob(value: object, index: int, item: object, what: str) -> bytes:
    if type(value) is bytes:
        return value
    if type(value) is str:
        return value.encode("utf-8", "surrogateescape")
    if isinstance(value, bytes | str):  # subclasses
        return to_bytes(value)
    raise InvalidTupleError(index, item, f"{what} must be str or bytes, not {type(value).__name__}")


def _score(value: object, index: int, item: object) -> float:
    if type(value) is float:
        if value - value == 0.0:  # false for NaN and both infinities
            return value
        raise InvalidTupleError(index, item, f"score must be a finite number, got {value!r}")
    if isinstance(value, int) and not isinstance(value, bool):
        if -_MAX_EXACT_INT <= value <= _MAX_EXACT_INT or float(value) == value:
            return float(value)
        raise InvalidTupleError(index, item, f"integer score {value} is not exact as a double (|x| > 2**53)")
    if isinstance(value, float):
        return _score(float(value), index, item)
    raise InvalidTupleError(index, item, f"score must be int or float, not {type(value).__name__}")


class Cluster:
    """CRDT sorted sets (a last-writer-wins 2P-set) over standalone Redis shards or a Redis Cluster.

    Semantics, per logical set K and member m (``docs/architecture.md`` has the full contract):

    * ``insert`` of (K, s, m) takes effect unless the cluster holds a newer-or-equal record of m (an insert
      with score >= s or a delete with score >= s); a delete takes effect unless it holds an insert with
      score > s or a delete with score >= s. A delete thus wins a tie in either order, applying a tuple
      twice changes nothing, and the visible state does not depend on the order of the writes.
    * With ``max_size=N`` each of K+ and K- keeps its N highest entries. Whatever is trimmed raises a
      per-key floor; inserts at or below the floor are stale. Trimming never resurrects a deleted member
      (unlike roshi), but it forgets: see the architecture notes for the exact weakening.
    * ``select`` reads K+ only, highest score first, ties by member descending; a key never written or
      holding only deletes reads as an empty list.

    Errors: invalid input raises :class:`InvalidTupleError` before anything is sent. A shard that fails
    is reported, never dropped: writes raise :class:`PartialWriteError` (or return it in
    ``WriteResult.failures`` with ``raise_on_error=False``); reads raise :class:`PartialReadError` (or fill
    ``ReadResult.errors`` with ``strict=False``).

    Thread-safe: one Cluster may be shared by threads.
    """

    def __init__(
        self,
        topology: Topology,
        *,
        max_size: int | None = None,
        floors: bool | None = None,
        prefix: Blob = "zc:",
        batch_size: int = 256,
        pipeline_calls: int = 64,
        decode: bool = True,
        instrumentation: Instrumentation = nop,
    ) -> None:
        if max_size is not None and (isinstance(max_size, bool) or not isinstance(max_size, int) or max_size <= 0):
            raise ConfigError(f"max_size must be a positive int or None, got {max_size!r}")
        if batch_size <= 0 or pipeline_calls <= 0:
            raise ConfigError("batch_size and pipeline_calls must be positive")
        self.topology = topology
        self.layout = KeyLayout(prefix)
        self.max_size = max_size
        if floors is False and max_size is not None:
            raise ConfigError("a size bound needs floors: trimming without them would resurrect deleted members")
        self.floors = max_size is not None if floors is None else floors
        self.batch_size = batch_size
        self.pipeline_calls = pipeline_calls
        self.decode = decode
        self.instrumentation = instrumentation
        self._script = scripts.write_script()
        self._forget = scripts.forget_script()
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()

    # -- construction -------------------------------------------------------------------------------------

    @classmethod
    def from_urls(
        cls, urls: Sequence[str], *, routing: Routing = "jump", connection: dict[str, Any] | None = None, **options: Any
    ) -> Cluster:
        """Standalone shards, routed client-side (``routing``: ``"jump"`` or roshi's ``"roshi"``).

        ``connection`` holds extra redis-py connection options (e.g. ``ssl_ca_certs``); URLs may carry ACL
        credentials (``redis://user:pass@host:port``) and TLS (``rediss://``).
        """
        return cls(StandaloneTopology(urls, routing, **(connection or {})), **options)

    @classmethod
    def from_cluster_url(cls, url: str, *, connection: dict[str, Any] | None = None, **options: Any) -> Cluster:
        """A native Redis Cluster, discovered from one seed node's URL."""
        return cls(ClusterTopology(url, **(connection or {})), **options)

    def close(self) -> None:
        """Close every connection and the worker threads."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        self.topology.close()

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        names = ", ".join(s.name for s in self.topology.shards)
        return f"Cluster({type(self.topology).__name__}[{names}], max_size={self.max_size})"

    # -- writes -------------------------------------------------------------------------------------------

    def insert(
        self, tuples: Iterable[KeyScoreMember | tuple[Blob, float, Blob]], *, raise_on_error: bool = True
    ) -> WriteResult:
        """Add members (see the class semantics). Returns which tuples took effect.

        Raises :class:`InvalidTupleError` (nothing sent) or :class:`PartialWriteError` when a shard failed
        (the error's ``result`` says which tuples are unconfirmed; resending them is safe).
        """
        return self._write(b"+", "insert", tuples, raise_on_error)

    def delete(
        self, tuples: Iterable[KeyScoreMember | tuple[Blob, float, Blob]], *, raise_on_error: bool = True
    ) -> WriteResult:
        """Remove members, leaving tombstones (also for members never inserted). Same contract as insert."""
        return self._write(b"-", "delete", tuples, raise_on_error)

    def _write(self, op: bytes, name: str, tuples: Iterable[Any], raise_on_error: bool) -> WriteResult:
        started = time.perf_counter()
        items = tuples if isinstance(tuples, list | tuple) else list(tuples)
        work = self._encode_writes(items)
        sha = self._script.sha
        bound = self.max_size or 0
        floors = self.floors
        flag = b"1" if floors else b"0"
        applied = [False] * len(items)
        commands: dict[int, list[tuple[Any, ...]]] = {}
        index_lists: dict[int, list[list[int]]] = {}
        for shard_idx, calls in work.items():
            commands[shard_idx] = [("EVALSHA", sha, len(c.keys), *c.keys, op, bound, flag, *c.argv) for c in calls]
            index_lists[shard_idx] = [c.indices for c in calls]
        outcome = self._fanout(commands, self._run_writes)
        failures: list[ShardFailure] = []
        for shard_idx, res in outcome.items():
            name_ = self.topology.shards[shard_idx].name
            if isinstance(res, BaseException):
                failed = [i for idx in index_lists[shard_idx] for i in idx]
                failures.append(ShardFailure(name_, res, tuple(failed)))
                continue
            bad: list[int] = []
            first_error: BaseException | None = None
            for indices, reply in zip(index_lists[shard_idx], res, strict=True):
                if isinstance(reply, BaseException):
                    bad.extend(indices)
                    first_error = first_error or reply
                    continue
                for i, flag in zip(indices, reply, strict=True):
                    applied[i] = flag == 49  # b"1"
            if first_error is not None:
                failures.append(ShardFailure(name_, first_error, tuple(bad)))
        result = WriteResult(applied, failures)
        self.instrumentation(
            OpEvent(
                name, len(items), time.perf_counter() - started, result.applied_count, tuple(f.shard for f in failures)
            )
        )
        return result.raise_for_failures() if raise_on_error else result

    def _encode_writes(self, items: Sequence[Any]) -> dict[int, list[_Call]]:
        """Validate every tuple, then pack them into script calls per shard (per slot on a Redis Cluster).

        A call holds groups of tuples of one logical key each (its Redis keys are sent once, and the script
        reads and writes each group's sets in a few commands); a key's tuples keep the caller's order.
        """
        layout, topo = self.layout, self.topology
        head = layout.head
        floors = self.floors
        by_slot = topo.by_slot
        keyed: dict[bytes, tuple[tuple[int, int], list[int], list[Any]]] = {}
        for i, item in enumerate(items):
            try:
                key, score, member = item
            except (TypeError, ValueError):
                raise InvalidTupleError(i, item, "expected a (key, score, member) tuple") from None
            kb = _blob(key, i, item, "key")
            mb = _blob(member, i, item, "member")
            s = _score(score, i, item)
            entry = keyed.get(kb)
            if entry is None:
                if not kb:
                    raise InvalidTupleError(i, item, "key must not be empty")
                slot = layout.slot(kb)
                entry = keyed[kb] = ((topo.shard_of(kb, slot), slot if by_slot else 0), [], [])
            entry[1].append(i)
            entry[2].extend((s, mb))
        per_shard: dict[int, list[_Call]] = {}
        filling: dict[tuple[int, int], _Call] = {}
        size = self.batch_size
        for kb, (group, indices, argv) in keyed.items():
            base = head + kb
            rkeys = (base + b"}+", base + b"}-", base + b"}~") if floors else (base + b"}+", base + b"}-")
            done = 0
            while done < len(indices):
                call = filling.get(group)
                if call is None:
                    call = filling[group] = _Call([], [], [])
                take = min(size - len(call.indices), len(indices) - done)
                call.keys += rkeys
                call.argv.append(take)
                call.argv += argv[2 * done : 2 * (done + take)]
                call.indices += indices[done : done + take]
                done += take
                if len(call.indices) >= size:
                    per_shard.setdefault(group[0], []).append(filling.pop(group))
        for group, call in filling.items():
            per_shard.setdefault(group[0], []).append(call)
        return per_shard

    # -- reads --------------------------------------------------------------------------------------------

    def select(
        self, keys: Iterable[Blob], offset: int = 0, limit: int = 10, *, strict: bool = True
    ) -> ReadResult[Blob, list[KeyScoreMember]]:
        """The members of each key's add set, highest score first (ties: member descending).

        ``offset`` skips that many members; ``limit`` (> 0) caps the answer per key. A key never written
        reads as ``[]``. Result keys are the caller's key objects.
        """
        check_limit(limit, offset)
        started = time.perf_counter()
        key_list = list(keys)
        encoded = self._encode_keys(key_list)
        adds = self.layout.adds
        stop = offset + limit - 1
        result = self._read(
            key_list,
            encoded,
            lambda kb, _: [("ZREVRANGE", adds(kb), offset, stop, "WITHSCORES")],
            lambda key, replies: self._pairs(key, replies[0]),
        )
        return self._finish("select", result, len(key_list), started, strict)

    def select_range(
        self,
        keys: Iterable[Blob],
        start: Cursor | None = None,
        stop: Cursor | None = None,
        limit: int = 10,
        *,
        strict: bool = True,
    ) -> ReadResult[Blob, list[KeyScoreMember]]:
        """Cursor paging: members strictly after ``start`` and strictly before ``stop`` in select order.

        ``None`` means the beginning (highest score) or the end. The last element of a page, as
        ``Cursor(score, member)``, is the ``start`` of the next page. Semantics are roshi's SelectRange.
        """
        check_limit(limit)
        started = time.perf_counter()
        key_list = list(keys)
        encoded = self._encode_keys(key_list)
        hi = repr(float(start.score)) if start is not None else "+inf"
        lo = repr(float(stop.score)) if stop is not None else "-inf"
        start_m = to_bytes(start.member) if start is not None else b""
        stop_m = to_bytes(stop.member) if stop is not None else b""
        adds = self.layout.adds

        def wanted(score: float, member: bytes) -> int:
            """1 keep, 0 skip (at or above start), -1 done (at or below stop)."""
            if start is not None and (score > start.score or (score == start.score and member >= start_m)):
                return 0
            if stop is not None and (score < stop.score or (score == stop.score and member <= stop_m)):
                return -1
            return 1

        def page(shard: Shard, kb: bytes) -> list[tuple[bytes, float]]:
            out: list[tuple[bytes, float]] = []
            offset, count = 0, limit + 16
            while True:
                command = ("ZREVRANGEBYSCORE", adds(kb), hi, lo, "WITHSCORES", "LIMIT", offset, count)
                pairs = _score_pairs(self._run_one(shard, command))
                for member, score in pairs:
                    verdict = wanted(score, member)
                    if verdict < 0:
                        return out
                    if verdict:
                        out.append((member, score))
                        if len(out) == limit:
                            return out
                if len(pairs) < count:
                    return out
                offset += count
                count *= 2

        result = self._read_each(key_list, encoded, page)
        return self._finish("select_range", result, len(key_list), started, strict)

    def score(
        self, key_members: Iterable[KeyMember | tuple[Blob, Blob]], *, strict: bool = True
    ) -> ReadResult[KeyMember, Presence]:
        """Whether each member is present, inserted or deleted, and at which score (see :class:`Presence`)."""
        started = time.perf_counter()
        items = [KeyMember(*km) for km in key_members]
        encoded = self._encode_keys([km.key for km in items])
        members = [_blob(km.member, i, km, "member") for i, km in enumerate(items)]
        layout = self.layout

        def presence(km: KeyMember, replies: list[Any]) -> Presence:
            ins, dele = replies
            if ins is not None and dele is not None:
                raise ZClusterError(f"member {km.member!r} of {km.key!r} is in both K+ and K- (foreign write?)")
            if ins is not None:
                return Presence(True, True, float(ins))
            if dele is not None:
                return Presence(True, False, float(dele))
            return NOT_PRESENT

        result = self._read(
            items,
            encoded,
            lambda kb, pos: [("ZSCORE", layout.adds(kb), members[pos]), ("ZSCORE", layout.removes(kb), members[pos])],
            presence,
        )
        return self._finish("score", result, len(items), started, strict)

    def keys(
        self,
        batch_size: int = 1000,
        *,
        include_removed: bool = False,
        match: Blob | None = None,
        progress: Callable[[str, int], None] | None = None,
    ) -> Iterator[list[Blob]]:
        """Every logical key, in lists of up to ``batch_size``, shard after shard (SCAN: no blocking).

        Each key is reported once per scan even where SCAN repeats it (or holds both K+ and K-). Keys
        holding only deletes are included with ``include_removed``. ``match`` is a Redis glob over the
        logical key. Keys written while the scan runs may or may not be reported. ``progress(shard, n)``
        is called after each SCAN step with the keys found so far on that shard. A failed shard raises
        :class:`PartialReadError` naming it (keys already yielded stay valid).
        """
        check_limit(batch_size)
        pattern = self.layout.scan_pattern(to_bytes(match) if match is not None else None, include_removed)
        batch: list[Blob] = []
        for shard in self.topology.masters():
            seen: set[bytes] = set()
            cursor = 0
            while True:
                try:
                    cursor, raw = shard.client.scan(cursor, match=pattern, count=batch_size)
                except _SHARD_ERRORS as exc:
                    failure = ShardFailure(shard.name, exc, ())
                    raise PartialReadError({}, {shard.name: failure}) from exc
                for rk in raw:  # bytes: clients never decode
                    parts = self.layout.logical(to_bytes(rk))
                    if parts is None or parts[0] in seen:
                        continue
                    seen.add(parts[0])
                    batch.append(from_bytes(parts[0]) if self.decode else parts[0])
                    if len(batch) >= batch_size:
                        yield batch
                        batch = []
                if progress is not None:
                    progress(shard.name, len(seen))
                if cursor == 0:
                    break
        if batch:
            yield batch

    def forget(self, keys: Iterable[Blob], up_to: float) -> int:
        """Retention: drop every record (inserts and tombstones) of ``keys`` with score <= ``up_to``.

        The keys' floors rise to ``up_to``, so later writes at or below it are stale: nothing forgotten
        comes back through a late replay. Needs ``floors`` (a Cluster built with ``floors=True`` or a
        ``max_size``); without them a forgotten tombstone would let an older insert resurrect. Returns
        the number of entries removed. A failed shard raises :class:`PartialReadError` naming its keys.
        """
        if not self.floors:
            raise ConfigError("forget() needs a Cluster with floors=True (or max_size)")
        started = time.perf_counter()
        bound = _score(up_to, 0, up_to)
        key_list = list(keys)
        encoded = self._encode_keys(key_list)
        layout, sha = self.layout, self._forget.sha
        result = self._read(
            key_list,
            encoded,
            lambda kb, _: [("EVALSHA", sha, 3, layout.adds(kb), layout.removes(kb), layout.floor(kb), bound)],
            lambda key, replies: int(replies[0]),
        )
        self._finish("forget", result, len(key_list), started, True)
        return sum(result.values())

    def load_scripts(self) -> None:
        """Load the scripts on every master now (they are otherwise loaded on first NOSCRIPT)."""
        for shard in self.topology.masters():
            self._load_on(shard.client)

    def _load_on(self, client: redis.Redis) -> None:
        client.script_load(self._script.source)
        client.script_load(self._forget.source)

    # -- read plumbing ------------------------------------------------------------------------------------

    def _encode_keys(self, keys: Sequence[Blob]) -> list[tuple[int, bytes]]:
        out = []
        for i, key in enumerate(keys):
            kb = _blob(key, i, key, "key")
            if not kb:
                raise InvalidTupleError(i, key, "key must not be empty")
            out.append((self.topology.shard_of(kb, self.layout.slot(kb)), kb))
        return out

    def _pairs(self, key: Blob, raw: list[bytes]) -> list[KeyScoreMember]:
        dec = from_bytes if self.decode else bytes
        return [KeyScoreMember(key, score, dec(member)) for member, score in _score_pairs(raw)]

    def _read(
        self,
        items: Sequence[Any],
        encoded: list[tuple[int, bytes]],
        build: Callable[[bytes, int], list[tuple[Any, ...]]],
        parse: Callable[[Any, list[Any]], Any],
    ) -> ReadResult[Any, Any]:
        """Pipeline ``build(kb, position)`` commands per shard, then ``parse(item, replies)`` per item."""
        work: dict[int, list[int]] = {}
        for pos, (shard_idx, _) in enumerate(encoded):
            work.setdefault(shard_idx, []).append(pos)
        commands: dict[int, list[tuple[Any, ...]]] = {}
        widths: dict[int, list[int]] = {}
        for shard_idx, positions in work.items():
            cmds: list[tuple[Any, ...]] = []
            ws: list[int] = []
            for pos in positions:
                kb = encoded[pos][1]
                built = build(kb, pos)
                cmds.extend(built)
                ws.append(len(built))
            commands[shard_idx], widths[shard_idx] = cmds, ws
        outcome = self._fanout(commands, self._run_commands)
        answers: list[Any] = [None] * len(items)
        for shard_idx, positions in work.items():
            res = outcome[shard_idx]
            name = self.topology.shards[shard_idx].name
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

    def _read_each(
        self,
        items: Sequence[Any],
        encoded: list[tuple[int, bytes]],
        fetch: Callable[[Shard, bytes], list[tuple[bytes, float]]],
    ) -> ReadResult[Any, Any]:
        work: dict[int, list[int]] = {}
        for pos, (shard_idx, _) in enumerate(encoded):
            work.setdefault(shard_idx, []).append(pos)

        def run(shard: Shard, positions: list[int]) -> list[Any]:
            out: list[Any] = []
            for pos in positions:
                try:
                    out.append(fetch(shard, encoded[pos][1]))
                except _SHARD_ERRORS as exc:
                    out.append(exc)
            return out

        outcome = self._fanout(work, run)
        dec = from_bytes if self.decode else bytes
        answers: list[Any] = [None] * len(items)
        for shard_idx, positions in work.items():
            res = outcome[shard_idx]
            name = self.topology.shards[shard_idx].name
            for n, pos in enumerate(positions):
                value = res if isinstance(res, BaseException) else res[n]
                if isinstance(value, BaseException):
                    answers[pos] = ShardFailure(name, value, (pos,))
                else:
                    answers[pos] = [KeyScoreMember(items[pos], s, dec(m)) for m, s in value]
        return _in_order(items, answers)

    def _finish(
        self, op: str, result: ReadResult[Any, Any], records: int, started: float, strict: bool
    ) -> ReadResult[Any, Any]:
        shards = tuple(sorted({f.shard for f in result.errors.values()}))
        self.instrumentation(OpEvent(op, records, time.perf_counter() - started, 0, shards))
        if strict and result.errors:
            raise PartialReadError(dict(result), dict(result.errors))
        return result

    # -- execution ----------------------------------------------------------------------------------------

    def _fanout(self, work: dict[int, T], fn: Callable[[Shard, T], R]) -> dict[int, R | BaseException]:
        """Run ``fn(shard, work)`` for every shard, in parallel threads; shard errors become values."""
        shards = self.topology.shards

        def guarded(idx: int) -> R | BaseException:
            try:
                return fn(shards[idx], work[idx])
            except _SHARD_ERRORS as exc:
                return exc

        if len(work) <= 1:
            return {idx: guarded(idx) for idx in work}
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=32, thread_name_prefix="zcluster")
            pool = self._pool
        futures = {idx: pool.submit(guarded, idx) for idx in work}
        return {idx: f.result() for idx, f in futures.items()}

    def _run_writes(self, shard: Shard, commands: list[tuple[Any, ...]]) -> list[Any]:
        return self._run_commands(shard, commands, streamed=True)

    def _run_commands(self, shard: Shard, commands: list[tuple[Any, ...]], streamed: bool = False) -> list[Any]:
        """Pipeline ``commands`` to ``shard``; replies (or per-command errors) in order.

        NOSCRIPT (restart, failover, SCRIPT FLUSH) reloads the script and resends; MOVED/ASK/TRYAGAIN
        follow the cluster. Resending is safe because every write is idempotent. ``streamed`` overlaps
        the client's packing with the server's work (for write calls, whose replies are plain values).
        """
        step = self.pipeline_calls
        chunks = [commands[lo : lo + step] for lo in range(0, len(commands), step)]
        if streamed:
            replies = self._streamed(shard.client, chunks)
        else:
            replies = [r for chunk in chunks for r in self._pipeline(shard.client, chunk)]
        missing = [j for j, r in enumerate(replies) if isinstance(r, NoScriptError)]
        if missing:
            self._load_on(shard.client)
            for j, r in zip(missing, self._pipeline(shard.client, [commands[j] for j in missing]), strict=True):
                replies[j] = r
        for j, r in enumerate(replies):
            if isinstance(r, MovedError | AskError | TryAgainError):
                replies[j] = self._redirected(shard, commands[j], r)
        return replies

    def _run_one(self, shard: Shard, command: tuple[Any, ...]) -> Any:
        reply = self._run_commands(shard, [command])[0]
        if isinstance(reply, BaseException):
            raise reply
        return reply

    @staticmethod
    def _streamed(client: redis.Redis, chunks: list[list[tuple[Any, ...]]]) -> list[Any]:
        """Send chunk k+1 before reading chunk k's replies, so the client packs while the server works.

        Replies are raw (no redis-py response callbacks) and in order; error replies are values. A lost
        connection resends every chunk on a fresh one (redis-py's retry policy): writes are idempotent.
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

    @staticmethod
    def _pipeline(client: redis.Redis, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
        pipe = client.pipeline(transaction=False)
        for command in commands:
            pipe.execute_command(*command)
        return list(pipe.execute(raise_on_error=False))

    def _redirected(self, shard: Shard, command: tuple[Any, ...], error: Exception) -> Any:
        client = shard.client
        for attempt in range(_MAX_REDIRECTS):
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
            reply = self._pipeline(client, cmds)[-1]
            if isinstance(reply, NoScriptError):
                self._load_on(client)
                reply = self._pipeline(client, cmds)[-1]
            if not isinstance(reply, MovedError | AskError | TryAgainError):
                return reply
            error = reply
        return ZClusterError(f"gave up after {_MAX_REDIRECTS} cluster redirects (last: {error})")
