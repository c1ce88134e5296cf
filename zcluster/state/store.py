"""Sequencer checkpoints and batch progress of one application, in the cluster.

Layout (namespace prefix ``zcstate:``, one logical set each):

* ``<app>/journal/<journal>``: the journal's checkpoint. One record per producer state, member
  ``<producer hex>|<last ack clock>|<begin offset>``, score = the largest clock the state covers (as
  :func:`clock_to_score`, exact for 64-bit clocks), plus the member ``~offset`` scored with the byte offset
  the states are valid at. A producer's current state is its highest-scored record; superseded records
  are deleted after each save.
* ``<app>/progress``: member = query id, score = the last committed batch id.

A checkpoint is saved with one write of one logical key, through a view whose ``batch_size`` exceeds the
records a checkpoint can hold: :class:`zcluster.Cluster` applies a key's tuples of one call, up to
``batch_size``, with one script call, so its offset and states change together or not at all. Every record only moves
forward: a write carrying an older clock, offset or batch id is stale for the 2P-set script, so a zombie
or a replayed batch cannot roll any of it back.

Durability: ``StateStore(..., durability=Durability(replicas=1))`` makes every write of the store
(checkpoint saves, the deletion of superseded records, batch commits) wait for Redis's own confirmation
(``WAIT`` / ``WAITAOF``, see :class:`zcluster.Durability`) through its view, whatever the cluster's own
writes do; not given, the store waits as its cluster does. A save not confirmed in time raises
:class:`zcluster.PartialWriteError` carrying a :class:`zcluster.DurabilityError`: the checkpoint was
written on the master but may be lost with it, and saving it again is safe.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from zcluster.errors import ConfigError
from zcluster.farm.config import Store
from zcluster.message.sequencer import ProducerState
from zcluster.message.uuid import ProducerID
from zcluster.state.clocks import clock_to_score, score_to_clock
from zcluster.types import Durability, KeyMember, KeyScoreMember

_ALL = 1_000_000  # select limit and batch size meaning "every record": producers per journal are few
_OFFSET = "~offset"


class JournalCheckpoint(NamedTuple):
    """Producer states of one journal, valid after reading it through byte ``offset`` (0: nothing read)."""

    offset: int
    states: list[ProducerState]


def _member(state: ProducerState) -> str:
    return f"{state.producer.hex()}|{state.last_ack}|{state.begin}"


def _parse(journal: str, member: str, score: float) -> ProducerState:
    producer, last_ack, begin = member.split("|")
    return ProducerState(journal, ProducerID(bytes.fromhex(producer)), int(last_ack), int(begin), score_to_clock(score))


def _rank(state: ProducerState) -> tuple[int, int, bool]:
    # Same max clock, different records: the later one has the larger last ACK, or closed its span.
    return (state.max_clock or state.last_ack, state.last_ack, state.begin < 0)


class StateStore:
    """Exactly-once bookkeeping for application ``app`` (a Spark query name or any consumer id).

    Records live under ``namespace`` on ``cluster``'s servers (a view sharing its connections).
    ``durability``: what the store's writes wait for (see the module); None: as ``cluster``'s writes.
    """

    def __init__(
        self, cluster: Store, app: str, namespace: str = "zcstate:", durability: Durability | None = None
    ) -> None:
        if not app or "/" in app:
            raise ConfigError(f"app id must be non-empty and without '/', got {app!r}")
        self.app = app
        # One call per save, never split: a journal's checkpoint changes atomically (see the module).
        self.cluster = cluster.view(namespace, floors=True, batch_size=_ALL, durability=durability)

    def _journal_key(self, journal: str) -> str:
        return f"{self.app}/journal/{journal}"

    # -- journal checkpoints -------------------------------------------------------------------------------

    def load_journal(self, journal: str) -> JournalCheckpoint:
        """The stored checkpoint of ``journal`` (offset 0 and no states if none), read in one snapshot."""
        key = self._journal_key(journal)
        offset, states = self._split(journal, self.cluster.select([key], limit=_ALL)[key])
        return JournalCheckpoint(offset, list(states.values()))

    @staticmethod
    def _split(journal: str, records: Sequence[KeyScoreMember]) -> tuple[int, dict[bytes, ProducerState]]:
        offset = 0
        best: dict[bytes, ProducerState] = {}
        for r in records:
            if r.member == _OFFSET:
                offset = int(r.score)
                continue
            state = _parse(journal, str(r.member), r.score)
            held = best.get(state.producer)
            if held is None or _rank(state) > _rank(held):
                best[state.producer] = state
        return offset, best

    def save_journal(self, journal: str, offset: int, states: Iterable[ProducerState]) -> bool:
        """Store ``journal``'s checkpoint at ``offset`` atomically; returns whether the offset advanced.

        States older than the stored ones (smaller max clock) and an offset below the stored one change
        nothing. Afterwards the superseded records are deleted (at their own scores, so a zombie re-sending
        one finds it stale).
        """
        key = self._journal_key(journal)
        tuples = [KeyScoreMember(key, clock_to_score(_rank(s)[0]), _member(s)) for s in states]
        tuples.append(KeyScoreMember(key, float(offset), _OFFSET))
        advanced = self.cluster.insert(tuples).applied[-1]
        records = self.cluster.select([key], limit=_ALL)[key]
        current = {_member(s) for s in self._split(journal, records)[1].values()}
        stale = [r for r in records if r.member != _OFFSET and r.member not in current]
        if stale:
            self.cluster.delete(stale)
        return advanced

    def prune_producers(self, journal: str, older_than_clock: int) -> int:
        """Forget producers of ``journal`` whose newest state covers only clocks <= ``older_than_clock``.

        Like the Sequencer's checkpoint pruning: their later duplicates would be delivered again, and a
        zombie can no longer write states that old. Returns the records removed. The offset record stays:
        clock scores are tiny doubles (below 1.0 until the year 2490), offsets are whole numbers >= 1.
        """
        return self.cluster.forget([self._journal_key(journal)], clock_to_score(older_than_clock))

    # -- progress --------------------------------------------------------------------------------------------

    def committed_batch(self, query_id: str) -> int | None:
        """The last batch id committed for ``query_id``, or None."""
        p = self.cluster.score([KeyMember(f"{self.app}/progress", query_id)])[
            KeyMember(f"{self.app}/progress", query_id)
        ]
        return int(p.score) if p.present and p.inserted and not math.isnan(p.score) else None

    def commit_batch(self, query_id: str, batch_id: int) -> bool:
        """Record batch ``batch_id`` of ``query_id`` as committed; False if it (or a later one) already was."""
        return self.cluster.insert([KeyScoreMember(f"{self.app}/progress", float(batch_id), query_id)]).applied[0]
