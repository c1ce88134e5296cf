"""Sequencer checkpoints and batch progress of one application, in the cluster.

Why this module is long: one class holds every layout it reads (the per-producer one, ``v2``, ``v3``, the fields of
``v4``) and the operator's audited ways to move a checkpoint (a restart, a lost range skipped; on a ``v4``
checkpoint both dispatch to :mod:`zcluster.state.txn`), each with the checks that keep it from half-applying.

Layout (namespace prefix ``zcstate:``, one logical set each):

* ``<app>/journal/<journal>``: the journal's checkpoint, one record whose member holds the whole checkpoint
  (the journal's identity, the byte offset read through, when it was saved, every producer state) and whose
  score is the checkpoint's position: ``base + offset``. A checkpoint is one consistent snapshot of the Sequencer, never
  merged from records of different saves, so a later state always supersedes an earlier one whatever their
  clocks (after a rollback a producer's max clock goes *down*: ranking states by clock let an older open
  span win and re-deliver the rolled-back messages). ``base`` is 0 until :meth:`StateStore.restart_journal`
  starts a journal over: it moves past every earlier position, so offsets may start again at 0.
* ``<app>/progress``: member = query id, score = the last committed batch id.
* ``<app>/audit``: what was done to the checkpoints besides reading (a restart, a lost range skipped by an
  operator or automatically), one JSON record each, scored by time.

Member layouts: ``v3|<uid>|<base>|<offset>|<saved at>|<producer:last_ack:begin:max_clock,...>`` (saved at: Unix
time, milliseconds); ``v2`` is the same without the time, and is still read (its time is unknown); ``v4`` (a
publishing application's, fenced, with ACK intents: :mod:`zcluster.state.txn`) adds fields after these, and
:meth:`StateStore.save_journal` refuses to save over it (:meth:`StateStore.restart_journal` and
:meth:`StateStore.skip_lost` move it fenced, through :meth:`zcluster.state.txn.TxnStore.take_over`). A save at or
below the stored position changes nothing, so the time says when the checkpoint last *moved*.

A save reads the stored position (a save not past it changes nothing), writes the new record (one tuple of one key:
atomic) and then forgets every record below its score, which also raises the key's floor there: a zombie or a
replayed batch saving an older checkpoint finds its write stale even when it races past the read, and no tombstone
is left behind per save (the store stays flat over months). Given the checkpoint the caller loaded (``loaded=``, as
the applier does), a save past it writes first and reads only when the floor refused the write, to say why: one
round trip less, the same outcomes. Where the forget fails (a replica of a farm down) the save stands and a warning
is logged: loads rank older snapshots below it, and the next save forgets them. Records of the layout before the
snapshots (a record per producer scored by its clock, plus ``~offset``) are read when no snapshot record exists and
forgotten by the first save.

A checkpoint is bound to the journal's identity (:attr:`zcluster.journal.JournalInfo.uid`, made when the journal is
created). The applier refuses to go on when the journal was destroyed and created again under the same name, or when
the checkpoint lies past the journal's end (:class:`JournalMismatchError`): continuing would silently skip the new
journal's messages below the old offset.

Durability: ``StateStore(..., durability=Durability(replicas=1))`` makes every write of the store (checkpoint saves,
the forgetting of superseded records, batch commits) wait for Redis's own confirmation (``WAIT`` / ``WAITAOF``, see
:class:`zcluster.Durability`) through its view, whatever the cluster's own writes do; not given, the store waits as
its cluster does. A save not confirmed in time raises :class:`zcluster.PartialWriteError` carrying a
:class:`zcluster.DurabilityError`: the checkpoint was written on the master but may be lost with it, and saving it
again is safe.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple

from zcluster.errors import ConfigError, InconsistentDataError, JournalMismatchError, PartialWriteError, ShardError
from zcluster.journal.store import JournalStore
from zcluster.message.sequencer import ProducerState
from zcluster.message.uuid import ProducerID
from zcluster.state.clocks import score_to_clock
from zcluster.state.layout import decode_record, encoded_states
from zcluster.state.txn import PARTITION_MARK, TxnCheckpoint, TxnStore
from zcluster.types import Durability, KeyMember, KeyScoreMember, Store

log = logging.getLogger("zcluster.state")

_ALL = 1_000_000  # select limit and batch size meaning "every record"
_VERSION = "v3"
_VERSIONS = ("v2|", "v3|", "v4|")  # the snapshot layouts read (v2: without the time; v4: zcluster.state.txn)
_LEGACY_OFFSET = "~offset"


class JournalCheckpoint(NamedTuple):
    """Producer states of one journal, valid after reading it through byte ``offset`` (0: nothing read).

    ``journal_id``: the identity of the journal the checkpoint was taken of ("" when unknown: none saved yet,
    or saved before identities existed). ``base``: where this journal's positions start (see the module).
    """

    offset: int
    states: list[ProducerState]
    journal_id: str = ""
    base: int = 0

    @property
    def position(self) -> int:
        """The checkpoint's rank among all checkpoints of its journal: ``base + offset``."""
        return self.base + self.offset


