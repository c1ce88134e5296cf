"""The 2P-set's merge across replicas: which record of a member wins, what each replica lacks, and the
merges of the replicas' answers that the farm's reads and the walker make with that rule.

A record is a member's newest write on one replica: an insert or a delete at a score. Across replicas the
winner is the record with the highest score; at equal scores a delete beats an insert (the same rule the
write script applies on one server, so a repaired replica ends where the others are). There is no bias
toward adds: a delete applied on one replica only wins the merge, and is repaired onto the others.

Everything here is pure: a merge takes what the replicas answered (one answer per replica, by index, or
the replica's failure) and returns the merged answer and the *fixes*, ``(replica index, write)`` pairs
that make every answering replica hold the winners; the farm turns fixes into repairs. Failures name a
replica's shards ``replica/host:port`` (:func:`shard_name`, the farm's one spelling of it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from zcluster.errors import PartialWriteError, ReplicaBusy, WriteRefusedError
from zcluster.types import (
    NOT_PRESENT,
    Blob,
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

#: One replica's answer to a read, or its failure as a whole.
Answer = ReadResult[Any, Any] | BaseException
#: A write that makes one replica (by index) hold a winner: the farm makes it a repair.
Fix = tuple[int, Write]
#: One key's members by stored bytes: (the member, each replica's record of it).
Members = dict[bytes, tuple[Blob, dict[int, Presence]]]

# -- the rule -------------------------------------------------------------------------------------------------


def rank(p: Presence) -> tuple[float, bool]:
    """Orders present records: higher score first, then a delete over an insert at the same score."""
    return (p.score, not p.inserted)


def winner(records: Sequence[Presence | None]) -> Presence | None:
    """The winning record among the present ones (None: no replica holds the member, or none answered)."""
    best: Presence | None = None
    for p in records:
        if p is not None and p.present and (best is None or rank(p) > rank(best)):
            best = p
    return best


def as_write(key: Blob, member: Blob, p: Presence) -> Write:
    """The write that puts record ``p`` on a replica."""
    return Insert(key, p.score, member) if p.inserted else Delete(key, p.score, member)


def differs(have: Presence | None, best: Presence) -> bool:
    """Whether a replica holding ``have`` needs ``best`` written (None: the replica did not answer)."""
    return have is not None and (not have.present or have.inserted != best.inserted or have.score != best.score)


def order(score: float, member: Blob) -> tuple[float, bytes]:
    """Select order, compared on stored bytes: higher score first, then member descending."""
    return (score, to_bytes(member))


def presence_of(write: Write) -> Presence:
    return Presence(True, isinstance(write, Insert), write.score)


def settle(key: Blob, member: Blob, have: Mapping[int, Presence | None]) -> tuple[Presence | None, list[Fix]]:
    """The winner of ``member`` among the replicas' records ``have`` (replica -> its record; None: it did
    not answer, ``NOT_PRESENT``: it holds none) and the fixes for the replicas holding another record."""
    best = winner(list(have.values()))
    if best is None:
        return None, []
    return best, [(i, as_write(key, member, best)) for i, p in have.items() if differs(p, best)]


def by_member(held: Mapping[int, Iterable[tuple[Blob, Presence]]]) -> Members:
    """The records of one key that replicas hold (replica -> its ``(member, record)`` pairs), grouped by
    member (stored bytes), in order of first appearance. A replica listing a member twice (in K+ and K-:
    a foreign write the layout forbids) keeps the record that ranks higher."""
    out: Members = {}
    for i, records in held.items():
        for member, p in records:
            _, per = out.setdefault(to_bytes(member), (member, {}))
            if i not in per or rank(p) > rank(per[i]):
                per[i] = p
    return out


# -- naming and shaping answers -------------------------------------------------------------------------------


def shard_name(replica: str, shard: str) -> str:
    """A replica's shard as the farm names it: ``replica/host:port`` (``replica/*``: the whole replica)."""
    return f"{replica}/{shard}"


