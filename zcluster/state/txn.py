"""Fenced checkpoints of publishing applications: Gazette's ACK intents, saved with the checkpoint.

Why this module is long: the protocol (claim, fenced save, an operator's take-over, the applier's publishing
side) is one argument, kept in one place so that it can be checked as a whole.

A mapper that returns :class:`zcluster.Publish` makes its application a *publishing* one: each journal's
batch is a consumer transaction that publishes uncommitted (CONTINUE_TXN) messages downstream. Its
checkpoint holds, beside the offset and the producer states, the *ACK intents* that commit those messages;
the intents are appended only after the checkpoint is saved, and on every start the last checkpoint's
intents are appended again (delivering ACKs a crash lost; rolling back the open span of the producer that
saved them, which an abandoned attempt of that process left, since a re-appended ACK carries that producer's
last ACK clock).

Producer identity: each *claim* of a journal (a process taking it over: a :class:`zcluster.state.Consumer`'s
first poll of it, or its first poll after a failure with a transaction in flight) makes a new random producer
id, recorded in the checkpoint with its clock. A zombie and its replacement never share a producer id, so the
zombie's late messages can never join a span its replacement's ACK commits; the clock continues from the
checkpoint's. A failure with nothing in flight (a stop at a lost range, a journal mismatch) keeps the claim,
checked against the stored checkpoint on the next poll, so a stopped process polling again neither claims nor
appends the last intents downstream on every poll, and still notices an operator's take-over.

A :class:`zcluster.spark.PositionedSink` checkpoints each (topic, partition) of its source the same way,
under the name :func:`partition_checkpoint` gives it: its offset is one past the last row applied (the
source's own offsets), with no producer states (rows carry no UUIDs).

Fencing: a journal's records (the same key as :class:`zcluster.state.StateStore`'s, layout ``v4``) are
scored by (generation, save number): ``2**60 + ((gen << 16 | seq) << 8)``, exact doubles above every
position of the older layouts. A claim saves at most ``SAVES`` (65,536) times: after that save the claim is
given up and the next batch claims again (a new generation, the intents appended again: harmless), so a
long-lived consumer never runs out of save numbers, and 2**36 generations outlast any run (a Spark sink
claims once per journal per task: at 100 batches a second, for over 20 years).
A claim reads the newest record and inserts a copy of it one generation up,
then reads again: if a save of the older generation landed meanwhile, it copies that one instead, until the
newest record below its claim is the one it copied; then it forgets everything below (raising the key's
floor, so an older generation's late save is refused by the server). A save inserts the next record of its
own generation and then reads the newest record back: only if that is its own is the save final and its
intents appended; otherwise a newer claim exists (:class:`zcluster.FencedError`). Every save that lands
before a claim's last read is adopted by the claim (and its intents appended by the claimer); every save that
lands after it reads the claim back and is never appended. So each checkpoint follows exactly one earlier
one, and only checkpoints that are followed have their intents appended. This needs reads that see every
write acknowledged before them (one master per key: a :class:`zcluster.Cluster`). A farm of replicas is refused
(:func:`check_store`): its reads answer from the replicas that answered, one when the others are down, so a
zombie's save landing on replicas that missed a newer claim (and its floor) could read itself back as newest
while the claim never saw it, and both the zombie's intents and the claimer's redo of the same input commit.

Operators: :meth:`zcluster.state.StateStore.restart_journal` and :meth:`~zcluster.state.StateStore.skip_lost` on a
``v4`` checkpoint go through :meth:`TxnStore.take_over`: a claim (so a running applier of the journal is fenced
as by any newer claim), the claimed checkpoint's intents appended, then one fenced save of the moved checkpoint.

Compatibility: the first claim copies a ``v2``/``v3`` (or older) checkpoint into a ``v4`` one; readers of
``v3`` read the fields they know of ``v4`` (the monitor, :meth:`StateStore.load_journal`). Saving a ``v3``
checkpoint over a ``v4`` one is refused (:class:`zcluster.ConfigError`): a non-publishing run of a publishing
application would lose the fence.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, NamedTuple

from zcluster._retry import retrying
from zcluster.errors import ConfigError, FencedError, MapperError, PartialWriteError
from zcluster.journal.store import CONTENT_TYPE_LABEL, JournalStore
from zcluster.message.envelope import Envelope
from zcluster.message.framing import Framing, framing_for
from zcluster.message.producer import AckIntent, Producer
from zcluster.message.sequencer import ProducerState
from zcluster.message.uuid import Clock, new_producer_id
from zcluster.state.layout import encode_states
from zcluster.types import KeyScoreMember, Publish, Store

if TYPE_CHECKING:
    from zcluster.state.store import StateStore

__all__ = ["Claim", "Publishing", "TxnCheckpoint", "TxnStore", "append_intents", "check_store", "partition_checkpoint"]

log = logging.getLogger("zcluster.state")

V4 = "v4|"
_SEQ_BITS = 16  # of the save number; the generation has the other 36 of a double's 52 exact ones
SAVES = 1 << _SEQ_BITS
"""Saves per claim (its save numbers); past the last one the claim is given up and made anew."""
GENERATIONS = 1 << 36
QUEUED = 4096  # messages a transaction queues before appending them
_TOP = 2.0**60  # every v4 score is at or above it; positions of the older layouts are far below


PARTITION_MARK = "~"
"""What begins the checkpoint name of a positioned source's partition (:func:`partition_checkpoint`)."""