class TimedCheckpoint(NamedTuple):
    """A stored checkpoint and when it was saved, i.e. when it last moved (a Unix time; None for a
    checkpoint of a layout without it, or none stored)."""

    checkpoint: JournalCheckpoint
    saved_at: float | None


def _decode(journal: str, member: str) -> TimedCheckpoint:
    journal_id, base, offset, saved_at, states = decode_record(journal, member)
    return TimedCheckpoint(JournalCheckpoint(offset, states, journal_id, base), saved_at)


def _legacy(journal: str, records: Sequence[KeyScoreMember]) -> JournalCheckpoint:
    """The layout before v2: one record per producer state (the highest-ranked per producer wins)."""
    offset = 0
    best: dict[bytes, tuple[tuple[int, int, bool], ProducerState]] = {}
    for r in records:
        member = str(r.member)
        if member == _LEGACY_OFFSET:
            offset = int(r.score)
            continue
        producer, last_ack, begin = member.split("|")
        state = ProducerState(
            journal, ProducerID(bytes.fromhex(producer)), int(last_ack), int(begin), score_to_clock(r.score)
        )
        rank = (state.max_clock or state.last_ack, state.last_ack, state.begin < 0)
        held = best.get(state.producer)
        if held is None or rank > held[0]:
            best[state.producer] = (rank, state)
    return JournalCheckpoint(offset, [s for _, s in best.values()])


