"""The Sequencer: turns read-uncommitted envelopes into read-committed ones, exactly once.

It follows Gazette's ``message.Sequencer`` state machine. For each (journal, producer) it tracks
the last acknowledged clock (``min_clock``, exclusive), the largest clock of the open span
(``max_clock``, inclusive) and the begin offset of that span. Each envelope given to
``queue_uncommitted`` gets a QueueOutcome:

* an OUTSIDE_TXN message with a new clock commits itself (OUTSIDE_COMMIT); a clock at or below the
  last ACK is a duplicate and is dropped (OUTSIDE_ALREADY_ACKED);
* a CONTINUE_TXN message opens (CONTINUE_BEGIN_SPAN) or extends (CONTINUE_EXTEND_SPAN) the producer's
  span, or is dropped as a duplicate (CONTINUE_ALREADY_ACKED, CONTINUE_TXN_CLOCK_LARGER);
* an ACK_TXN commits the span's messages with clocks up to its own and rolls back those above it
  (ACK_EMPTY, ACK_COMMIT_RING, or ACK_COMMIT_REPLAY when part of the span has left the ring); an ACK
  at the last ACK's clock rolls the span back (ACK_ROLLBACK); an ACK *below* it also rolls back, and
  is logged as an error: exactly-once degrades to at-least-once there, as in Gazette.

After an outcome that commits, call ``step()`` until it returns None; every envelope it returns is
committed, in journal order, once. ACK envelopes are returned too (``Envelope.is_ack``). Committed
messages are released as soon as their ACK is read, whatever other producers still have open: no
head-of-line blocking. Envelopes whose clock is zero (e.g. the all-zero UUID) opt out: they are
always committed at once and never tracked.

A bounded ring indexes the most recent envelopes; an entry holds its envelope until it is dequeued or
evicted. When an ACK commits a span that began before the ring's oldest entry, ``replay_range()`` names the
exact journal byte range to read again, and ``start_replay(iterator)`` supplies those envelopes; ``step()``
then resumes. A replay delivers exactly what the ring would have: it skips what ``queue_uncommitted`` dropped
(duplicates, clocks going back within the span) or committed alone (zero clocks), where Gazette's delivers
those above the last ACK.

``checkpoint()`` returns journal offsets and producer states from which a new Sequencer continues exactly
where this one is: offsets never pass a commit whose span is not fully dequeued, and the states make
duplicates on both sides of the checkpoint recognisable.

Why this module is long: it is one state machine (Gazette's), whose outcome table, ring and replay share
private state; split up, each part would reach into the others' internals.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping
from enum import IntEnum
from typing import TYPE_CHECKING, Any, Final, cast

from zcluster._fasttuples import native_untrack
from zcluster.message.checkpoints import Checkpoint, ProducerState, ReplayRange
from zcluster.message.envelope import Envelope
from zcluster.message.errors import ReplayError, ReplayRequiredError, SequencerError
from zcluster.message.uuid import ProducerID, clock_span, format_uuid, get_clock, get_flags

__all__ = ["Checkpoint", "ProducerState", "QueueOutcome", "ReplayError", "ReplayRange", "ReplayRequiredError"]
__all__ += ["Sequencer", "SequencerError"]

if TYPE_CHECKING:
    from mypy_extensions import i64  # a native 64-bit int once compiled (zcluster._native); an int otherwise

log = logging.getLogger(__name__)

_OUTSIDE: Final = 0
_PAD: Final = bytes(10)  # before a state's 6-byte producer: where a UUID holds it (Sequencer._key)
_CONTINUE: Final = 1
_ACK: Final = 2


class QueueOutcome(IntEnum):
    """The decision ``Sequencer.queue_uncommitted`` made for an envelope (Gazette's names)."""

    OUTSIDE_ALREADY_ACKED = 0
    OUTSIDE_COMMIT = 1
    CONTINUE_ALREADY_ACKED = 2
    CONTINUE_TXN_CLOCK_LARGER = 3
    CONTINUE_BEGIN_SPAN = 4
    CONTINUE_EXTEND_SPAN = 5
    ACK_ROLLBACK = 6
    ACK_EMPTY = 7
    ACK_COMMIT_RING = 8
    ACK_COMMIT_REPLAY = 9


# The members as Final module globals: reading an Enum member as a class attribute costs ~50 ns (Python 3.11),
# a global ~5, and queue_uncommitted names several per message; compiled (zcluster._native), a Final one is a
# C static, where any other global is a dict lookup at each use.
_OUTSIDE_ALREADY_ACKED: Final = QueueOutcome.OUTSIDE_ALREADY_ACKED
_OUTSIDE_COMMIT: Final = QueueOutcome.OUTSIDE_COMMIT
_CONTINUE_ALREADY_ACKED: Final = QueueOutcome.CONTINUE_ALREADY_ACKED
_CONTINUE_TXN_CLOCK_LARGER: Final = QueueOutcome.CONTINUE_TXN_CLOCK_LARGER
_CONTINUE_BEGIN_SPAN: Final = QueueOutcome.CONTINUE_BEGIN_SPAN
_CONTINUE_EXTEND_SPAN: Final = QueueOutcome.CONTINUE_EXTEND_SPAN
_ACK_ROLLBACK: Final = QueueOutcome.ACK_ROLLBACK
_ACK_EMPTY: Final = QueueOutcome.ACK_EMPTY
_ACK_COMMIT_RING: Final = QueueOutcome.ACK_COMMIT_RING
_ACK_COMMIT_REPLAY: Final = QueueOutcome.ACK_COMMIT_REPLAY
_COMMITS: Final = frozenset({_OUTSIDE_COMMIT, _ACK_EMPTY, _ACK_COMMIT_RING, _ACK_COMMIT_REPLAY})
_UNTRACK: Final = native_untrack()  # for the rings of ints (zcluster/_tuples.c)


class _Partial:
    """A producer's state within a journal, and its span's entries in the ring."""

    __slots__ = ("begin", "journal", "max_clock", "min_clock", "producer", "ring_start", "ring_stop")

    def __init__(self, journal: str, producer: bytes, min_clock: int, max_clock: int, begin: int) -> None:
        self.journal = journal
        self.producer = producer
        self.min_clock = min_clock  # Exclusive minimum clock of the span (last ACK).
        self.max_clock = max_clock  # Inclusive maximum clock of the span.
        self.begin = begin  # Journal offset where the span begins, or -1.
        self.ring_start = -1  # Ring index of the span's first entry still in the ring, or -1.
        self.ring_stop = -1  # Ring index of its last entry, or -1.


class Sequencer:
    """Sequences read-uncommitted envelopes of any number of journals into read-committed ones.

    `offsets` and `states` restore a ``checkpoint()``; `buffer` is the ring size (at least 1).
    Not safe for concurrent use.
    """

    def __init__(
        self,
        offsets: Mapping[str, int] | None = None,
        states: Iterable[ProducerState] = (),
        buffer: int = 1024,
    ) -> None:
        cap = max(1, buffer)
        self._offsets: dict[str, int] = dict(offsets or {})
        self._last_offsets: dict[str, int] = dict(self._offsets)
        self._partials: dict[int, _Partial] = {}  # by _key: compiled, a tuple key cost a tuple, a slice, two hashes
        self._journal_ids: dict[str, int] = {}
        self._last_journal, self._last_id = "".join(["\0", "unset"]), -1  # _key's cache; unset: a str no caller holds
        for n, st in enumerate(states):
            max_clock = st.last_ack if st.max_clock is None else max(st.max_clock, st.last_ack)
            # A producer that is not 6 bytes matches no UUID: kept under a key no UUID makes, as it came.
            key = self._key(st.journal, _PAD + st.producer) if len(st.producer) == 6 else -1 - n
            self._partials[key] = _Partial(st.journal, st.producer, st.last_ack, max_clock, st.begin)
        self._emit: _Partial | None = None
        self._dequeued: Envelope | None = None
        self._dequeued_clock = 0
        self._replay_it: Iterator[Envelope] | None = None
        self._replay_max = 0  # The largest clock of the span's producer replayed so far (see step)
        self._cap = cap
        self._head = 0
        # Slots made as the head first reaches them (_advance), up to cap: a fixed ring's unreached ones are empty
        size = min(cap, 512)
        self._ring: list[Envelope | None] = [None] * size
        self._ring_clock = [0] * size
        self._ring_begin = [0] * size
        self._ring_owner: list[_Partial | None] = [None] * size
        self._next = [-1] * size
        if _UNTRACK is not None:  # ints only, ever: nothing for the collector to walk (thousands of slots)
            _UNTRACK(self._ring_clock)
            _UNTRACK(self._ring_begin)
            _UNTRACK(self._next)

    @property
    def dequeued(self) -> Envelope | None:
        """The envelope last returned by ``step()``, until ``step()`` is called again."""
        return self._dequeued

    def read_through(self, journal: str) -> int:
        """The offset of `journal` through which envelopes have been fully sequenced (0 if unknown)."""
        return self._offsets.get(journal, 0)

    def queue_uncommitted(self, env: Envelope) -> QueueOutcome:
        """Apply the next read-uncommitted envelope of its journal and return the outcome.

        Envelopes of one journal must be queued in offset order. After OUTSIDE_COMMIT, ACK_EMPTY,
        ACK_COMMIT_RING or ACK_COMMIT_REPLAY, call ``step()`` until it returns None before queueing
        again (SequencerError otherwise).
        """
        if self._emit is not None:
            raise SequencerError("committed messages remain to dequeue: call step() until it returns None")
        head = self._head
        ring = self._ring
        if ring[head] is not None:
            self._evict_head()

        uuid = env.uuid
        real_clock = clock = get_clock(uuid)
        flags = get_flags(uuid)
        journal = env.journal

        if clock == 0:
            # Zero clocks opt out: committed at once, never indexed.
            partial = _Partial(journal, uuid[10:16], 0, 0, -1)
            flags, clock = _OUTSIDE, 1
        else:
            key = self._key(journal, uuid)
            found = self._partials.get(key)  # typed as found: compiled (zcluster._native), a type is checked
            if found is None:
                found = self._partials[key] = _Partial(journal, uuid[10:16], clock - 1, clock - 1, -1)
            partial = found

        # Decide the outcome; state changes happen below, by outcome.
        if flags == _CONTINUE:
            if clock <= partial.min_clock:
                outcome = _CONTINUE_ALREADY_ACKED
            elif clock <= partial.max_clock:
                outcome = _CONTINUE_TXN_CLOCK_LARGER
            elif partial.begin == -1:
                outcome = _CONTINUE_BEGIN_SPAN
            else:
                outcome = _CONTINUE_EXTEND_SPAN
        elif flags == _ACK:
            if clock < partial.min_clock:
                # An upstream producer restored an older checkpoint and will re-send messages under
                # new UUIDs: accept the reset, which weakens exactly-once to at-least-once.
                self._log_error(env, partial, "ACK_TXN below the last ACK (loss of exactly-once semantics)")
                outcome = _ACK_ROLLBACK
            elif clock == partial.min_clock:
                outcome = _ACK_ROLLBACK
            elif partial.begin == -1:
                outcome = _ACK_EMPTY
            elif partial.ring_start == -1 or partial.begin != self._ring_begin[partial.ring_start]:
                outcome = _ACK_COMMIT_REPLAY  # None, or only a trailing part, of the span is in the ring.
            else:
                outcome = _ACK_COMMIT_RING
        else:
            if flags != _OUTSIDE:
                self._log_error(env, partial, "unexpected UUID flags (handled as OUTSIDE_TXN)")
            if clock <= partial.min_clock:
                outcome = _OUTSIDE_ALREADY_ACKED
            else:
                if partial.begin != -1 and partial.begin != env.begin:  # Equal: re-read after a restore.
                    self._log_error(
                        env,
                        partial,
                        "OUTSIDE_TXN after CONTINUE_TXN of the same producer "
                        "(mixed committed and uncommitted publishing?): the open span is dropped",
                    )
                outcome = _OUTSIDE_COMMIT

        if outcome in _COMMITS:
            # Index the committing envelope, then commit the span through its clock: span messages
            # with larger clocks are rolled back when dequeued.
            self._add_at_head(env, real_clock, partial)
            if outcome is _OUTSIDE_COMMIT:
                partial.begin = env.begin
                partial.ring_start = partial.ring_stop  # Any open span is clobbered: a rollback.
            elif outcome is _ACK_EMPTY:
                partial.begin = env.begin
            partial.max_clock = clock
            self._emit = partial
            # Offsets move only once the span is dequeued, so a restored Sequencer reads the ACK again.
        elif outcome is _CONTINUE_BEGIN_SPAN or outcome is _CONTINUE_EXTEND_SPAN:
            if outcome is _CONTINUE_BEGIN_SPAN:
                partial.begin = env.begin
            self._add_at_head(env, real_clock, partial)
            partial.max_clock = clock
            self._offsets[journal] = env.end
        elif outcome is _ACK_ROLLBACK:
            partial.min_clock = partial.max_clock = clock
            partial.begin = partial.ring_start = partial.ring_stop = -1
            self._offsets[journal] = env.end
        else:  # A duplicate: only the read-through offset moves.
            self._offsets[journal] = env.end
        return outcome

    def commit_outside(self, env: Envelope) -> QueueOutcome | None:
        """The fast path of the commonest case: ``queue_uncommitted(env)`` and ``step()`` until None, in one
        call, for an OUTSIDE_TXN envelope whose producer has no open span.

        Returns OUTSIDE_COMMIT (deliver ``env``: it is the only envelope that sequence would dequeue, and it
        counts as processed) or OUTSIDE_ALREADY_ACKED (drop it). The Sequencer's state, ring included, is
        then what the two calls would leave, but for the clock and offset that the released ring entry keeps
        and nothing reads. Returns None, changing nothing, for every other case
        (other flags, a zero clock, an open span, a sequence still being dequeued): give ``env`` to
        ``queue_uncommitted`` then.
        """
        uuid = env.uuid
        if ((uuid[8] << 8) | uuid[9]) & 0x3FF != _OUTSIDE or self._emit is not None:
            return None
        clock = get_clock(uuid)
        if clock == 0:
            return None
        journal = env.journal
        key = self._key(journal, uuid)
        partial = self._partials.get(key)
        if partial is None:
            partial = self._partials[key] = _Partial(journal, uuid[10:16], clock - 1, clock - 1, -1)
        elif partial.begin != -1 or partial.ring_stop != -1:
            return None  # an open span: rolled back by this message, and logged, on the general path
        head = self._head
        if self._ring[head] is not None:
            self._evict_head()
        if clock <= partial.min_clock:
            self._offsets[journal] = env.end
            return _OUTSIDE_ALREADY_ACKED
        # queue_uncommitted's OUTSIDE_COMMIT indexes the envelope at the head; step() then dequeues it,
        # releasing its entry (see step), and, once done, moves the offset. Only live entries' clocks and
        # begins are read (a span's, from its ring_start on): the released one's are not written.
        self._advance(head)
        partial.min_clock = partial.max_clock = clock
        self._offsets[journal] = env.end
        return _OUTSIDE_COMMIT

    def step(self) -> Envelope | None:
        """Return the next committed envelope, or None when the committed sequence is exhausted
        (and at once when nothing was committed).

        Raises ReplayRequiredError if the sequence needs a replay that was not started, and
        ReplayError if the replay iterator fails or yields an envelope outside ``replay_range()``.
        """
        emit = self._emit
        if emit is None:
            return None
        ring = self._ring
        if self._dequeued is not None:
            emit.min_clock = self._dequeued_clock  # The previous envelope has been processed.
        elif self._replay_it is None and emit.begin != self._ring_begin[emit.ring_start]:
            raise ReplayRequiredError("ACK_COMMIT_REPLAY: call replay_range() and start_replay() before step()")

        while emit.ring_start != -1:
            if self._replay_it is None:
                idx = emit.ring_start
                env: Envelope = ring[idx]  # type: ignore[assignment]
                clock = self._ring_clock[idx]
                emit.ring_start = self._next[idx]
                # Released once dequeued (nothing reads a dequeued entry again): a delivered envelope and its
                # message are freed when the application drops them, not a ring's length later, so the
                # garbage collector never sees them grow old (most of its cost per message, before).
                ring[idx] = self._ring_owner[idx] = None
                self._next[idx] = -1
            else:
                env_or_none = self._next_replayed(emit)
                if env_or_none is None:
                    continue
                env = env_or_none
                clock = env.clock
                if clock <= self._replay_max:
                    # Not in the span: queue_uncommitted dropped it (a duplicate, a clock going back within the
                    # span) or committed it alone when read (a zero clock). Gazette's Step delivers those of
                    # them above the last ACK and not above the ACK's clock: what the ring never holds.
                    continue
                self._replay_max = clock  # what queue_uncommitted took as the span's max_clock
            self._dequeued = env
            self._dequeued_clock = clock
            if clock != 0 and clock <= emit.min_clock:
                # A duplicate: common in replayed ranges; in the ring only after a restore from a
                # state without max_clock (e.g. Gazette's), which let it in as a span extension.
                continue
            if clock > emit.max_clock:
                continue  # Above the ACK's clock: rolled back.
            emit.begin = env.begin  # A checkpoint taken now resumes the span here.
            return env

        # The span is fully dequeued: only now may the journal's offset pass its ACK.
        self._offsets[emit.journal] = self._dequeued.end  # type: ignore[union-attr]
        emit.max_clock = emit.min_clock
        emit.begin = emit.ring_start = emit.ring_stop = -1
        self._dequeued = None
        self._dequeued_clock = 0
        self._emit = None
        return None

    def _next_replayed(self, emit: _Partial) -> Envelope | None:
        assert self._replay_it is not None
        try:
            env = next(self._replay_it)
        except StopIteration:
            self._replay_it = None  # Replay done; the rest of the span is in the ring.
            return None
        except Exception as exc:
            raise ReplayError(f"replay reader: {exc}") from exc
        limit = self._ring_begin[emit.ring_start]
        if env.journal != emit.journal:
            raise ReplayError(f"replay of wrong journal ({env.journal}; expected {emit.journal})")
        if env.begin < emit.begin:
            raise ReplayError(f"replay has wrong begin ({env.begin}; expected >= {emit.begin})")
        if env.end > limit:
            raise ReplayError(f"replay has wrong end ({env.end}; expected <= {limit})")
        if env.uuid[10:16] != emit.producer:
            return None  # Other producers' messages are interleaved in the replayed range.
        return env

    def replay_range(self) -> ReplayRange:
        """The journal and [begin, end) byte range to replay after ACK_COMMIT_REPLAY.
        Raises SequencerError if nothing is being dequeued."""
        emit = self._emit
        if emit is None:
            raise SequencerError("no committed sequence to replay")
        return ReplayRange(emit.journal, emit.begin, self._ring_begin[emit.ring_start])

    def start_replay(self, envelopes: Iterable[Envelope]) -> None:
        """Supply the envelopes of ``replay_range()`` (read-uncommitted, in offset order; envelopes
        of other producers, duplicates, clocks going back within the span and zero clocks are skipped,
        as ``queue_uncommitted`` skipped them). Raises SequencerError if nothing is being dequeued."""
        if self._emit is None:
            raise SequencerError("no committed sequence to replay")
        self._replay_it = iter(envelopes)
        # The replay starts at the span's first message not yet processed: every clock the span took before
        # it is at most the last processed one.
        self._replay_max = self._emit.min_clock

    def has_pending(self) -> bool:
        """True if a span was begun or extended since the last checkpoint: more messages are likely coming."""
        last = self._last_offsets
        return any(p.begin >= last.get(p.journal, 0) for p in self._partials.values())

    def checkpoint(self, prune_horizon: float = 0.0) -> Checkpoint:
        """Return the read-through offsets and producer states to restore this Sequencer from.

        With `prune_horizon` > 0 (seconds), producers whose largest clock is older than the journal's
        latest acknowledged clock minus the horizon are forgotten (their later duplicates would be
        delivered again). May be called while dequeuing: the current ``dequeued`` envelope counts
        as not yet processed, so a Sequencer restored from this checkpoint delivers it again,
        followed by the rest of its span (as Gazette does).
        """
        horizon: dict[str, int] = {}
        units = clock_span(prune_horizon) if prune_horizon > 0 else -1  # -1: no pruning
        for p in self._partials.values() if units >= 0 else ():
            if p.min_clock > horizon.get(p.journal, 0):
                horizon[p.journal] = p.min_clock
        states: list[ProducerState] = []
        for key, p in list(self._partials.items()):
            if units < 0 or p.max_clock >= max(0, horizon.get(p.journal, 0) - units):
                # cast, not ProducerID(): a NewType's call is a Python call once compiled (zcluster._native)
                states.append(ProducerState(p.journal, cast(ProducerID, p.producer), p.min_clock, p.begin, p.max_clock))
            else:
                del self._partials[key]
        self._last_offsets.update(self._offsets)
        return Checkpoint(dict(self._offsets), states)

    def _key(self, journal: str, b: bytes) -> int:
        """The ``_partials`` key of (journal, the producer of UUID ``b``, its bytes 10..16): the journal's
        number, then 48 bits."""
        if journal is self._last_journal:
            jid: i64 = self._last_id
        else:
            jid = self._journal_ids.setdefault(journal, len(self._journal_ids))
            self._last_journal, self._last_id = journal, jid
        if jid >= 1 << 15:  # past 2**63 in 64 bits: plain ints (a Sequencer of 32,768 journals and more)
            return (int(jid) << 48) | int.from_bytes(b[10:16], "big")
        # i64s (plain ints uncompiled): a tagged int's shift checks for overflow at each step; one read per byte
        # at a constant index into a typed local (as uuid.get_clock), where a computed index costs more
        b0: i64 = b[10]
        b1: i64 = b[11]
        b2: i64 = b[12]
        b3: i64 = b[13]
        b4: i64 = b[14]
        b5: i64 = b[15]
        return (jid << 48) | (b0 << 40) | (b1 << 32) | (b2 << 24) | (b3 << 16) | (b4 << 8) | b5

    def _add_at_head(self, env: Envelope, clock: int, partial: _Partial) -> None:
        head = self._head
        self._ring[head] = env
        self._ring_clock[head] = clock
        self._ring_begin[head] = env.begin
        self._ring_owner[head] = partial
        self._next[head] = -1
        if partial.ring_stop == -1:
            partial.ring_start = head
        else:
            self._next[partial.ring_stop] = head
        partial.ring_stop = head
        self._advance(head)

    def _advance(self, head: int) -> None:
        """Move the head past ``head``: to the next slot, made if the head never reached it, or back to 0."""
        head += 1
        size = len(self._next)
        if head == size:
            if size < self._cap:
                more = min(size, self._cap - size)
                rings: list[tuple[list[Any], object]] = [(self._ring, None), (self._ring_owner, None), (self._next, -1)]
                for ring, empty in [*rings, (self._ring_clock, 0), (self._ring_begin, 0)]:
                    ring.extend([empty] * more)
            else:
                head = 0
        self._head = head

    def _evict_head(self) -> None:
        head = self._head
        p = self._ring_owner[head]
        # The owner's span may still start here; if so it now starts at the next entry (or nowhere).
        if p is not None and p.ring_start == head:
            nxt = self._next[head]
            if p.ring_start == p.ring_stop and nxt == -1:
                p.ring_start = p.ring_stop = -1
            elif p.ring_start != p.ring_stop and nxt != -1:
                p.ring_start = nxt
            else:
                raise AssertionError("ring invariant violated: ring_start == ring_stop iff next == -1")
        self._ring[head] = None
        self._ring_owner[head] = None
        self._next[head] = -1

    def _log_error(self, env: Envelope, p: _Partial, msg: str) -> None:
        log.error(
            "%s: journal=%s begin=%d end=%d uuid=%s min_clock=%d max_clock=%d span_begin=%d",
            msg,
            env.journal,
            env.begin,
            env.end,
            format_uuid(env.uuid),
            p.min_clock,
            p.max_clock,
            p.begin,
        )
