"""The walker: a resumable sweep of every replica's keyspace that repairs what reads never touch.

A sweep visits each replica in turn (SCAN, no blocking). A key found on replica ``j`` is skipped when an
earlier replica whose own sweep completed holds it: that sweep already visited it. So every key held by
any replica is visited about once, and a farm whose replicas agree costs one fingerprint per key per
replica in the first sweep and one existence check per earlier replica in the later ones.

For each visited key the replicas' fingerprints (:meth:`zcluster.Cluster.fingerprints`, computed
server-side) are compared; only keys that differ are read whole, merged by the 2P-set rules and repaired
(the winning record of every member is written onto every replica that lacks it, tombstones included).
Memory is bounded by one batch of keys, whatever the divergence: repairs are written batch by batch, not
queued.
"""

from __future__ import annotations

import functools
import queue
import threading
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from typing import Any

from zcluster.errors import PartialScanError, PartialWriteError
from zcluster.farm.farm import Farm, _failed, _named
from zcluster.farm.merge import as_write, differs, presence_of, winner
from zcluster.farm.repair import Repair, TokenBucket
from zcluster.types import NOT_PRESENT, Blob, Presence, ReadResult, ShardFailure, to_bytes

__all__ = ["SweepStep", "WalkReport", "Walker", "parse_position", "sweep"]


@dataclass(frozen=True)
class SweepStep:
    """Keys of ``replica`` not held by an earlier completed replica; ``position`` resumes after them.
    ``known`` holds the fingerprints already known for them (replica index -> answer)."""

    replica: int
    keys: list[Blob]
    position: str | None
    known: dict[int, ReadResult[Blob, bytes]]


def _reads(
    farm: Farm, fn: Callable[[Farm, list[Blob], int], ReadResult[Blob, Any]], keys: list[Blob], replicas: list[int]
) -> list[ReadResult[Blob, Any]]:
    """``fn`` on ``replicas`` in parallel; a replica whose call raised answers with every key failed."""
    answers = farm._each_safe(functools.partial(fn, farm, keys), replicas)
    return [_failed(keys, a) if isinstance(a, BaseException) else a for a in answers]


def _fingerprints(farm: Farm, keys: list[Blob], replica: int) -> ReadResult[Blob, bytes]:
    return farm.clusters[replica].fingerprints(keys, strict=False)


def _serialized(farm: Farm, keys: list[Blob], replica: int) -> ReadResult[Blob, bytes]:
    return farm.clusters[replica].fingerprints(keys, kind="serialized", strict=False)


def _exists(farm: Farm, keys: list[Blob], replica: int) -> ReadResult[Blob, bytes]:
    return farm.clusters[replica].fingerprints(keys, kind="exists", strict=False)


def _floors(farm: Farm, keys: list[Blob], replica: int) -> ReadResult[Blob, float | None]:
    return farm.clusters[replica].floors_of(keys, strict=False)


def _holds(answer: bytes, include_removed: bool) -> bool:
    """Whether a key is one a sweep reports (it has members; or, ``include_removed``, any record)."""
    return answer == b"+" or (include_removed and answer == b"1")


def parse_position(position: str | None, replicas: int) -> tuple[int, list[bool], str | None]:
    """A walk position as (replica index, which earlier sweeps completed, that replica's scan position);
    ValueError naming it when it is not a position of a farm of ``replicas``."""
    if position is None:
        return 0, [], None
    try:
        j_text, clean_text, cluster_pos = position.split("/", 2)
        j = int(j_text)
        clean = [c == "1" for c in clean_text]
        ok = 0 <= j < replicas and len(clean) == j + 1 and set(clean_text) <= {"0", "1"}
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(f"not a walk position of this farm ({replicas} replicas): {position!r}")
    return j, clean, cluster_pos or None


def _format_position(j: int, clean: list[bool], cluster_pos: str | None) -> str:
    return f"{j}/{''.join('1' if c else '0' for c in clean)}/{cluster_pos or ''}"


def sweep(
    farm: Farm,
    *,
    batch_size: int = 1000,
    include_removed: bool = True,
    match: Blob | None = None,
    position: str | None = None,
    failures: list[ShardFailure] | None = None,
) -> Iterator[SweepStep]:
    """Every key held by any replica, in steps (see the module). ``position`` (a step's) resumes a sweep.

    A replica shard that cannot be scanned is skipped and that replica's sweep counts as incomplete (its
    keys are then not used to skip later replicas' keys). Its failures are appended to ``failures`` as
    they happen when it is given; otherwise :class:`PartialScanError` is raised at the end, after every
    step.
    """
    replicas = len(farm.clusters)
    j, clean, cluster_pos = parse_position(position, replicas)
    if not clean:
        clean = [True]
    errors: list[ShardFailure] = []
    while j < replicas:
        cluster = farm.clusters[j]
        try:
            keys, nxt = cluster.scan(cluster_pos, batch_size, include_removed=include_removed, match=match)
        except PartialScanError as exc:
            # Reported at once: a walk stopped before the sweep's end must still say what it could not scan.
            (errors if failures is None else failures).extend(_named(farm.names[j], f) for f in exc.failures)
            clean[j] = False
            keys, nxt = [], cluster.next_shard(cluster_pos)
        earlier = [i for i in range(j) if clean[i]]
        known: dict[int, ReadResult[Blob, bytes]] = {}
        if keys and earlier:
            answers = _reads(farm, _exists, keys, earlier)
            held = {k for ans in answers for k, has in ans.items() if _holds(has, include_removed)}
            keys = [k for k in keys if k not in held]
            # The keys left are held by none of these replicas: their fingerprint is b"" there.
            for i, ans in zip(earlier, answers, strict=True):
                fps: ReadResult[Blob, bytes] = ReadResult()
                fps.update((k, b"") for k in keys if k in ans)
                fps.errors.update((k, ans.errors[k]) for k in keys if k in ans.errors)
                known[i] = fps
        if nxt is None:
            after = _format_position(j + 1, [*clean, True], None) if j + 1 < replicas else None
        else:
            after = _format_position(j, clean, nxt)
        yield SweepStep(j, keys, after, known)
        if nxt is None:
            j += 1
            clean.append(True)
        cluster_pos = nxt
    if errors:
        raise PartialScanError(errors)


