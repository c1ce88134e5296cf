"""The farm: one logical store kept on several independent clusters (replicas), as roshi's farm.

Every write goes to every replica; a write is confirmed when ``write_quorum`` replicas confirmed it.
Reads follow a :mod:`read strategy <zcluster.farm.reads>`; the answers of different replicas are
merged by the 2P-set rules (:mod:`zcluster.farm.merge`) and the replicas that answered differently get
the winning record written (:mod:`read-repair <zcluster.farm.repair>`). The walker
(:mod:`zcluster.farm.walker`) sweeps the whole keyspace and repairs what reads never touch. Because
writes are idempotent and order-independent, any replica can be rebuilt from the others.

Why this module is long: it is the farm's whole public contract (one class, mirroring
:class:`zcluster.Cluster`) plus the two merges that read strategies need (windows and scores); the
strategies' parameters, the merge rules, repairs and the walker live in the modules beside it.
"""

from __future__ import annotations

import functools
import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field
from typing import Any, TypeVar

from zcluster import _writes
from zcluster._encode import check_limit, listed_keys
from zcluster._reporting import Reporting
from zcluster.cluster import Cluster
from zcluster.errors import ConfigError, InvalidTupleError, PartialWriteError, ShardError
from zcluster.farm._replicas import (
    DEFAULT_STRAGGLER_WAIT,
    POLL,
    LateCounts,
    ReplicaBusy,
    ReplicaLate,
    Replicas,
    Workers,
    answered_by,
    check_same_layout,
    late_read,
    late_write,
    layout_of,
    quorum_reached,
    whole_failure,
)
from zcluster.farm.merge import as_write, differs, order, winner
from zcluster.farm.quorum import parse_quorum
from zcluster.farm.reads import (
    ReadStrategy,
    SendAllReadAll,
    SendOneReadOne,
    SendVarReadFirstLinger,
    read_strategy,
)
from zcluster.farm.repair import Repair, RepairCounts, Repairer, RepairStrategy, TokenBucket, repair_strategy
from zcluster.instrumentation import Instrumentation, OpEvent, nop
from zcluster.types import (
    NOT_PRESENT,
    Blob,
    Cursor,
    Delete,
    Insert,
    KeyMember,
    KeyScoreMember,
    Presence,
    ReadResult,
    ShardFailure,
    Write,
    WriteResult,
    to_bytes,
)

__all__ = ["Farm", "FarmWriteResult", "QuorumError"]

log = logging.getLogger("zcluster.farm")
T = TypeVar("T")
MAX_LINGERING = 64
Answer = ReadResult[Any, Any] | BaseException


@dataclass
class FarmWriteResult(WriteResult):
    """Outcome of a farm write, per input tuple.

    ``confirmed[i]`` counts the replicas that answered for tuple ``i`` (applied it or found it stale);
    the tuple is confirmed when that reaches ``quorum``. ``applied[i]``: it took effect on every replica
    that answered for it (at least one), i.e. it was newer than all they held, as :attr:`WriteResult.applied`
    for the farm as one store: a replica that missed or lost an older write of the member (and so applies
    it again) does not make a duplicate look new (:class:`zcluster.state.DedupStore` relies on it).
    ``failures`` lists, per replica shard (named ``replica/host:port``), only the tuples left
    below the quorum (so :attr:`ok` means "every tuple reached the quorum"); ``replica_failures`` has
    every failure of every replica, the ones a quorum covered included (the walker repairs those).
    ``late`` names the replicas the write returned without (see ``straggler_wait`` in :class:`Farm`):
    their tuples are in ``replica_failures`` with a :class:`~zcluster.farm.ReplicaLate` error, and their
    calls go on in the background; tuples such a call then fails are handed to read-repair.
    """

    confirmed: list[int] = field(default_factory=list)
    quorum: int = 1
    replica_failures: dict[str, list[ShardFailure]] = field(default_factory=dict)
    late: list[str] = field(default_factory=list)


