"""How a checkpoint record spells its producer states: one text shared by :class:`zcluster.state.StateStore`'s
records (``v2``, ``v3``) and the fenced ones of :mod:`zcluster.state.txn` (``v4``). It sits below both: ``store``
imports ``txn`` (it hands a ``v4`` checkpoint's restart and skip to it), so ``txn`` imports ``store`` for types
only."""

from __future__ import annotations

from collections.abc import Iterable

from zcluster.message.sequencer import ProducerState

__all__ = ["encode_states"]


def encode_states(states: Iterable[ProducerState]) -> str:
    """Producer states as a checkpoint member holds them (sorted, so one snapshot has one text)."""
    parts = (
        f"{s.producer.hex()}:{s.last_ack}:{s.begin}:{s.last_ack if s.max_clock is None else s.max_clock}"
        for s in states
    )
    return ",".join(sorted(parts))
