"""The Producer: what stamping message UUIDs needs, shared by every publisher.

A :class:`Producer` holds one producer's identity and clock and the state its transactions need: the
last ACK clock it gave each journal, and the journals of the open transaction with their ACK messages.
The publishers are built on it: the synchronous :class:`zcluster.message.Publisher`, the asynchronous
``AsyncPublisher`` of :mod:`zcluster.journal.publishing` and ``Channels.produce``/``broadcast`` of
:mod:`zcluster.channels`; they only decide when frames are appended.

The rules that make exactly-once reading work (the Sequencer's side is in :mod:`.sequencer`):

* Clocks increase: every stamp ticks the clock, so each UUID's clock is larger than every earlier one.
  An internal clock (none given) is first raised to wall time by :meth:`Producer.update_clock`; a
  caller's clock is only ticked (the caller updates it).
* Clocks increase in journal order: a publisher holds :meth:`Producer.journal_lock` (or
  :meth:`Producer.hold`) of a journal from stamping a message until its frame is appended (or queued, in
  an order the appends keep), so concurrent publishes never land out of clock order. A Sequencer drops a
  committed message whose clock is not above the last one it saw.
* A committed (OUTSIDE_TXN) message acknowledges itself: it becomes its journal's last ACK clock.
* A commit ACK (ACK_TXN) gets a fresh clock, larger than every message stamped before it; it becomes
  the journal's last ACK clock.
* A rollback ACK carries the producer's previous ACK clock in that journal: its last committed message
  or commit ACK there, or, if it has none, the clock just below the transaction's first message there
  (where a Sequencer that first meets this producer puts its last ACK). An ACK at the last ACK's clock
  rolls the open span back. A lower clock would read as a reset (an ACK below the last ACK: the
  Sequencer rolls back but logs the loss of exactly-once), and a higher one would commit span messages.
* A rollback retires the producer id: the rollback ACKs carry the old id, and everything stamped after
  them carries a fresh random one (as Gazette, whose abandoned transaction's producer never publishes
  again). A copy of a rolled-back message appended after the rollback ACK (a retried or re-routed append)
  then opens a span under the retired id that no ACK commits: it is never delivered, by a reader that
  started from any checkpoint. Under the same id the next commit ACK would commit it (its clock is below
  the ACK's, and the journal keeps no record of which clocks the rollback dropped).

A journal joins the open transaction when its first CONTINUE_TXN message is stamped, before that message
is appended: should the append fail after all (or its reply be lost), the ACK still covers the journal.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterable, Iterator
from typing import NamedTuple

from zcluster.message.envelope import Message
from zcluster.message.framing import Framing, framing_for
from zcluster.message.mapping import MappingFunc
from zcluster.message.uuid import Clock, Flags, ProducerID, build_uuid, new_producer_id

__all__ = ["AckIntent", "Producer", "Stamping", "route", "validate"]


class AckIntent(NamedTuple):
    """A framed ACK_TXN message and the journal it acknowledges pending messages of."""

    journal: str
    intent: bytes


def validate(msg: Message) -> None:
    """Call ``msg.validate()`` if it has one (which raises if `msg` must not be published)."""
    check = getattr(msg, "validate", None)
    if check is not None:
        check()


def route(mapping: MappingFunc, msg: Message) -> tuple[str, Framing]:
    """Validate ``msg`` (if it has ``validate()``), map it to a journal, and find that journal's framing.

    Raises whatever ``msg.validate()`` raises (before any mapping), EmptyPartitionsError from the mapping,
    TypeError naming a mapping that returned anything but ``(journal, content_type)`` (a bare journal
    name, say), and UnknownContentTypeError for a journal whose content type has no framing.
    """
    validate(msg)
    routed = mapping(msg)
    if not (isinstance(routed, tuple | list) and len(routed) == 2):
        name = getattr(mapping, "__qualname__", repr(mapping))
        raise TypeError(f"mapping {name} returned {routed!r}: a mapping returns a (journal, content_type) pair")
    journal, content_type = routed
    return journal, framing_for(content_type)


class Producer:
    """One producer's UUID stamping: its id, its Clock, its last ACK per journal, its open transaction.

    `clock`: a caller's Clock, only ticked (the caller keeps it updated); without one, an internal Clock
    raised to wall time by :meth:`update_clock`. `producer`: a 6-byte producer id (ValueError otherwise);
    without one, a random id. A rollback retires the id (a random one follows; see the module docstring).
    Safe for concurrent use; a transaction (``stamp_uncommitted`` and the intents that close it) has one
    writer. Message methods (``set_uuid``, ``new_acknowledgement``) are called under the producer's lock:
    they must not call back into it.
    """

    def __init__(self, clock: Clock | None = None, producer: bytes | None = None) -> None:
        if producer is not None and len(producer) != 6:
            raise ValueError("a producer id is 6 bytes")
        self._id = ProducerID(bytes(producer)) if producer is not None else new_producer_id()
        self._auto_update = clock is None
        self._clock = Clock() if clock is None else clock
        self._lock = threading.Lock()
        self._last_ack: dict[str, int] = {}
        self._txn: dict[str, tuple[Message, Framing]] = {}  # journal -> (its ACK message, its framing)
        self._journal_locks: dict[str, threading.Lock] = {}

    @property
    def id(self) -> ProducerID:
        """The 6-byte producer id the next UUID carries (a rollback replaces it with a fresh one)."""
        with self._lock:
            return self._id

    @property
    def clock(self) -> Clock:
        return self._clock

    def update_clock(self) -> None:
        """Raise an internal clock to wall time (a no-op for a caller's clock); call once per publish call."""
        if self._auto_update:
            self._clock.update(time.time_ns())

    def route(self, mapping: MappingFunc, msg: Message) -> tuple[str, Framing]:
        """:func:`route`: validate `msg`, map it to a journal, find that journal's framing."""
        return route(mapping, msg)

    # -- ordering --------------------------------------------------------------------------------------

    def journal_lock(self, journal: str) -> threading.Lock:
        """The lock to hold from stamping a message of `journal` until its frame is appended."""
        lock = self._journal_locks.get(journal)
        if lock is None:
            with self._lock:
                lock = self._journal_locks.setdefault(journal, threading.Lock())
        return lock

    @contextlib.contextmanager
    def hold(self, journals: Iterable[str]) -> Iterator[None]:
        """Hold the :meth:`journal_lock` of every journal of `journals` (taken in name order, so two holders
        never deadlock)."""
        with contextlib.ExitStack() as stack:
            for journal in sorted(set(journals)):
                stack.enter_context(self.journal_lock(journal))
            yield

    # -- stamping --------------------------------------------------------------------------------------

    def stamp_committed(self, msg: Message, *journals: str) -> int:
        """Give `msg` an OUTSIDE_TXN UUID with a fresh clock, which becomes the last ACK clock of each of
        `journals` (where `msg` is appended: usually one, every channel of a broadcast). Returns the clock."""
        with self._lock:
            clock = self._clock.tick()
            msg.set_uuid(build_uuid(self._id, clock, Flags.OUTSIDE_TXN))
            for journal in journals:
                self._last_ack[journal] = clock
        return clock

    def stamp_uncommitted(self, msg: Message, journal: str, framing: Framing) -> int:
        """Give `msg` a CONTINUE_TXN UUID with a fresh clock, as part of the open transaction, which
        `journal` joins (with ``msg.new_acknowledgement(journal)`` as its ACK, framed by `framing`) if
        this is its first message there. Returns the clock."""
        with self._lock:
            clock = self._clock.tick()
            msg.set_uuid(build_uuid(self._id, clock, Flags.CONTINUE_TXN))
            if journal not in self._txn:
                self._txn[journal] = (msg.new_acknowledgement(journal), framing)
                # No earlier ACK here: a rollback ACKs just below the span, where a sequencer that first meets
                # this producer puts its last ACK (below every clock would read as a reset).
                self._last_ack.setdefault(journal, clock - 1)
        return clock

    # -- closing the transaction ------------------------------------------------------------------------

    @property
    def transaction(self) -> list[str]:
        """The journals of the open transaction, in the order they joined it."""
        with self._lock:
            return list(self._txn)

    def last_ack(self, journal: str) -> int | None:
        """This producer's last ACK clock in `journal` (None if it never acknowledged anything there)."""
        with self._lock:
            return self._last_ack.get(journal)

    def commit_intents(self) -> list[AckIntent]:
        """One ACK_TXN per journal of the open transaction, each with a fresh clock (larger than every
        message stamped before), committing it once appended; a new transaction begins."""
        return self._close(rollback=False)

    def rollback_intents(self) -> list[AckIntent]:
        """One ACK_TXN per journal of the open transaction, at the producer's previous ACK clock there
        (see the module docstring), rolling it back once appended; a new transaction begins, under a fresh
        producer id (the old one is retired) if the transaction had any message."""
        return self._close(rollback=True)

    def _close(self, rollback: bool) -> list[AckIntent]:
        with self._lock:
            closing: list[tuple[str, int, bytes]] = []
            for journal, (ack, framing) in self._txn.items():
                clock = self._last_ack[journal] if rollback else self._clock.tick()
                ack.set_uuid(build_uuid(self._id, clock, Flags.ACK_TXN))
                closing.append((journal, clock, framing.marshal(ack)))
            # Only once every ACK is framed: the transaction ends, and commits become the last ACKs.
            self._txn.clear()
            if not rollback:
                self._last_ack.update((journal, clock) for journal, clock, _ in closing)
            elif closing:
                # The rolled-back id is retired: a late copy of one of its messages (a retried append landing
                # after the rollback ACK) opens a span under it that no ACK ever commits. Under the same id,
                # the next transaction's ACK would commit that copy; no journal records which clocks a
                # rollback dropped, so a reader (from any checkpoint) could not tell it apart.
                self._id = new_producer_id()
                self._last_ack.clear()
        return [AckIntent(journal, data) for journal, _, data in closing]


class Stamping:
    """What every publisher shows of its :class:`Producer` (kept in ``_producer``): its id and its Clock."""

    _producer: Producer

    @property
    def producer(self) -> ProducerID:
        """The 6-byte producer id the UUIDs this publisher stamps next carry; a rollback retires it and
        the publisher continues under a fresh random one."""
        return self._producer.id

    @property
    def clock(self) -> Clock:
        """The producer's Clock (the caller's, if one was given)."""
        return self._producer.clock