class StateStore:
    """Exactly-once bookkeeping for application ``app`` (a Spark query name or any consumer id).

    Records live under ``namespace`` on ``cluster``'s servers (a view sharing its connections).
    ``durability``: what the store's writes wait for (see the module); None: as ``cluster``'s writes.
    """

    def __init__(
        self, cluster: Store, app: str, namespace: str = "zcstate:", durability: Durability | None = None
    ) -> None:
        if not app or "/" in app:
            raise ConfigError(f"app id must be non-empty and without '/', got {app!r}")
        self.app = app
        self.cluster = cluster.view(namespace, floors=True, batch_size=_ALL, durability=durability)
        # Per journal, the last checkpoint saved, as text and decoded: a load of that text parses nothing (see _load)
        self._saved: dict[str, tuple[str, TimedCheckpoint]] = {}

    def _journal_key(self, journal: str) -> str:
        return f"{self.app}/journal/{journal}"

    # -- journal checkpoints -------------------------------------------------------------------------------

    def load_journal(self, journal: str) -> JournalCheckpoint:
        """The stored checkpoint of ``journal`` (offset 0 and no states if none), read in one snapshot."""
        return self.load_journal_timed(journal).checkpoint

    def load_journal_timed(self, journal: str) -> TimedCheckpoint:
        """The stored checkpoint of ``journal`` and when it last moved (see :class:`TimedCheckpoint`)."""
        key = self._journal_key(journal)
        return self.timed(journal, self.cluster.select([key], limit=_ALL)[key])

    def timed(self, journal: str, records: Sequence[KeyScoreMember]) -> TimedCheckpoint:
        """The checkpoint held by ``records``, the records of ``journal``'s key as read from the store's view.

        A record that does not parse (written by hand or by other code: an offset ``3710.0``, a missing
        field) raises :class:`zcluster.InconsistentDataError` naming the application, the journal and the
        record; the store is left as it is (a save past it, or :meth:`restart_journal`, supersedes it)."""
        current = [r for r in records if str(r.member).startswith(_VERSIONS)]
        # Equal positions hold the same snapshot unless two writers disagreed; either way pick one, always the same.
        best = max(current, key=lambda r: (r.score, str(r.member))) if current else None
        try:
            if best is None:
                return TimedCheckpoint(_legacy(journal, records), None)
            return self._load(journal, str(best.member))
        except ValueError as exc:  # int() of a non-integer field, a field missing or extra, bad hex
            shown = str(best.member) if best is not None else "; ".join(str(r.member) for r in records)
            raise InconsistentDataError(
                f"application {self.app}, journal {journal}: corrupt checkpoint record {shown[:200]!r} ({exc}); it "
                "stays as it is until a later save or restart_journal() supersedes it"
            ) from None

    def _load(self, journal: str, member: str) -> TimedCheckpoint:
        """``_decode(journal, member)``, unparsed when this store saved it last (an applier's next batch): a parse
        costs ~0.6 µs per producer state, and short-lived producers (a Spark sink's tasks) make thousands."""
        saved = self._saved.get(journal)
        if saved is None or saved[0] != member:
            return _decode(journal, member)
        checkpoint, saved_at = saved[1]
        return TimedCheckpoint(checkpoint._replace(states=list(checkpoint.states)), saved_at)  # a list of its own

    def save_journal(
        self,
        journal: str,
        offset: int,
        states: Iterable[ProducerState],
        *,
        journal_id: str = "",
        base: int = 0,
        loaded: JournalCheckpoint | None = None,
    ) -> bool:
        """Store ``journal``'s checkpoint (``states`` valid after reading through ``offset``) atomically;
        returns whether it was stored.

        ``states`` replace the stored ones as a whole. A checkpoint at or below the stored position changes
        nothing (returns False). ``journal_id`` and ``base``: as the checkpoint loaded (see the module).
        ``loaded``: the checkpoint the caller loaded before; a save past its position writes without reading
        the stored one first (two round trips instead of three). That changes no outcome: the key's floor
        refuses a save that a newer one passed meanwhile (and a publishing application's claim raised the
        floor above every position), and only then is the stored checkpoint read, to say which it was.
        """
        if "|" in journal_id or ":" in journal_id or "," in journal_id:
            raise ConfigError(f"journal {journal}: identity {journal_id!r} must not contain '|', ':' or ','")
        _check_offsets(journal, offset=offset, base=base)
        key = self._journal_key(journal)
        position = base + offset
        text, decoded = encoded_states(journal, states)
        millis = round(time.time() * 1000)
        record = KeyScoreMember(key, float(position), f"{_VERSION}|{journal_id}|{base}|{offset}|{millis}|{text}")
        if decoded is not None and type(offset) is int and type(base) is int:  # else the text may decode otherwise
            checkpoint = JournalCheckpoint(offset, decoded, journal_id, base)
            self._saved[journal] = (str(record.member), TimedCheckpoint(checkpoint, millis / 1000))
        if loaded is None or position <= loaded.position:
            if not self._forward(journal, key, position):
                return False  # not forward: the stored record (and its time, when it last moved) stays
            stored = self.cluster.insert([record]).applied[0]
        else:
            stored = self.cluster.insert([record]).applied[0]
            if not stored and not self._forward(journal, key, position):
                return False  # refused by the floor: a newer save passed the loaded one (ConfigError if v4)
        if position >= 1:
            # Older records go, and the floor rises to just below this position: a zombie's older save is stale.
            try:
                self.cluster.forget([key], float(position - 1))
            except PartialWriteError as exc:
                # Harmless: loads rank the older snapshots below this one, and the next save forgets them.
                log.warning("checkpoint of %s saved at %d; forgetting older ones failed: %s", journal, position, exc)
        return stored

    def _forward(self, journal: str, key: str, position: int) -> bool:
        """Whether ``position`` is past the stored checkpoint of ``journal`` (one read); raises
        :class:`zcluster.ConfigError` when that is a publishing application's (``v4``: only its applier saves it)."""
        held = [r for r in self.cluster.select([key], limit=_ALL)[key] if str(r.member).startswith(_VERSIONS)]
        if any(str(r.member).startswith("v4|") for r in held):
            raise ConfigError(
                f"application {self.app}, journal {journal}: the checkpoint is a publishing application's (fenced, "
                "with ACK intents; zcluster.state.txn): only its applier saves it (restart_journal and skip_lost "
                "move it fenced). Nothing was changed"
            )
        return not held or max(r.score for r in held) < position

    def restart_journal(
        self, journal: str, journal_id: str = "", reason: str = "", *, publish: JournalStore | None = None
    ) -> JournalCheckpoint:
        """Start ``journal`` over: its next batch delivers the journal from offset 0, with no producer states,
        bound to ``journal_id`` (the journal's identity now; see :class:`JournalMismatchError`).

        The effects already applied stay. The restart is recorded in the application's audit log
        (:meth:`audit`) with ``reason``, before the checkpoint can move (as :meth:`skip_lost` says: never a
        move without its entry). Returns the new (empty) checkpoint.

        A publishing application's checkpoint (``v4``) is restarted fenced (:meth:`TxnStore.take_over
        <zcluster.state.txn.TxnStore.take_over>`): an applier still running on the journal gets
        :class:`zcluster.FencedError` on its next save and what it published since its last save never commits
        (unless that save landed before this claim read the checkpoint: adopted, it commits once);
        the last saved transaction's ACK intents are appended to ``publish`` (the journal store the application
        publishes to) first, so downstream sees that transaction committed, once; the new checkpoint keeps them
        either way and the application's next claim appends them (again: harmless). ``publish`` is not used
        otherwise.

        A publishing :class:`zcluster.spark.PositionedSink`'s checkpoint (``~<topic>/<partition>``) is refused
        (:class:`zcluster.ConfigError`, nothing changed): it follows the source's own offsets, so offset 0 would
        publish and commit its derived messages again while its increments stay fenced. Use a new ``query_name``.
        """
        if journal.startswith(PARTITION_MARK):
            raise ConfigError(
                f"application {self.app}: {journal} is a PositionedSink's checkpoint of topic-partition "
                f"{journal[len(PARTITION_MARK) :]}, which follows the source's own offsets: restarting it at offset "
                "0 would publish and commit its derived messages again while its increments stay fenced. Nothing "
                "was changed. To start over, run the query under a new query_name"
            )

        def audit(offset: int, stored_id: str) -> KeyScoreMember:
            details = {"offset": offset, "stored_id": stored_id, "journal_id": journal_id, "reason": reason}
            return self._record("restart", journal, details)

        if self._publishing(journal):

            def start_over(cp: TxnCheckpoint) -> TxnCheckpoint:
                return cp._replace(offset=0, states=[], journal_id=journal_id, base=cp.base + cp.offset + 1)

            _, moved = self._take_over_audited(
                journal, start_over, publish, lambda claimed: audit(claimed.offset, claimed.journal_id)
            )
            return JournalCheckpoint(0, [], journal_id, moved.base)
        held = self.load_journal(journal)
        restarted = JournalCheckpoint(0, [], journal_id, held.position + 1)
        audit(held.offset, held.journal_id)
        self.save_journal(journal, 0, [], journal_id=journal_id, base=restarted.base)
        return restarted

    def skip_lost(
        self,
        journals: object,
        journal: str,
        begin: int,
        end: int,
        reason: str = "",
        *,
        publish: JournalStore | None = None,
    ) -> JournalCheckpoint:
        """Move ``journal``'s checkpoint past its lost range [``begin``, ``end``): the one audited way past
        bytes a file journal lost (see :mod:`zcluster.state.lost`). ``journals``: the journal store, which
        must report exactly that range as lost (:meth:`zcluster.journal.FileJournals.lost_ranges`), and the
        checkpoint must lie at its begin (everything before it applied) or inside it. Anything else raises
        :class:`zcluster.ConfigError` and changes nothing. Producer states are kept as they are. Recorded
        in :meth:`audit` with ``reason`` *before* the checkpoint can move: the checkpoint never moves past the
        range without its audit entry (an audit write that fails moves nothing). Returns the new checkpoint.

        A publishing application's checkpoint (``v4``) is moved fenced, as :meth:`restart_journal` says (a running
        applier fenced; the last saved transaction's intents appended to ``publish`` first, or kept in the new
        checkpoint without it). The checks run again on the checkpoint claimed: if an applier moved it in between,
        :class:`zcluster.ConfigError` says so, and the claim stays (an unchanged copy of the checkpoint). The entry
        is written last before the fenced save; if that save is fenced (:class:`zcluster.FencedError`) the entry
        stays unless the store shows the save refused (see :meth:`_take_over_audited`).
        """
        _check_offsets(journal, begin=begin, end=end)
        held, journal_id = _check_skip(self, journals, journal, begin, end)
        if self._publishing(journal):

            def past(cp: TxnCheckpoint) -> TxnCheckpoint:
                if (cp.offset, cp.base, cp.journal_id) != (held.offset, held.base, held.journal_id):
                    raise ConfigError(
                        f"application {self.app}: the checkpoint of journal {journal} moved while skipping lost "
                        f"range {begin}..{end} (offset {held.offset} -> {cp.offset}): an applier is running on it. "
                        "Nothing was skipped (the journal was claimed: its applier claims it again); try again"
                    )
                return cp._replace(offset=end, journal_id=journal_id)

            def audit(cp: TxnCheckpoint) -> KeyScoreMember:
                return self.record_skip(
                    journal, begin, end, cp.offset, reason, by="operator", base=cp.base, journal_id=journal_id
                )

            _, moved = self._take_over_audited(journal, past, publish, audit)
            return JournalCheckpoint(moved.offset, moved.states, moved.journal_id, moved.base)
        self.record_skip(journal, begin, end, held.offset, reason, by="operator", base=held.base, journal_id=journal_id)
        self.save_journal(journal, end, held.states, journal_id=journal_id, base=held.base)
        return JournalCheckpoint(end, held.states, journal_id, held.base)

    def _take_over_audited(
        self,
        journal: str,
        move: Callable[[TxnCheckpoint], TxnCheckpoint],
        publish: JournalStore | None,
        audit: Callable[[TxnCheckpoint], KeyScoreMember],
    ) -> tuple[TxnCheckpoint, TxnCheckpoint]:
        """:meth:`TxnStore.take_over` with its audit entry (``audit(claimed)``, the entry written) last before the
        fenced save, since a claim racing the save may adopt it (the checkpoint moves, the save raises FencedError).
        After a failed save the entry is withdrawn only if the store shows the save refused: its record not held
        (held, it stays adoptable until the fencing claim's last read), the checkpoint's position below the saved
        one. Any doubt (the check or the withdrawal failing) keeps it."""
        txns = TxnStore(self)
        written: list[tuple[KeyScoreMember, TxnCheckpoint]] = []

        def before_save(claimed: TxnCheckpoint, ranked: TxnCheckpoint) -> None:
            written.append((audit(claimed), ranked))

        try:
            return txns.take_over(journal, move, publish, before_save=before_save)
        except Exception:
            if not written:
                raise  # failed before the entry: nothing moved, nothing audited
            entry, ranked = written[0]
            try:
                newest = txns.load(journal)
                if txns.holds(journal, ranked) or newest.base + newest.offset >= ranked.base + ranked.offset:
                    log.warning("application %s, journal %s: a claim may have adopted the fenced save (the checkpoint "
                                "then moved): its audit entry is kept", self.app, journal)  # fmt: skip
                else:
                    self.cluster.delete([entry])
            except ShardError as exc:
                log.warning("application %s, journal %s: the audit entry is kept: %s", self.app, journal, exc)
            raise

    def _publishing(self, journal: str) -> bool:
        """Whether ``journal``'s checkpoint is a publishing application's (``v4``: :mod:`zcluster.state.txn`)."""
        key = self._journal_key(journal)
        return any(str(r.member).startswith("v4|") for r in self.cluster.select([key], limit=_ALL)[key])

    def record_skip(
        self,
        journal: str,
        begin: int,
        end: int,
        offset: int,
        reason: str,
        *,
        by: str,
        base: int = 0,
        journal_id: str = "",
    ) -> KeyScoreMember:
        """Record in :meth:`audit` that the lost range [begin, end) of ``journal`` was skipped from checkpoint
        offset ``offset`` (``by``: ``operator``, or ``applier`` for ``fail_on_data_loss=False``; ``base`` and
        ``journal_id``: the checkpoint's). Recording the same skip again (a retried batch) keeps one entry.
        Returns the entry as written (deleting it withdraws it)."""
        details: dict[str, object] = dict(
            begin=begin, end=end, offset=offset, base=base, journal_id=journal_id, reason=reason, by=by
        )
        return self._record("skip", journal, details, timed=False)

    def audit(self) -> list[dict[str, object]]:
        """What was done to this application's checkpoints besides reading them, oldest first (one dict per
        action, with ``action``, ``journal`` and ``at``, a Unix time)."""
        key = self.audit_key
        return audit_entries(self.cluster.select([key], limit=_ALL)[key])

    @property
    def audit_key(self) -> str:
        """The key of the audit log in the store's view (:attr:`cluster`)."""
        return f"{self.app}/audit"

    def _record(self, action: str, journal: str, details: dict[str, object], *, timed: bool = True) -> KeyScoreMember:
        """One audit entry, returned; ``timed=False`` leaves the time out of the member (it is the score, and
        :meth:`audit` reads it from there), so that the same entry written twice stays one."""
        when = time.time()
        doc = {"action": action, "journal": journal, **({"at": when} if timed else {}), **details}
        entry = KeyScoreMember(self.audit_key, when, json.dumps(doc, sort_keys=True))
        self.cluster.insert([entry])
        return entry

    # -- progress --------------------------------------------------------------------------------------------

    def committed_batch(self, query_id: str) -> int | None:
        """The last batch id committed for ``query_id``, or None."""
        p = self.cluster.score([KeyMember(f"{self.app}/progress", query_id)])[
            KeyMember(f"{self.app}/progress", query_id)
        ]
        return int(p.score) if p.present and p.inserted and not math.isnan(p.score) else None

    def commit_batch(self, query_id: str, batch_id: int) -> bool:
        """Record batch ``batch_id`` of ``query_id`` as committed; False if it (or a later one) already was."""
        return self.cluster.insert([KeyScoreMember(f"{self.app}/progress", float(batch_id), query_id)]).applied[0]


