"""Synthetic at-least-once traffic with a known outcome, for the demo, the tests and the benchmarks.

Several producers publish timeline events (JSON) into journals: committed messages, transactions that
commit, transactions that roll back, and duplicated appends (the exact bytes of an earlier frame appended
again, as a retried append would). :class:`Traffic` accumulates what a correct exactly-once consumer must
end up with: per timeline key, each event's visible score (or its deletion), under the 2P-set rules.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from zcluster.journal.publishing import AsyncPublisher
from zcluster.journal.store import JournalStore
from zcluster.message.framing import CONTENT_TYPE_NDJSON, framing_for
from zcluster.message.journals import JournalSpec
from zcluster.message.mapping import modulo_mapping
from zcluster.message.records import JsonMessage
from zcluster.types import Delete, Incr, Insert

__all__ = ["Traffic", "create_journals", "leaderboard_mapper", "publish", "timeline_mapper"]


def timeline_mapper(message: Any) -> list[Insert | Delete]:
    """The demo's mapper: ``{"user", "event", "ts", "op"}`` -> one write to ``timeline:<user>``."""
    doc = message.doc
    write = Delete if doc["op"] == "remove" else Insert
    return [write(f"timeline:{doc['user']}", float(doc["ts"]), str(doc["event"]))]


def leaderboard_mapper(message: Any) -> list[Insert | Delete | Incr]:
    """:func:`timeline_mapper`, and one point per event for its user on the ``leaderboard`` (exactly once)."""
    return [*timeline_mapper(message), Incr("leaderboard", str(message.doc["user"]), 1)]


@dataclass
class Traffic:
    """What was published, and the state it must produce."""

    journals: list[str]
    committed: int = 0
    rolled_back: int = 0
    duplicates: int = 0
    transactions: int = 0
    best: dict[tuple[str, str], tuple[float, int]] = field(default_factory=dict)
    events: dict[str, int] = field(default_factory=dict)  # committed events per user: the leaderboard

    def apply(self, doc: dict[str, Any]) -> None:
        """Fold a committed message into the model: the highest score wins, a removal winning ties."""
        self.events[str(doc["user"])] = self.events.get(str(doc["user"]), 0) + 1
        key, member = f"timeline:{doc['user']}", str(doc["event"])
        rank = (float(doc["ts"]), 1 if doc["op"] == "remove" else 0)
        held = self.best.get((key, member))
        if held is None or rank > held:
            self.best[(key, member)] = rank

    def leaderboard(self) -> list[tuple[str, float]]:
        """Users by committed events, highest first (ties: user descending), as ``select`` reads them."""
        return sorted(((u, float(n)) for u, n in self.events.items()), key=lambda e: (e[1], e[0]), reverse=True)

    def expected(self) -> dict[str, list[tuple[str, float]]]:
        """Visible members per key, score descending (ties: member descending)."""
        out: dict[str, list[tuple[str, float]]] = {}
        for (key, member), (score, removed) in self.best.items():
            out.setdefault(key, [])
            if not removed:
                out[key].append((member, score))
        for members in out.values():
            members.sort(key=lambda ms: (ms[1], ms[0]), reverse=True)
        return out


def create_journals(store: JournalStore, names: list[str]) -> None:
    """Create ndjson journals labelled ``topic=timelines`` (existing ones are kept)."""
    existing = {s.name for s in store.list("")}
    for name in names:
        if name not in existing:
            store.create(JournalSpec(name, {"content-type": CONTENT_TYPE_NDJSON, "topic": "timelines"}))


def publish(
    store: JournalStore,
    traffic: Traffic,
    *,
    producers: int = 3,
    messages: int = 1000,
    users: int = 50,
    txn_every: int = 7,
    rollback_every: int = 4,
    duplicate_rate: float = 0.03,
    seed: int = 0,
    start_ts: float = 1_700_000_000.0,
) -> Traffic:
    """Publish ``messages`` events per producer into ``traffic.journals``; updates and returns ``traffic``.

    Every ``txn_every``-th step opens a transaction of 2-6 events; every ``rollback_every``-th
    transaction rolls back. About ``duplicate_rate`` of the frames are appended a second time: committed
    ones later on, transactional ones right after the original while the transaction is open (a producer
    that rolled back never re-sends the rolled-back frames, as in Gazette).
    About one event in ten removes an earlier event of the same user at a later timestamp.
    """
    rng = random.Random(seed)
    specs = [JournalSpec(j, {"content-type": CONTENT_TYPE_NDJSON}) for j in traffic.journals]
    mapping = modulo_mapping(lambda m: m.doc["user"], lambda: specs)
    framing = framing_for(CONTENT_TYPE_NDJSON)
    pubs = [AsyncPublisher(store) for _ in range(producers)]
    recent: list[tuple[str, bytes]] = []
    seen: dict[str, list[tuple[str, float]]] = {}

    def event(p: int, n: int) -> dict[str, Any]:
        user = f"u{rng.randrange(users)}"
        ts = start_ts + n + rng.random()
        if seen.get(user) and rng.random() < 0.1:
            victim, at = rng.choice(seen[user])
            return {"user": user, "event": victim, "ts": max(ts, at + 1.0), "op": "remove"}
        name = f"s{seed}-p{p}-e{n}"
        seen.setdefault(user, []).append((name, ts))
        return {"user": user, "event": name, "ts": ts, "op": "add"}

    def duplicate(journal: str, frame: bytes) -> None:
        for pub_ in pubs:
            pub_.barrier()  # the original is in the journal before its copy
        store.append(journal, frame)  # a retried append: the same bytes, the same UUID
        traffic.duplicates += 1

    try:
        for n in range(messages):
            for p, pub in enumerate(pubs):
                if n % txn_every == p % txn_every:
                    traffic.transactions += 1
                    docs = [event(p, n * 10 + k) for k in range(rng.randint(2, 6))]
                    frames = []
                    for doc in docs:
                        msg = JsonMessage(dict(doc))
                        pub.publish_uncommitted(mapping, msg)
                        frames.append((mapping(msg)[0], framing.marshal(msg)))
                        if rng.random() < duplicate_rate:
                            duplicate(*frames[-1])  # retried inside the open transaction
                    if traffic.transactions % rollback_every == 0:
                        pub.rollback()
                        traffic.rolled_back += len(docs)
                    else:
                        pub.commit()
                        for doc in docs:
                            traffic.apply(doc)
                        traffic.committed += len(docs)
                        recent.extend(frames)
                else:
                    doc = event(p, n * 10)
                    msg = JsonMessage(dict(doc))
                    pub.publish_committed(mapping, msg)
                    recent.append((mapping(msg)[0], framing.marshal(msg)))
                    traffic.apply(doc)
                    traffic.committed += 1
                if recent and rng.random() < duplicate_rate * producers:
                    # A late copy of a committed message (a retry that landed after later appends).
                    duplicate(*recent[rng.randrange(max(0, len(recent) - 50), len(recent))])
            if len(recent) > 1000:
                del recent[:500]
    finally:
        for pub in pubs:
            pub.close()
    return traffic
