"""The cluster: 2P-set CRDT sorted sets over a topology of Redis servers.

Writes go through one Lua script (``lua/write.lua``) that applies many tuples per call, each atomically.
Tuples are grouped by shard (by hash slot on a Redis Cluster), split into calls of at most ``batch_size``
tuples, pipelined per shard, and the shards run in parallel threads. Encoding lives in
:mod:`zcluster._encode`, shard I/O in :mod:`zcluster._transport`, routing in :mod:`zcluster._topology`.

Why this module is long: it is one class, the store's whole public contract, and most of its lines are the
docstrings that state it; everything that is not the API already lives in the private modules above.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from zcluster import _encode, _guard, _reads, _writes
from zcluster._aggregate_keys import WholeKeys
from zcluster._aggregates import Aggregates, IncrementPlan
from zcluster._encode import Encoder, blob, check_limit, listed_keys, positive, score_pairs
from zcluster._following import following, link, live, scanning
from zcluster._inspect import Inspection
from zcluster._keys import KeyLayout
from zcluster._moves import StoreMoved
from zcluster._scripts import (
    aggregate_script,
    fingerprint_script,
    forget_script,
    incr_script,
    node_write_script,
    write_script,
)
from zcluster._topology import FAILOVER_TIMEOUT, ClusterTopology, Routing, StandaloneTopology, Topology
from zcluster._transport import SHARD_ERRORS, Transport, read, read_each
from zcluster._urls import seed_url
from zcluster.errors import (
    ConfigError,
    InconsistentDataError,
    InvalidTupleError,
    PartialScanError,
)
from zcluster.instrumentation import Instrumentation, nop
from zcluster.types import (
    NOT_PRESENT,
    Blob,
    Cursor,
    Delete,
    Durability,
    Insert,
    KeyMember,
    KeyScoreMember,
    Presence,
    ReadResult,
    ShardFailure,
    WriteResult,
    from_bytes,
    to_bytes,
)

__all__ = ["Cluster"]


class Cluster(Inspection, Aggregates):
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
    * Atomicity: each tuple is applied atomically. The tuples of one logical key in one write call, up to
      ``batch_size`` of them, are applied by one script call: all together or none (what the exactly-once
      checkpoints rely on). Nothing is atomic across keys.

    Errors (:mod:`zcluster.errors`): invalid input raises :class:`InvalidTupleError` before anything is
    sent. A shard that fails is reported, never dropped: writes raise :class:`PartialWriteError` (or
    return it in ``WriteResult.failures`` with ``raise_on_error=False``); reads raise
    :class:`PartialReadError` (or fill ``ReadResult.errors`` with ``strict=False``); ``keys`` raises
    :class:`PartialScanError` after yielding every reachable shard's keys.

    Durability (``durability=Durability(replicas=n, local_aof=..., timeout=..., deadline=...)``, default
    none): after each shard's writes of ``insert``/``delete``/``apply`` (and increments), on the connection
    that sent them, the cluster waits until ``n`` replicas of that shard's master acknowledged them
    (``WAIT``) and/or the master fsynced them to its AOF (``WAITAOF``, Redis >= 7.2 and Valkey; older
    servers cannot confirm it), asking again until ``deadline`` (60 s: a failover and the old master's
    rejoin as a replica). A shard not confirmed by then is a failed shard whose error is a :class:`DurabilityError`:
    its tuples are unconfirmed although the master executed them (resending is safe). ``forget`` and the
    reads do not wait. See :class:`zcluster.Durability` for the exact semantics.

    Thread-safe: one Cluster may be shared by threads. Each public call reports one :class:`OpEvent` to
    ``instrumentation``, also when it failed.

    Migrations (:mod:`zcluster.migration`): a Cluster that connected before a migration of its standalone
    store cut over follows the store to its new layout by itself (a call cut off by the cut-over runs again
    there; a scan raises :class:`LayoutMismatchError` and can start again). One opened on the old list after
    the cut-over is refused with :class:`LayoutMovedError`, which names the new one, unless ``follow_moves``.
    """

    _next: Cluster | None = None  # the incarnation that followed this one to a migration's target

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
        durability: Durability | None = None,
        follow_moves: bool = False,
    ) -> None:
        scripts = (
            write_script(),
            forget_script(),
            fingerprint_script(),
            node_write_script(),
            incr_script(),
            aggregate_script(),
        )
        transport = Transport(topology, scripts, positive(pipeline_calls, "pipeline_calls"))
        self._setup(
            transport, True, max_size, floors, prefix, batch_size, decode, instrumentation, durability=durability
        )
        transport.guard = _guard.install(topology, self._layout, self.max_size, follow_moves)  # LayoutMismatchError

    def _setup(
        self,
        transport: Transport,
        owner: bool,
        max_size: int | None,
        floors: bool | None,
        prefix: Blob,
        batch_size: int,
        decode: bool,
        instrumentation: Instrumentation,
        durability: Durability | None = None,
    ) -> None:
        if max_size is not None:
            positive(max_size, "max_size")
        if durability is not None and not isinstance(durability, Durability):
            raise ConfigError(f"durability must be a zcluster.Durability or None, got {durability!r}")
        if floors is False and max_size is not None:
            raise ConfigError("a size bound needs floors: trimming without them would resurrect deleted members")
        self._transport = transport
        self._owner = owner
        self._layout = KeyLayout(prefix)
        self.max_size = max_size
        self.floors = max_size is not None if floors is None else floors
        self.batch_size = positive(batch_size, "batch_size")
        self.decode = decode
        self.instrumentation = instrumentation
        self.durability = durability
        self._encoder = Encoder(self._layout, transport.topology, self.floors, batch_size)
        write, forget, fingerprint, node, incr, aggregate = transport.scripts
        self._plan = _writes.WritePlan(transport, self._encoder, write, node, max_size, durability, self._report)
        self._increments = IncrementPlan(transport, self._encoder, incr, durability)
        self._whole = WholeKeys(transport, self._encoder, aggregate, durability)
        self._write_sha, self._forget_sha, self._fingerprint_sha = write.sha, forget.sha, fingerprint.sha

    # -- construction -------------------------------------------------------------------------------------

    @classmethod
    def from_urls(
        cls,
        urls: Sequence[str],
        *,
        routing: Routing = "jump",
        connection: dict[str, Any] | None = None,
        **options: Any,
    ) -> Cluster:
        """Standalone shards, routed client-side (``routing``: ``"jump"`` or roshi's ``"roshi"``).

        ``connection`` holds extra redis-py connection options (e.g. ``ssl_ca_certs``); URLs may carry ACL
        credentials (``redis://user:pass@host:port``) and TLS (``rediss://``). See also
        :func:`zcluster.connect`, which takes any of the URL forms.
        """
        return cls(StandaloneTopology(urls, routing, **(connection or {})), **options)

    @classmethod
    def from_cluster_url(
        cls,
        url: str,
        *,
        connection: dict[str, Any] | None = None,
        failover_timeout: float = FAILOVER_TIMEOUT,
        seeds: Sequence[str] = (),
        **options: Any,
    ) -> Cluster:
        """A native Redis Cluster, discovered from one seed node's URL (``redis://``, ``rediss://``, or the
        same written ``redis+cluster://`` / ``rediss+cluster://`` as :func:`zcluster.connect` takes it). It
        follows failovers and resharding by itself; a call waits up to ``failover_timeout`` seconds for an
        unreachable master's slots to move, and for a migrating slot whose keys it needs on one node
        (TRYAGAIN) to finish moving (0: fail at once; 32 TRYAGAIN tries), see ``docs/architecture.md`` (Routing).
        ``seeds``: other nodes (``"host:port"``, same scheme and credentials) asked for the slot map when
        the seed does not answer."""
        return cls(ClusterTopology(seed_url(url), failover_timeout, seeds, **(connection or {})), **options)

    def view(
        self,
        prefix: Blob,
        *,
        max_size: int | None = None,
        floors: bool | None = None,
        batch_size: int | None = None,
        decode: bool | None = None,
        durability: Durability | None = None,
    ) -> Cluster:
        """Another namespace on the same servers and connections (state, dedup and checkpoint records).

        The view shares this cluster's connections, worker threads and instrumentation; it does not own
        them: its ``close()`` does nothing, and it stops working when this cluster is closed. Options not
        given are this cluster's, except ``max_size`` (none unless given) and ``floors`` (as for a new
        Cluster). ``durability`` replaces this cluster's for the view's writes only (e.g. checkpoints that
        wait for a replica while the bulk writes do not); not given, the view waits as this cluster does.
        """
        view = object.__new__(Cluster)
        view._setup(
            self._transport,
            False,
            max_size,
            floors,
            prefix,
            self.batch_size if batch_size is None else batch_size,
            self.decode if decode is None else decode,
            self.instrumentation,
            durability=self.durability if durability is None else durability,
        )
        return view

    def _live(self) -> Cluster:
        return live(self)  # type: ignore[no-any-return]

    def _follow(self, moved: StoreMoved) -> None:
        def build(transport: Transport) -> Cluster:
            follower = object.__new__(Cluster)  # not the owner: the first incarnation's transport closes its successors
            options = (self.max_size, self.floors, self._layout.prefix, self.batch_size, self.decode)
            follower._setup(transport, False, *options, self.instrumentation, durability=self.durability)
            return follower

        link(self, build, moved)

    def _known_shards(self) -> tuple[str, ...]:
        return tuple(s.name for s in self._transport.topology.shards)  # not masters(): it walks the slot map

    @property
    def prefix(self) -> bytes:
        """The namespace prefix of every Redis key of this cluster."""
        return self._layout.prefix

    @property
    def shards(self) -> list[str]:
        """Names (``host:port``) of the servers holding data."""
        return [s.name for s in self._live()._transport.topology.masters()]

    def nodes(self) -> list[str]:
        """Every server this client knows (``host:port``): a Redis Cluster's masters and the replicas its
        last slot map listed; the standalone shards otherwise."""
        topology = self._live()._transport.topology
        return topology.nodes() if isinstance(topology, ClusterTopology) else self.shards

    def shard_of(self, key: Blob) -> str:
        """The name of the server holding logical ``key``."""
        current = self._live()
        idx, _ = current._encoder.keys([key])[0]
        return current._transport.topology.shards[idx].name

    def close(self) -> None:
        """Close every connection and the worker threads (a :meth:`view` leaves them to its owner)."""
        if self._owner:
            self._transport.close()

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        topology = self._live()._transport.topology
        names = ", ".join(s.name for s in topology.shards)
        return f"Cluster({type(topology).__name__}[{names}], prefix={self.prefix!r}, max_size={self.max_size})"

    # -- writes -------------------------------------------------------------------------------------------

    def insert(
        self, tuples: Iterable[KeyScoreMember | tuple[Blob, float, Blob]], *, raise_on_error: bool = True
    ) -> WriteResult:
        """Add members (see the class semantics). Returns which tuples took effect.

        Raises :class:`InvalidTupleError` (nothing sent) or :class:`PartialWriteError` when a shard failed
        (the error's ``result`` says which tuples are unconfirmed).
        """
        items = tuples if isinstance(tuples, list | tuple) else list(tuples)
        return self._write("insert", _writes.inserts(items), len(items), raise_on_error)

    def delete(
        self, tuples: Iterable[KeyScoreMember | tuple[Blob, float, Blob]], *, raise_on_error: bool = True
    ) -> WriteResult:
        """Remove members, leaving tombstones (also for members never inserted). Same contract as insert."""
        items = tuples if isinstance(tuples, list | tuple) else list(tuples)
        return self._write("delete", _writes.deletes(items), len(items), raise_on_error)

    def apply(self, writes: Iterable[Insert | Delete], *, raise_on_error: bool = True) -> WriteResult:
        """Inserts and deletes in one call (one round of shard I/O); ``applied`` follows ``writes``' order.

        Every element must be an :class:`Insert` or a :class:`Delete`. Since writes are order-independent,
        the visible state is the same as applying them one by one, in any order (with a size bound: see the
        class notes). The ``applied`` bits of writes to the same member within one call depend on the order
        the servers apply them in, which is not the caller's.
        """
        items = writes if isinstance(writes, list | tuple) else list(writes)
        try:
            ops = _writes.split(items)
        except InvalidTupleError as error:
            self._report("apply", len(items), 0.0, error=error)
            raise
        return self._write("apply", ops, len(items), raise_on_error)

    def _write(self, name: str, ops: _writes.Ops, n: int, raise_on_error: bool) -> WriteResult:
        result = self._plan.write(name, ops, n)
        if raise_on_error and result.refused is not None:
            raise result.refused
        return result.raise_for_failures() if raise_on_error else result

    # -- reads --------------------------------------------------------------------------------------------

    def select(
        self, keys: Iterable[Blob], offset: int = 0, limit: int = 10, *, strict: bool = True
    ) -> ReadResult[Blob, list[KeyScoreMember]]:
        """The members of each key's add set, highest score first (ties: member descending).

        ``offset`` skips that many members; ``limit`` (> 0) caps the answer per key. A key never written
        reads as ``[]``. Result keys are the caller's key objects.
        """
        started = time.perf_counter()
        with self._reporting("select", started):
            check_limit(limit, offset)
            key_list = listed_keys(keys)
            encoded = self._encoder.keys(key_list)
            adds, stop, pairs = self._layout.adds, offset + limit - 1, self._pairs
            result = read(
                self._transport,
                key_list,
                encoded,
                lambda kb, _: [("ZREVRANGE", adds(kb), offset, stop, "WITHSCORES")],
                lambda key, replies: pairs(key, score_pairs(replies[0])),
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
        A shard that fails (or times out) fails all of its keys of the call at once.
        """
        started = time.perf_counter()
        with self._reporting("select_range", started):
            check_limit(limit)
            key_list = listed_keys(keys)
            encoded = self._encoder.keys(key_list)
        page = _reads.range_pages(self._transport, self._layout.adds, start, stop, limit)
        result = read_each(self._transport, key_list, encoded, page, self._pairs)
        return self._finish("select_range", result, len(key_list), started, strict)

    def score(
        self, key_members: Iterable[KeyMember | tuple[Blob, Blob]], *, strict: bool = True
    ) -> ReadResult[KeyMember, Presence]:
        """Whether each member is present, inserted or deleted, and at which score (see :class:`Presence`).

        Raises :class:`InconsistentDataError` if a member is in both K+ and K- (a foreign write).
        """
        started = time.perf_counter()
        with self._reporting("score", started):
            items = _encode.key_members(key_members)
            encoded = self._encoder.keys([km.key for km in items])
            members = [blob(km.member, i, km, "member") for i, km in enumerate(items)]
            layout = self._layout

            def presence(km: KeyMember, replies: list[Any]) -> Presence:
                ins, dele = replies
                if ins is not None and dele is not None:
                    raise InconsistentDataError(
                        f"member {km.member!r} of {km.key!r} is in both K+ and K- (a foreign write?)"
                    )
                if ins is not None:
                    return Presence(True, True, float(ins))
                if dele is not None:
                    return Presence(True, False, float(dele))
                return NOT_PRESENT

            result = read(
                self._transport,
                items,
                encoded,
                lambda kb, pos: [
                    ("ZSCORE", layout.adds(kb), members[pos]),
                    ("ZSCORE", layout.removes(kb), members[pos]),
                ],
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
        is called after each SCAN step with the keys found so far on that shard.

        A shard that fails does not stop the scan: every other shard is scanned and its keys yielded,
        then :class:`PartialScanError` names the shards whose keys are missing (keys already yielded
        stay valid). The instrumentation event is reported when the iteration ends.
        """
        check_limit(batch_size)
        if match is not None and not isinstance(match, str | bytes):
            raise TypeError(f"match must be str or bytes, not {type(match).__name__}")
        pattern = self._layout.scan_pattern(to_bytes(match) if match is not None else None, include_removed)
        return _reads.scan_keys(self._transport, self._layout, self.decode, self._report, pattern, batch_size, progress)

    def scan(
        self,
        position: str | None = None,
        batch_size: int = 1000,
        *,
        include_removed: bool = False,
        match: Blob | None = None,
    ) -> tuple[list[Blob], str | None]:
        """One resumable step of :meth:`keys`: some keys, and the position to continue from.

        Start with ``position=None``; the answer's position is None once every shard was scanned. A
        position is a short string (``"<shard>:<cursor>"``), valid for as long as the topology's masters
        do not change; a step may return no keys and still have more to come. SCAN's guarantees hold: every
        key present for the whole scan is returned at least once, some may be returned twice. A failed
        shard raises :class:`PartialScanError` naming it (retry the same position, or move past it with
        :meth:`next_shard`).
        """
        check_limit(batch_size)
        if match is not None and not isinstance(match, str | bytes):
            raise TypeError(f"match must be str or bytes, not {type(match).__name__}")
        pattern = self._layout.scan_pattern(to_bytes(match) if match is not None else None, include_removed)
        masters = self._transport.topology.masters()
        index, cursor = _reads.scan_position(position, len(masters))
        shard = masters[index]
        try:
            cursor, raw = _reads.scan_step(self._transport, self._layout, shard, cursor, pattern, batch_size)
        except SHARD_ERRORS as exc:
            raise PartialScanError([ShardFailure(shard.name, exc, ())]) from exc
        keys: list[Blob] = [from_bytes(kb) for kb in raw] if self.decode else list(raw)
        if cursor != 0:
            return keys, f"{index}:{cursor}"
        return keys, self.next_shard(f"{index}:0")

    def next_shard(self, position: str | None) -> str | None:
        """The :meth:`scan` position at the start of the shard after ``position``'s (None: none left)."""
        masters = len(self._transport.topology.masters())
        index, _ = _reads.scan_position(position, masters)
        return f"{index + 1}:0" if index + 1 < masters else None

    # -- plumbing -----------------------------------------------------------------------------------------

    def _pairs(self, key: Blob, pairs: list[tuple[bytes, float]]) -> list[KeyScoreMember]:
        dec = from_bytes if self.decode else bytes
        return [KeyScoreMember(key, score, dec(member)) for member, score in pairs]


for _name in (
    *("insert", "delete", "apply", "select", "select_range", "score", "view"),
    *("records", "floors_of", "fingerprints", "stats", "ping", "load_scripts", "forget"),
    *("increment", "ranks", "top", "fences", "counters"),
):
    setattr(Cluster, _name, following(getattr(Cluster, _name)))
for _name in ("keys", "scan", "next_shard"):
    setattr(Cluster, _name, scanning(getattr(Cluster, _name)))