def audit_entries(records: Sequence[KeyScoreMember]) -> list[dict[str, object]]:
    """The entries of :meth:`StateStore.audit` held by ``records`` (the audit key's, as read), oldest first."""
    out = []
    for r in reversed(records):
        doc = json.loads(str(r.member))
        doc.setdefault("at", r.score)
        out.append(doc)
    return out


def _check_offsets(journal: str, **offsets: object) -> None:
    """Byte offsets are non-negative ints (not bools, not floats such as ``3710.0``, which a record would keep
    as text no reader parses): :class:`ConfigError` naming the journal and the value otherwise."""
    for name, value in offsets.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ConfigError(
                f"journal {journal}: {name} must be a non-negative int (a byte offset), got {value!r}. "
                "Nothing was changed"
            )


def _check_skip(
    state: StateStore, journals: object, journal: str, begin: int, end: int
) -> tuple[JournalCheckpoint, str]:
    """The checks of :meth:`StateStore.skip_lost`: the stored checkpoint and the journal's identity to bind
    the moved checkpoint to; :class:`ConfigError` (nothing changed) when the skip is not allowed, and
    :class:`zcluster.state.JournalMismatchError` when the checkpoint is of another journal of that name."""
    app = state.app
    lost_ranges = getattr(journals, "lost_ranges", None)
    if lost_ranges is None:
        raise ConfigError(
            f"application {app}: the journal store {type(journals).__name__} keeps no lost ranges; nothing "
            f"of journal {journal} can be skipped"
        )
    ranges = list(lost_ranges(journal))
    if not any((r.begin, r.end) == (begin, end) for r in ranges):
        known = ", ".join(f"{r.begin}..{r.end}" for r in ranges) or "none"
        raise ConfigError(
            f"application {app}: bytes {begin}..{end} are not a lost range of journal {journal} (its lost ranges: "
            f"{known}); only exactly a reported lost range can be skipped. Nothing was changed"
        )
    held = state.load_journal(journal)
    info = getattr(journals, "info", None)
    current = info(journal).uid if info is not None else ""
    if held.journal_id and current and held.journal_id != current:
        raise JournalMismatchError(app, journal, held.offset, None, held.journal_id, current)
    if held.offset < begin:
        raise ConfigError(
            f"application {app}: the checkpoint of journal {journal} is at offset {held.offset}, before the lost "
            f"range {begin}..{end}: bytes {held.offset}..{begin} are not applied yet. Run the consumer first (it "
            "applies everything up to the lost range and stops there), then skip it. Nothing was changed"
        )
    if held.offset >= end:
        raise ConfigError(
            f"application {app}: the checkpoint of journal {journal} is at offset {held.offset}, already past the "
            f"lost range {begin}..{end}. Nothing was changed"
        )
    return held, held.journal_id or current