def partition_checkpoint(topic: str, partition: object) -> str:
    """The name a publishing :class:`zcluster.spark.PositionedSink` checkpoints a (``topic``, ``partition``)
    under, as a journal of its application: ``~<topic>/<partition>``. No journal name begins with ``~`` (a
    segment begins with a letter or digit: :func:`zcluster.journal.store.validate_journal_name`), so it never
    names the checkpoint of a journal a ``Consumer`` or ``ZClusterSink`` of the same application reads."""
    return f"{PARTITION_MARK}{topic}/{partition}"


def score(gen: int, seq: int) -> float:
    """The score of save ``seq`` of generation ``gen``: ordered by (gen, seq), exact (doubles in [2**60, 2**61)
    are 256 apart)."""
    if not (0 <= gen < GENERATIONS and 0 <= seq < SAVES):
        raise ConfigError(
            f"checkpoint generation {gen} (< {GENERATIONS}) or save number {seq} (< {SAVES}) out of range"
        )
    return _TOP + float(((gen << _SEQ_BITS) | seq) << 8)


def _unscore(value: float) -> tuple[int, int]:
    k = int(value - _TOP) >> 8
    return k >> _SEQ_BITS, k & (SAVES - 1)


class TxnCheckpoint(NamedTuple):
    """A publishing application's checkpoint of one journal: the offset read through and the producer states
    (as :class:`zcluster.state.JournalCheckpoint`), the generation ``gen`` and save number ``seq`` that rank it,
    the ``owner`` producer id that published the transaction it closes and that producer's ``clock``, and the
    ``intents`` that commit that transaction's messages (appended after the save, and again on every claim)."""

    offset: int
    states: list[ProducerState]
    journal_id: str
    base: int
    gen: int
    seq: int
    owner: bytes
    clock: int
    intents: list[AckIntent]
    saved_at: float | None = None

    def body(self) -> str:
        """What a claim copies: everything but the ranking, the owner and the time."""
        fields = (self.journal_id, self.base, self.offset, encode_states(self.states), self.clock)
        return "|".join(map(str, (*fields, _encode_intents(self.intents))))


def _encode_intents(intents: list[AckIntent]) -> str:
    doc = [[i.journal, base64.b64encode(i.intent).decode()] for i in intents]
    return base64.b64encode(json.dumps(doc).encode()).decode() if doc else ""


def _encode(cp: TxnCheckpoint, saved_at: float) -> str:
    return (
        f"v4|{cp.journal_id}|{cp.base}|{cp.offset}|{round(saved_at * 1000)}|{encode_states(cp.states)}|{cp.gen}|"
        f"{cp.seq}|{cp.owner.hex()}|{cp.clock}|{_encode_intents(cp.intents)}"
    )


