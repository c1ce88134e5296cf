"""Read-repair: writing a winning record onto the replicas that lack it, under a strategy.

Every repair is counted once as requested and once as done, failed or dropped, both in
:attr:`RepairCounts` and in the instrumentation (``farm.repair`` events with ``records`` = requested and
``applied`` = done, ``farm.repair_failed`` and ``farm.repair_dropped`` events with their counts): nothing
is dropped silently. A repair is an ordinary idempotent write, so a dropped one costs only time: the next
read or the walker finds the same difference again.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from zcluster._aggregate_keys import KeyState, whole_keys_of
from zcluster._transport import SHARD_ERRORS
from zcluster.cluster import Cluster
from zcluster.errors import ConfigError
from zcluster.farm._merge import shard_name
from zcluster.instrumentation import Instrumentation, OpEvent
from zcluster.types import Blob, Write

log = logging.getLogger("zcluster.farm")


class AggregateCopy(NamedTuple):
    """An aggregate key's whole state (``whole``, a dump of the replica whose copy leads) to put in place
    of a replica's copy, unless that copy moved since it was read with the fences ``expected`` (see
    :mod:`zcluster.farm._aggregates`)."""

    key: Blob
    expected: bytes
    whole: KeyState


class Repair(NamedTuple):
    """A record to write onto one replica, or an aggregate key to replace there (named for failure reports)."""

    replica: str
    cluster: Cluster
    write: Write | AggregateCopy


class TokenBucket:
    """``rate`` tokens per second, at most ``burst`` saved; refills continuously (thread-safe)."""

    def __init__(self, rate: float, burst: float | None = None) -> None:
        if not rate > 0:
            raise ConfigError(f"rate must be > 0, got {rate!r}")
        self.rate = float(rate)
        self.burst = float(burst if burst is not None else max(rate, 1.0))
        if not self.burst >= 1:
            raise ConfigError(f"burst must be >= 1, got {burst!r}")
        self._tokens = self.burst
        self._last = time.monotonic()
        self._lock = threading.Lock()

    def _refill(self) -> None:
        now = time.monotonic()
        self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate)
        self._last = now

    def take(self, n: float = 1.0) -> bool:
        """Take ``n`` tokens if there are that many now."""
        with self._lock:
            self._refill()
            if self._tokens >= n:
                self._tokens -= n
                return True
            return False

    def wait(self, n: float = 1.0) -> None:
        """Take ``n`` tokens, sleeping until they are there (``n`` above the burst waits for the debt)."""
        with self._lock:
            self._refill()
            self._tokens -= n
            debt = -self._tokens
        if debt > 0:
            time.sleep(debt / self.rate)


@dataclass(frozen=True)
class RepairAll:
    """Write every repair before the read returns (or, for a lingering read, in its background thread)."""


@dataclass(frozen=True)
class NoRepair:
    """Write no repair; each one found is counted as dropped (for reads that must not write)."""


@dataclass(frozen=True)
class RateLimitedRepair:
    """Write repairs at up to ``per_second`` (bursts of ``burst``); the ones over the rate are dropped."""

    per_second: float
    burst: float | None = None


@dataclass(frozen=True)
class NonBlockingRepair:
    """Queue repairs for a background thread; the read never waits. A full queue (``queue_size``
    repairs) drops what does not fit."""

    queue_size: int = 10_000


RepairStrategy = RepairAll | NoRepair | RateLimitedRepair | NonBlockingRepair


def repair_strategy(value: RepairStrategy | str) -> RepairStrategy:
    """A strategy from itself or its short name: ``"all"``, ``"none"``, ``"nonblocking"``."""
    if isinstance(value, RepairAll | NoRepair | RateLimitedRepair | NonBlockingRepair):
        return value
    named: dict[str, RepairStrategy] = {"all": RepairAll(), "none": NoRepair(), "nonblocking": NonBlockingRepair()}
    if isinstance(value, str) and value in named:
        return named[value]
    raise ConfigError(f"unknown repair strategy {value!r}: use {', '.join(named)} or a strategy object")


@dataclass
class RepairCounts:
    """Repairs found by reads and walks: each is also done, failed or dropped (or still queued)."""

    requested: int = 0
    done: int = 0
    failed: int = 0
    dropped: int = 0

    @property
    def queued(self) -> int:
        return self.requested - self.done - self.failed - self.dropped


class Repairer:
    """Carries out a :data:`RepairStrategy` for a farm and its views (one per farm, shared)."""

    def __init__(self, strategy: RepairStrategy, instrumentation: Instrumentation) -> None:
        self.strategy = strategy
        self.instrumentation = instrumentation
        self.counts = RepairCounts()
        self._lock = threading.Lock()
        self._bucket = (
            TokenBucket(strategy.per_second, strategy.burst) if isinstance(strategy, RateLimitedRepair) else None
        )
        self._queue: queue.Queue[Repair | None] | None = None
        self._thread: threading.Thread | None = None
        if isinstance(strategy, NonBlockingRepair):
            if strategy.queue_size <= 0:
                raise ConfigError(f"queue_size must be positive, got {strategy.queue_size!r}")
            self._queue = queue.Queue(strategy.queue_size)

    def submit(self, repairs: Sequence[Repair]) -> None:
        """Handle ``repairs`` as the strategy says; never raises for a replica's failure (it is counted)."""
        if not repairs:
            return
        self._count(requested=len(repairs))
        strategy = self.strategy
        if isinstance(strategy, NoRepair):
            self._count(dropped=len(repairs))
        elif isinstance(strategy, RepairAll):
            self.write(repairs)
        elif self._bucket is not None:
            allowed = [r for r in repairs if self._bucket.take()]
            self._count(dropped=len(repairs) - len(allowed))
            self.write(allowed)
        else:
            self._enqueue(repairs)

    def _enqueue(self, repairs: Sequence[Repair]) -> None:
        assert self._queue is not None
        self._start()
        dropped = 0
        for r in repairs:
            try:
                self._queue.put_nowait(r)
            except queue.Full:
                dropped += 1
        self._count(dropped=dropped)

    def _start(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._drain, name="zcluster-repair", daemon=True)
                self._thread.start()

    def _drain(self) -> None:
        assert self._queue is not None
        while True:
            first = self._queue.get()
            batch = [first]
            while len(batch) < 1024:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            stop = None in batch
            work = [r for r in batch if r is not None]
            try:
                self.write(work)
            except Exception as exc:  # a bug: the thread must live on (write() counted the repairs failed)
                log.exception("repair of %d record(s) failed", len(work))
                self.instrumentation(OpEvent("farm.repair", len(work), 0.0, 0, (), exc))
            finally:
                for _ in batch:
                    self._queue.task_done()
            if stop:
                return

    def drop(self, count: int) -> None:
        """Count ``count`` repairs found but not to be written (the farm is closing): requested and dropped."""
        self._count(requested=count, dropped=count)

    def repair_now(self, repairs: Sequence[Repair]) -> tuple[int, int]:
        """Write ``repairs`` whatever the strategy (the walker's), counted like the others; (done, failed)."""
        self._count(requested=len(repairs))
        return self.write(repairs)

    def write(self, repairs: Sequence[Repair]) -> tuple[int, int]:
        """Write ``repairs`` now, grouped by replica; each is counted done or failed; (done, failed)."""
        by_cluster: dict[int, tuple[str, Cluster, list[Write]]] = {}
        copies: list[tuple[str, Cluster, AggregateCopy]] = []
        for replica, cluster, write in repairs:
            if isinstance(write, AggregateCopy):
                copies.append((replica, cluster, write))
            else:
                by_cluster.setdefault(id(cluster), (replica, cluster, []))[2].append(write)
        started = time.perf_counter()
        done = failed = 0
        failed_names: list[str] = []
        try:
            for replica, cluster, copy in copies:
                try:
                    # False: the copy moved since it was read (an increment reached it); the next read or
                    # walk compares it again. Counted failed, never silently done.
                    done += whole_keys_of(cluster).restore(copy.key, copy.expected, copy.whole)
                except SHARD_ERRORS as exc:
                    log.warning("repair of aggregate key %r on %s failed: %s", copy.key, replica, exc)
                    failed_names.append(shard_name(replica, "*"))
            for replica, cluster, writes in by_cluster.values():
                result = cluster.apply(writes, raise_on_error=False)
                bad = len(result.failed_indices)
                done += len(writes) - bad
                failed += bad
                failed_names += [shard_name(replica, f.shard) for f in result.failures]
        finally:  # a write that raised (a bug) leaves the rest failed, each repair counted once
            failed = len(repairs) - done
            self._count(done=done, failed=failed)
            seconds = time.perf_counter() - started
            self.instrumentation(OpEvent("farm.repair", len(repairs), seconds, done, tuple(failed_names)))
        return done, failed

    def _count(self, requested: int = 0, done: int = 0, failed: int = 0, dropped: int = 0) -> None:
        with self._lock:
            c = self.counts
            c.requested += requested
            c.done += done
            c.failed += failed
            c.dropped += dropped
        if dropped:
            self.instrumentation(OpEvent("farm.repair_dropped", dropped, 0.0))
        if failed:
            self.instrumentation(OpEvent("farm.repair_failed", failed, 0.0))

    def snapshot(self) -> RepairCounts:
        with self._lock:
            c = self.counts
            return RepairCounts(c.requested, c.done, c.failed, c.dropped)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until queued repairs are written (True) or ``timeout`` passed (False)."""
        if self._queue is None:
            return True
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._queue.unfinished_tasks:
            if deadline is not None and time.monotonic() > deadline:
                return False
            time.sleep(0.005)
        return True

    def close(self) -> None:
        """Write what is queued, then stop the background thread."""
        if self._queue is not None and self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None
