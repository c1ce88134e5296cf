"""How a farm calls its replicas: in parallel, returning once enough of them answered.

A farm call (:meth:`Replicas.gather`) runs one call per replica on daemon worker threads and waits, in
slices of :data:`POLL` seconds (so that Ctrl-C reaches the waiting thread), until every call finished,
or until the caller's ``enough`` says the answers so far suffice (a write: every tuple confirmed by the
write quorum; a ``SendAllReadAll`` read: every item answered by a read quorum) and ``straggler_wait``
more seconds passed. The calls still running then are *late*: the farm call returns without them (their
outcome is a :class:`ReplicaLate`), and each finishes in the background, bounded by its replica's socket
timeout; when it finishes, the caller's ``late`` hook gets its outcome on that thread (a write hands the
tuples the replica failed to read-repair). A replica with :data:`MAX_LATE` late calls still running is
not called at all (its outcome is a :class:`ReplicaBusy`): a hung replica ties up at most that many
threads and connections, and calls stop waiting for it.

Daemon threads, not a ``ThreadPoolExecutor``: the interpreter joins a pool's threads at exit, so a call
hung on a stopped server kept a Ctrl-C'd process alive for the whole socket timeout.

What is a replica's failure and what a bug: :data:`zcluster._transport.SHARD_ERRORS`, the cluster's own
rule for a shard (ReplicaLate and ReplicaBusy are TimeoutErrors, so OSErrors): :meth:`Replicas.each` makes
those a replica's outcome and raises anything else.

Also here: what a late call leaves behind (:func:`late_write`, :func:`late_read`), and the one rule for
what replicas must share (:func:`check_same_layout`), used by :class:`zcluster.farm.Farm` and
:class:`zcluster.farm.FarmConfig` alike.
"""

from __future__ import annotations

import functools
import logging
import math
import queue
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from zcluster._transport import SHARD_ERRORS
from zcluster.errors import ConfigError, ReplicaBusy, ReplicaLate
from zcluster.farm._merge import shard_name
from zcluster.farm._repair import Repair
from zcluster.types import Blob, Delete, Insert, ReadResult, Write, WriteResult, to_bytes

if TYPE_CHECKING:
    from zcluster.farm.farm import Farm

log = logging.getLogger("zcluster.farm")
T = TypeVar("T")

#: Seconds a farm call still waits for the other replicas once it has what it needs (see the module).
DEFAULT_STRAGGLER_WAIT = 0.5
#: Late calls a replica may have running before calls skip it (:class:`ReplicaBusy`).
MAX_LATE = 4
#: The longest a waiting thread blocks before it checks again (and a pending Ctrl-C is raised).
POLL = 0.1
#: Worker threads for the calls that are not late, on top of ``MAX_LATE`` per replica for the late ones.
WORKERS = 16

Layout = tuple[bytes, int | None, bool]


@dataclass
class LateCounts:
    """Replica calls a farm returned without (``late``; ``running`` of them not finished yet, ``failed``
    of them finished with a failure of some tuples or keys), and calls not made because the replica was
    busy with late calls (``skipped``)."""

    late: int = 0
    running: int = 0
    failed: int = 0
    skipped: int = 0


def layout_of(prefix: Blob, max_size: int | None, floors: bool | None) -> Layout:
    """What replicas must share, as a :class:`zcluster.Cluster` settles it (``floors`` None: floors when
    there is a ``max_size``)."""
    return to_bytes(prefix), max_size, (max_size is not None) if floors is None else bool(floors)


def check_same_layout(layouts: Sequence[Layout]) -> None:
    """ConfigError unless every replica has the same prefix, ``max_size`` and floors: a repair writes one
    replica's record onto another, and a replica that trims (or keeps floors) differently never agrees
    with the others (every walk would find the key diverged and its repairs change nothing)."""
    if len(set(layouts)) > 1:
        shown = ", ".join(f"replica{i}: prefix={p!r}, max_size={m}, floors={f}" for i, (p, m, f) in enumerate(layouts))
        raise ConfigError(f"replicas must share prefix, max_size and floors (a repair copies records), got {shown}")


