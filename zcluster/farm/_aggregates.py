"""Increments on a farm: written to every replica, read from the replica whose copy holds the most, and
repaired by copying that replica's whole key.

Why every replica, not a quorum: a key's fence per source only moves forward, so a replica that missed an
increment and then applied a later one of the same source can never take the missed one, and nothing it
holds tells what it lacks. So an increment counts as confirmed only once every replica confirmed it; a
replica that failed makes the call fail (resend it, as for a Cluster), which keeps every replica's copy of
a key, per source, a prefix of that source's increments. Two copies are then ordered by their fences
(position and count per source, :class:`zcluster.Fence`): the copy that is ahead on every source holds
everything the other holds, and replacing the other with it is exact. The count tells a replica restarted
empty (or restored from an old backup), whose later increments moved its fence as far, from one that has
them all.

A repair reads the leading copy whole and replaces the other copy in one script call that first checks
the target still holds the fences it was read with (an increment that reached it meanwhile makes the
repair a no-op; the next read or walk tries again). Copies that no single copy leads (replicas each ahead
on another source: a caller that stopped resending) cannot be merged exactly: they are reported, never
guessed at.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from zcluster._aggregate_keys import KeyState, whole_keys_of
from zcluster._aggregates import Position
from zcluster._encode import check_limit, listed_keys
from zcluster._reporting import Reporting
from zcluster.cluster import Cluster
from zcluster.errors import QuorumError
from zcluster.farm import _quorum
from zcluster.farm._merge import failed, named
from zcluster.farm._quorum import FarmWriteResult
from zcluster.farm._repair import AggregateCopy, Repair
from zcluster.farm._replicas import Replicas
from zcluster.farm._strategies import Shared
from zcluster.types import Blob, Count, Fence, Incr, KeyMember, KeyScoreMember, ReadResult, ShardFailure

K = TypeVar("K")
V = TypeVar("V")


@dataclass
class AggregateRepairs:
    """What :meth:`FarmAggregates.repair_aggregates` found and did: ``aggregates``, the keys that are
    aggregate keys on some replica (the rest are 2P-sets or absent everywhere); ``diverged``, those whose
    replicas' copies differ; ``repaired`` / ``failed``: copies replaced / not (the replica failed, or the
    key moved since it was read); ``unsettled``: keys no single copy leads (see the module), left as they
    are; ``failures``: replicas that could not be read."""

    aggregates: list[Blob] = field(default_factory=list)
    diverged: int = 0
    repaired: int = 0
    failed: int = 0
    unsettled: list[Blob] = field(default_factory=list)
    failures: list[ShardFailure] = field(default_factory=list)


def leads(a: dict[bytes, Fence], b: dict[bytes, Fence]) -> bool:
    """Whether a copy with fences ``a`` holds everything one with fences ``b`` holds (see the module)."""
    for source, f in b.items():
        mine = a.get(source)
        if mine is None or mine.position < f.position or mine.held < f.held:
            return False
    return True


def leader(states: dict[int, KeyState]) -> int | None:
    """The replica whose copy leads every other answering copy (the lowest index among equals); None if
    none does, or if the key is a 2P-set on some replica (kinds differ: nothing to copy)."""
    if any(s.kind == "2" for s in states.values()):
        return None
    for i, s in sorted(states.items()):
        if all(leads(s.fences, o.fences) for o in states.values()):
            return i
    return None


def _alike(states: dict[int, KeyState]) -> bool:
    """Whether every copy holds the same increments (compared parsed: servers may sort text differently)."""
    first = next(iter(states.values()))
    return all((s.kind, s.fences) == (first.kind, first.fences) for s in states.values())


class FarmAggregates(Reporting):
    """The increments part of :class:`zcluster.farm.Farm`'s API (see the module). A mixin: the Farm holds
    the replicas."""

    clusters: list[Cluster]
    names: list[str]
    _shared: Shared

    def increment(
        self,
        source: str,
        items: Iterable[tuple[Position, Incr | Count]],
        *,
        ttl: int | None = None,
        raise_on_error: bool = True,
    ) -> FarmWriteResult:
        """:meth:`zcluster.Cluster.increment` on every replica, in parallel; an increment is confirmed only
        once **every** replica confirmed it (applied it, or found it at or below its fence): the result's
        ``quorum`` is the number of replicas, whatever ``write_quorum`` says (the module says why). A
        replica that fails makes the call fail (:class:`QuorumError`, its failures named
        ``replica/host:port``): resend, as for a Cluster, before anything later of ``source``; a replica
        that is down therefore stops increments until it is back or removed from the farm. ``applied[i]``:
        new to every replica that answered for it. A refused increment (a key of another kind, an
        overflow) raises :class:`WriteRefusedError`. A call waits for every replica (no ``straggler_wait``),
        each up to its socket timeout."""
        started = time.perf_counter()
        items = items if isinstance(items, list | tuple) else list(items)
        n = len(items)

        def one(i: int) -> Any:
            return self.clusters[i].increment(source, items, ttl=ttl, raise_on_error=False)

        try:
            outcomes = self._replicas.each(one)
        except BaseException as exc:
            self._report("farm.increment", n, started, error=exc)
            raise
        result = _quorum.confirm(self.names, outcomes, n, len(self.clusters))
        self._report("farm.increment", n, started, result.applied_count, [f.shard for f in result.failures])
        if raise_on_error:
            if result.refused is not None:
                raise result.refused
            if result.failures:
                raise QuorumError(result)
        return result

    def top(
        self, keys: Iterable[Blob], offset: int = 0, limit: int = 10, *, strict: bool = True
    ) -> ReadResult[Blob, list[KeyScoreMember]]:
        """:meth:`zcluster.Cluster.top` of each sums key from the replica whose copy leads the others (see
        the module); replicas behind it are repaired under the farm's repair strategy. Every replica is
        asked, whatever the read strategy: only their fences tell which copy is complete."""
        key_list = listed_keys(keys)
        check_limit(limit, offset)

        def read(c: Cluster) -> ReadResult[Blob, list[KeyScoreMember]]:
            return c.top(key_list, offset, limit, strict=False)

        return self._from_leaders("farm.top", key_list, key_list, lambda k: k, read, strict)

    def ranks(
        self, key_members: Iterable[KeyMember | tuple[Blob, Blob]], *, strict: bool = True
    ) -> ReadResult[KeyMember, tuple[int, float] | None]:
        """:meth:`zcluster.Cluster.ranks` from the leading replica of each key, as :meth:`top`."""
        items = [km if type(km) is KeyMember else KeyMember(*km) for km in key_members]
        key_list = list(dict.fromkeys(km.key for km in items))

        def read(c: Cluster) -> ReadResult[KeyMember, tuple[int, float] | None]:
            return c.ranks(items, strict=False)

        return self._from_leaders("farm.ranks", key_list, items, lambda km: km.key, read, strict)

    def counters(self, keys: Iterable[Blob], *, strict: bool = True) -> ReadResult[Blob, dict[Blob, int]]:
        """:meth:`zcluster.Cluster.counters` from the leading replica of each key, as :meth:`top`."""
        key_list = listed_keys(keys)

        def read(c: Cluster) -> ReadResult[Blob, dict[Blob, int]]:
            return c.counters(key_list, strict=False)

        return self._from_leaders("farm.counters", key_list, key_list, lambda k: k, read, strict)

    def repair_aggregates(self, keys: Iterable[Blob]) -> AggregateRepairs:
        """Compare every replica's copy of each aggregate key among ``keys`` and replace the copies behind
        the leading one with it now, whatever the repair strategy (the walker's repairs; counted in
        :attr:`repairs`). Keys that are no aggregate on any replica are left to the 2P-set repair."""
        key_list = listed_keys(keys)
        report = AggregateRepairs()
        states = self._states(key_list)
        behind: dict[Blob, tuple[int, dict[int, KeyState]]] = {}
        for key in key_list:
            answered = {i: ans[key] for i, ans in enumerate(states) if key in ans}
            report.failures += [
                named(self.names[i], ans.errors[key]) for i, ans in enumerate(states) if key in ans.errors
            ][:1]
            if not any(s.aggregate for s in answered.values()):
                continue
            report.aggregates.append(key)
            if _alike(answered):
                continue
            report.diverged += 1
            lead = leader(answered)
            if lead is None:
                self._report("farm.unsettled", 1, time.perf_counter())
                report.unsettled.append(key)
            else:
                behind[key] = (lead, answered)
        copies = self._copies(behind)
        if copies:
            report.repaired, report.failed = self._shared.repairer.repair_now(copies)
        return report

    # -- internals ----------------------------------------------------------------------------------------

    @property
    def _replicas(self) -> Replicas:
        replicas: Replicas = self._shared.replicas
        return replicas

    def _states(self, keys: list[Blob]) -> list[ReadResult[Blob, KeyState]]:
        """Every replica's :class:`KeyState` of ``keys`` (a failed replica: every key in ``errors``)."""
        answers = self._replicas.each(lambda i: whole_keys_of(self.clusters[i]).states(keys))
        return [failed(keys, a) if isinstance(a, BaseException) else a for a in answers]

    def _copies(self, behind: dict[Blob, tuple[int, dict[int, KeyState]]]) -> list[Repair]:
        """The repairs replacing every copy behind its key's leader (key -> (leader, every copy's state)) with
        the leader's, each leader's keys dumped in one read. A key its leader could not dump now is counted
        a dropped repair (the next read or walk finds it again)."""
        targets = {
            key: [i for i, s in answered.items() if (s.kind, s.fences) != (answered[lead].kind, answered[lead].fences)]
            for key, (lead, answered) in behind.items()
        }
        by_lead: dict[int, list[Blob]] = {}
        for key, (lead, _) in behind.items():
            by_lead.setdefault(lead, []).append(key)
        repairs: list[Repair] = []
        for lead, keys in by_lead.items():
            whole = whole_keys_of(self.clusters[lead]).states(keys, dump=True)
            for key in keys:
                if key in whole and whole[key].aggregate:
                    answered = behind[key][1]
                    repairs += [
                        Repair(self.names[i], self.clusters[i], AggregateCopy(key, answered[i].canon, whole[key]))
                        for i in targets[key]
                    ]
                else:
                    self._shared.repairer.drop(len(targets[key]))
        return repairs

    def _from_leaders(
        self,
        op: str,
        keys: list[Blob],
        items: Sequence[K],
        key_of: Callable[[K], Blob],
        read: Callable[[Cluster], ReadResult[K, V]],
        strict: bool,
    ) -> ReadResult[K, V]:
        """``read`` on every replica alongside its fences of ``keys``; each item answered from its key's
        leading replica (none leads: the replica holding the most increments, and the key is reported
        ``farm.unsettled``), repairs of the others handed to the repair strategy."""
        started = time.perf_counter()
        with self._reporting(op, started):

            def both(i: int) -> tuple[ReadResult[Blob, KeyState], ReadResult[K, V]]:
                c = self.clusters[i]
                return whole_keys_of(c).states(keys), read(c)

            answers = self._replicas.each(both)
            states: list[ReadResult[Blob, KeyState]] = []
            data: list[ReadResult[K, V]] = []
            for a in answers:
                if isinstance(a, BaseException):
                    states.append(failed(keys, a))
                    data.append(failed(list(items), a))
                else:
                    states.append(a[0])
                    data.append(a[1])
            chosen: dict[Blob, int] = {}
            behind: dict[Blob, tuple[int, dict[int, KeyState]]] = {}
            for key in keys:
                answered = {i: s[key] for i, s in enumerate(states) if key in s}
                if not answered:
                    continue
                lead = leader(answered)
                if lead is None:
                    self._report("farm.unsettled", 1, started)
                    lead = max(answered, key=lambda i: sum(f.held for f in answered[i].fences.values()))
                elif not _alike(answered):
                    behind[key] = (lead, answered)
                chosen[key] = lead
            result: ReadResult[K, V] = ReadResult()
            for item in items:
                key = key_of(item)
                lead_of = chosen.get(key)
                if lead_of is None:
                    errors = [named(self.names[i], s.errors[key]) for i, s in enumerate(states) if key in s.errors]
                    result.errors[item] = errors[0]  # a key no replica answered is in some replica's errors
                elif item in data[lead_of]:
                    result[item] = data[lead_of][item]
                else:
                    result.errors[item] = named(self.names[lead_of], data[lead_of].errors[item])
            self._shared.repairer.submit(self._copies(behind))
        return self._finish(op, result, len(items), started, strict)
