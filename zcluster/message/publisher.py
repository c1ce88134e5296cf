"""The Publisher: maps messages to journals, stamps them with UUIDs and appends them.

``publish_committed`` writes OUTSIDE_TXN messages, readable by read-committed readers at once.
``publish_uncommitted`` writes CONTINUE_TXN messages of an open transaction; ``build_ack_intents``
then returns one ACK_TXN message per journal written, which commits them once appended. To make the
transaction atomic, persist the intents *before* appending them, and append them again after a
crash (appending an ACK twice is harmless: the second is a duplicate).

The UUID is assigned while the journal's append lock is held, so the clocks of one producer's
messages increase in journal order even under concurrent ``publish_committed`` calls.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from typing import Any, NamedTuple

from zcluster.message.framing import Framing, framing_for
from zcluster.message.journals import AppendResult, JournalWriter
from zcluster.message.mapping import MappingFunc
from zcluster.message.uuid import Clock, Flags, ProducerID, build_uuid, new_producer_id

__all__ = ["AckIntent", "Publisher", "route"]


class AckIntent(NamedTuple):
    """A framed ACK_TXN message and the journal it acknowledges pending messages of."""

    journal: str
    intent: bytes


def route(mapping: MappingFunc, msg: Any) -> tuple[str, Framing]:
    """Validate ``msg`` (if it has ``validate()``), map it to a journal, and find that journal's framing."""
    validate = getattr(msg, "validate", None)
    if validate is not None:
        validate()
    journal, content_type = mapping(msg)
    return journal, framing_for(content_type)


class Publisher:
    """Publishes messages through a JournalWriter under one ProducerID.

    Without a `clock`, an internal Clock is raised to the wall-clock time on every publish; a
    caller-provided Clock is only ticked, and the caller updates it (cheaper at high rates).
    """

    def __init__(self, writer: JournalWriter, clock: Clock | None = None, producer: bytes | None = None) -> None:
        self._writer = writer
        self._auto_update = clock is None
        self._clock = Clock() if clock is None else clock
        if producer is not None and len(producer) != 6:
            raise ValueError("a producer id is 6 bytes")
        self._producer = ProducerID(producer) if producer is not None else new_producer_id()
        self._locks: dict[str, threading.Lock] = {}
        self._locks_lock = threading.Lock()
        self._intents: dict[str, tuple[Any, Framing]] = {}

    @property
    def producer(self) -> ProducerID:
        return self._producer

    @property
    def clock(self) -> Clock:
        return self._clock

    def publish_committed(self, mapping: MappingFunc, msg: Any) -> AppendResult:
        """Validate, map, stamp (OUTSIDE_TXN) and append `msg`; return where it landed.

        Raises whatever ``msg.validate()`` raises (before any mapping), EmptyPartitionsError from the
        mapping, UnknownContentTypeError for an unframeable journal, TypeError if the framing cannot
        marshal `msg`, and the writer's errors. Safe for concurrent use.
        """
        return self._publish(mapping, msg, Flags.OUTSIDE_TXN)[1]

    def publish_uncommitted(self, mapping: MappingFunc, msg: Any) -> AppendResult:
        """Like publish_committed, but as part of the open transaction (CONTINUE_TXN): read-committed
        readers see `msg` only after the ACK of ``build_ack_intents`` is appended. The journal is
        remembered for that ACK. Not safe for concurrent use (a transaction has one writer)."""
        journal, result, framing = self._publish(mapping, msg, Flags.CONTINUE_TXN)
        if journal not in self._intents:
            self._intents[journal] = (msg.new_acknowledgement(journal), framing)
        return result

    def build_ack_intents(self) -> list[AckIntent]:
        """Return one ACK_TXN intent per journal written by publish_uncommitted since the last call,
        and start a new transaction. Each ACK's clock is larger than every message published before."""
        out: list[AckIntent] = []
        for journal, (ack, framing) in self._intents.items():
            ack.set_uuid(build_uuid(self._producer, self._clock.tick(), Flags.ACK_TXN))
            out.append(AckIntent(journal, framing.marshal(ack)))
        self._intents.clear()
        return out

    def append_ack_intents(self, intents: Iterable[AckIntent]) -> list[AppendResult]:
        """Append each intent to its journal (after the caller has persisted them)."""
        return [self._writer.append(journal, data) for journal, data in intents]

    def _publish(self, mapping: MappingFunc, msg: Any, flags: int) -> tuple[str, AppendResult, Framing]:
        if self._auto_update:
            self._clock.update(time.time_ns())
        journal, framing = route(mapping, msg)
        with self._lock_of(journal):
            msg.set_uuid(build_uuid(self._producer, self._clock.tick(), flags))
            return journal, self._writer.append(journal, framing.marshal(msg)), framing

    def _lock_of(self, journal: str) -> threading.Lock:
        lock = self._locks.get(journal)
        if lock is None:
            with self._locks_lock:
                lock = self._locks.setdefault(journal, threading.Lock())
        return lock
