"""The Publisher: maps messages to journals, stamps them with UUIDs and appends them, synchronously.

``publish_committed`` writes OUTSIDE_TXN messages, readable by read-committed readers at once.
``publish_uncommitted`` writes CONTINUE_TXN messages of an open transaction; ``build_ack_intents``
then returns one ACK_TXN message per journal written, which commits them once appended, and
``build_rollback_intents`` one that rolls them back. To make the transaction atomic, persist the
intents *before* appending them, and append them again after a crash (appending an ACK twice is
harmless: the second is a duplicate, or an empty rollback).

Stamping is the :class:`zcluster.message.producer.Producer`'s (its module docstring states the rules).
The UUID is assigned while the journal's lock is held, until the frame is appended, so the clocks of one
producer's messages increase in journal order even under concurrent ``publish_committed`` calls.
"""

from __future__ import annotations

from collections.abc import Iterable

from zcluster.message.envelope import Message
from zcluster.message.journals import AppendResult, JournalWriter
from zcluster.message.mapping import MappingFunc
from zcluster.message.producer import AckIntent, Producer, Stamping, route
from zcluster.message.uuid import Clock

__all__ = ["AckIntent", "Publisher", "route"]


class Publisher(Stamping):
    """Publishes messages through a JournalWriter under one ProducerID.

    Without a `clock`, an internal Clock is raised to the wall-clock time on every publish; a
    caller-provided Clock is only ticked, and the caller updates it (cheaper at high rates).
    `producer` is a 6-byte producer id (ValueError otherwise; default: a random one).
    """

    def __init__(self, writer: JournalWriter, clock: Clock | None = None, producer: bytes | None = None) -> None:
        self._writer = writer
        self._producer = Producer(clock, producer)

    def publish_committed(self, mapping: MappingFunc, msg: Message) -> AppendResult:
        """Validate, map, stamp (OUTSIDE_TXN) and append `msg`; return where it landed.

        Raises whatever ``msg.validate()`` raises (before any mapping), EmptyPartitionsError from the
        mapping, UnknownContentTypeError for an unframeable journal, TypeError if the framing cannot
        marshal `msg`, and the writer's errors. Safe for concurrent use.
        """
        producer = self._producer
        producer.update_clock()
        journal, framing = producer.route(mapping, msg)
        with producer.journal_lock(journal):
            producer.stamp_committed(msg, journal)
            return self._writer.append(journal, framing.marshal(msg))

    def publish_uncommitted(self, mapping: MappingFunc, msg: Message) -> AppendResult:
        """Like publish_committed, but as part of the open transaction (CONTINUE_TXN): read-committed
        readers see `msg` only after the ACK of ``build_ack_intents`` is appended. The journal is
        remembered for that ACK. Not safe for concurrent use (a transaction has one writer)."""
        producer = self._producer
        producer.update_clock()
        journal, framing = producer.route(mapping, msg)
        with producer.journal_lock(journal):
            producer.stamp_uncommitted(msg, journal, framing)
            return self._writer.append(journal, framing.marshal(msg))

    def build_ack_intents(self) -> list[AckIntent]:
        """Return one ACK_TXN intent per journal written by publish_uncommitted since the last call,
        and start a new transaction. Each ACK's clock is larger than every message published before."""
        return self._producer.commit_intents()

    def build_rollback_intents(self) -> list[AckIntent]:
        """Return one ACK_TXN intent per journal written by publish_uncommitted since the last call that
        rolls those messages back once appended, and start a new transaction. Each ACK carries the
        producer's previous ACK clock in its journal (its last committed message or commit ACK there, or
        the clock just below the transaction's first message there), so read-committed readers drop the
        transaction's messages. Persist and append them as ``build_ack_intents``' intents. The producer id
        is retired: later messages carry a fresh one (the Producer's module docstring says why)."""
        return self._producer.rollback_intents()

    def append_ack_intents(self, intents: Iterable[AckIntent]) -> list[AppendResult]:
        """Append each intent to its journal (after the caller has persisted them)."""
        out = []
        for journal, data in intents:
            with self._producer.journal_lock(journal):
                out.append(self._writer.append(journal, data))
        return out
