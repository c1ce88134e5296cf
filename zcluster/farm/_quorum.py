"""Quorums: how many replicas must confirm a write (roshi's percentage strings), when a farm call has
heard from enough of them, and what the replicas' answers to a write add up to.

A write is encoded once for every replica of the same shape (:func:`prepare`), sent to all of them
(:func:`send`), and confirmed per tuple when ``quorum`` replicas answered for it (:func:`confirm`, which
makes the :class:`FarmWriteResult`). A write quorum of ``q`` out of ``n`` replicas has a read quorum of
``n - q + 1`` (:func:`read_quorum`): any set of that many replicas meets every set of ``q``, so a read
that heard from a read quorum sees every confirmed write.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from zcluster import _writes
from zcluster._following import MAX_MOVES
from zcluster._moves import StoreMoved
from zcluster.cluster import Cluster
from zcluster.errors import ConfigError, LayoutMismatchError, ReplicaLate, ShardError
from zcluster.farm._merge import named
from zcluster.types import ReadResult, ShardFailure, WriteResult

__all__ = ["FarmWriteResult", "parse_quorum"]


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
    their tuples are in ``replica_failures`` with a :class:`~zcluster.ReplicaLate` error, and their
    calls go on in the background; tuples such a call then fails are handed to read-repair.
    """

    confirmed: list[int] = field(default_factory=list)
    quorum: int = 1
    replica_failures: dict[str, list[ShardFailure]] = field(default_factory=dict)
    late: list[str] = field(default_factory=list)


def parse_quorum(quorum: str | int, replicas: int) -> int:
    """The number of replicas out of ``replicas`` that ``quorum`` asks for.

    A string is a percentage of the replicas, rounded up: ``"51%"`` of 3 is 2, ``"34%"`` of 3 is 2,
    ``"32%"`` of 3 is 1, ``"50%"`` of 5 is 3, ``"100%"`` is all of them. An int is a count. Anything
    that asks for no replica or more than there are (``"0%"``, ``"110%"``, ``0``, ``4`` of 3), or does not
    parse (``"abc"``, ``"-1%"``), is a :class:`ConfigError`.
    """
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas <= 0:
        raise ConfigError(f"a farm needs at least one replica, got {replicas!r}")
    if isinstance(quorum, int) and not isinstance(quorum, bool):
        count = quorum
    elif isinstance(quorum, str) and quorum.strip().endswith("%"):
        text = quorum.strip()[:-1].strip()
        try:
            percent = Fraction(text)
        except (ValueError, ZeroDivisionError):
            raise ConfigError(f"write quorum {quorum!r} is not a percentage like '51%'") from None
        if not text or text[0] in "+-" or percent <= 0 or percent > 100:
            raise ConfigError(f"write quorum {quorum!r} must be a percentage in (0%, 100%]")
        product = percent * replicas / 100
        count = product.numerator // product.denominator + (product.denominator != 1)
    else:
        raise ConfigError(f"write quorum {quorum!r} must be a percentage like '51%' or a replica count")
    if not 1 <= count <= replicas:
        raise ConfigError(f"write quorum {quorum!r} asks for {count} of {replicas} replica(s)")
    return count


def read_quorum(replicas: int, quorum: int) -> int:
    """Replicas a read needs to see every write that ``quorum`` of ``replicas`` confirmed."""
    return replicas - quorum + 1


def quorum_reached(n: int, quorum: int, outcomes: Sequence[Any]) -> bool:
    """Whether the replicas' write results so far (None: not answered yet) confirm each of ``n`` tuples
    ``quorum`` times."""
    answered = [o for o in outcomes if isinstance(o, WriteResult)]
    short = Counter(i for o in answered for i in o.failed_indices)
    return len(answered) - max(short.values(), default=0) >= quorum


def answered_by(items: Sequence[Any], need: int, outcomes: Sequence[Any]) -> bool:
    """Whether every item has an answer from ``need`` replicas (a read quorum) among ``outcomes``."""
    answered = [o for o in outcomes if isinstance(o, ReadResult)]
    if sum(1 for o in answered if not o.errors) >= need:
        return True
    return len(answered) >= need and all(sum(1 for o in answered if item in o) >= need for item in items)


