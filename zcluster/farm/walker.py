"""The walker: a resumable sweep of every replica's keyspace that repairs what reads never touch.

The sweep (:mod:`zcluster.farm._sweep`) visits each replica in turn and skips the keys an earlier replica
whose own sweep completed holds, so every key held by any replica is visited about once, and a farm whose
replicas agree costs one fingerprint per key per replica in the first sweep and one existence check per
earlier replica in the later ones.

For each visited key the replicas' fingerprints (:meth:`zcluster.Cluster.fingerprints`, computed
server-side) are compared; only keys that differ are read whole, merged by the 2P-set rules and repaired
(the winning record of every member is written onto every replica that lacks it, tombstones included).
Memory is bounded by one batch of keys, whatever the divergence: repairs are written batch by batch, not
queued. The walker uses only the public :class:`~zcluster.farm.Farm` (``per_replica``, ``records``,
``repair_now``) and :class:`zcluster.Cluster` methods.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from typing import Any

from zcluster._writes import REFUSED
from zcluster.errors import PartialWriteError, WriteRefusedError
from zcluster.farm._merge import Fix, merge_records, named
from zcluster.farm._repair import TokenBucket
from zcluster.farm._sweep import SweepStep, parse_position, sweep
from zcluster.farm.farm import Farm
from zcluster.types import Blob, ShardFailure, Write

__all__ = ["WalkReport", "Walker"]


@dataclass
class WalkReport:
    """What a walk did. ``position`` resumes it (None: it reached the end of the last replica).

    ``keys``: comparisons made. Every key is compared at least once per sweep, and may be compared again,
    so ``keys`` is at least, not exactly, the keys held: SCAN may return a key more than once. A key that
    changed while the walk passed it (a write, or the walk's own repair) may be met again (its records sit
    in up to three Redis keys, and SCAN may meet the one it gained after meeting another), and SCAN may
    return any key twice while the server resizes its keyspace. Such a key is compared again (harmless: a
    repaired key then agrees, so it is not counted in ``diverged`` again).
    ``diverged``: keys whose replicas held different records; ``repaired`` /
    ``repair_failures``: records written / not written (the replica failed); ``floors_raised``: keys of a
    replica whose floor was raised to the key's highest floor (see :meth:`Walker._repairs`);
    ``failures``: replica shards that could not be scanned or read (their keys were not compared, or
    only among the others). Aggregate keys (increments) are compared by their fences and repaired by
    copying the leading replica's whole key (:meth:`Farm.repair_aggregates`): ``repaired`` counts such a
    copy as one; ``unsettled`` lists the aggregate keys no replica's copy leads (left as they are).
    """

    keys: int = 0
    diverged: int = 0
    repaired: int = 0
    floors_raised: int = 0
    repair_failures: int = 0
    seconds: float = 0.0
    position: str | None = None
    failures: list[ShardFailure] = field(default_factory=list)
    unsettled: list[Blob] = field(default_factory=list)

    @property
    def keys_per_second(self) -> float:
        return self.keys / self.seconds if self.seconds > 0 else 0.0


class Walker:
    """Sweeps a farm's keyspace and repairs every difference (see the module).

    ``rate``: keys per second at most (None: as fast as the replicas answer). ``batch_size``: keys per
    step; memory holds one step's keys and, for the keys that differ, their records.
    """

    def __init__(self, farm: Farm, *, rate: float | None = None, batch_size: int = 1000) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        self.farm = farm
        self.batch_size = batch_size
        self._bucket = TokenBucket(rate, burst=batch_size) if rate is not None else None

    def run(
        self,
        position: str | None = None,
        *,
        stop: threading.Event | None = None,
        max_keys: int | None = None,
        progress: Callable[[WalkReport, int], None] | None = None,
    ) -> WalkReport:
        """Walk from ``position`` (None: the start) to the end, or until ``stop`` is set or ``max_keys``
        were compared; the report's ``position`` resumes it. ``progress(report, replica)`` is called after
        each step."""
        report = WalkReport(position=position)
        started = time.perf_counter()
        failures: list[ShardFailure] = []
        steps = _prefetched(sweep(self.farm, batch_size=self.batch_size, position=position, failures=failures))
        try:
            for step in steps:
                if self._bucket is not None and step.keys:
                    self._bucket.wait(len(step.keys))
                self._compare(step, report)
                report.position = step.position
                report.seconds = time.perf_counter() - started
                if progress is not None:
                    progress(report, step.replica)
                if (stop is not None and stop.is_set()) or (max_keys is not None and report.keys >= max_keys):
                    break
            else:
                report.position = None
        finally:
            steps.close()  # stops the scanning thread, also when a comparison raised
        report.failures += failures
        report.seconds = time.perf_counter() - started
        return report

    def check_position(self, position: str) -> None:
        """ValueError naming ``position`` unless a walk of this farm could have reported it (a replica of
        this farm, and a scan position within that replica's shards)."""
        replica, _, cluster_position = parse_position(position, len(self.farm.clusters))
        self.farm.clusters[replica].next_shard(cluster_position)

    def _compare(self, step: SweepStep, report: WalkReport) -> None:
        farm, keys = self.farm, step.keys
        if not keys:
            return
        report.keys += len(keys)
        missing = [i for i in range(len(farm.clusters)) if i not in step.known]
        # Cheap serialized fingerprints first; the keys they cannot settle get record fingerprints.
        fresh = farm.per_replica(lambda c: c.fingerprints(keys, kind="serialized", strict=False), keys, missing)
        quick = {**step.known, **dict(zip(missing, fresh, strict=True))}
        suspects = [key for key in keys if len({ans[key] for ans in quick.values() if key in ans}) > 1]
        exact = (
            dict(enumerate(farm.per_replica(lambda c: c.fingerprints(suspects, strict=False), suspects)))
            if suspects
            else {}
        )
        diverged = [key for key in suspects if len({ans[key] for ans in exact.values() if key in ans}) > 1]
        for key in keys:
            failed = [named(farm.names[i], ans.errors[key]) for i, ans in quick.items() if key in ans.errors]
            report.failures += failed[:1]
        if not diverged:
            return
        aggregates = farm.repair_aggregates(diverged)
        report.diverged += aggregates.diverged + len(diverged) - len(aggregates.aggregates)
        report.repaired += aggregates.repaired
        report.repair_failures += aggregates.failed
        report.unsettled += aggregates.unsettled
        report.failures += aggregates.failures
        handled = set(aggregates.aggregates)
        diverged = [key for key in diverged if key not in handled]
        if not diverged:
            return
        fixes = self._repairs(diverged, report)
        if fixes:
            done, unwritten = farm.repair_now(fixes)
            report.repaired += done
            report.repair_failures += unwritten

    def _repairs(self, keys: list[Blob], report: WalkReport) -> list[Fix]:
        """The records to write for ``keys``, after raising every replica's floor to the highest one.

        A floor (``forget``, or trimming with ``max_size``) is replicated like a record: a replica below
        the highest floor of a key, or still holding records at or below it, forgets up to it (the
        records it drops are ones another replica forgot). Records at or below that floor are then left
        out of the merge, so a replica rebuilt without its floor does not bring forgotten records back.
        """
        farm = self.farm
        held = farm.records(keys)
        floors = farm.per_replica(lambda c: c.floors_of(keys, strict=False), keys)
        forgets: dict[tuple[int, float], list[Blob]] = {}
        fixes: list[Fix] = []
        for key in keys:
            answered = [i for i, res in enumerate(held) if key in res and key in floors[i]]
            known = [f for i in answered if (f := floors[i][key]) is not None]
            top = max(known) if known else None
            kept: dict[int, list[Write]] = {}
            for i in answered:
                records = held[i][key]
                if top is not None and farm.clusters[i].floors:
                    mine = floors[i][key]
                    below = mine is None or mine < top
                    if below or any(w.score <= top for w in records):
                        forgets.setdefault((i, top), []).append(key)
                kept[i] = [w for w in records if top is None or w.score > top]
            for merged in merge_records(key, kept):
                fixes += merged.fixes
        for (i, top), forgotten in forgets.items():
            try:
                farm.clusters[i].forget(forgotten, top)
                report.floors_raised += len(forgotten)
            except PartialWriteError as exc:
                report.failures += [named(farm.names[i], f) for f in exc.result.failures]
            except WriteRefusedError as exc:
                # A key that became an aggregate since it was read: left unchanged, counted as a failure
                # (the next walk compares it as an aggregate).
                report.floors_raised += sum(exc.result.applied)
                report.failures += [named(farm.names[i], f) for f in exc.result.failures]
                report.failures.append(named(farm.names[i], ShardFailure(REFUSED, exc, tuple(sorted(exc.refused)))))
        return fixes


def _prefetched(steps: Iterator[SweepStep], depth: int = 2) -> Generator[SweepStep, None, None]:
    """``steps`` produced by a background thread up to ``depth`` ahead, so that the next scan overlaps
    the current comparison. The producer's exception is raised here; closing the generator stops it."""
    ready: queue.Queue[tuple[str, Any]] = queue.Queue(depth)
    stopping = threading.Event()

    def offer(item: tuple[str, Any]) -> bool:
        while not stopping.is_set():
            try:
                ready.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for step in steps:
                if not offer(("step", step)):
                    return
            offer(("end", None))
        except BaseException as exc:  # handed to the consumer, which raises it
            offer(("error", exc))

    thread = threading.Thread(target=produce, name="zcluster-walk-scan", daemon=True)
    thread.start()
    try:
        while True:
            kind, value = ready.get()
            if kind == "end":
                return
            if kind == "error":
                raise value
            yield value
    finally:
        stopping.set()
        thread.join()