def named(replica: str, failure: ShardFailure) -> ShardFailure:
    """``failure`` of one of ``replica``'s shards, the shard named by :func:`shard_name`."""
    return ShardFailure(shard_name(replica, failure.shard), failure.error, failure.indices)


def failed(items: Sequence[Any], exc: BaseException) -> ReadResult[Any, Any]:
    """The answer of a replica whose whole call failed: every item in ``errors`` (shard ``*``: the
    replica as a whole; readers prefix the replica's name)."""
    out: ReadResult[Any, Any] = ReadResult()
    out.errors.update((item, ShardFailure("*", exc, ())) for item in items)
    return out


def in_order(
    items: Sequence[Any], values: Mapping[Any, Any], errors: Mapping[Any, ShardFailure]
) -> ReadResult[Any, Any]:
    """A read's result over ``items`` (in their order): an item's value, else its failure."""
    result: ReadResult[Any, Any] = ReadResult()
    for item in items:
        if item in values:
            result[item] = values[item]
        elif item in errors:
            result.errors[item] = errors[item]
    return result


def sliced(result: ReadResult[Blob, list[KeyScoreMember]], offset: int, limit: int) -> ReadResult[Blob, Any]:
    """Every key's entries ``[offset, offset + limit)``; failures as they are."""
    out: ReadResult[Blob, list[KeyScoreMember]] = ReadResult()
    out.update({k: v[offset : offset + limit] for k, v in result.items()})
    out.errors.update(result.errors)
    return out


def answered(
    item: Any, answers: Sequence[Answer], names: Sequence[str], errors: dict[Any, ShardFailure]
) -> dict[int, Any]:
    """Each replica's answer for ``item`` (replica -> value; replicas that failed it left out). When no
    replica answered, the first failure, named, goes into ``errors`` (a replica failed as a whole is named
    without a shard)."""
    have: dict[int, Any] = {}
    error: ShardFailure | None = None
    for i, answer in enumerate(answers):
        if isinstance(answer, BaseException):
            error = error if error is not None else ShardFailure(names[i], answer, ())
        elif item in answer:
            have[i] = answer[item]
        elif error is None:
            error = named(names[i], answer.errors[item])
    if not have and error is not None:
        errors[item] = error
    return have


# -- the merges -----------------------------------------------------------------------------------------------


def merge_scores(
    items: Sequence[KeyMember], answers: Sequence[Answer], names: Sequence[str]
) -> tuple[ReadResult[KeyMember, Presence], list[Fix]]:
    """``score`` merged: each key-member's winning record among the replicas' answers (``NOT_PRESENT``
    when no answering replica holds one), and the fixes. An item no replica answered is in ``errors``."""
    values: dict[KeyMember, Presence] = {}
    errors: dict[KeyMember, ShardFailure] = {}
    fixes: list[Fix] = []
    for km in items:
        have = answered(km, answers, names, errors)
        if not have:
            continue
        best, found = settle(km.key, km.member, have)
        values[km] = best if best is not None else NOT_PRESENT
        fixes += found
    return in_order(items, values, errors), fixes


class Merged(NamedTuple):
    """One member of a key across the replicas that answered: ``held``, each one's record (``NOT_PRESENT``:
    it holds none; a replica that did not answer is not in it), ``best``, the winner, and the ``fixes``
    that make the others hold it (:meth:`zcluster.farm.Farm.repair_now` writes them)."""

    member: Blob
    held: dict[int, Presence]
    best: Presence
    fixes: list[Fix]

    def differing(self, replicas: int) -> list[bool]:
        """For each of ``replicas`` replicas, whether its record differs from the winner (one that did not
        answer does not)."""
        return [differs(self.held.get(i), self.best) for i in range(replicas)]


def merge_records(key: Blob, held: Mapping[int, Iterable[Write]]) -> list[Merged]:
    """Every member of ``key`` merged across the replicas that answered (``held``: replica -> its records
    of the key, as :meth:`zcluster.Cluster.records` reads them), in order of first appearance."""
    members = by_member({i: [(w.member, presence_of(w)) for w in records] for i, records in held.items()})
    out: list[Merged] = []
    for member, per in members.values():
        have = {i: per.get(i, NOT_PRESENT) for i in held}
        best, fixes = settle(key, member, have)
        if best is not None:
            out.append(Merged(member, have, best, fixes))
    return out


