"""The parts of :class:`zcluster.Cluster`'s reads that are not its API: cursor paging of ``select_range``,
the scan of every key, one SCAN step, resumable scan positions, server-side fingerprints packed many keys
per call, shard stats."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import redis

from zcluster._encode import score_pairs
from zcluster._keys import ADD, KeyLayout
from zcluster._server_module import version as module_version
from zcluster._slots import NodeView
from zcluster._topology import Shard, StandaloneTopology
from zcluster._transport import SHARD_ERRORS, Transport
from zcluster.errors import PartialScanError
from zcluster.types import Blob, Cursor, ShardFailure, ShardStats, from_bytes, to_bytes


def range_pages(
    transport: Transport, adds: Callable[[bytes], bytes], start: Cursor | None, stop: Cursor | None, limit: int
) -> Callable[[Shard, bytes], list[tuple[bytes, float]]]:
    """``select_range``'s read of one key: members strictly after ``start`` and strictly before ``stop``
    (select order), up to ``limit``, paging ZREVRANGEBYSCORE until enough are found."""
    hi = repr(float(start.score)) if start is not None else "+inf"
    lo = repr(float(stop.score)) if stop is not None else "-inf"
    start_m = to_bytes(start.member) if start is not None else b""
    stop_m = to_bytes(stop.member) if stop is not None else b""

    def wanted(score: float, member: bytes) -> int:
        """1 keep, 0 skip (at or above start), -1 done (at or below stop)."""
        if start is not None and (score > start.score or (score == start.score and member >= start_m)):
            return 0
        if stop is not None and (score < stop.score or (score == stop.score and member <= stop_m)):
            return -1
        return 1

    def page(shard: Shard, kb: bytes) -> list[tuple[bytes, float]]:
        # Member comparisons happen here, on bytes: Lua compares strings by the server's locale.
        out: list[tuple[bytes, float]] = []
        offset, count = 0, limit + 16
        while True:
            command = ("ZREVRANGEBYSCORE", adds(kb), hi, lo, "WITHSCORES", "LIMIT", offset, count)
            reply = transport.commands(shard, [command])[0]
            if isinstance(reply, BaseException):
                raise reply
            pairs = score_pairs(reply)
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

    return page


def scan_step(
    transport: Transport, layout: KeyLayout, shard: Shard, cursor: int, pattern: bytes, count: int
) -> tuple[int, list[bytes]]:
    """One SCAN step on ``shard``: the next cursor and the logical keys found (once each).

    On standalone shards, a key found on a shard its routing does not name is left out: a migration's copy
    not cut over yet, or a moved key not cleaned up yet (:mod:`zcluster.migration`); no read ever sees it."""
    cursor, raw = transport.node_call(shard, lambda: shard.client.scan(cursor, match=pattern, count=count))
    logical = layout.logical
    topology = transport.topology
    place = topology.shards.index(shard) if isinstance(topology, StandaloneTopology) else -1
    out: dict[bytes, None] = {}
    for rk in raw:  # bytes: clients never decode
        parts = logical(to_bytes(rk))
        if parts is not None and (place < 0 or topology.shard_of(parts[0], layout.slot(parts[0])) == place):
            out[parts[0]] = None
    return int(cursor), list(out)


def scan_position(position: str | None, masters: int) -> tuple[int, int]:
    """A :meth:`Cluster.scan` position as (master index, SCAN cursor); ValueError if it is not one."""
    if position is None:
        return 0, 0
    index_text, sep, cursor_text = str(position).partition(":")
    if sep and index_text.isdigit() and cursor_text.isdigit() and int(index_text) < masters:
        return int(index_text), int(cursor_text)
    raise ValueError(f"not a scan position of this cluster ({masters} masters): {position!r}")


def fingerprints(
    transport: Transport,
    layout: KeyLayout,
    encoded: list[tuple[int, bytes]],
    floors: bool,
    size: int,
    sha: str,
    mode: str,
) -> list[Any]:
    """Each key's fingerprint (``lua/fingerprint.lua`` in ``mode``), ``size`` keys per script call (one slot
    per call on a Redis Cluster), or a :class:`ShardFailure` for the keys of a call that failed."""
    groups: dict[int, dict[int, list[int]]] = {}
    one_slot = transport.topology.single_slot_calls
    for pos, (shard_idx, kb) in enumerate(encoded):
        groups.setdefault(shard_idx, {}).setdefault(layout.slot(kb) if one_slot else 0, []).append(pos)
    commands: dict[int, list[tuple[Any, ...]]] = {}
    positions: dict[int, list[list[int]]] = {}
    stride = 3 if floors else 2  # without floors a key has no floor to read
    for shard_idx, by_group in groups.items():
        for members in by_group.values():
            for lo in range(0, len(members), size):
                chunk = members[lo : lo + size]
                rkeys = [k for p in chunk for k in layout.script_keys(encoded[p][1], floors)]
                commands.setdefault(shard_idx, []).append(("EVALSHA", sha, len(rkeys), *rkeys, mode, stride))
                positions.setdefault(shard_idx, []).append(chunk)
    outcome = transport.fanout(commands, transport.commands)
    answers: list[Any] = [None] * len(encoded)
    for shard_idx, res in outcome.items():
        name = transport.topology.shards[shard_idx].name
        replies = [res] * len(positions[shard_idx]) if isinstance(res, BaseException) else res
        for chunk, reply in zip(positions[shard_idx], replies, strict=True):
            for j, p in enumerate(chunk):
                bad = isinstance(reply, BaseException)
                answers[p] = ShardFailure(name, reply, (p,)) if bad else to_bytes(reply[j])
    return answers


def shard_stats(layout: KeyLayout, write_sha: str, scan: bool, clustered: bool, shard: Shard, _: None) -> ShardStats:
    """:meth:`Cluster.stats` of one master (its keys counted by a SCAN with ``scan``; its open slots when
    ``clustered``, a Redis Cluster node)."""
    client = shard.client
    server, memory = client.info("server"), client.info("memory")
    keys = removed_only = None
    if scan:
        adds: set[bytes] = set()
        removes: set[bytes] = set()
        for raw in client.scan_iter(match=layout.scan_pattern(None, include_removed=True), count=1000):
            parts = layout.logical(bytes(raw))
            if parts is not None:
                (adds if parts[1] == ADD else removes).add(parts[0])
        keys, removed_only = len(adds), len(removes - adds)
    version = server.get("valkey_version", server.get("redis_version"))
    return ShardStats(
        shard=shard.name,
        dbsize=int(client.dbsize()),
        keys=keys,
        removed_only=removed_only,
        used_memory=int(memory["used_memory"]),
        used_memory_human=str(memory.get("used_memory_human", "")),
        script_loaded=bool(client.script_exists(write_sha)[0]),
        version=f"{server.get('server_name', 'redis')} {version}",
        open_slots=_open_slots(client) if clustered else None,
        module_version=module_version(client),
    )


def _open_slots(client: redis.Redis) -> tuple[str, ...] | None:
    """The slots a node's ``CLUSTER NODES`` shows it holding open for a migration, the other node named by
    its address; None when the server refuses the command (an ACL, a managed service renaming it)."""
    try:
        view = NodeView(to_bytes(client.execute_command("CLUSTER", "NODES")).decode())
    except redis.ResponseError:
        return None
    named = view.address.get
    return (
        *(f"{slot} migrating to {named(peer, peer)}" for slot, peer in sorted(view.migrating.items())),
        *(f"{slot} importing from {named(peer, peer)}" for slot, peer in sorted(view.importing.items())),
    )


def scan_keys(
    transport: Transport,
    layout: KeyLayout,
    decode: bool,
    report: Callable[..., None],
    pattern: bytes,
    batch_size: int,
    progress: Callable[[str, int], None] | None,
) -> Iterator[list[Blob]]:
    """:meth:`Cluster.keys`: every master scanned in turn, each key once per shard, the failed shards raised
    as :class:`PartialScanError` at the end; ``report`` gets the call's event when the iteration ends."""
    started = time.perf_counter()
    batch: list[Blob] = []
    failures: list[ShardFailure] = []
    found = 0
    try:
        for shard in transport.topology.masters():
            seen: set[bytes] = set()
            cursor = 0
            while True:
                try:
                    cursor, raw = scan_step(transport, layout, shard, cursor, pattern, batch_size)
                except SHARD_ERRORS as exc:
                    failures.append(ShardFailure(shard.name, exc, ()))
                    break
                for kb in raw:
                    if kb in seen:
                        continue
                    seen.add(kb)
                    batch.append(from_bytes(kb) if decode else kb)
                    if len(batch) >= batch_size:
                        found += len(batch)
                        yield batch
                        batch = []
                if progress is not None:
                    progress(shard.name, len(seen))
                if cursor == 0:
                    break
        if batch:
            found += len(batch)
            yield batch
    finally:
        report("keys", found, started, shards=[f.shard for f in failures])
    if failures:
        raise PartialScanError(failures)


def merge_failures(failures: Iterable[ShardFailure]) -> list[ShardFailure]:
    """One ShardFailure per shard, holding every index its per-item failures named."""
    merged: dict[str, tuple[BaseException, list[int]]] = {}
    for f in failures:
        merged.setdefault(f.shard, (f.error, []))[1].extend(f.indices)
    return [ShardFailure(shard, error, tuple(sorted(idx))) for shard, (error, idx) in merged.items()]
