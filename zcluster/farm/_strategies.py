"""How the read strategies ask the replicas; :class:`zcluster.farm.Farm` picks one per read.

* :func:`in_turn` (``SendOneReadOne``): one replica (round robin; a busy one answers as failed), the
  items it failed asked of the next.
* :func:`first_then_linger` (``SendAllReadFirstLinger``, and ``SendVarReadFirstLinger`` once it
  broadcasts): every replica asked, the first answer that has every item returned; every answer merged in
  the background (tracked, :meth:`Shared.linger`) and the fixes it found repaired.
* :func:`ask_round` (``SendAllReadAll``'s merged select, one round of windows): the replicas asked until a
  read quorum answered every key; the ones late or busy are not asked again by the same read.

What a farm shares with its views is here too (:class:`Shared`): the replica calls, the repairer, and the
read strategies' state (the round robin, the lingering merges). What a merge is, is
:mod:`zcluster.farm._merge`; how replicas are called, :mod:`zcluster.farm._replicas`.
"""

from __future__ import annotations

import functools
import itertools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait
from typing import Any

from zcluster._transport import SHARD_ERRORS
from zcluster.cluster import Cluster
from zcluster.errors import ReplicaBusy, ReplicaLate
from zcluster.farm._merge import Answer, Fix, failed, in_order, named
from zcluster.farm._quorum import answered_by
from zcluster.farm._repair import Repairer
from zcluster.farm._replicas import POLL, Replicas, Workers
from zcluster.instrumentation import OpEvent
from zcluster.types import Blob, KeyScoreMember, ReadResult, ShardFailure

log = logging.getLogger("zcluster.farm")
#: Lingering reads' merges in flight before a read runs its merge itself (see :meth:`Shared.linger`).
MAX_LINGERING = 64
Fetch = Callable[[Cluster, list[Any]], ReadResult[Any, Any]]
Merge = Callable[[list[Answer]], tuple[ReadResult[Any, Any], list[Fix]]]
#: A window read of one replica: the first ``window`` entries of ``keys`` (``select``, ``select_range``).
WindowFetch = Callable[[Cluster, list[Blob], int], ReadResult[Blob, list[KeyScoreMember]]]


class Shared:
    """What a farm and its views share: the replica calls (threads, late calls) and the repairer, and the
    lingering reads' merges."""

    def __init__(self, repairer: Repairer, replicas: Replicas) -> None:
        self.repairer = repairer
        self.replicas = replicas
        self.lock = threading.Lock()
        self.rr = itertools.count()
        self.lingering: set[Future[None]] = set()
        self.linger_pool = Workers(4, "zcluster-linger")

    def linger(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` (a lingering read's merge and repairs) in the background, tracked for flushing.

        On threads of their own: a merge asks replicas through :attr:`replicas`, and a pool waiting on
        its own tasks could deadlock. Past :data:`MAX_LINGERING` merges in flight the caller runs ``fn``
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


def guarded(fetch: Fetch, cluster: Cluster, items: list[Any]) -> ReadResult[Any, Any]:
    """``fetch``, with a replica's own failure (``SHARD_ERRORS``) as an answer failing every item."""
    try:
        return fetch(cluster, items)
    except SHARD_ERRORS as exc:
        return failed(items, exc)


def in_turn(
    replicas: Replicas, clusters: Sequence[Cluster], start: int, items: list[Any], fetch: Fetch
) -> ReadResult[Any, Any]:
    """``fetch`` on one replica after the other from ``start``, each asked the items the previous ones
    failed, until every item is answered; the failures are the last replica's."""
    answers: dict[Any, Any] = {}
    errors: dict[Any, ShardFailure] = {}
    remaining = items
    for step in range(len(clusters)):
        i = (start + step) % len(clusters)
        if replicas.busy(i):  # hung: asking it would cost its socket timeout
            answer = failed(remaining, replicas.skip(i, replicas.names[i]))
        else:
            answer = fetch(clusters[i], remaining)
        answers.update(answer)
        errors = {k: named(replicas.names[i], f) for k, f in answer.errors.items()}
        remaining = [k for k in remaining if k in answer.errors]
        if not remaining:
            break
    return in_order(items, answers, errors)


def first_then_linger(
    shared: Shared, futures: dict[int, Future[ReadResult[Any, Any]]], merge: Merge, repair: Callable[[list[Fix]], None]
) -> ReadResult[Any, Any]:
    """The first of the replicas' answers (``futures``, by replica) that has every item; every answer is
    merged in the background and ``repair`` gets the fixes. When none has every item, the merge of all of
    them, its fixes repaired before returning."""
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

    def linger() -> tuple[ReadResult[Any, Any], list[Fix]]:
        while wait(ordered, timeout=POLL).not_done:  # in slices: a Ctrl-C is not held up
            pass
        return merge([f.result() for f in ordered])

    if first is None:  # no replica answered everything: the merge of what they did answer
        result, fixes = linger()
        repair(fixes)
        return result
    shared.linger(lambda: repair(linger()[1]))
    return first


def window(
    fetch: WindowFetch, keys: list[Blob], size: int, clusters: Sequence[Cluster], i: int
) -> ReadResult[Blob, Any]:
    """Replica ``i``'s first ``size`` entries of ``keys``."""
    return fetch(clusters[i], keys, size)


def ask_round(
    replicas: Replicas,
    fn: Callable[[int], ReadResult[Any, Any]],
    keys: list[Blob],
    gone: dict[int, Answer],
    quorum: int,
    late: Callable[[int, Any], None],
) -> list[Answer]:
    """One round of a window read: ``fn(i)`` on every replica ``i`` not ``gone``, returning once ``quorum``
    of them (a read quorum, or all that are asked) answered every key, and ``straggler_wait`` passed.
    Replicas late or busy join ``gone`` (the read does not ask them again) and answer with that failure."""
    asked = [i for i in range(replicas.count) if i not in gone]
    enough = functools.partial(answered_by, keys, min(quorum, len(asked)))
    answered = replicas.each(fn, asked, enough=enough, late=late)
    by_replica = dict(zip(asked, answered, strict=True))
    gone.update((i, a) for i, a in by_replica.items() if isinstance(a, ReplicaLate | ReplicaBusy))
    return [by_replica[i] if i in by_replica else gone[i] for i in range(replicas.count)]