class QuorumError(PartialWriteError):
    """Fewer replicas than the write quorum confirmed some tuples; ``result`` (a :class:`FarmWriteResult`)
    says which, and names the replicas that failed. Resending the failed tuples is safe."""

    def __init__(self, result: FarmWriteResult) -> None:
        super().__init__(result)
        below = len(result.failed_indices)  # distinct tuples
        self.args = (f"{below} tuple(s) confirmed by fewer than {result.quorum} replica(s): {self.args[0]}",)


class _Shared:
    """What a farm and its views share: the replica calls (threads, late calls) and the repairer."""

    def __init__(self, repairer: Repairer, replicas: Replicas) -> None:
        self.repairer = repairer
        self.replicas = replicas
        self.lock = threading.Lock()
        self.rr = itertools.count()
        self.lingering: set[Future[None]] = set()
        self.linger_pool = Workers(4, "zcluster-linger")

    def linger(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` (a lingering read's merge and repairs) in the background, tracked for flushing.

        On threads of their own: a merge asks replicas through :meth:`executor`, and a pool waiting on
        its own tasks could deadlock. Past ``MAX_LINGERING`` merges in flight the caller runs ``fn``
        itself (backpressure: a slower read, never a skipped merge or an unbounded backlog).
        """
        with self.lock:
            if len(self.lingering) >= MAX_LINGERING:
                future = None
            else:
                future = self.linger_pool.submit(fn)
                self.lingering.add(future)
        if future is None:
            fn()
            return
        future.add_done_callback(self._done)

    def _done(self, future: Future[None]) -> None:
        with self.lock:
            self.lingering.discard(future)
        exc = future.exception()
        if exc is not None:  # a bug in the merge: nothing else would ever see it
            log.error("a lingering read's repair failed", exc_info=exc)
            self.repairer.instrumentation(OpEvent("farm.repair", 0, 0.0, 0, (), exc))

    def wait_lingering(self, timeout: float | None) -> bool:
        """Wait for the lingering merges in flight (in slices: a Ctrl-C is not held up); False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.lock:
            lingering = list(self.lingering)
        while lingering:
            left = POLL if deadline is None else min(POLL, deadline - time.monotonic())
            if left <= 0:
                return False
            lingering = list(wait(lingering, timeout=left).not_done)
        return True


class Farm(Reporting):
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
        quorum = parse_quorum(write_quorum, len(clusters))
        names = [f"replica{i}" for i in range(len(clusters))] if names is None else [str(n) for n in names]
        if len(names) != len(clusters) or len(set(names)) != len(names):
            raise ConfigError(f"names must be {len(clusters)} distinct names, got {names!r}")
        check_same_layout([layout_of(c.prefix, c.max_size, c.floors) for c in clusters])
        replicas = Replicas(len(clusters), straggler_wait)
        repairer = Repairer(repair_strategy(repair), instrumentation)
        shared = _Shared(repairer, replicas)
        self._setup(clusters, quorum, read_strategy(read), names, instrumentation, shared, True)

    def _setup(
        self,
        clusters: list[Cluster],
        quorum: int,
        read: ReadStrategy,
        names: list[str],
        instrumentation: Instrumentation,
        shared: _Shared,
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
        for i, c in enumerate(self.clusters):
            if shared.replicas.running(i):
                # Cut its connections first: a late call blocked on a reply then fails at once, where
                # Cluster.close would wait for its shard threads (up to the socket timeout).
                c._transport.topology.close()
            c.close()

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
            prepared: dict[Any, Any] = {}
            work = []
            for c in self.clusters:  # encode once for every replica of the same shape
                plan = _writes.plan_of(c)
                shape = plan.shape()
                p = prepared.get(shape) if shape is not None else None
                if p is None:
                    try:
                        p = plan.prepare(ops)
                    except ShardError as exc:  # e.g. a Redis Cluster replica with a slot uncovered
                        p = exc
                    if shape is not None:
                        prepared[shape] = p
                work.append((plan, p))
            outcomes = self._each_safe(
                functools.partial(_send, name, ops, n, started, work),
                enough=functools.partial(quorum_reached, n, self.quorum),
                late=functools.partial(late_write, self, ops, n, started),
            )
            results = [whole_failure(o, n) if isinstance(o, BaseException) else o for o in outcomes]
        except BaseException as exc:
            self._report(f"farm.{name}", n, started, error=exc)
            raise
        confirmed = [len(results)] * n
        fresh = [True] * n  # new to every replica that answered for it
        for r in results:
            failed = set(r.failed_indices)
            for i in failed:
                confirmed[i] -= 1
            fresh = [f and (a or i in failed) for i, (f, a) in enumerate(zip(fresh, r.applied, strict=True))]
        applied = [f and c > 0 for f, c in zip(fresh, confirmed, strict=True)]
        below = {i for i in range(n) if confirmed[i] < self.quorum}
        failures = []
        everything: dict[str, list[ShardFailure]] = {}
        for replica, r in zip(self.names, results, strict=True):
            everything[replica] = [ShardFailure(f"{replica}/{f.shard}", f.error, f.indices) for f in r.failures]
            for f in everything[replica]:
                lost = tuple(i for i in f.indices if i in below)
                if lost:
                    failures.append(ShardFailure(f.shard, f.error, lost))
        late = [replica for replica, o in zip(self.names, outcomes, strict=True) if isinstance(o, ReplicaLate)]
        result = FarmWriteResult(applied, failures, confirmed, self.quorum, everything, late)
        self._report(f"farm.{name}", n, started, result.applied_count, [f.shard for f in failures])
        if raise_on_error and failures:
            raise QuorumError(result)
        return result

    def forget(self, keys: Iterable[Blob], up_to: float) -> int:
        """:meth:`Cluster.forget` on every replica; the most entries any replica removed. A replica that
        failed raises :class:`PartialWriteError` naming its shards (the others did their part)."""
        key_list = list(keys)
        outcome = self._each_safe(lambda i: self.clusters[i].forget(key_list, up_to))
        failures = []
        for replica, res in zip(self.names, outcome, strict=True):
            if isinstance(res, PartialWriteError):
                failures += [ShardFailure(f"{replica}/{f.shard}", f.error, f.indices) for f in res.result.failures]
            elif isinstance(res, ReplicaBusy):
                failures.append(ShardFailure(f"{replica}/*", res, tuple(range(len(key_list)))))
            elif isinstance(res, BaseException):
                raise res
        if failures:
            handled = [all(i not in f.indices for f in failures) for i in range(len(key_list))]
            raise PartialWriteError(WriteResult(handled, failures))
        return max(int(r) for r in outcome if not isinstance(r, BaseException))

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
            at = order(score, member)
            return (start is None or at < order(start.score, start.member)) and (
                stop is None or at > order(stop.score, stop.member)
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

        def merge(answers: list[Answer]) -> tuple[ReadResult[KeyMember, Presence], list[Repair]]:
            return self._merge_scores(items, answers)

        result = self._read(items, fetch, merge)
        return self._finish("farm.score", result, len(items), started, strict)

    def records(self, keys: Iterable[Blob]) -> list[ReadResult[Blob, list[Write]]]:
        """What each replica holds for ``keys`` (:meth:`Cluster.records`), in replica order, unmerged:
        for inspection (``zcluster diff``). A replica that failed has its keys in ``errors``."""
        key_list = listed_keys(keys)
        return self._replica_reads(lambda i: self.clusters[i].records(key_list, strict=False), key_list)

    def keys(
        self, batch_size: int = 1000, *, include_removed: bool = False, match: Blob | None = None
    ) -> Iterator[list[Blob]]:
        """Every logical key held by any replica, each reported by the first replica that holds it
        (see :func:`zcluster.farm.walker.sweep`): a replica's keys are checked against the earlier
        replicas, so a key is reported once even where all replicas hold it. A replica that failed during
        the sweep raises :class:`PartialScanError` at the end, after every key that could be read."""
        from zcluster.farm.walker import sweep

        for step in sweep(self, batch_size=batch_size, include_removed=include_removed, match=match):
            if step.keys:
                yield step.keys

    def ping(self) -> dict[str, BaseException | None]:
        """Every replica's masters (``replica/host:port``) and their PING failure (None: answered)."""
        out: dict[str, BaseException | None] = {}
        answers = self._each_safe(lambda i: self.clusters[i].ping())
        for replica, cluster, res in zip(self.names, self.clusters, answers, strict=True):
            if isinstance(res, ReplicaBusy):
                res = dict.fromkeys(cluster.shards, res)
            elif isinstance(res, BaseException):
                raise res
            out.update({f"{replica}/{shard}": err for shard, err in res.items()})
        return out

    # -- read strategies ----------------------------------------------------------------------------------

    def _read(
        self,
        items: list[Any],
        fetch: Callable[[Cluster, list[Any]], ReadResult[Any, Any]],
        merge: Callable[[list[Answer]], tuple[ReadResult[Any, Any], list[Repair]]],
    ) -> ReadResult[Any, Any]:
        """Run the read strategy: ``fetch`` asks one replica, ``merge`` turns every replica's answer into
        the merged result and the repairs it found (and may ask replicas more)."""
        strategy = self.read_strategy
        if not items:
            return ReadResult()
        fetch = functools.partial(self._guarded, fetch)
        if isinstance(strategy, SendOneReadOne):
            return self._one(items, fetch)
        if isinstance(strategy, SendAllReadAll):
            answers = self._each_safe(
                functools.partial(_fetch_on, fetch, items, self.clusters),
                enough=functools.partial(answered_by, items, self._read_quorum()),
                late=functools.partial(late_read, self, len(items), time.perf_counter()),
            )
            result, repairs = merge(answers)
            self._shared.repairer.submit(repairs)
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
        return self._first_then_linger(futures, merge)

    def _read_quorum(self) -> int:
        """Replicas a read needs to see every write the quorum confirmed: any of them meets any write quorum."""
        return len(self.clusters) - self.quorum + 1

    def _guarded(
        self, fetch: Callable[[Cluster, list[Any]], ReadResult[Any, Any]], cluster: Cluster, items: list[Any]
    ) -> ReadResult[Any, Any]:
        """``fetch``, with a replica's own failure (ShardError, OSError) as an answer failing every item."""
        try:
            return fetch(cluster, items)
        except (ShardError, OSError) as exc:
            return _failed(items, exc)

    def _replica_reads(self, fn: Callable[[int], ReadResult[Any, Any]], items: list[Any]) -> list[ReadResult[Any, Any]]:
        """``fn(i)`` on every replica ``i`` in parallel, in replica order; a replica whose call raised a
        ShardError or OSError answers with every item in ``errors``."""
        answers = self._each_safe(fn)
        return [_failed(items, a) if isinstance(a, BaseException) else a for a in answers]

    def _first_then_linger(
        self,
        futures: dict[int, Future[ReadResult[Any, Any]]],
        merge: Callable[[list[Answer]], tuple[ReadResult[Any, Any], list[Repair]]],
    ) -> ReadResult[Any, Any]:
        pending = set(futures.values())
        first: ReadResult[Any, Any] | None = None
        while pending and first is None:
            done, pending = wait(pending, timeout=POLL, return_when=FIRST_COMPLETED)
            for f in done:
                if f.result().errors:  # reads with strict=False raise only for bad input or a bug
                    continue
                first = f.result()
                break
        ordered = [futures[i] for i in sorted(futures)]

        def linger() -> tuple[ReadResult[Any, Any], list[Repair]]:
            while wait(ordered, timeout=POLL).not_done:  # in slices: a Ctrl-C is not held up
                pass
            return merge([f.result() for f in ordered])

        if first is None:  # no replica answered everything: the merge of what they did answer
            result, repairs = linger()
            self._shared.repairer.submit(repairs)
            return result
        self._shared.linger(lambda: self._shared.repairer.submit(linger()[1]))
        return first

    def _one(
        self, items: list[Any], fetch: Callable[[Cluster, list[Any]], ReadResult[Any, Any]]
    ) -> ReadResult[Any, Any]:
        start = next(self._shared.rr) % len(self.clusters)
        answers: dict[Any, Any] = {}
        errors: dict[Any, ShardFailure] = {}
        remaining = items
        for step in range(len(self.clusters)):
            i = (start + step) % len(self.clusters)
            replicas = self._shared.replicas
            if replicas.busy(i):  # hung: asking it would cost its socket timeout
                answer = _failed(remaining, replicas.skip(i, self.names[i]))
            else:
                answer = fetch(self.clusters[i], remaining)
            answers.update(answer)
            errors = {k: _named(self.names[i], f) for k, f in answer.errors.items()}
            remaining = [k for k in remaining if k in answer.errors]
            if not remaining:
                break
        return _in_order(items, answers, errors)

    # -- merges -------------------------------------------------------------------------------------------

    def _merge_scores(
        self, items: list[KeyMember], answers: list[Answer]
    ) -> tuple[ReadResult[KeyMember, Presence], list[Repair]]:
        values: dict[KeyMember, Presence] = {}
        errors: dict[KeyMember, ShardFailure] = {}
        repairs: list[Repair] = []
        for km in items:
            have: list[Presence | None] = []
            for i, ans in enumerate(answers):
                if isinstance(ans, BaseException):
                    have.append(None)
                    errors.setdefault(km, ShardFailure(self.names[i], ans, ()))
                elif km in ans:
                    have.append(ans[km])
                else:
                    have.append(None)
                    errors.setdefault(km, _named(self.names[i], ans.errors[km]))
            if all(h is None for h in have):
                continue
            errors.pop(km, None)
            best = winner(have)
            values[km] = best if best is not None else NOT_PRESENT
            if best is not None:
                repairs += [
                    Repair(self.names[i], self.clusters[i], as_write(km.key, km.member, best))
                    for i, h in enumerate(have)
                    if differs(h, best)
                ]
        return _in_order(items, values, errors), repairs

    def _window_read(
        self,
        op: str,
        keys: list[Blob],
        fetch: Callable[[Cluster, list[Blob], int], ReadResult[Blob, list[KeyScoreMember]]],
        offset: int,
        limit: int,
        strict: bool,
        within: Callable[[float, Blob], bool] | None = None,
    ) -> ReadResult[Blob, list[KeyScoreMember]]:
        started = time.perf_counter()
        need = offset + limit

        def first(c: Cluster, ks: list[Blob]) -> ReadResult[Blob, list[KeyScoreMember]]:
            return fetch(c, ks, need)

        def merge(answers: list[Answer]) -> tuple[ReadResult[Blob, list[KeyScoreMember]], list[Repair]]:
            return self._merge_windows(keys, answers, fetch, need, within)

        if isinstance(self.read_strategy, SendAllReadAll):
            result, repairs = self._merge_windows(keys, None, fetch, need, within)
            self._shared.repairer.submit(repairs)
        else:
            result = self._read(keys, first, merge)
        return self._finish(f"farm.{op}", _sliced(result, offset, limit), len(keys), started, strict)

    def _merge_windows(
        self,
        keys: list[Blob],
        answers: list[Answer] | None,
        fetch: Callable[[Cluster, list[Blob], int], ReadResult[Blob, list[KeyScoreMember]]],
        need: int,
        within: Callable[[float, Blob], bool] | None = None,
    ) -> tuple[ReadResult[Blob, list[KeyScoreMember]], list[Repair]]:
        """The first ``need`` entries of every key's merged set, widening the windows until exact.

        ``answers`` (one per replica: each key's first ``need`` entries, or the replica's failure) are
        the first round when a lingering read already has them. A member in no replica's window ranks
        below the lowest entry of the window of the replica holding its winner (if that window was
        full), so merged entries at or above the highest full window's lowest entry are exact; when
        fewer than ``need`` are, the windows are doubled and those keys asked again. ``within``
        (``select_range``): whether a winner lies inside the range; a member seen inside it on one replica
        may win with another replica's record outside it, and is then left out.
        """
        window = need
        values: dict[Blob, list[KeyScoreMember]] = {}
        errors: dict[Blob, ShardFailure] = {}
        repairs: list[Repair] = []
        pending = keys
        gone: dict[int, Answer] = {}  # late or busy replicas: not asked again by this read
        started = time.perf_counter()
        while pending:
            if answers is None:
                got = self._windows(
                    functools.partial(_ask, fetch, pending, window, self.clusters), pending, gone, started
                )
            else:
                got, answers = answers, None
            more: list[Blob] = []
            lookups: dict[int, list[KeyMember]] = {}
            merging: dict[Blob, dict[int, list[KeyScoreMember]]] = {}
            for key in pending:
                have: dict[int, list[KeyScoreMember]] = {}
                for i, ans in enumerate(got):
                    if isinstance(ans, BaseException):
                        errors.setdefault(key, ShardFailure(self.names[i], ans, ()))
                    elif key in ans:
                        have[i] = ans[key]
                    else:
                        errors.setdefault(key, _named(self.names[i], ans.errors[key]))
                if not have:
                    continue
                errors.pop(key, None)
                lists = list(have.values())
                flat = [(e.member, e.score) for e in lists[0]]
                if all([(e.member, e.score) for e in other] == flat for other in lists[1:]):
                    values[key] = lists[0][:need]  # agreeing windows are exact (see the docstring)
                    continue
                merging[key] = have
                members = {to_bytes(e.member): e.member for entries in lists for e in entries}
                for i, entries in have.items():
                    seen = {to_bytes(e.member) for e in entries}
                    lookups.setdefault(i, []).extend(KeyMember(key, m) for b, m in members.items() if b not in seen)
            scores = self._each_safe(functools.partial(_look_up, lookups, self.clusters), list(lookups))
            looked: dict[int, ReadResult[KeyMember, Presence] | BaseException] = dict(zip(lookups, scores, strict=True))
            for key, have in merging.items():
                records: dict[bytes, tuple[Blob, dict[int, Presence | None]]] = {}
                for i, entries in have.items():
                    for e in entries:
                        records.setdefault(to_bytes(e.member), (e.member, {}))[1][i] = Presence(True, True, e.score)
                lost: ShardFailure | None = None
                for member, per in records.values():
                    for i in have:
                        if i not in per:
                            km = KeyMember(key, member)
                            score_answer = looked[i]
                            if isinstance(score_answer, BaseException):
                                lost = lost or ShardFailure(f"{self.names[i]}/*", score_answer, ())
                            elif km in score_answer:
                                per[i] = score_answer[km]
                            else:  # its tombstone may be the winner: the key is not answered
                                lost = lost or _named(self.names[i], score_answer.errors[km])
                if lost is not None:
                    errors[key] = lost
                    continue
                visible: list[KeyScoreMember] = []
                key_repairs: list[Repair] = []
                for member, per in records.values():
                    best = winner(list(per.values()))
                    if best is None:
                        continue
                    if best.inserted and (within is None or within(best.score, member)):
                        visible.append(KeyScoreMember(key, best.score, member))
                    key_repairs += [
                        Repair(self.names[i], self.clusters[i], as_write(key, member, best))
                        for i, p in per.items()
                        if differs(p, best)
                    ]
                visible.sort(key=lambda e: order(e.score, e.member), reverse=True)
                floors = [order(es[-1].score, es[-1].member) for es in have.values() if len(es) >= window]
                if floors:
                    bound = max(floors)
                    exact = [e for e in visible if order(e.score, e.member) >= bound]
                else:
                    exact = visible
                if len(exact) >= need or not floors:
                    values[key] = exact[:need]
                    repairs += key_repairs
                else:
                    more.append(key)
            pending = more
            window *= 2
        return _in_order(keys, values, errors), repairs

    def _windows(
        self,
        fn: Callable[[int], ReadResult[Any, Any]],
        keys: list[Blob],
        gone: dict[int, Answer],
        started: float,
    ) -> list[Answer]:
        """One round of a window read: ``fn(i)`` on every replica not ``gone``, returning once a read quorum
        answered every key (and ``straggler_wait`` passed); replicas late or busy join ``gone`` (this read
        does not ask them again) and answer with that failure."""
        asked = [i for i in range(len(self.clusters)) if i not in gone]
        answered = self._each_safe(
            fn,
            asked,
            enough=functools.partial(answered_by, keys, min(self._read_quorum(), len(asked))),
            late=functools.partial(late_read, self, len(keys), started),
        )
        by_replica = dict(zip(asked, answered, strict=True))
        gone.update((i, a) for i, a in by_replica.items() if isinstance(a, ReplicaLate | ReplicaBusy))
        return [by_replica[i] if i in by_replica else gone[i] for i in range(len(self.clusters))]

    # -- plumbing -----------------------------------------------------------------------------------------

    def _each_safe(
        self,
        fn: Callable[[int], T],
        replicas: Sequence[int] | None = None,
        *,
        enough: Callable[[Sequence[T | BaseException | None]], bool] | None = None,
        late: Callable[[int, T | BaseException], None] | None = None,
    ) -> list[T | BaseException]:
        """``fn(i)`` for every replica index ``i`` of ``replicas`` (default: all), in parallel, in that
        order (see :meth:`Replicas.gather` for ``enough`` and ``late``). A replica's failures (ShardError,
        OSError; also :class:`ReplicaLate` and :class:`ReplicaBusy`, TimeoutErrors) become values, anything
        else (a bug, bad input) propagates."""
        indices = range(len(self.clusters)) if replicas is None else replicas
        calls = [(i, self.names[i], functools.partial(fn, i)) for i in indices]
        outcomes = self._shared.replicas.gather(calls, enough, late)
        for outcome in outcomes:
            if isinstance(outcome, BaseException) and not isinstance(outcome, ShardError | OSError):
                raise outcome
        return outcomes


def _send(
    name: str, ops: _writes.Ops, n: int, started: float, work: list[tuple[_writes.WritePlan, Any]], i: int
) -> WriteResult:
    """One replica's part of a farm write; a replica that could not even route the tuples failed them all."""
    plan, prepared = work[i]
    if isinstance(prepared, ShardError):
        return WriteResult([False] * n, [ShardFailure("routing", prepared, tuple(range(n)))])
    return plan.send(name, ops, prepared, n, started)


def _ask(
    fetch: Callable[[Cluster, list[Blob], int], ReadResult[Blob, list[KeyScoreMember]]],
    keys: list[Blob],
    window: int,
    clusters: list[Cluster],
    i: int,
) -> ReadResult[Blob, list[KeyScoreMember]]:
    return fetch(clusters[i], keys, window)


def _fetch_on(
    fetch: Callable[[Cluster, list[Any]], ReadResult[Any, Any]], items: list[Any], clusters: list[Cluster], i: int
) -> ReadResult[Any, Any]:
    return fetch(clusters[i], items)


def _look_up(lookups: dict[int, list[KeyMember]], clusters: list[Cluster], i: int) -> ReadResult[KeyMember, Presence]:
    return clusters[i].score(lookups[i], strict=False)


def _failed(items: Sequence[Any], exc: BaseException) -> ReadResult[Any, Any]:
    """The answer of a replica whose whole call failed: every item in ``errors`` (shard ``*``: the
    replica as a whole; readers prefix the replica's name)."""
    failed: ReadResult[Any, Any] = ReadResult()
    failed.errors.update((item, ShardFailure("*", exc, ())) for item in items)
    return failed


def _named(replica: str, failure: ShardFailure) -> ShardFailure:
    return ShardFailure(f"{replica}/{failure.shard}", failure.error, failure.indices)


def _sliced(result: ReadResult[Blob, list[KeyScoreMember]], offset: int, limit: int) -> ReadResult[Blob, Any]:
    out: ReadResult[Blob, list[KeyScoreMember]] = ReadResult()
    out.update({k: v[offset : offset + limit] for k, v in result.items()})
    out.errors.update(result.errors)
    return out


def _in_order(items: Sequence[Any], values: dict[Any, Any], errors: dict[Any, ShardFailure]) -> ReadResult[Any, Any]:
    result: ReadResult[Any, Any] = ReadResult()
    for item in items:
        if item in values:
            result[item] = values[item]
        elif item in errors:
            result.errors[item] = errors[item]
    return result
