"""What a :class:`zcluster.message.sequencer.Sequencer` checkpoint is made of (re-exported there): the producer
states and offsets it restores from, and the byte range a transaction asks to replay."""

from __future__ import annotations

from typing import NamedTuple

from zcluster._fasttuples import native_construct
from zcluster.message.uuid import ProducerID

__all__ = ["Checkpoint", "ProducerState", "ReplayRange"]


class ProducerState(NamedTuple):
    """Checkpointed state of one producer in one journal.

    `last_ack`: clock of its last acknowledged message. `begin`: journal offset where its open span
    (not yet fully dequeued) begins, or -1 when it has none. `max_clock`: the largest clock of that
    span read so far; Gazette's ProducerState lacks it (None, as when restoring a Gazette
    checkpoint, means `last_ack`). Keeping it lets a restored Sequencer recognise duplicates of
    span messages that were read before the checkpoint.
    """

    journal: str
    producer: ProducerID
    last_ack: int
    begin: int
    max_clock: int | None = None


def _native_constructor() -> None:
    construct = native_construct()  # made in C at checkpoints, thousands at a time (see zcluster._fasttuples)
    if construct is not None:
        construct(ProducerState)


_native_constructor()


class Checkpoint(NamedTuple):
    """Offsets to resume reading each journal from, and the producer states to restore."""

    offsets: dict[str, int]
    states: list[ProducerState]


class ReplayRange(NamedTuple):
    """Read [begin, end) of `journal` again and pass the envelopes to ``start_replay``."""

    journal: str
    begin: int
    end: int
