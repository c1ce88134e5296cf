"""The farm: one logical store kept on several independent clusters (replicas), as roshi's farm.

Every write goes to every replica; a write is confirmed when ``write_quorum`` replicas confirmed it
(:mod:`zcluster.farm._quorum`). Reads follow a :mod:`read strategy <zcluster.farm.reads>`, dispatched
here; the answers of different replicas are merged by the 2P-set rules (:mod:`zcluster.farm._merge`) and
the replicas that answered differently get the winning record written (read-repair,
:mod:`zcluster.farm._repair`). The walker (:mod:`zcluster.farm.walker`) sweeps the whole keyspace
(:mod:`zcluster.farm._sweep`) and repairs what reads never touch. How the replicas are called (in
parallel, without the late ones) is :mod:`zcluster.farm._replicas`, and how each read strategy asks them
:mod:`zcluster.farm._strategies`. Because writes are idempotent and order-independent, any replica can be
rebuilt from the others.

Why this module is long: it is the farm's whole public contract, one class mirroring
:class:`zcluster.Cluster` with its guarantees written on it, and the dispatch of the read strategies;
everything else lives in the private modules named above.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, wait
from typing import Any, TypeVar

from zcluster import _writes
from zcluster._encode import check_limit, listed_keys
from zcluster.cluster import Cluster
from zcluster.errors import (
    ConfigError,
    InvalidTupleError,
    QuorumError,
    ReplicaBusy,
)
from zcluster.farm import _merge, _quorum, _replicas, _strategies
from zcluster.farm._aggregates import FarmAggregates
from zcluster.farm._merge import Answer, Fix, KeyDiff
from zcluster.farm._quorum import FarmWriteResult
from zcluster.farm._repair import Repair, RepairCounts, Repairer, RepairStrategy, TokenBucket, repair_strategy
from zcluster.farm._replicas import DEFAULT_STRAGGLER_WAIT, LateCounts
from zcluster.farm._strategies import Shared
from zcluster.farm._sweep import sweep
from zcluster.farm.reads import ReadStrategy, SendAllReadAll, SendOneReadOne, SendVarReadFirstLinger, read_strategy
from zcluster.instrumentation import Instrumentation, nop
from zcluster.types import (
    Blob,
    Cursor,
    Delete,
    Insert,
    KeyMember,
    KeyScoreMember,
    Presence,
    ReadResult,
    ShardStats,
    Write,
)

__all__ = ["Farm"]

K = TypeVar("K")
V = TypeVar("V")


class Farm(FarmAggregates):
    """The :class:`zcluster.Cluster` API over replicas: independent clusters holding the same sets.

    Guarantees (``docs/architecture.md`` has the reasoning):

    * A write returns once every replica answered or failed, or once every tuple was confirmed by the
      quorum and ``straggler_wait`` more seconds passed (the replicas still silent are *late*, see
      Timeouts). With ``raise_on_error`` (default), a tuple that fewer than the quorum confirmed raises
      :class:`QuorumError`; resending is safe. A confirmed tuple is on at least ``quorum`` replicas; the
      others get it from read-repair or the walker.
    * ``write_quorum`` is a percentage of the replicas, rounded up (``"51%"``: a majority), or a count.
      With a majority quorum and :class:`SendAllReadAll`, a read after a confirmed write sees it (or a
      newer write) as long as at most a minority of replicas failed since.
    * Reads never return a record that no replica holds; the merge decides each member by the 2P-set
      rules with every answering replica's records, tombstones included (no bias toward adds).
    * A replica that is down makes reads and writes slower, never wrong: reads answer from the others
      (a key no replica could answer is a :class:`PartialReadError`), writes count it out of the quorum.

    Increments (``increment``, ``top``, ``ranks``, ``counters``, ``repair_aggregates``) are confirmed by every
    replica, not the quorum, and read from the replica whose copy leads: see :class:`FarmAggregates`.

    Replicas must share the layout options (``prefix``, ``max_size``, floors), else :class:`ConfigError`:
    a repair writes one replica's record onto another. One farm may be shared by threads; :meth:`close`
    closes the clusters.

    Timeouts. Each replica's connections have redis-py's ``socket_connect_timeout`` (default 5 s: TCP
    connect and, for ``rediss://``, the TLS handshake) and ``socket_timeout`` (default 30 s: any one
    command's reply); set them per replica in its URLs (``redis://host:6379?socket_timeout=5``) or with
    ``Cluster.from_urls(..., connection={"socket_timeout": 5})``. A hung replica costs a call at most
    ``straggler_wait`` (default 0.5 s): once a write has every tuple confirmed by the quorum, or a
    :class:`SendAllReadAll` read has every key answered by a read quorum (``len(clusters) - quorum + 1``
    replicas, which any write quorum intersects), the call waits that much longer for the other replicas,
    then returns without them. Their calls go on in the background, bounded by their socket timeout
    (:attr:`late_calls` counts them; ``farm.late`` events report each one's outcome); tuples a late write
    then fails are handed to read-repair (the ``repair`` strategy; counted in :attr:`repairs`). A replica
    with 4 late calls still running is not called (a :class:`ReplicaBusy` failure) until one finishes.
    ``straggler_wait=0`` returns as soon as the quorum answered (roshi's rule). A call that needs a slow
    replica (a tuple short of the quorum without it, the walker, ``forget``) waits for it, up to its socket
    timeout. :meth:`close` waits ``straggler_wait`` for late calls, then cuts them (their failures are
    counted as dropped repairs; the walker finds them); :meth:`flush_repairs` waits for them.
    """

    def __init__(
        self,
        clusters: Sequence[Cluster],
        *,
        write_quorum: str | int = "51%",
        read: ReadStrategy | str = "all",
        repair: RepairStrategy | str = "all",
        names: Sequence[str] | None = None,
        instrumentation: Instrumentation = nop,
        straggler_wait: float = DEFAULT_STRAGGLER_WAIT,
    ) -> None:
        clusters = list(clusters)
        quorum = _quorum.parse_quorum(write_quorum, len(clusters))
        names = [f"replica{i}" for i in range(len(clusters))] if names is None else [str(n) for n in names]
        if len(names) != len(clusters) or len(set(names)) != len(names):
            raise ConfigError(f"names must be {len(clusters)} distinct names, got {names!r}")
        _replicas.check_same_layout([_replicas.layout_of(c.prefix, c.max_size, c.floors) for c in clusters])
        replicas = _replicas.Replicas(names, straggler_wait)
        repairer = Repairer(repair_strategy(repair), instrumentation)
        shared = Shared(repairer, replicas)
        self._setup(clusters, quorum, read_strategy(read), names, instrumentation, shared, True)

    def _setup(
        self,
        clusters: list[Cluster],
        quorum: int,
        read: ReadStrategy,
        names: list[str],
        instrumentation: Instrumentation,
        shared: Shared,
        owner: bool,
    ) -> None:
        self.clusters = clusters
        self.names = names
        self.quorum = quorum
        self.read_strategy = read
        self.instrumentation = instrumentation
        self._shared = shared
        self._owner = owner
        self._bucket = TokenBucket(read.per_second, read.burst) if isinstance(read, SendVarReadFirstLinger) else None

    def view(self, prefix: Blob, **options: Any) -> Farm:
        """Another namespace on every replica (:meth:`Cluster.view` with ``options``), sharing this farm's
        connections, threads and repairs; its :meth:`close` does nothing."""
        view = object.__new__(Farm)
        clusters = [c.view(prefix, **options) for c in self.clusters]
        view._setup(clusters, self.quorum, self.read_strategy, self.names, self.instrumentation, self._shared, False)
        return view

    @property
    def prefix(self) -> bytes:
        return self.clusters[0].prefix

    @property
    def shards(self) -> list[str]:
        """Every replica's masters, named ``replica/host:port``."""
        return [_merge.shard_name(n, s) for n, c in zip(self.names, self.clusters, strict=True) for s in c.shards]

    def _known_shards(self) -> tuple[str, ...]:
        clusters = zip(self.names, self.clusters, strict=True)
        return tuple(_merge.shard_name(n, s) for n, c in clusters for s in c._known_shards())

    @property
    def repairs(self) -> RepairCounts:
        """Repairs requested, done, failed and dropped so far (by this farm and its views)."""
        return self._shared.repairer.snapshot()

    @property
    def late_calls(self) -> LateCounts:
        """Replica calls this farm (and its views) returned without, and calls skipped (see Timeouts)."""
        return self._shared.replicas.counts()

    def flush_repairs(self, timeout: float | None = None) -> bool:
        """Wait for lingering reads, late replica calls and queued repairs (:class:`NonBlockingRepair`) to
        finish, repairs written; False if ``timeout`` passed first."""
        deadline = None if timeout is None else time.monotonic() + timeout

        def left() -> float | None:
            return None if deadline is None else max(0.0, deadline - time.monotonic())

        shared = self._shared
        return shared.wait_lingering(left()) and shared.replicas.flush(left()) and shared.repairer.flush(left())

    def close(self) -> None:
        """Finish lingering reads and queued repairs, give late replica calls ``straggler_wait`` to finish
        (then cut them: their failures are counted as dropped repairs), stop the threads and close every
        replica (a view does nothing)."""
        if not self._owner:
            return
        shared = self._shared
        shared.wait_lingering(None)
        shared.replicas.flush(shared.replicas.straggler_wait)
        shared.replicas.close()
        shared.linger_pool.close()
        shared.repairer.close()
        for c in self.clusters:
            c.close()  # closes its connections first: a late call blocked on a reply fails at once

    def __enter__(self) -> Farm:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Farm({', '.join(self.names)}; quorum {self.quorum}/{len(self.clusters)}, {self.read_strategy})"

    # -- writes -------------------------------------------------------------------------------------------

    def insert(
        self, tuples: Iterable[KeyScoreMember | tuple[Blob, float, Blob]], *, raise_on_error: bool = True
    ) -> FarmWriteResult:
        """:meth:`Cluster.insert` on every replica (validated and encoded once); see :class:`FarmWriteResult`."""
        items = tuples if isinstance(tuples, list | tuple) else list(tuples)
        return self._write("insert", _writes.inserts(items), len(items), raise_on_error)

    def delete(
        self, tuples: Iterable[KeyScoreMember | tuple[Blob, float, Blob]], *, raise_on_error: bool = True
    ) -> FarmWriteResult:
        """:meth:`Cluster.delete` on every replica; same contract as :meth:`insert`."""
        items = tuples if isinstance(tuples, list | tuple) else list(tuples)
        return self._write("delete", _writes.deletes(items), len(items), raise_on_error)

    def apply(self, writes: Iterable[Insert | Delete], *, raise_on_error: bool = True) -> FarmWriteResult:
        """:meth:`Cluster.apply` on every replica; same contract as :meth:`insert`."""
        items = writes if isinstance(writes, list | tuple) else list(writes)
        try:
            ops = _writes.split(items)
        except InvalidTupleError as error:
            self._report("farm.apply", len(items), 0.0, error=error)
            raise
        return self._write("apply", ops, len(items), raise_on_error)

    def _write(self, name: str, ops: _writes.Ops, n: int, raise_on_error: bool) -> FarmWriteResult:
        started = time.perf_counter()
        try:
            outcomes = self._shared.replicas.each(
                functools.partial(_quorum.send, name, ops, n, started, _quorum.prepare(self.clusters, ops)),
                enough=functools.partial(_quorum.quorum_reached, n, self.quorum),
                late=functools.partial(_replicas.late_write, self, ops, n, started),
            )
        except BaseException as exc:
            self._report(f"farm.{name}", n, started, error=exc)
            raise
        result = _quorum.confirm(self.names, outcomes, n, self.quorum)
        self._report(f"farm.{name}", n, started, result.applied_count, [f.shard for f in result.failures])
        if raise_on_error and result.failures:
            raise QuorumError(result)
        return result

    def forget(self, keys: Iterable[Blob], up_to: float) -> int:
        """:meth:`Cluster.forget` on every replica; the most entries any replica removed. A replica that
        failed raises :class:`PartialWriteError` naming its shards (the others did their part). Aggregate
        keys are refused on every replica holding one, unchanged, as :meth:`Cluster.forget` refuses them:
        once every replica did its part, :class:`WriteRefusedError` names the first refused key and its kind
        (its ``refused``: every key refused on some replica; ``result.failures``: the failed shards)."""
        key_list = list(keys)
        outcome = self._shared.replicas.each(lambda i: self.clusters[i].forget(key_list, up_to))
        _merge.raise_forget_failures(self.names, key_list, outcome)
        return max(int(r) for r in outcome if not isinstance(r, BaseException))

    def repair_now(self, writes: Iterable[tuple[int, Write]]) -> tuple[int, int]:
        """Write each ``(replica index, write)`` now, whatever the repair strategy (the walker's repairs),
        counted in :attr:`repairs` and reported like every repair; (written, failed)."""
        return self._shared.repairer.repair_now(self._repairs(writes))

    # -- reads --------------------------------------------------------------------------------------------

    def select(
        self, keys: Iterable[Blob], offset: int = 0, limit: int = 10, *, strict: bool = True
    ) -> ReadResult[Blob, list[KeyScoreMember]]:
        """:meth:`Cluster.select` under the farm's read strategy (each replica is asked for the first
        ``offset + limit`` members)."""
        key_list = listed_keys(keys)
        check_limit(limit, offset)

        def fetch(c: Cluster, ks: list[Blob], window: int) -> ReadResult[Blob, list[KeyScoreMember]]:
            return c.select(ks, 0, window, strict=False)

        return self._window_read("select", key_list, fetch, offset, limit, strict)

    def select_range(
        self,
        keys: Iterable[Blob],
        start: Cursor | None = None,
        stop: Cursor | None = None,
        limit: int = 10,
        *,
        strict: bool = True,
    ) -> ReadResult[Blob, list[KeyScoreMember]]:
        """:meth:`Cluster.select_range` under the farm's read strategy."""
        key_list = listed_keys(keys)
        check_limit(limit)

        def fetch(c: Cluster, ks: list[Blob], window: int) -> ReadResult[Blob, list[KeyScoreMember]]:
            return c.select_range(ks, start, stop, window, strict=False)

        def within(score: float, member: Blob) -> bool:
            # A winner from another replica's record (score lookup) may lie outside the range.
            at = _merge.order(score, member)
            return (start is None or at < _merge.order(start.score, start.member)) and (
                stop is None or at > _merge.order(stop.score, stop.member)
            )

        return self._window_read("select_range", key_list, fetch, 0, limit, strict, within)

    def score(
        self, key_members: Iterable[KeyMember | tuple[Blob, Blob]], *, strict: bool = True
    ) -> ReadResult[KeyMember, Presence]:
        """:meth:`Cluster.score` under the farm's read strategy; merged, it is each member's winning record."""
        items = [km if type(km) is KeyMember else KeyMember(*km) for km in key_members]
        started = time.perf_counter()

        def fetch(c: Cluster, kms: list[KeyMember]) -> ReadResult[KeyMember, Presence]:
            return c.score(kms, strict=False)

        def merge(answers: list[Answer]) -> tuple[ReadResult[KeyMember, Presence], list[Fix]]:
            return _merge.merge_scores(items, answers, self.names)

        result = self._read(items, fetch, merge)
        return self._finish("farm.score", result, len(items), started, strict)

    def records(self, keys: Iterable[Blob]) -> list[ReadResult[Blob, list[Write]]]:
        """What each replica holds for ``keys`` (:meth:`Cluster.records`), in replica order, unmerged:
        for inspection (``zcluster diff``). A replica that failed has its keys in ``errors``."""
        key_list = listed_keys(keys)
        return self.per_replica(lambda c: c.records(key_list, strict=False), key_list)

    def diff(self, keys: Iterable[Blob]) -> list[KeyDiff]:
        """Each key compared across the replicas' :meth:`records` (``zcluster diff``): every member's record
        on each replica and the merged one, and the replicas that could not read the key. Repairs nothing
        (:meth:`repair_now` with the members' ``fixes`` would)."""
        key_list = listed_keys(keys)
        answers = self.records(key_list)
        return [_merge.diff_key(key, answers, self.names) for key in key_list]

    def per_replica(
        self, read: Callable[[Cluster], ReadResult[K, V]], items: Sequence[K], replicas: Sequence[int] | None = None
    ) -> list[ReadResult[K, V]]:
        """``read(cluster)`` on every replica (or on those at the indices ``replicas``) in parallel, unmerged,
        in that order: for comparing replicas (the walker). ``read`` answers for ``items`` (a cluster read
        with ``strict=False``); a replica whose call failed as a whole (its failure, late or busy) answers
        with every item in ``errors`` (shard ``*``). Anything but a replica's failure propagates."""
        answers = self._shared.replicas.each(lambda i: read(self.clusters[i]), replicas)
        return [_merge.failed(items, a) if isinstance(a, BaseException) else a for a in answers]

    def keys(
        self, batch_size: int = 1000, *, include_removed: bool = False, match: Blob | None = None
    ) -> Iterator[list[Blob]]:
        """Every logical key held by any replica, each reported by the first replica that holds it
        (the walker's sweep): a replica's keys are checked against the earlier replicas, so a key is
        reported by one replica even where all replicas hold it (at least once: as with
        :meth:`zcluster.Cluster.scan`, SCAN may return a key more than once). A replica that failed during
        the sweep raises :class:`PartialScanError` at the end, after every key that could be read."""
        for step in sweep(self, batch_size=batch_size, include_removed=include_removed, match=match):
            if step.keys:
                yield step.keys

    def ping(self) -> dict[str, BaseException | None]:
        """Every replica's masters (``replica/host:port``) and their PING failure (None: answered)."""
        out: dict[str, BaseException | None] = {}
        answers = self._shared.replicas.each(lambda i: self.clusters[i].ping())
        for replica, cluster, res in zip(self.names, self.clusters, answers, strict=True):
            if isinstance(res, ReplicaBusy):
                res = dict.fromkeys(cluster.shards, res)
            elif isinstance(res, BaseException):
                raise res
            out.update({_merge.shard_name(replica, shard): err for shard, err in res.items()})
        return out

    def stats(self, scan: bool = True) -> list[ShardStats]:
        """:meth:`Cluster.stats` of every replica, in replica order, its shards named ``replica/host:port``.
        A shard that fails is reported in its entry's ``error``, never raised; so is every shard of a
        replica that failed as a whole (e.g. busy, see Timeouts)."""
        answers = self._shared.replicas.each(lambda i: self.clusters[i].stats(scan=scan))
        out: list[ShardStats] = []
        for replica, cluster, res in zip(self.names, self.clusters, answers, strict=True):
            if isinstance(res, BaseException):
                res = [ShardStats(shard, error=f"{type(res).__name__}: {res}") for shard in cluster.shards]
            out += [dataclasses.replace(s, shard=_merge.shard_name(replica, s.shard)) for s in res]
        return out

    # -- read strategies ----------------------------------------------------------------------------------

    def _read(self, items: list[Any], fetch: _strategies.Fetch, merge: _strategies.Merge) -> ReadResult[Any, Any]:
        """Run the read strategy: ``fetch`` asks one replica, ``merge`` turns every replica's answer into
        the merged result and the fixes it found (and may ask replicas more)."""
        strategy = self.read_strategy
        if not items:
            return ReadResult()
        fetch = functools.partial(_strategies.guarded, fetch)
        if isinstance(strategy, SendOneReadOne):
            return _strategies.in_turn(
                self._shared.replicas, self.clusters, next(self._shared.rr) % len(self.clusters), items, fetch
            )
        if isinstance(strategy, SendAllReadAll):
            answers = self._shared.replicas.each(
                lambda i: fetch(self.clusters[i], items),
                enough=functools.partial(_quorum.answered_by, items, self._read_quorum()),
                late=functools.partial(_replicas.late_read, self, len(items), time.perf_counter()),
            )
            result, fixes = merge(answers)
            self._repair(fixes)
            return result
        pool = self._shared.replicas.workers
        start = next(self._shared.rr) % len(self.clusters)
        futures: dict[int, Future[ReadResult[Any, Any]]] = {}
        if self._bucket is not None and not self._bucket.take():  # SendVar over its rate: one replica first
            futures[start] = pool.submit(functools.partial(fetch, self.clusters[start], items))
            assert isinstance(strategy, SendVarReadFirstLinger)
            done, _ = wait(list(futures.values()), timeout=strategy.threshold)
            if done:
                answer = futures[start].result()
                if not answer.errors:
                    return answer
        for i, c in enumerate(self.clusters):
            if i not in futures:
                futures[i] = pool.submit(functools.partial(fetch, c, items))
        return _strategies.first_then_linger(self._shared, futures, merge, self._repair)

    def _window_read(
        self,
        op: str,
        keys: list[Blob],
        fetch: _strategies.WindowFetch,
        offset: int,
        limit: int,
        strict: bool,
        within: Callable[[float, Blob], bool] | None = None,
    ) -> ReadResult[Blob, list[KeyScoreMember]]:
        started = time.perf_counter()
        need = offset + limit

        def first(c: Cluster, ks: list[Blob]) -> ReadResult[Blob, list[KeyScoreMember]]:
            return fetch(c, ks, need)

        def merge(answers: list[Answer]) -> tuple[ReadResult[Blob, list[KeyScoreMember]], list[Fix]]:
            return self._merge_windows(keys, answers, fetch, need, within)

        if isinstance(self.read_strategy, SendAllReadAll):
            result, fixes = self._merge_windows(keys, None, fetch, need, within)
            self._repair(fixes)
        else:
            result = self._read(keys, first, merge)
        return self._finish(f"farm.{op}", _merge.sliced(result, offset, limit), len(keys), started, strict)

    def _merge_windows(
        self,
        keys: list[Blob],
        answers: list[Answer] | None,
        fetch: _strategies.WindowFetch,
        need: int,
        within: Callable[[float, Blob], bool] | None = None,
    ) -> tuple[ReadResult[Blob, list[KeyScoreMember]], list[Fix]]:
        """:func:`_merge.merge_windows` over the replicas, in rounds of :func:`_strategies.ask_round` (the
        replicas late or busy in a round are not asked again); ``answers``: the first round, if known."""
        gone: dict[int, Answer] = {}
        started = time.perf_counter()

        def ask(pending: list[Blob], window: int) -> list[Answer]:
            late = functools.partial(_replicas.late_read, self, len(pending), started)
            fn = functools.partial(_strategies.window, fetch, pending, window, self.clusters)
            return _strategies.ask_round(self._shared.replicas, fn, pending, gone, self._read_quorum(), late)

        return _merge.merge_windows(keys, self.names, need, ask, self._look_up, within, answers)

    def _look_up(self, lookups: dict[int, list[KeyMember]]) -> dict[int, Answer]:
        """Each replica's records of the key-members ``lookups`` asks of it (its ``score``), or its failure."""
        answers = self._shared.replicas.each(lambda i: self.clusters[i].score(lookups[i], strict=False), list(lookups))
        return dict(zip(lookups, answers, strict=True))

    def _read_quorum(self) -> int:
        return _quorum.read_quorum(len(self.clusters), self.quorum)

    def _repairs(self, fixes: Iterable[tuple[int, Write]]) -> list[Repair]:
        return [Repair(self.names[i], self.clusters[i], w) for i, w in fixes]

    def _repair(self, fixes: Iterable[tuple[int, Write]]) -> None:
        """Hand ``fixes`` to the repair strategy."""
        self._shared.repairer.submit(self._repairs(fixes))
