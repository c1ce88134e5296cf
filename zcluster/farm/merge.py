"""The 2P-set's merge across replicas: which record of a member wins, and what each replica lacks.

A record is a member's newest write on one replica: an insert or a delete at a score. Across replicas the
winner is the record with the highest score; at equal scores a delete beats an insert (the same rule the
write script applies on one server, so a repaired replica ends where the others are). There is no bias
toward adds: a delete applied on one replica only wins the merge, and is repaired onto the others.
"""

from __future__ import annotations

from collections.abc import Sequence

from zcluster.types import Blob, Delete, Insert, Presence, Write, to_bytes


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