def check_straggler_wait(value: float) -> float:
    """``value`` as seconds (a finite number >= 0), else ConfigError."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise ConfigError(f"straggler_wait must be a number of seconds >= 0, got {value!r}")
    return float(value)


class Workers:
    """At most ``limit`` daemon threads running submitted calls; started on demand, idle ones reused."""

    def __init__(self, limit: int, name: str) -> None:
        self.limit = limit
        self.name = name
        self._queue: queue.SimpleQueue[tuple[Future[Any] | None, Callable[[], Any]] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads = 0
        self._idle = threading.Semaphore(0)
        self._closed = False

    def submit(self, fn: Callable[[], T]) -> Future[T]:
        """Run ``fn`` on a worker; its future has what it returned or raised."""
        future: Future[T] = Future()
        self._put(future, fn)
        return future

    def run(self, fn: Callable[[], object]) -> None:
        """Run ``fn`` on a worker, for its effects (it must not raise)."""
        self._put(None, fn)

    def _put(self, future: Future[Any] | None, fn: Callable[[], Any]) -> None:
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{self.name}: the farm is closed")
            self._queue.put((future, fn))
            if not self._idle.acquire(blocking=False) and self._threads < self.limit:
                self._threads += 1
                threading.Thread(target=self._work, name=f"{self.name}-{self._threads}", daemon=True).start()

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            future, fn = item
            if future is None:
                try:
                    fn()
                except BaseException:  # pragma: no cover - run() takes calls that catch everything
                    log.exception("a farm worker's call raised")
            elif future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn())
                except BaseException as exc:  # delivered to whoever waits on the future
                    future.set_exception(exc)
            del item, future, fn
            self._idle.release()

    def close(self) -> None:
        """Let the threads end once the queue is done; does not wait for them (they are daemons)."""
        with self._lock:
            self._closed = True
            for _ in range(self._threads):
                self._queue.put(None)


class _Call:
    """One replica's part of a farm call: its outcome, or that the farm call left without it."""

    __slots__ = ("abandoned", "finished", "late", "lock", "outcome", "replica", "started")

    def __init__(self, replica: int, late: Callable[[Any], None] | None) -> None:
        self.replica = replica
        self.late = late
        self.lock = threading.Lock()
        self.outcome: Any = None
        self.finished = False
        self.abandoned = False
        self.started = time.perf_counter()


class Replicas:
    """The worker threads and the late calls of a farm's replicas, named ``names`` (shared with its views)."""

    def __init__(self, names: Sequence[str], straggler_wait: float) -> None:
        self.names = list(names)
        self.count = count = len(self.names)
        self.straggler_wait = check_straggler_wait(straggler_wait)
        self.workers = Workers(WORKERS + MAX_LATE * count, "zcluster-farm")
        self.closed = False
        self._running = [0] * count
        self._counts = LateCounts()
        self._cond = threading.Condition()

    # -- accounting ----------------------------------------------------------------------------------------

    def busy(self, replica: int) -> bool:
        """Whether ``replica`` has :data:`MAX_LATE` late calls running (calls skip it)."""
        return self._running[replica] >= MAX_LATE  # one read of a list item: no lock needed

    def skip(self, replica: int, name: str) -> ReplicaBusy:
        with self._cond:
            self._counts.skipped += 1
        return ReplicaBusy(f"{name}: not called, {MAX_LATE} earlier calls still running (hung or slow?)")

    def running(self, replica: int) -> int:
        """Late calls of ``replica`` not finished yet."""
        with self._cond:
            return self._running[replica]

    def counts(self) -> LateCounts:
        with self._cond:
            c = self._counts
            return LateCounts(c.late, sum(self._running), c.failed, c.skipped)

    def count_failed(self) -> None:
        with self._cond:
            self._counts.failed += 1

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until no late call is running (True) or ``timeout`` passed (False)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while sum(self._running):
                left = POLL if deadline is None else min(POLL, deadline - time.monotonic())
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    # -- calls ---------------------------------------------------------------------------------------------

    def each(
        self,
        fn: Callable[[int], T],
        indices: Sequence[int] | None = None,
        *,
        enough: Callable[[Sequence[T | BaseException | None]], bool] | None = None,
        late: Callable[[int, T | BaseException], None] | None = None,
    ) -> list[T | BaseException]:
        """``fn(i)`` for every replica index ``i`` of ``indices`` (default: all), in parallel, outcomes in
        that order (see :meth:`gather` for ``enough`` and ``late``). A replica's failure (``SHARD_ERRORS``,
        see the module) becomes its outcome; anything else (a bug, bad input) propagates."""
        chosen = range(self.count) if indices is None else indices
        outcomes = self.gather([(i, self.names[i], functools.partial(fn, i)) for i in chosen], enough, late)
        for outcome in outcomes:
            if isinstance(outcome, BaseException) and not isinstance(outcome, SHARD_ERRORS):
                raise outcome
        return outcomes

    def gather(
        self,
        calls: Sequence[tuple[int, str, Callable[[], T]]],
        enough: Callable[[Sequence[T | BaseException | None]], bool] | None = None,
        late: Callable[[int, T | BaseException], None] | None = None,
    ) -> list[T | BaseException]:
        """Run every ``(replica, name, fn)`` of ``calls``; their outcomes in order (what ``fn`` returned or
        raised). Returns when all finished; or, once ``enough(outcomes so far)`` (None: not answered yet)
        is true, when ``straggler_wait`` more seconds passed: the calls still running then answer
        :class:`ReplicaLate`, and ``late(replica, outcome)`` runs on the call's thread when it finishes.
        A busy replica (:meth:`busy`) is not called and answers :class:`ReplicaBusy`. Waits in slices of
        :data:`POLL`; a KeyboardInterrupt while waiting leaves the calls running as late ones."""
        outcomes: list[Any] = [None] * len(calls)
        running: dict[int, _Call] = {}
        done: queue.SimpleQueue[int] = queue.SimpleQueue()
        for pos, (replica, name, fn) in enumerate(calls):
            if self.busy(replica):
                outcomes[pos] = self.skip(replica, name)
            elif len(calls) == 1:  # nothing to wait for in parallel (as before: on the calling thread)
                try:
                    outcomes[pos] = fn()
                except BaseException as exc:
                    if not isinstance(exc, Exception):
                        raise
                    outcomes[pos] = exc
            else:
                call = _Call(replica, None if late is None else functools.partial(late, replica))
                running[pos] = call
                self.workers.run(functools.partial(self._run, call, fn, done, pos))
        deadline: float | None = None
        try:
            while running:
                if deadline is None and enough is not None and enough(outcomes):
                    deadline = time.monotonic() + self.straggler_wait
                wait = POLL if deadline is None else min(POLL, deadline - time.monotonic())
                if wait <= 0:
                    break
                try:
                    pos = done.get(timeout=wait)
                except queue.Empty:
                    continue
                outcomes[pos] = running.pop(pos).outcome
        finally:  # what is still running is late (also after a KeyboardInterrupt: its outcome still counts)
            for pos, call in running.items():
                outcomes[pos] = self._abandon(call, calls[pos][1])
        return outcomes

    def _run(self, call: _Call, fn: Callable[[], Any], done: queue.SimpleQueue[int], pos: int) -> None:
        try:
            outcome: Any = fn()
        except BaseException as exc:  # a replica's failure or a bug: the caller tells them apart
            outcome = exc
        with call.lock:
            call.outcome, call.finished = outcome, True
            abandoned = call.abandoned
        if not abandoned:
            done.put(pos)
            return
        try:
            if call.late is not None:
                call.late(outcome)
        except Exception:  # a bug in the hook: nothing else would see it
            log.exception("handling a late replica call failed")
        finally:
            with self._cond:
                self._running[call.replica] -= 1
                self._cond.notify_all()

    def _abandon(self, call: _Call, name: str) -> Any:
        """The outcome of ``call`` if it finished meanwhile, else a ReplicaLate (and the call is late)."""
        with call.lock:
            if call.finished:
                return call.outcome
            call.abandoned = True
            with self._cond:
                self._running[call.replica] += 1
                self._counts.late += 1
        seconds = time.perf_counter() - call.started
        log.info("%s had not answered after %.3f s: its call goes on in the background", name, seconds)
        return ReplicaLate(f"{name} had not answered after {seconds:.3f} s (the others sufficed); its call goes on")

    def close(self) -> None:
        self.closed = True
        self.workers.close()


