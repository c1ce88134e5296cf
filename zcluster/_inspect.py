"""The inspection part of :class:`zcluster.Cluster`'s API: what operators, repairs and diffs read besides the
sets' members (every record of a key, floors, fingerprints) and the servers' state (stats, ping, scripts),
and retention (``forget``: records dropped below a floor raised in the same call).
A mixin: :class:`zcluster.Cluster` holds the connections and the layout it uses."""

from __future__ import annotations

import functools
import time
from collections.abc import Iterable
from typing import Any, Literal

from zcluster import _encode, _reads
from zcluster._aggregate_keys import KIND_NAMES
from zcluster._encode import Encoder, listed_keys, score_pairs
from zcluster._keys import KeyLayout
from zcluster._reporting import Reporting
from zcluster._topology import ClusterTopology
from zcluster._transport import Transport, in_order, read
from zcluster.errors import ConfigError, PartialWriteError, WriteRefusedError
from zcluster.types import Blob, Delete, Insert, ReadResult, ShardStats, Write, WriteResult, from_bytes


class Inspection(Reporting):
    """Records, floors and retention, fingerprints, stats, ping and script loading of a Cluster (see
    :class:`zcluster.Cluster`)."""

    _transport: Transport
    _layout: KeyLayout
    _encoder: Encoder
    _write_sha: str
    _fingerprint_sha: str
    _forget_sha: str
    floors: bool
    batch_size: int
    decode: bool

    def records(self, keys: Iterable[Blob], *, strict: bool = True) -> ReadResult[Blob, list[Write]]:
        """Every record each key holds: its members as :class:`Insert` (K+) and its tombstones as
        :class:`Delete` (K-), highest score first. A key never written reads as ``[]``.

        Reads each key whole (what a repair or a diff needs); for large sets prefer :meth:`select_range`.
        """
        started = time.perf_counter()
        with self._reporting("records", started):
            key_list = listed_keys(keys)
            encoded = self._encoder.keys(key_list)
            layout = self._layout
            dec = from_bytes if self.decode else bytes

            def parse(key: Blob, replies: list[Any]) -> list[Write]:
                out: list[Write] = [Insert(key, s, dec(m)) for m, s in score_pairs(replies[0])]
                out += [Delete(key, s, dec(m)) for m, s in score_pairs(replies[1])]
                out.sort(key=lambda w: w.score, reverse=True)
                return out

            result = read(
                self._transport,
                key_list,
                encoded,
                lambda kb, _: [
                    ("ZRANGE", layout.adds(kb), 0, -1, "WITHSCORES"),
                    ("ZRANGE", layout.removes(kb), 0, -1, "WITHSCORES"),
                ],
                parse,
            )
        return self._finish("records", result, len(key_list), started, strict)

    def floors_of(self, keys: Iterable[Blob], *, strict: bool = True) -> ReadResult[Blob, float | None]:
        """Each key's floor (see :meth:`forget` and ``max_size``): writes at or below it are stale for
        members without a record; None when the key has none."""
        started = time.perf_counter()
        with self._reporting("floors", started):
            key_list = listed_keys(keys)
            encoded = self._encoder.keys(key_list)
            layout = self._layout
            result = read(
                self._transport,
                key_list,
                encoded,
                lambda kb, _: [("GET", layout.floor(kb))],
                lambda key, replies: None if replies[0] is None else float(replies[0]),
            )
        return self._finish("floors", result, len(key_list), started, strict)

    def fingerprints(
        self,
        keys: Iterable[Blob],
        *,
        kind: Literal["records", "serialized", "exists"] = "records",
        strict: bool = True,
    ) -> ReadResult[Blob, bytes]:
        """A short digest of every record each key holds, and of its floor (``b""`` for a key holding
        neither).

        ``kind="records"``: two servers whose fingerprints of a key are equal hold the same records and
        floor for it (up to SHA-1 collisions); equal records give equal fingerprints on servers that print
        scores alike (the same major version). ``kind="serialized"`` is about twice as cheap (a SHA-1 of
        the sets' ``DUMP``): equal still means equal records, but equal records may differ (another
        internal encoding or server version), so compare ``"records"`` fingerprints before concluding.
        ``kind="exists"``: only whether each key holds members (``b"+"``), only tombstones (``b"1"``) or
        nothing (``b""``). All ``b""`` for a key holding nothing. Computed server-side, many keys per
        call, so comparing replicas moves a few bytes per key.
        """
        started = time.perf_counter()
        with self._reporting("fingerprints", started):
            key_list = listed_keys(keys)
            encoded = self._encoder.keys(key_list)
            if kind not in ("records", "serialized", "exists"):
                raise ValueError(f"kind must be 'records', 'serialized' or 'exists', not {kind!r}")
            mode = "fingerprint" if kind == "records" else kind
            answers = _reads.fingerprints(
                self._transport, self._layout, encoded, self.floors, self.batch_size, self._fingerprint_sha, mode
            )
            result: ReadResult[Blob, bytes] = in_order(key_list, answers)
        return self._finish("fingerprints", result, len(key_list), started, strict)

    def stats(self, scan: bool = True) -> list[ShardStats]:
        """One :class:`ShardStats` per master: Redis keys, this prefix's logical keys (a SCAN of every
        shard unless ``scan`` is False), memory, whether the write script is loaded, server version, and on a
        Redis Cluster the slots held open by a migration.

        A shard that fails is reported in its entry's ``error``, never raised.
        """
        layout, sha = self._layout, self._write_sha
        topology = self._transport.topology
        one = functools.partial(_reads.shard_stats, layout, sha, scan, isinstance(topology, ClusterTopology))
        masters = {topology.shards.index(s): None for s in topology.masters()}
        outcome = self._transport.fanout(masters, one)
        out = []
        for idx, res in outcome.items():
            name = topology.shards[idx].name
            out.append(
                ShardStats(name, error=f"{type(res).__name__}: {res}") if isinstance(res, BaseException) else res
            )
        return out

    def ping(self) -> dict[str, BaseException | None]:
        """Each master's name and its PING failure (None when it answered)."""
        topology = self._transport.topology
        masters = {topology.shards.index(s): None for s in topology.masters()}
        outcome = self._transport.fanout(masters, lambda shard, _: shard.client.ping())
        return {
            topology.shards[idx].name: res if isinstance(res, BaseException) else None for idx, res in outcome.items()
        }

    def load_scripts(self) -> None:
        """Load the scripts on every master now (they are otherwise loaded on first NOSCRIPT)."""
        for shard in self._transport.topology.masters():
            self._transport.load_scripts(shard)

    def forget(self, keys: Iterable[Blob], up_to: float) -> int:
        """Retention: drop every record (inserts and tombstones) of ``keys`` with score <= ``up_to``.

        The keys' floors rise to ``up_to``, so later writes at or below it are stale: nothing forgotten
        comes back through a late replay. Needs ``floors`` (a Cluster built with ``floors=True`` or a
        ``max_size``); without them a forgotten tombstone would let an older insert resurrect. Returns
        the number of entries removed. A failed shard raises :class:`PartialWriteError` whose result
        has one entry per key (``applied[i]``: key ``i`` was handled; the failed keys are listed).

        Only 2P-set keys are forgotten. An aggregate key (:class:`Incr` sums, :class:`Count` counters)
        holds totals, not scored records: it is refused, atomically on its server, before anything of it
        changes, and the call goes on with the other keys. Once every key was handled, the refusals raise
        :class:`WriteRefusedError`, naming the first refused key and its kind; its ``refused`` maps each
        refused key's index to why, and its ``result.applied[i]`` says key ``i`` was forgotten. So a
        retention pass over :meth:`keys` (which lists aggregate keys too) runs through: per batch, catch
        ``WriteRefusedError``; every key not in its ``refused`` was forgotten (the entries removed are not
        counted then). Expire aggregate keys with ``increment``'s ``ttl`` instead.
        """
        started = time.perf_counter()
        with self._reporting("forget", started):
            if not self.floors:
                raise ConfigError("forget() needs a Cluster with floors=True (or max_size)")
            bound = _encode.score(up_to, 0, up_to)
            key_list = listed_keys(keys)
            encoded = self._encoder.keys(key_list)
            layout, sha = self._layout, self._forget_sha
            result = read(
                self._transport,
                key_list,
                encoded,
                lambda kb, _: [("EVALSHA", sha, 3, layout.adds(kb), layout.removes(kb), layout.floor(kb), bound)],
                lambda key, replies: replies[0] if isinstance(replies[0], list) else int(replies[0]),
            )
        refused = {
            i: f"key {key!r} is {KIND_NAMES[from_bytes(bytes(done[1]))]}, not a 2P-set: forget() left it unchanged"
            for i, key in enumerate(key_list)
            if isinstance(done := result.get(key), list)
        }
        handled = [key in result and i not in refused for i, key in enumerate(key_list)]
        failures = _reads.merge_failures(result.errors.values())
        self._report("forget", len(key_list), started, sum(handled), [f.shard for f in failures])
        if refused:
            first = min(refused)
            raise WriteRefusedError(first, key_list[first], refused[first], refused, WriteResult(handled, failures))
        if failures:
            raise PartialWriteError(WriteResult(handled, failures))
        return sum(result.values())
