"""Sequencer producer states, journal offsets and batch progress of one application, in the cluster.

Layout (namespace prefix ``zcstate:``, one logical set each):

* ``<app>/producers/<journal>``: one record per state of a producer, member ``<producer hex>|<last ack
  clock>|<begin offset>``, score = the largest clock the state covers (as :func:`clock_to_score`). The
  current state of a producer is its highest-scored record; older records are deleted after each save.
* ``<app>/offsets``: member = journal, score = read-through byte offset.
* ``<app>/progress``: member = query id, score = the last committed batch id.

Every record only moves forward: a write carrying an older clock, offset or batch id is stale for the
2P-set script, so a zombie or a replayed batch cannot roll any of it back.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

from zcluster.cluster import Cluster
from zcluster.message.sequencer import ProducerState
from zcluster.message.uuid import ProducerID
from zcluster.state.clocks import clock_to_score, score_to_clock
from zcluster.types import KeyMember, KeyScoreMember

_ALL = 1_000_000  # select limit meaning "every record": producers per journal are few


def _member(state: ProducerState) -> str:
    return f"{state.producer.hex()}|{state.last_ack}|{state.begin}"


def _parse(journal: str, member: str, score: float) -> ProducerState:
    producer, last_ack, begin = member.split("|")
    return ProducerState(journal, ProducerID(bytes.fromhex(producer)), int(last_ack), int(begin), score_to_clock(score))


def _rank(state: ProducerState) -> tuple[int, int, bool]:
    # Same max clock, different records: the later one has the larger last ACK, or closed its span.
    return (state.max_clock or state.last_ack, state.last_ack, state.begin < 0)


class StateStore:
    """Exactly-once bookkeeping for application ``app`` (a Spark query name or any consumer id)."""

    def __init__(self, cluster: Cluster, app: str, namespace: str = "zcstate:") -> None:
        if not app or "/" in app:
            raise ValueError(f"app id must be non-empty and without '/', got {app!r}")
        self.app = app
        self.cluster = Cluster(cluster.topology, prefix=namespace, floors=True)

    def _producers_key(self, journal: str) -> str:
        return f"{self.app}/producers/{journal}"

    # -- producer states ------------------------------------------------------------------------------------

    def load_producers(self, journals: Iterable[str]) -> list[ProducerState]:
        """The current state of every producer of ``journals``."""
        keys = {self._producers_key(j): j for j in journals}
        if not keys:
            return []
        found = self.cluster.select(list(keys), limit=_ALL)
        out: list[ProducerState] = []
        for key, records in found.items():
            out.extend(self._current(keys[str(key)], records).values())
        return out

    @staticmethod
    def _current(journal: str, records: Sequence[KeyScoreMember]) -> dict[bytes, ProducerState]:
        best: dict[bytes, ProducerState] = {}
        for r in records:
            state = _parse(journal, str(r.member), r.score)
            held = best.get(state.producer)
            if held is None or _rank(state) > _rank(held):
                best[state.producer] = state
        return best

    def save_producers(self, states: Iterable[ProducerState]) -> None:
        """Store producer states; a state older than the stored one (smaller max clock) changes nothing.

        Afterwards the superseded records of these producers are deleted (at their own scores, so a
        zombie re-sending one finds it stale).
        """
        by_journal: dict[str, list[ProducerState]] = {}
        for s in states:
            by_journal.setdefault(s.journal, []).append(s)
        if not by_journal:
            return
        self.cluster.insert(
            [KeyScoreMember(self._producers_key(s.journal), clock_to_score(_rank(s)[0]), _member(s))
             for group in by_journal.values() for s in group]
        )  # fmt: skip
        keys = {self._producers_key(j): j for j in by_journal}
        stale: list[KeyScoreMember] = []
        for key, records in self.cluster.select(list(keys), limit=_ALL).items():
            current = {_member(s) for s in self._current(keys[str(key)], records).values()}
            stale.extend(r for r in records if r.member not in current)
        if stale:
            self.cluster.delete(stale)

    def prune_producers(self, journal: str, older_than_clock: int) -> int:
        """Forget producers of ``journal`` whose newest state covers only clocks <= ``older_than_clock``.

        Like the Sequencer's checkpoint pruning: their later duplicates would be delivered again, and a
        zombie can no longer write states that old. Returns the records removed.
        """
        return self.cluster.forget([self._producers_key(journal)], clock_to_score(older_than_clock))

    # -- offsets ---------------------------------------------------------------------------------------------

    def load_offsets(self) -> dict[str, int]:
        records = self.cluster.select([f"{self.app}/offsets"], limit=_ALL)[f"{self.app}/offsets"]
        return {str(r.member): int(r.score) for r in records}

    def save_offsets(self, offsets: Mapping[str, int]) -> None:
        """Advance read-through offsets; an offset below the stored one changes nothing."""
        if offsets:
            self.cluster.insert([KeyScoreMember(f"{self.app}/offsets", float(o), j) for j, o in offsets.items()])

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
