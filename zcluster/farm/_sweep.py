"""The sweep: every key held by any replica of a farm, visited about once, in resumable steps.

A sweep visits each replica in turn (SCAN, no blocking). A key found on replica ``j`` is skipped when an
earlier replica whose own sweep completed holds it: that sweep already visited it. So every key held by
any replica is visited about once, at the cost of one existence check per earlier replica. The walker
(:mod:`zcluster.farm.walker`) compares and repairs the keys of each step; :meth:`zcluster.farm.Farm.keys`
lists them. A position (``replica/completed sweeps/scan position``) resumes a sweep after a step.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from zcluster.errors import PartialScanError
from zcluster.farm._merge import named
from zcluster.types import Blob, ReadResult, ShardFailure

if TYPE_CHECKING:
    from zcluster.cluster import Cluster
    from zcluster.farm.farm import Farm


@dataclass(frozen=True)
class SweepStep:
    """Keys of ``replica`` not held by an earlier completed replica; ``position`` resumes after them.
    ``known`` holds the fingerprints already known for them (replica index -> answer)."""

    replica: int
    keys: list[Blob]
    position: str | None
    known: dict[int, ReadResult[Blob, bytes]]


def parse_position(position: str | None, replicas: int) -> tuple[int, list[bool], str | None]:
    """A sweep position as (replica index, which earlier sweeps completed, that replica's scan position);
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


def _exists(keys: list[Blob]) -> Callable[[Cluster], ReadResult[Blob, bytes]]:
    return lambda c: c.fingerprints(keys, kind="exists", strict=False)


def _holds(answer: bytes, include_removed: bool) -> bool:
    """Whether a key is one a sweep reports (it has members; or, ``include_removed``, any record)."""
    return answer == b"+" or (include_removed and answer == b"1")


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
            (errors if failures is None else failures).extend(named(farm.names[j], f) for f in exc.failures)
            clean[j] = False
            keys, nxt = [], cluster.next_shard(cluster_pos)
        earlier = [i for i in range(j) if clean[i]]
        known: dict[int, ReadResult[Blob, bytes]] = {}
        if keys and earlier:
            answers = farm.per_replica(_exists(keys), keys, earlier)
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