# -- a quorum write -------------------------------------------------------------------------------------------


def prepare(clusters: Sequence[Cluster], ops: _writes.Ops) -> list[tuple[Cluster, _writes.WritePlan, Any]]:
    """Each replica's write plan and its prepared calls, encoded once for every replica of the same shape;
    a replica that could not route the tuples has its ShardError instead (e.g. a Redis Cluster replica
    with a slot uncovered)."""
    prepared: dict[Any, Any] = {}
    work = []
    for c in clusters:
        plan = _writes.plan_of(c)  # of the layout it follows now (a migration may have moved it)
        shape = plan.shape()
        p = prepared.get(shape) if shape is not None else None
        if p is None:
            try:
                p = plan.prepare(ops)
            except ShardError as exc:
                p = exc
            if shape is not None:
                prepared[shape] = p
        work.append((c, plan, p))
    return work


def send(
    name: str, ops: _writes.Ops, n: int, started: float, work: list[tuple[Cluster, _writes.WritePlan, Any]], i: int
) -> WriteResult:
    """Replica ``i``'s part of a farm write; a replica that could not even route the tuples failed them all.
    A replica whose store a migration moved under the write follows it and is sent the write again, whole,
    where the store lives now (writes are idempotent), as a Cluster's own call is (:mod:`zcluster._following`);
    after :data:`~zcluster._following.MAX_MOVES` moves in one write its tuples fail with a
    :class:`LayoutMismatchError` (never the internal ``StoreMoved``)."""
    cluster, plan, prepared = work[i]
    for _ in range(MAX_MOVES):
        if isinstance(prepared, ShardError):
            return WriteResult([False] * n, [ShardFailure("routing", prepared, tuple(range(n)))])
        try:
            return plan.send(name, ops, prepared, n, started)
        except StoreMoved as moved:
            cluster._live()._follow(moved)
        plan = _writes.plan_of(cluster)
        try:
            prepared = plan.prepare(ops)
        except ShardError as exc:
            prepared = exc
    return whole_failure(LayoutMismatchError(f"the store moved {MAX_MOVES} times during one write"), n)


def whole_failure(error: BaseException, n: int) -> WriteResult:
    """The write result of a replica whose whole call failed (or was late, or skipped): shard ``*``."""
    return WriteResult([False] * n, [ShardFailure("*", error, tuple(range(n)))])


def tally(results: Sequence[WriteResult], n: int, quorum: int) -> tuple[list[bool], list[int], set[int]]:
    """What the replicas' results of a write of ``n`` tuples add up to, per tuple: ``applied`` (new to
    every replica that answered for it, and at least one did), ``confirmed`` (the replicas that answered
    for it: applied it or found it stale), and the tuples below ``quorum``."""
    confirmed = [len(results)] * n
    fresh = [True] * n  # new to every replica that answered for it
    for r in results:
        failed = set(r.failed_indices)
        for i in failed:
            confirmed[i] -= 1
        fresh = [f and (a or i in failed) for i, (f, a) in enumerate(zip(fresh, r.applied, strict=True))]
    applied = [f and c > 0 for f, c in zip(fresh, confirmed, strict=True)]
    return applied, confirmed, {i for i in range(n) if confirmed[i] < quorum}


def confirm(names: Sequence[str], outcomes: Sequence[Any], n: int, quorum: int) -> FarmWriteResult:
    """The result of a write of ``n`` tuples from every replica's outcome (a WriteResult, or the failure of
    its whole call: a ReplicaLate names it in ``late``); shards named ``replica/host:port``."""
    results = [whole_failure(o, n) if isinstance(o, BaseException) else o for o in outcomes]
    applied, confirmed, below = tally(results, n, quorum)
    failures = []
    everything: dict[str, list[ShardFailure]] = {}
    for replica, r in zip(names, results, strict=True):
        everything[replica] = [named(replica, f) for f in r.failures]
        for f in everything[replica]:
            lost = tuple(i for i in f.indices if i in below)
            if lost:
                failures.append(ShardFailure(f.shard, f.error, lost))
    late = [replica for replica, o in zip(names, outcomes, strict=True) if isinstance(o, ReplicaLate)]
    return FarmWriteResult(applied, failures, confirmed, quorum, everything, late)