def decode_v4(fields: list[str]) -> tuple[int, int, bytes, int, list[AckIntent]]:
    """(gen, seq, owner, clock, intents) from the fields of a v4 member past the v3 ones (ValueError if bad)."""
    gen, seq, owner, clock, intents = fields
    held = json.loads(base64.b64decode(intents)) if intents else []
    return (
        int(gen),
        int(seq),
        bytes.fromhex(owner),
        int(clock),
        [AckIntent(str(j), base64.b64decode(data)) for j, data in held],
    )


class TxnStore:
    """Claims and fenced saves of one publishing application's journal checkpoints (see the module), over a
    :class:`zcluster.state.StateStore` (its view, its keys, its parsing of the older layouts)."""

    def __init__(self, state: StateStore) -> None:
        check_store(state.cluster, state.app)
        self.state = state

    def _records(self, journal: str) -> list[KeyScoreMember]:
        key = self.state._journal_key(journal)
        return self.state.cluster.select([key], limit=1_000_000)[key]

    def _parse(self, journal: str, record: KeyScoreMember | None) -> TxnCheckpoint:
        """The record as a TxnCheckpoint (a record of an older layout, or none: generation 0, no owner)."""
        records = [] if record is None else [record]
        timed = self.state.timed(journal, records)
        cp = timed.checkpoint
        member = "" if record is None else str(record.member)
        if member.startswith(V4):
            gen, seq, owner, clock, intents = decode_v4(member.split("|")[6:])
            return TxnCheckpoint(
                cp.offset, cp.states, cp.journal_id, cp.base, gen, seq, owner, clock, intents, timed.saved_at
            )
        return TxnCheckpoint(cp.offset, cp.states, cp.journal_id, cp.base, 0, 0, b"", 0, [], timed.saved_at)

    @staticmethod
    def newest(records: list[KeyScoreMember], below: float | None = None) -> KeyScoreMember | None:
        """The newest record (below ``below``): v4 records outrank the older layouts by score; of records of
        the older layouts, the snapshot layouts' top one (as StateStore.timed picks), else all of them."""
        held = [r for r in records if below is None or r.score < below]
        v4 = [r for r in held if str(r.member).startswith(V4)]
        pool = v4 or [r for r in held if str(r.member).startswith(("v2|", "v3|"))]
        return max(pool, key=lambda r: (r.score, str(r.member))) if pool else None

    def load(self, journal: str) -> TxnCheckpoint:
        """The newest checkpoint of ``journal`` (what a claim starts from)."""
        records = self._records(journal)
        newest = self.newest(records)
        if newest is None and records:  # the layout before snapshots: StateStore parses the whole key
            cp = self.state.timed(journal, records).checkpoint
            return TxnCheckpoint(cp.offset, cp.states, cp.journal_id, cp.base, 0, 0, b"", 0, [])
        return self._parse(journal, newest)

    def claim(self, journal: str, owner: bytes, attempts: int = 8) -> TxnCheckpoint:
        """Take ``journal`` over for producer ``owner``: returns the checkpoint to continue from (its
        ``intents`` are still to be appended, by the caller, before anything new is published). Raises
        :class:`zcluster.FencedError` when another claim of the same or a newer generation is seen (that
        claimer goes on; this one's record is deleted), or older saves keep landing ``attempts`` times."""
        key = self.state._journal_key(journal)
        for _ in range(attempts):
            start = self.load(journal)
            gen = start.gen + 1
            mine = start._replace(gen=gen, seq=0, owner=owner)
            record = KeyScoreMember(key, score(gen, 0), _encode(mine, time.time()))
            if not self.state.cluster.insert([record]).applied[0]:
                raise FencedError(self.state.app, journal, gen, None)
            records = self._records(journal)
            rivals = [r for r in records if r.score >= record.score and str(r.member) != record.member]
            below = self.newest(records, record.score)
            if rivals or (below is None and start.gen > 0):
                # Another claim of this generation or a newer one, or one that finished (it forgot the
                # checkpoint this claim copied): it goes on.
                self.state.cluster.delete([record])
                theirs = max((_unscore(r.score)[0] for r in rivals if r.score >= _TOP), default=None)
                raise FencedError(self.state.app, journal, gen, theirs)
            if below is None or self._parse(journal, below).body() == start.body():
                self._forget(journal, record.score - 256.0)
                return mine
            # A save of the older generation landed after this claim's load: withdraw, and claim from it.
            self.state.cluster.delete([record])
        raise FencedError(self.state.app, journal, gen, None)

    def save_journal(self, journal: str, saved: TxnCheckpoint) -> TxnCheckpoint:
        """Save ``saved`` (its ``seq`` one past the previous save or claim of its generation; ``saved_at``, when
        given, the time recorded, so that a retry writes the same record) fenced; returns it. Raises
        :class:`zcluster.FencedError` when a newer claim exists: the save is not final, and the caller must not
        append its intents. That claim may have adopted it (it read the save as the newest before this read-back:
        its claimer appends the intents, which commit once, through it); otherwise they never commit."""
        key = self.state._journal_key(journal)
        record = KeyScoreMember(key, score(saved.gen, saved.seq), _encode(saved, saved.saved_at or time.time()))
        applied = self.state.cluster.insert([record]).applied[0]
        newest = self.newest(self._records(journal))
        if not applied or newest is None or str(newest.member) != record.member or newest.score != record.score:
            theirs = _unscore(newest.score)[0] if newest is not None and newest.score >= _TOP else None
            raise FencedError(self.state.app, journal, saved.gen, theirs)
        self._forget(journal, record.score - 256.0)
        return saved

    def take_over(
        self,
        journal: str,
        move: Callable[[TxnCheckpoint], TxnCheckpoint],
        publish: JournalStore | None,
        before_save: Callable[[TxnCheckpoint, TxnCheckpoint], None] | None = None,
    ) -> tuple[TxnCheckpoint, TxnCheckpoint]:
        """An operator's action on ``journal`` (:meth:`StateStore.restart_journal`, :meth:`StateStore.skip_lost`):
        a :meth:`claim` under a new producer id, then one fenced save of ``move(claimed)`` (its offset, states,
        identity and base; the ranking and owner stay the claim's). Returns (claimed, saved).

        ``publish``: the journal store the application publishes to. Given, the claimed checkpoint's intents (the
        last transaction saved before the action) are appended there before the save: downstream sees that
        transaction committed now, once. Either way the saved checkpoint keeps them and the application's next
        claim appends them again (an intent appended again changes nothing), so a wrong ``publish`` store loses
        nothing.

        Guaranteed: an applier of the journal holding an older claim (running, paused, a zombie) gets
        :class:`zcluster.FencedError` on its next save and appends nothing: what it published since its last save
        commits only if that save landed before this claim read the checkpoint (adopted: its intents are
        appended here, once), and otherwise never. Errors: what ``move`` raises (it checks the claimed checkpoint; the
        claim then stays, an unchanged copy of the checkpoint one generation up: a running applier claims again);
        :class:`zcluster.FencedError` when another claim came after this one (this save is not final: that claim
        adopted the claimed checkpoint, or this save if it landed before the claim's last read, see
        :meth:`holds`); :class:`zcluster.ShardError` subclasses; a failing append (the claim stays, with the
        intents). ``before_save(claimed, ranked)``: called last before the save (``ranked`` is the record it
        writes, :meth:`holds` tells whether it landed), e.g. to write an audit entry first: an error it raises
        saves nothing (the claim stays)."""
        claimed = self.claim(journal, bytes(new_producer_id()))
        moved = move(claimed)
        if publish is not None:
            append_intents(publish, claimed.intents)
        # Kept even when appended: re-appending is harmless, dropping them would lose them to a wrong ``publish``.
        # The time is fixed here so that the record is known before it is written (see ``holds``).
        ranked = moved._replace(
            gen=claimed.gen, seq=claimed.seq + 1, owner=claimed.owner, intents=claimed.intents, saved_at=time.time()
        )
        if before_save is not None:
            before_save(claimed, ranked)
        return claimed, self.save_journal(journal, ranked)

    def holds(self, journal: str, saved: TxnCheckpoint) -> bool:
        """Whether ``journal``'s key holds the record a :meth:`save_journal` of ``saved`` (with its ``saved_at``)
        writes: after a FencedError, a record still held may yet be adopted by the claim that fenced it (until
        that claim's last read); one not held was refused, or was forgotten by a claim that finished (which
        adopted it or not: its record, the newest, says)."""
        key = self.state._journal_key(journal)
        record = KeyScoreMember(key, score(saved.gen, saved.seq), _encode(saved, saved.saved_at or 0.0))
        return any(r.score == record.score and str(r.member) == record.member for r in self._records(journal))

    def _forget(self, journal: str, up_to: float) -> None:
        try:
            self.state.cluster.forget([self.state._journal_key(journal)], up_to)
        except PartialWriteError as exc:  # harmless: the newer record ranks above; the next save forgets them
            log.warning("checkpoint of %s: forgetting older records failed: %s", journal, exc)