@dataclass(frozen=True)
class KeyDiff:
    """One key on every replica (:meth:`zcluster.farm.Farm.diff`): its ``members`` merged, in merged select
    order (highest score first), and ``failures``, the replicas that could not read it (replica name -> the
    failure, its shard named ``replica/host:port``)."""

    key: Blob
    members: list[Merged]
    failures: dict[str, ShardFailure]

    @property
    def agree(self) -> bool:
        """Whether every replica that answered holds every member's winning record."""
        return not any(m.fixes for m in self.members)


def diff_key(key: Blob, answers: Sequence[ReadResult[Blob, list[Write]]], names: Sequence[str]) -> KeyDiff:
    """``key`` compared across the replicas' records (``answers``, one per replica)."""
    failures: dict[str, ShardFailure] = {}
    held: dict[int, list[Write]] = {}
    for i, answer in enumerate(answers):
        if key in answer.errors:
            failures[names[i]] = named(names[i], answer.errors[key])
        else:
            held[i] = answer.get(key, [])
    members = sorted(merge_records(key, held), key=lambda m: order(m.best.score, m.member), reverse=True)
    return KeyDiff(key, members, failures)


Window = list[KeyScoreMember]
#: One round of a window read: every replica's first ``window`` entries of ``keys`` (or its failure).
Ask = Callable[[list[Blob], int], Sequence[Answer]]
#: Asks replicas the records of key-members (replica -> its key-members): their ``score`` answers.
LookUp = Callable[[dict[int, list[KeyMember]]], Mapping[int, Answer]]


def merge_windows(
    keys: list[Blob],
    names: Sequence[str],
    need: int,
    ask: Ask,
    look_up: LookUp,
    within: Callable[[float, Blob], bool] | None = None,
    answers: Sequence[Answer] | None = None,
) -> tuple[ReadResult[Blob, Window], list[Fix]]:
    """A merged ``select``: each key's first ``need`` merged entries, and the fixes, from rounds of every
    replica's first entries (``ask(keys, window)``; the first round's ``answers`` when the caller has
    them), the windows doubled for the keys a round could not settle.

    Windows that agree are the answer (a member in K+ has no tombstone on the same replica). Otherwise a
    replica whose window did not show a member is asked its record of it (``look_up``; a key a lookup
    failed for is not answered: that replica's tombstone may be the winner), and winners are taken. A
    member in no replica's window ranks below the lowest entry of the window of the replica holding its
    winner (if that window was full), so merged entries at or above the highest full window's lowest
    entry are exact; a key with fewer than ``need`` of them is asked again with doubled windows.
    ``within`` (``select_range``): whether a winner lies inside the range; a member seen inside it on one
    replica may win with another replica's record outside it, and is then left out.
    """
    values: dict[Blob, Window] = {}
    errors: dict[Blob, ShardFailure] = {}
    fixes: list[Fix] = []
    pending, window = keys, need
    while pending:
        got = ask(pending, window) if answers is None else answers
        answers = None
        pending = _window_round(pending, got, names, need, window, look_up, within, values, errors, fixes)
        window *= 2
    return in_order(keys, values, errors), fixes