# -- what the farm's late calls leave behind ------------------------------------------------------------------


def writes_at(ops: list[Any], indices: Iterable[int]) -> list[Write]:
    """The writes of a farm write's ``ops`` at input positions ``indices`` (to resend them as repairs)."""
    wanted = set(indices)
    out: list[Write] = []
    for op, items, positions in ops:
        kind = Insert if op == b"+" else Delete
        for pos, item in enumerate(items):
            if (positions[pos] if positions is not None else pos) in wanted:
                out.append(item if isinstance(item, Insert | Delete) else kind(*item))
    return out


def late_write(farm: Farm, ops: list[Any], n: int, started: float, replica: int, outcome: Any) -> None:
    """A late replica's part of a farm write finished (on its thread): a ``farm.late`` event, and the
    tuples it failed are handed to read-repair (once the farm is closed, counted as dropped repairs: the
    walker finds them)."""
    name = farm.names[replica]
    if isinstance(outcome, WriteResult):
        failed, error, applied = outcome.failed_indices, None, outcome.applied_count
        shards = tuple(shard_name(name, f.shard) for f in outcome.failures)
    else:
        failed, error, applied, shards = list(range(n)), outcome, 0, (shard_name(name, "*"),)
    farm._report("farm.late", n, started, applied, shards, error)
    if not failed:
        return
    shared = farm._shared
    shared.replicas.count_failed()
    if error is not None and not isinstance(error, SHARD_ERRORS):
        log.error("a late write on %s raised", name, exc_info=error)
    repairs = [Repair(name, farm.clusters[replica], w) for w in writes_at(ops, failed)]
    if shared.replicas.closed:
        log.info("%s: a late write failed %d tuple(s), farm closed: left to the walker", name, len(failed))
        shared.repairer.drop(len(repairs))
        return
    log.warning("%s: a late write failed %d tuple(s); handed to read-repair", name, len(failed))
    shared.repairer.submit(repairs)


def late_read(farm: Farm, n: int, started: float, replica: int, outcome: Any) -> None:
    """A late replica's read finished (on its thread): a ``farm.late`` event only. Its answer was not
    merged, so this read repairs none of its differences: the next read or the walker finds them."""
    name = farm.names[replica]
    if isinstance(outcome, ReadResult):
        shards: tuple[str, ...] = tuple(sorted({shard_name(name, f.shard) for f in outcome.errors.values()}))
        error = None
    else:
        shards, error = (shard_name(name, "*"),), outcome
    if shards:
        farm._shared.replicas.count_failed()
    farm._report("farm.late", n, started, 0, shards, error)