class Claim:
    """A journal this process claimed: the checkpoint it continues from (the last one it claimed or saved),
    its producer, and the frames of the open transaction waiting to be appended (journal -> frames)."""

    def __init__(self, checkpoint: TxnCheckpoint, producer: Producer) -> None:
        self.checkpoint = checkpoint
        self.producer = producer
        self.pending: dict[str, list[bytes]] = {}
        self.queued = 0  # frames in pending
        self.published = 0  # messages of the open transaction appended (uncommitted) so far
        # A transaction may be in flight: a message stamped since the last final save, or a save (or its ACK
        # appends) begun and not finished. A failure then gives the claim up (Publishing.guard).
        self.open = False
        # Kept through a failure with nothing in flight (a stop at a lost range, a journal mismatch): checked
        # against the stored checkpoint before its next use, as an operator may have taken the journal over.
        self.suspect = False


class Publishing:
    """The applier's publishing side (see the module): claims, uncommitted publishing, the fenced commit.

    ``writer``: the journal store the :class:`zcluster.Publish` messages go to. ``retries``: of state reads and
    writes that meet a failing shard."""

    def __init__(self, writer: JournalStore, retries: int) -> None:
        self.writer, self.retries = writer, retries
        self.claims: dict[str, Claim] = {}
        self._framings: dict[str, Framing] = {}

    def claimed(self, state: StateStore, journal: str) -> Claim:
        """This process's claim of ``journal``: made (and the last checkpoint's intents appended again) on the
        first call, or the first after :meth:`guard` gave it up or found it superseded in the store."""
        held = self.claims.get(journal)
        txns = TxnStore(state)
        if held is not None and held.suspect:
            newest = retrying(lambda: txns.load(journal), self.retries, f"load checkpoint of {journal}")
            mine = held.checkpoint
            if (newest.gen, newest.seq, newest.owner) == (mine.gen, mine.seq, mine.owner):
                held.suspect = False
            else:  # claimed since (an operator's take-over, another process): continue from there
                del self.claims[journal]
                held = None
        if held is None:
            owner = bytes(new_producer_id())
            checkpoint = retrying(lambda: txns.claim(journal, owner), self.retries, f"claim {journal}")
            # Before anything new: ACKs a crash lost are delivered; the saver's abandoned span is rolled back.
            self._append(checkpoint.intents)
            clock = Clock(checkpoint.clock)
            clock.update(time.time_ns())
            held = Claim(checkpoint, Producer(clock, owner))
            self.claims[journal] = held
        return held

    @contextlib.contextmanager
    def guard(self, journal: str) -> Iterator[None]:
        """Give up the claim of ``journal`` on a failure inside with a transaction in flight (:attr:`Claim.open`):
        the next batch claims it again with a new producer id, so nothing published uncommitted under this one
        can be committed by a later ACK. A failure with nothing in flight (a stop at a lost range after the
        checkpoint before it was saved; a journal mismatch) keeps the claim, checked against the store on its
        next use: a process stopped there and polling again does not claim (and append the last intents to
        every downstream journal) on every poll."""
        try:
            yield
        except BaseException:
            held = self.claims.get(journal)
            if held is not None and held.open:
                del self.claims[journal]
            elif held is not None:
                held.suspect = True
            raise

    def mapper(
        self, claim: Claim, map_message: Callable[[str, Envelope], list[Any]]
    ) -> Callable[[str, Envelope], list[Any]]:
        """``map_message`` (the applier's mapper call) with its :class:`zcluster.Publish` items published on
        ``claim`` (:meth:`split`); a message that cannot be published raises :class:`zcluster.MapperError`."""

        def mapped(journal: str, env: Envelope) -> list[Any]:
            return self.published(claim, map_message(journal, env), "journal", journal, env.begin, env.message)

        return mapped

    def published(self, claim: Claim, writes: list[Any], what: str, source: str, offset: int, item: Any) -> list[Any]:
        """:meth:`split` of the writes mapped from ``item`` (a message, or a row) at ``offset`` of ``source`` (a
        ``what``: a journal, or a positioned source's partition ``<topic>/<partition>``); a message that cannot
        be published raises :class:`zcluster.MapperError` naming them."""
        try:
            return self.split(claim, writes)
        except Exception as exc:
            raise MapperError(
                f"mapper's message to publish for {what} {source} offset {offset} ({type(item).__name__}) "
                f"cannot be published: {type(exc).__name__}: {exc}"
            ) from exc

    def split(self, claim: Claim, writes: list[Any]) -> list[Any]:
        """Stamp the :class:`zcluster.Publish` items of ``writes`` uncommitted (framed and queued on
        ``claim``); returns the other writes."""
        if not any(type(w) is Publish for w in writes):
            return writes
        rest = []
        for w in writes:
            if type(w) is not Publish:
                rest.append(w)
                continue
            target, msg = w.journal, w.message
            journal = target if isinstance(target, str) else target(msg)[0]
            framing = self._framing(journal)
            claim.open = True
            claim.producer.stamp_uncommitted(msg, journal, framing)
            claim.pending.setdefault(journal, []).append(framing.marshal(msg))
            claim.queued += 1
        if claim.queued >= QUEUED:
            self._flush(claim)
        return rest

    def commit(
        self, state: StateStore, journal: str, claim: Claim, offset: int, states: list[ProducerState], journal_id: str
    ) -> int:
        """Close the transaction: append its messages, save the checkpoint with its ACK intents (fenced), then
        append the intents. Returns how many messages were published. Nothing read and nothing published:
        nothing saved."""
        held = claim.checkpoint
        if offset == held.offset and not claim.pending and not claim.published:
            return 0
        claim.open = True
        self._flush(claim)
        published, claim.published = claim.published, 0
        intents = claim.producer.commit_intents()
        saved = held._replace(
            offset=offset,
            states=states,
            journal_id=journal_id,
            seq=held.seq + 1,
            clock=claim.producer.clock.value,
            intents=intents,
            saved_at=time.time(),  # fixed here: a retried save sends the same record
        )
        txns = TxnStore(state)
        claim.checkpoint = retrying(lambda: txns.save_journal(journal, saved), self.retries, f"save {journal}")
        self._append(intents)
        claim.open = False
        if saved.seq >= SAVES - 1:  # the claim's last save number: the next batch claims anew
            self.claims.pop(journal, None)
        return published

    def _flush(self, claim: Claim) -> None:
        """Append the queued messages (uncommitted: any time before the save will do; appending in chunks
        bounds a long transaction's memory)."""
        for target, frames in claim.pending.items():
            self.writer.append_many(target, frames)
            claim.published += len(frames)
        claim.pending, claim.queued = {}, 0

    def _append(self, intents: list[AckIntent]) -> None:
        append_intents(self.writer, intents)

    def _framing(self, journal: str) -> Framing:
        framing = self._framings.get(journal)
        if framing is None:
            framing = self._framings[journal] = framing_for(self.writer.info(journal).labels[CONTENT_TYPE_LABEL])
        return framing


def append_intents(writer: JournalStore, intents: list[AckIntent]) -> None:
    """Append each ACK intent to its journal in ``writer``, in order (appending one again changes nothing)."""
    for intent in intents:
        writer.append(intent.journal, intent.intent)


def check_store(store: Store, app: str) -> None:
    """Refuse (:class:`zcluster.ConfigError`) to keep publishing application ``app``'s checkpoints on a farm of
    replicas (see the module: its fencing needs reads that see every acknowledged write). Told apart by its read
    strategy, as the state layer never loads the farm."""
    if hasattr(store, "read_strategy"):
        raise ConfigError(
            f"application {app} publishes (publish=): its fenced checkpoints need reads that see every write "
            "acknowledged before them, and a farm of replicas does not give that (a read answers from the replicas "
            "that answered, one when the others are down: a zombie's save could miss a newer claim and what it "
            "published commit beside its replacement's redo). Keep this application's state on a Cluster"
        )