def _window_round(
    keys: list[Blob],
    answers: Sequence[Answer],
    names: Sequence[str],
    need: int,
    window: int,
    look_up: LookUp,
    within: Callable[[float, Blob], bool] | None,
    values: dict[Blob, Window],
    errors: dict[Blob, ShardFailure],
    fixes: list[Fix],
) -> list[Blob]:
    """One round of :func:`merge_windows` over ``keys``, into ``values``, ``errors`` and ``fixes``; the
    keys whose windows must widen."""
    merging: dict[Blob, tuple[dict[int, Window], Members]] = {}
    for key in keys:
        have = answered(key, answers, names, errors)
        if not have:
            continue
        windows = list(have.values())
        flat = [(e.member, e.score) for e in windows[0]]
        if all([(e.member, e.score) for e in other] == flat for other in windows[1:]):
            values[key] = windows[0][:need]  # agreeing windows are exact
            continue
        shown = {i: [(e.member, Presence(True, True, e.score)) for e in entries] for i, entries in have.items()}
        merging[key] = (have, by_member(shown))
    lookups: dict[int, list[KeyMember]] = {}
    for key, (have, members) in merging.items():
        for i in have:
            lookups.setdefault(i, []).extend(KeyMember(key, m) for m, per in members.values() if i not in per)
    looked = look_up(lookups)
    more: list[Blob] = []
    for key, (have, members) in merging.items():
        lost = _looked_up(key, members, have, looked, names)
        if lost is not None:
            errors[key] = lost
            continue
        page, found = _page(key, members, have, need, window, within)
        if page is None:
            more.append(key)
        else:
            values[key] = page
            fixes += found
    return more


def _looked_up(
    key: Blob, members: Members, have: Mapping[int, Window], looked: Mapping[int, Answer], names: Sequence[str]
) -> ShardFailure | None:
    """Completes ``members`` with the records looked up on the replicas whose window did not show them;
    the first lookup that failed, if any."""
    lost: ShardFailure | None = None
    for member, per in members.values():
        for i in have:
            if i in per:
                continue
            km, answer = KeyMember(key, member), looked[i]
            if isinstance(answer, BaseException):
                lost = lost if lost is not None else ShardFailure(shard_name(names[i], "*"), answer, ())
            elif km in answer:
                per[i] = answer[km]
            elif lost is None:
                lost = named(names[i], answer.errors[km])
    return lost


def _page(
    key: Blob,
    members: Members,
    have: Mapping[int, Window],
    need: int,
    window: int,
    within: Callable[[float, Blob], bool] | None,
) -> tuple[Window | None, list[Fix]]:
    """The merged first ``need`` entries of ``key`` and its fixes; None when fewer than ``need`` are exact."""
    visible: Window = []
    fixes: list[Fix] = []
    for member, per in members.values():
        best, found = settle(key, member, per)
        if best is None:
            continue
        if best.inserted and (within is None or within(best.score, member)):
            visible.append(KeyScoreMember(key, best.score, member))
        fixes += found
    visible.sort(key=lambda e: order(e.score, e.member), reverse=True)
    floors = [order(es[-1].score, es[-1].member) for es in have.values() if len(es) >= window]
    if not floors:
        return visible[:need], fixes
    exact = [e for e in visible if order(e.score, e.member) >= max(floors)]
    return (exact[:need], fixes) if len(exact) >= need else (None, [])


def raise_forget_failures(names: Sequence[str], keys: list[Blob], outcome: Sequence[Any]) -> None:
    """What :meth:`Farm.forget <zcluster.farm.Farm.forget>` raises from its replicas' outcomes, if anything:
    :class:`WriteRefusedError` for keys some replica refused (an aggregate key), else
    :class:`PartialWriteError` for failed shards, each named by its replica; an unexpected error as is."""
    failures: list[ShardFailure] = []
    refused: dict[int, str] = {}
    for replica, res in zip(names, outcome, strict=True):
        if isinstance(res, WriteRefusedError):
            for i, why in res.refused.items():
                refused.setdefault(i, f"{why} (replica {replica})")
            failures += [named(replica, f) for f in res.result.failures]
        elif isinstance(res, PartialWriteError):
            failures += [named(replica, f) for f in res.result.failures]
        elif isinstance(res, ReplicaBusy):
            failures.append(ShardFailure(shard_name(replica, "*"), res, tuple(range(len(keys)))))
        elif isinstance(res, BaseException):
            raise res
    handled = [i not in refused and all(i not in f.indices for f in failures) for i in range(len(keys))]
    if refused:
        first = min(refused)
        raise WriteRefusedError(first, keys[first], refused[first], refused, WriteResult(handled, failures))
    if failures:
        raise PartialWriteError(WriteResult(handled, failures))