@dataclass
class WalkReport:
    """What a walk did. ``position`` resumes it (None: it reached the end of the last replica).

    ``keys``: keys compared; ``diverged``: keys whose replicas held different records; ``repaired`` /
    ``repair_failures``: records written / not written (the replica failed); ``floors_raised``: keys of a
    replica whose floor was raised to the key's highest floor (see :meth:`Walker._repairs`);
    ``failures``: replica shards that could not be scanned or read (their keys were not compared, or
    only among the others).
    """

    keys: int = 0
    diverged: int = 0
    repaired: int = 0
    floors_raised: int = 0
    repair_failures: int = 0
    seconds: float = 0.0
    position: str | None = None
    failures: list[ShardFailure] = field(default_factory=list)

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

    def _compare(self, step: SweepStep, report: WalkReport) -> None:
        farm, keys = self.farm, step.keys
        if not keys:
            return
        report.keys += len(keys)
        missing = [i for i in range(len(farm.clusters)) if i not in step.known]
        # Cheap serialized fingerprints first; the keys they cannot settle get record fingerprints.
        fresh = _reads(farm, _serialized, keys, missing)
        quick = {**step.known, **dict(zip(missing, fresh, strict=True))}
        suspects = [key for key in keys if len({ans[key] for ans in quick.values() if key in ans}) > 1]
        exact = (
            dict(enumerate(_reads(farm, _fingerprints, suspects, list(range(len(farm.clusters)))))) if suspects else {}
        )
        diverged = [key for key in suspects if len({ans[key] for ans in exact.values() if key in ans}) > 1]
        for key in keys:
            failed = [_named(farm.names[i], ans.errors[key]) for i, ans in quick.items() if key in ans.errors]
            report.failures += failed[:1]
        if not diverged:
            return
        report.diverged += len(diverged)
        repairs = self._repairs(diverged, report)
        if repairs:
            done, unwritten = farm._shared.repairer.repair_now(repairs)
            report.repaired += done
            report.repair_failures += unwritten

    def _repairs(self, keys: list[Blob], report: WalkReport) -> list[Repair]:
        """The records to write for ``keys``, after raising every replica's floor to the highest one.

        A floor (``forget``, or trimming with ``max_size``) is replicated like a record: a replica below
        the highest floor of a key, or still holding records at or below it, forgets up to it (the
        records it drops are ones another replica forgot). Records at or below that floor are then left
        out of the merge, so a replica rebuilt without its floor does not bring forgotten records back.
        """
        farm = self.farm
        held = farm.records(keys)
        floors = _reads(farm, _floors, keys, list(range(len(farm.clusters))))
        forgets: dict[tuple[int, float], list[Blob]] = {}
        repairs: list[Repair] = []
        for key in keys:
            answered = [i for i, res in enumerate(held) if key in res and key in floors[i]]
            known = [f for i in answered if (f := floors[i][key]) is not None]
            top = max(known) if known else None
            per: dict[bytes, tuple[Any, dict[int, Presence]]] = {}
            for i in answered:
                records = held[i][key]
                if top is not None and farm.clusters[i].floors:
                    mine = floors[i][key]
                    below = mine is None or mine < top
                    if below or any(w.score <= top for w in records):
                        forgets.setdefault((i, top), []).append(key)
                for w in records:
                    if top is None or w.score > top:
                        per.setdefault(to_bytes(w.member), (w.member, {}))[1][i] = presence_of(w)
            for member, have in per.values():
                best = winner([have.get(i, NOT_PRESENT) for i in answered])
                if best is None:
                    continue
                repairs += [
                    Repair(farm.names[i], farm.clusters[i], as_write(key, member, best))
                    for i in answered
                    if differs(have.get(i, NOT_PRESENT), best)
                ]
        for (i, top), forgotten in forgets.items():
            try:
                farm.clusters[i].forget(forgotten, top)
                report.floors_raised += len(forgotten)
            except PartialWriteError as exc:
                report.failures += [_named(farm.names[i], f) for f in exc.result.failures]
        return repairs


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
