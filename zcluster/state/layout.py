"""How a checkpoint record spells its producer states: one text shared by :class:`zcluster.state.StateStore`'s
records (``v2``, ``v3``) and the fenced ones of :mod:`zcluster.state.txn` (``v4``). It sits below both: ``store``
imports ``txn`` (it hands a ``v4`` checkpoint's restart and skip to it), so ``txn`` imports ``store`` for types
only.

Compiled with the hot path (zcluster._native): an applier saves and loads every producer state of a journal at
each batch, and a journal read by short-lived producers (a Spark sink makes one per task) holds thousands.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from operator import itemgetter
from typing import Any, Final, cast

from zcluster.message.sequencer import ProducerState
from zcluster.message.uuid import ProducerID

__all__ = ["decode_record", "decode_states", "encode_states", "encoded_states"]


def _text(s: ProducerState) -> str:
    # Its fields as objects: compiled (zcluster._native), a field read by name is checked against its annotation,
    # and a state made elsewhere may hold a bytearray producer (or a bool clock) that plain Python formats.
    fields: tuple[object, ...] = s
    producer, last_ack, max_clock = fields[1], fields[2], fields[4]
    hexed = producer.hex() if isinstance(producer, bytes) else bytes(cast(Any, producer)).hex()
    return f"{hexed}:{last_ack}:{fields[3]}:{last_ack if max_clock is None else max_clock}"


def _fastest_text() -> Callable[[object], str | None]:
    """As uuid.bytes16: the C twin (zcluster.state._statetext, None for what it does not spell) when the compiled
    build is in use, else the reference, _text."""
    try:
        from zcluster.state._statetext import state_text
    except ImportError:
        return cast(Callable[[object], str | None], _text)
    return state_text


_STATE_TEXT: Final = _fastest_text()  # Final: compiled, a C static


def _spelled(s: ProducerState) -> str:
    """``_text(s)``, by the C twin where it can."""
    text = _STATE_TEXT(s)
    return _text(s) if text is None else text


_first: Final = itemgetter(0)


def _as_state(s: object) -> ProducerState:
    """``s`` as a ProducerState: itself, or another object with the fields' names read by name (as before this
    was compiled; its items are objects here, where an item typed a ProducerState is checked as a tuple)."""
    if type(s) is ProducerState:
        return s
    named: Any = s
    return ProducerState(named.journal, named.producer, named.last_ack, named.begin, named.max_clock)


def encode_states(states: Iterable[ProducerState]) -> str:
    """Producer states as a checkpoint member holds them (sorted, so one snapshot has one text)."""
    items: Iterable[object] = states  # objects: see _as_state
    return ",".join(sorted([_spelled(_as_state(s)) for s in items]))


def encoded_states(journal: str, states: Iterable[ProducerState]) -> tuple[str, list[ProducerState] | None]:
    """``encode_states(states)``, and what ``decode_states(journal, text)`` returns for it, made without
    parsing the text (None when that is not known without parsing: a state of another journal, or a field
    of another type than a decode makes)."""
    spelled: list[tuple[str, ProducerState]] = []  # sorted by text (equal texts are equal states, below)
    known = True
    items: Iterable[object] = states  # objects: see _as_state
    for item in items:
        s = _as_state(item)
        text = _spelled(s)
        fields: tuple[object, ...] = s  # as _text reads them (a bool clock must not pass for an int)
        producer, last_ack, begin, max_clock = fields[1], fields[2], fields[3], fields[4]
        if max_clock is None:
            max_clock = last_ack
        if not (type(last_ack) is int and type(begin) is int and type(max_clock) is int and fields[0] == journal):
            known = False
        elif type(producer) is not bytes or fields[4] is None:  # a decode makes bytes (ProducerID is a NewType)
            s = ProducerState(journal, ProducerID(bytes(cast(Any, producer))), s.last_ack, s.begin, max_clock)
        spelled.append((text, s))
    spelled.sort(key=_first)
    return ",".join([t for t, _ in spelled]), [s for _, s in spelled] if known else None


def decode_states(journal: str, text: str) -> list[ProducerState]:
    """The producer states of ``journal`` spelled by ``text`` (ValueError if it does not parse)."""
    states: list[ProducerState] = []
    if not text:
        return states
    for part in text.split(","):
        fields = part.split(":")
        if len(fields) != 4:
            raise ValueError(f"producer state {part!r} has {len(fields)} fields, not 4")
        producer = cast(ProducerID, bytes.fromhex(fields[0]))  # a NewType's call is a Python call once compiled
        states.append(ProducerState(journal, producer, int(fields[1]), int(fields[2]), int(fields[3])))
    return states


def decode_record(journal: str, member: str) -> tuple[str, int, int, float | None, list[ProducerState]]:
    """A ``v2``, ``v3`` or ``v4`` checkpoint record's journal identity, base, offset, time saved (None for ``v2``)
    and producer states (ValueError if it does not parse; ``v4``'s further fields are zcluster.state.txn's)."""
    fields = member.split("|")
    saved_at = None
    if fields[0] in ("v3", "v4"):
        _, journal_id, base, offset, millis, producers = fields[:6] if fields[0] == "v4" else fields
        saved_at = int(millis) / 1000
    else:
        _, journal_id, base, offset, producers = fields
    return journal_id, int(base), int(offset), saved_at, decode_states(journal, producers)
