"""Fenced increments (:class:`zcluster.Incr`, :class:`zcluster.Count`): validated, packed into calls of
``lua/incr.lua`` per shard (per slot on a Redis Cluster), sent in rounds, their verdicts read back.

Exactly once, per (key, source): the script applies an increment only if its position is above the key's
fence for that source and moves the fence in the same call, so a resend, a replay or a zombie changes
nothing. Positions are (c, m, j) triples. Two rules keep the fence from skipping anything:

* a call's increments of one key keep the caller's order, and a key's increments beyond ``batch_size``
  go in later rounds, each sent only once the one before it was confirmed;
* a key whose call failed (or whose total was refused) gets none of its later increments sent in this
  call: they are reported unconfirmed, so the caller resends them, in order, after the failed ones.

Why this module is long: it holds the increments' validation, their sending in rounds and slices, and the
``Cluster`` API of aggregate keys, kept together because the three share one format (positions, fences,
verdicts). An aggregate key read or replaced whole (a farm's repairs) is :mod:`zcluster._aggregate_keys`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import Future
from typing import Any

from zcluster._aggregate_keys import FENCE, WholeKeys, counters_of
from zcluster._encode import Encoder, blob, listed_keys, positive
from zcluster._encode import key_members as key_members_of
from zcluster._reporting import Reporting
from zcluster._scripts import Script
from zcluster._topology import Shard, StandaloneTopology
from zcluster._transport import Transport, read
from zcluster._writes import refusal
from zcluster.errors import ConfigError, InvalidTupleError
from zcluster.types import (
    Blob,
    Count,
    Durability,
    Fence,
    Incr,
    KeyMember,
    KeyScoreMember,
    ReadResult,
    ShardFailure,
    WriteResult,
    from_bytes,
)

Position = int | tuple[int, int] | tuple[int, int, int]
"""Where an increment comes from in its source: an offset, (offset, offset) or a full (c, m, j) triple."""

MAX_POSITION = 1 << 53  # positions travel as Lua numbers (doubles)
MAX_TTL = 10**10  # seconds; Redis refuses an EXPIRE whose deadline in ms overflows int64, after the totals moved
_SLICE = 2048  # increments per shard sent while the next are built (see IncrementPlan.send)
_EXACT = 1 << 53  # integers a double holds exactly
INT64 = (-(1 << 63), (1 << 63) - 1)
_REASONS = {
    ord("k"): "its key is of another kind (a 2P-set, or the other kind of aggregate)",
    ord("o"): "its total would leave the int64 range (counters) or stop being a finite number (sums)",
    ord("s"): "an earlier increment of its key and source in the call was refused",
}


def triples(items: Sequence[tuple[Position, Any]]) -> list[tuple[int, int, int]]:
    """Each item's position as a (c, m, j) triple: a shorter position gets j = its index among the
    consecutive items with that same position. Positions must strictly increase: a position names one
    increment of its source (and a key's fence is the last position applied), so two items with one full
    position would be one increment twice. Anything else is :class:`InvalidTupleError` naming the item."""
    out: list[tuple[int, int, int]] = []
    last: tuple[int, int, int] = (-1, -1, -1)
    run_of: tuple[int, int] | None = None
    j = 0
    for i, pair in enumerate(items):
        if type(pair) is not tuple or len(pair) != 2:
            _not_a_pair(i, pair)
        position, item = pair
        if type(position) is int and 0 <= position < MAX_POSITION:  # the common case, inline
            j = j + 1 if run_of is not None and run_of[0] == position and run_of[1] == 0 else 0
            run_of = (position, 0)
            triple = (position, 0, j)
            if triple <= last:
                _not_increasing(i, item, triple, last)
            last = triple
            out.append(triple)
            continue
        # A position is an int or a tuple (or list) of them, nothing else that iterates (bytes, sets, dicts).
        parts = (
            (position,) if isinstance(position, int) else tuple(position) if isinstance(position, tuple | list) else ()
        )
        if not 1 <= len(parts) <= 3 or not all(
            isinstance(p, int) and not isinstance(p, bool) and 0 <= p < MAX_POSITION for p in parts
        ):
            raise InvalidTupleError(i, item, f"position {position!r} must be an int or 1 to 3 ints in [0, 2**53)")
        if len(parts) == 3:
            triple = (parts[0], parts[1], parts[2])
            run_of = None
        else:
            head = (parts[0], parts[1] if len(parts) == 2 else 0)
            j = j + 1 if head == run_of else 0
            run_of = head
            triple = (head[0], head[1], j)
        if triple <= last:
            _not_increasing(i, item, triple, last)
        last = triple
        out.append(triple)
    return out


def _not_a_pair(i: int, pair: Any) -> None:
    if isinstance(pair, Incr | Count):
        raise InvalidTupleError(i, pair, "an increment needs its position: give (position, increment)")
    if not isinstance(pair, tuple | list) or len(pair) != 2:
        raise InvalidTupleError(i, pair, "expected a (position, Incr or Count) pair")


def _not_increasing(i: int, item: Any, triple: tuple[int, int, int], last: tuple[int, int, int]) -> None:
    if triple < last:
        raise InvalidTupleError(i, item, f"position {triple} is below the one before it ({last})")
    raise InvalidTupleError(
        i,
        item,
        f"position {triple} is item #{i - 1}'s too: a position names one increment of its source "
        "(give each increment its own j, or a shorter position, whose j counts them)",
    )


class _Call:
    """One script call: its kind, the caller's indices in ARGV order, KEYS, ARGV and the keys it holds.
    A key's chunk is never split across calls."""

    __slots__ = ("argv", "group", "indices", "kind", "owners", "rkeys")

    def __init__(self, kind: bytes, group: int) -> None:
        self.kind, self.group = kind, group  # group: the slot on a Redis Cluster (one slot per call), else -1
        self.indices: list[int] = []
        self.rkeys: list[bytes] = []
        self.argv: list[Any] = []
        self.owners: list[tuple[bytes, bytes]] = []


Entry = tuple[int, tuple[int, int, int], bytes, Any]  # caller index, position, member or field, delta


class IncrementPlan:
    """Sends one Cluster's increments (its layout, routing, batch size, durability)."""

    def __init__(self, transport: Transport, encoder: Encoder, script: Script, durability: Durability | None) -> None:
        self.transport, self.encoder, self.sha, self.durability = transport, encoder, script.sha, durability

    def send(
        self, source: bytes, items: Sequence[tuple[Position, Any]], ttl: int
    ) -> tuple[list[bool], list[ShardFailure], dict[int, str]]:
        """Apply ``items`` ((position, Incr or Count) pairs) for ``source``: which were applied, the failures
        (unconfirmed: resend them), and the refused ones (index -> why; resending cannot help)."""
        keys = _keyed(items, triples(items))
        out = _Outcome(len(items))
        size = self.encoder.batch_size
        # Each key's increments in chunks of `size`; chunk r of every key goes in round r (one round, and no
        # slicing, when every key fits: the common case).
        rounds = max((-(-len(entries) // size) for entries in keys.values()), default=0)
        script_keys = self.encoder.layout.script_keys
        for rnd in range(rounds):
            lo, hi = rnd * size, (rnd + 1) * size
            calls: dict[int, list[_Call]] = {}
            filling: dict[tuple[int, int, bytes], _Call] = {}
            held: dict[int, int] = {}  # increments in calls[shard]
            # In one round the calls are independent (each key's increments are in one call): a shard's calls
            # go out once they hold _SLICE increments, while the next are built, so the server works while
            # the client builds (each costs about what the other does).
            sent: list[tuple[dict[int, list[_Call]], Future[dict[int, Any]]]] = []
            for owner, entries in keys.items():
                entry = entries if rounds == 1 else entries[lo:hi]
                if not entry:
                    continue
                if owner in out.stopped:  # an earlier increment of the key is unconfirmed or refused: not sent
                    out.not_sent(owner, entry)
                    continue
                shard, call = self._call_for(calls, filling, owner, len(entry))
                call.rkeys.extend(script_keys(owner[1], False))
                argv, indices = call.argv, call.indices
                argv.append(source)
                argv.append(len(entry))
                for i, (c, m, j), member, delta in entry:
                    indices.append(i)
                    argv.extend((c, m, j, member, delta))
                call.owners.append(owner)
                held[shard] = held.get(shard, 0) + len(entry)
                if rounds == 1 and held[shard] >= _SLICE:
                    batch = {shard: calls.pop(shard)}
                    held[shard] = 0
                    for at in [at for at in filling if at[0] == shard]:
                        del filling[at]
                    sent.append((batch, self.transport.executor().submit(self._fanout, batch, ttl)))
            rest = self._fanout(calls, ttl) if calls else {}
            for batch, future in sent:
                out.read(self.transport, batch, future.result())
            out.read(self.transport, calls, rest)
            out.stop_refused(keys, rounds, lo, hi)
        return out.applied, out.failures, out.refused

    def _fanout(self, calls: dict[int, list[_Call]], ttl: int) -> dict[int, Any]:
        """Send ``calls`` (per shard) as script calls; each shard's replies, or its failure."""
        return self.transport.fanout(
            {
                s: [(*self._head(s), len(c.rkeys), *c.rkeys, c.kind, ttl, *c.argv) for c in cs]
                for s, cs in calls.items()
            },
            self._writer,
        )

    def _writer(self, shard: Shard, commands: list[tuple[Any, ...]]) -> list[Any]:
        # a standalone server is asked whether it has zcluster's Redis module (a Redis Cluster's redirects
        # could reach a node without it: the script there)
        if isinstance(self.transport.topology, StandaloneTopology):
            return self.transport.natively(shard, commands, self.sha, self.durability)
        return self.transport.writes(shard, commands, self.durability)

    def _head(self, shard_idx: int) -> tuple[str, ...]:
        """A standalone server known to have zcluster's Redis module takes the script's arguments after the
        SHA as ZCLUSTER.INCR (zcluster._server_module)."""
        transport = self.transport
        if isinstance(transport.topology, StandaloneTopology) and transport.native_writes(
            transport.topology.shards[shard_idx]
        ):
            return ("ZCLUSTER.INCR",)
        return ("EVALSHA", self.sha)

    def _call_for(
        self,
        calls: dict[int, list[_Call]],
        filling: dict[tuple[int, int, bytes], _Call],
        owner: tuple[bytes, bytes],
        count: int,
    ) -> tuple[int, _Call]:
        """The shard of ``owner`` and its call (per slot, on a Redis Cluster) of its kind with room for ``count``
        more."""
        kind, kb = owner
        layout, topo = self.encoder.layout, self.encoder.topology
        slot = layout.slot(kb)
        shard = topo.shard_of(kb, slot)
        at = (shard, slot if topo.single_slot_calls else -1, kind)
        call = filling.get(at)
        if call is None or len(call.indices) + count > self.encoder.batch_size:
            call = filling[at] = _Call(kind, at[1])
            calls.setdefault(shard, []).append(call)
        return shard, call


class _Outcome:
    """What a :meth:`IncrementPlan.send` found so far: per caller index applied or not, the failures, the
    refusals, and the keys stopped (None: refused; else the failure that left an increment unconfirmed)."""

    def __init__(self, n: int) -> None:
        self.applied = [False] * n
        self.failures: list[ShardFailure] = []
        self.refused: dict[int, str] = {}
        self.stopped: dict[tuple[bytes, bytes], ShardFailure | None] = {}

    def not_sent(self, owner: tuple[bytes, bytes], entry: list[Entry]) -> None:
        """``owner``'s increments ``entry`` not sent: an earlier one of its key is unconfirmed or refused."""
        why = self.stopped[owner]
        if why is None:
            self.refused.update((e[0], _REASONS[ord("s")]) for e in entry)
        else:
            self.failures.append(ShardFailure(why.shard, why.error, tuple(e[0] for e in entry)))

    def read(self, transport: Transport, calls: dict[int, list[_Call]], outcome: dict[int, Any]) -> None:
        """Take the verdicts of ``calls`` from their shards' ``outcome``."""
        applied, refused = self.applied, self.refused
        for shard_idx, res in outcome.items():
            name = transport.topology.shards[shard_idx].name
            for k, call in enumerate(calls[shard_idx]):
                reply = res if isinstance(res, BaseException) else res[k]
                if isinstance(reply, BaseException):
                    failure = ShardFailure(name, reply, tuple(call.indices))
                    self.failures.append(failure)
                    self.stopped.update(dict.fromkeys(call.owners, failure))
                elif reply.count(49) == len(call.indices):  # every one applied ("1"): the common case
                    for i in call.indices:
                        applied[i] = True
                else:
                    for i, verdict in zip(call.indices, reply, strict=True):
                        if verdict == 49:  # "1"
                            applied[i] = True
                        elif verdict != 48:  # not "0" (at or below the fence: applied before)
                            refused[i] = _REASONS[verdict]

    def stop_refused(self, keys: dict[tuple[bytes, bytes], list[Entry]], rounds: int, lo: int, hi: int) -> None:
        """Stop every key with a refused increment in this round: none of its later ones is sent."""
        if not self.refused or rounds == 1:
            return
        for owner, entries in keys.items():
            if owner not in self.stopped and any(e[0] in self.refused for e in entries[lo:hi]):
                self.stopped[owner] = None


def _keyed(
    items: Sequence[tuple[Position, Any]], positions: list[tuple[int, int, int]]
) -> dict[tuple[bytes, bytes], list[Entry]]:
    """Validate every increment and group them by (kind, key), in the caller's order."""
    keys: dict[tuple[bytes, bytes], list[Entry]] = {}
    encoded: dict[Any, bytes] = {}  # keys and members repeat (hot keys): encode each once
    for i, ((_, item), position) in enumerate(zip(items, positions, strict=True)):
        kind_of = type(item)
        if kind_of is Incr or isinstance(item, Incr):
            kind, d = b"s", item.delta
            # A finite float or an int exact as a double goes as it is (hiredis and redis-py print a float's
            # shortest round-tripping form); anything else is checked, and refused, the slow way.
            delta: Any = (
                d
                if (type(d) is float and d - d == 0.0) or (type(d) is int and -_EXACT <= d <= _EXACT)
                else _sum_delta(i, item)
            )
        elif kind_of is Count or isinstance(item, Count):
            kind, delta = b"c", _count_delta(i, item)
        else:
            raise InvalidTupleError(i, item, "expected an Incr or a Count")
        key, member = item[0], item[1]
        kb = encoded.get(key) if type(key) is str else None
        if kb is None:
            kb = blob(key, i, item, "key")
            if not kb:
                raise InvalidTupleError(i, item, "key must not be empty")
            if type(key) is str:
                encoded[key] = kb
        mb = encoded.get(member) if type(member) is str else None
        if mb is None:
            mb = blob(member, i, item, "member" if kind == b"s" else "field")
            if type(member) is str:
                encoded[member] = mb
        if kind == b"c" and mb.startswith(FENCE):
            raise InvalidTupleError(i, item, f"a counter's field must not start with {FENCE!r} (its fences' prefix)")
        entry = keys.get((kind, kb))
        if entry is None:
            entry = keys[(kind, kb)] = []
        entry.append((i, position, mb, delta))
    return keys


def _sum_delta(i: int, item: Incr) -> str:
    d = item.delta
    if isinstance(d, bool) or not isinstance(d, int | float):
        raise InvalidTupleError(i, item, f"delta must be int or float, not {type(d).__name__}")
    if isinstance(d, float) and not math.isfinite(d):
        raise InvalidTupleError(i, item, f"delta must be a finite number, got {d!r}")
    try:
        f = float(d)
    except OverflowError:  # an int beyond the largest double (about 1.8e308)
        f = math.inf
    if f != d:
        raise InvalidTupleError(i, item, f"integer delta {d} is not exact as a double (|x| > 2**53)")
    return repr(f)


def _count_delta(i: int, item: Count) -> str:
    d = item.delta
    if isinstance(d, bool) or not isinstance(d, int):
        raise InvalidTupleError(i, item, f"a Count's delta must be an int, not {type(d).__name__}")
    if not INT64[0] <= d <= INT64[1]:
        raise InvalidTupleError(i, item, f"delta {d} is outside the int64 range")
    return str(d)


class Aggregates(Reporting):
    """The aggregate part of :class:`zcluster.Cluster`'s API: fenced increments and counter reads. A mixin:
    the Cluster holds the connections and the layout."""

    _increments: IncrementPlan
    _whole: WholeKeys
    _transport: Transport
    _encoder: Encoder
    decode: bool

    def increment(
        self,
        source: str,
        items: Iterable[tuple[Position, Incr | Count]],
        *,
        ttl: int | None = None,
        raise_on_error: bool = True,
    ) -> WriteResult:
        """Apply ``items``, (position, :class:`Incr` or :class:`Count`) pairs from ``source``, each at most once.

        ``source`` names the stream the increments come from (a journal, a Kafka topic-partition, any
        sequence the caller owns; up to 1 KB, no ``|``); a position is where an increment sits in it: an
        offset, an (offset, offset) pair, or a full (c, m, j) triple of non-negative ints below 2**53 (an int,
        or a tuple or list of ints; nothing else). Shorter positions get j = the index among the consecutive
        items with that same position, so keep a position's increments in one call, in a fixed order.
        Positions must strictly increase within a call: a position names one increment of its source, so two
        items with the same full position (whatever their keys) are an :class:`InvalidTupleError` naming both,
        never one applied and the other taken for its duplicate.

        Guarantees: per (key, source) the server keeps the position of the last increment applied (the
        key's fence) and applies an increment only above it, in the same script call; so sending the same
        items again (a retry, a replayed batch, a zombie) changes nothing, and ``applied[i]`` is False for
        an increment found at or below the fence. Within a call a key's increments go in order, and once
        one of them is unconfirmed (its shard failed) or refused, none after it is sent: resend the
        unconfirmed ones, in order, before anything later of that source. Increments of different sources
        never fence each other. ``ttl`` (seconds, 1 to 10**10) is set on a key when this call creates it, not
        refreshed (per-hour or per-day keys expire on their own; a replay after a key expired counts again).

        Errors: :class:`InvalidTupleError` (nothing sent) for a bad item (a :class:`Count` field starting
        with ``b"\\x00zc|"``, the prefix of the fences a counters key keeps among its fields, too) or a
        position not above the one before it; :class:`ConfigError` (nothing sent) for a bad ``source`` or ``ttl``;
        :class:`WriteRefusedError` for a key of another kind (also at or below the fence: never taken for a
        duplicate) or a total that would leave int64 (counters) or stop being a finite double (sums; nothing
        of that increment applied; the error's ``result`` says what the rest did); :class:`PartialWriteError`
        for a failed shard (resending is safe). With ``raise_on_error=False`` both are in the result's
        ``failures``.
        """
        started = time.perf_counter()
        items = items if isinstance(items, list | tuple) else list(items)
        with self._reporting("increment", started):
            src = blob(source, 0, source, "source")
            if not src or len(src) > 1024 or b"|" in src:
                raise ConfigError(f"source {source!r} must be 1 to 1024 bytes without '|'")
            if ttl is not None and positive(ttl, "ttl") > MAX_TTL:
                raise ConfigError(f"ttl must be at most {MAX_TTL} seconds (about 317 years), got {ttl!r}")
            applied, failures, refused = self._increments.send(src, items, ttl or 0)
        if refused:
            failures.append(refusal(refused, [(b"", [item for _, item in items], None)], len(items), applied, failures))
        result = WriteResult(applied, failures)
        self._report("increment", len(items), started, result.applied_count, [f.shard for f in failures])
        if raise_on_error:
            if result.refused is not None:
                raise result.refused
            result.raise_for_failures()
        return result

    def ranks(
        self, key_members: Iterable[KeyMember | tuple[Blob, Blob]], *, strict: bool = True
    ) -> ReadResult[KeyMember, tuple[int, float] | None]:
        """Each member's place on its sums key's leaderboard: (rank, total), rank 0 the highest total (ties:
        member descending, as :meth:`select` orders them); None for a member without a total."""
        started = time.perf_counter()
        with self._reporting("ranks", started):
            items = key_members_of(key_members)
            encoded = self._encoder.keys([km.key for km in items])
            members = [blob(km.member, i, km, "member") for i, km in enumerate(items)]
            adds = self._encoder.layout.adds

            def parse(km: KeyMember, replies: list[Any]) -> tuple[int, float] | None:
                rank, total = replies
                return None if rank is None else (int(rank), float(total))

            result = read(
                self._transport,
                items,
                encoded,
                lambda kb, pos: [("ZREVRANK", adds(kb), members[pos]), ("ZSCORE", adds(kb), members[pos])],
                parse,
            )
        return self._finish("ranks", result, len(items), started, strict)

    def top(
        self, keys: Iterable[Blob], offset: int = 0, limit: int = 10, *, strict: bool = True
    ) -> ReadResult[Blob, list[KeyScoreMember]]:
        """A leaderboard page of each sums key (:class:`Incr`): ``limit`` members from ``offset``, highest
        total first (ties: member descending), as (key, total, member). The same read as :meth:`select`
        (totals are the scores of the key's sorted set), named for what it reads; a :class:`~zcluster.farm.Farm`'s
        ``top`` differs from its ``select`` (it picks the replica whose fences hold the most)."""
        return self.select(keys, offset, limit, strict=strict)  # type: ignore[attr-defined,no-any-return]

    def fences(self, keys: Iterable[Blob], *, strict: bool = True) -> ReadResult[Blob, dict[Blob, Fence] | None]:
        """Each aggregate key's fences: source -> :class:`Fence` (the last position applied from it and how
        many of its increments the key holds); None for a key that is no aggregate (a 2P-set, or nothing).
        For inspection, and for a farm to tell which replica's copy of a key holds the most."""
        started = time.perf_counter()
        with self._reporting("fences", started):
            key_list = listed_keys(keys)
            states = self._whole.states(key_list)
            dec = from_bytes if self.decode else bytes
            result: ReadResult[Blob, dict[Blob, Fence] | None] = ReadResult()
            result.update(
                (k, {dec(s): f for s, f in st.fences.items()} if st.aggregate else None) for k, st in states.items()
            )
            result.errors = states.errors
        return self._finish("fences", result, len(key_list), started, strict)

    def counters(self, keys: Iterable[Blob], *, strict: bool = True) -> ReadResult[Blob, dict[Blob, int]]:
        """Every counter of each counters key (:class:`Count`), field -> total; ``{}`` for a key never
        incremented. Sums keys (:class:`Incr`) are read with :meth:`select` (totals highest first) and
        :meth:`score`'s presence of a member."""
        started = time.perf_counter()
        with self._reporting("counters", started):
            key_list = listed_keys(keys)
            encoded = self._encoder.keys(key_list)
            adds, dec = self._encoder.layout.adds, from_bytes if self.decode else bytes
            result = read(
                self._transport,
                key_list,
                encoded,
                lambda kb, _: [("HGETALL", adds(kb))],
                lambda key, replies: {dec(f): int(v) for f, v in counters_of(replies[0])},
            )
        return self._finish("counters", result, len(key_list), started, strict)
