"""How far behind is it: the progress and lag of the applications whose checkpoints the cluster holds.

What ``zcluster consumers`` prints, as an API a health check can call:

* :func:`applications`: the application ids with checkpoints (a SCAN of the state namespace; no registry),
  and :func:`checkpoints`: each one's checkpointed journals too, from that one SCAN;
* :func:`progress`: per journal of one application, a :class:`JournalProgress`: its checkpoint (offset,
  producer states, open transactions, when it last moved), the journal's end (its write head) and the lag
  between them in bytes (and frames, on request: that reads the lag), the lost ranges ahead, the lost
  ranges skipped (from the audit log), and what stops the application there, if anything.

The verdict is the consumer's: with a journal store, :func:`progress` reads each lag the way the consumer's
next poll reads it (the same reader, :func:`zcluster.journal.frames.read_range_frames`), so damage the
journal store has not recovered yet (a fragment file cut short, unreadable or missing) is reported as the
error the consumer meets, not as ``ok``. That read costs what the next poll's read costs (``verify=False``
skips it: ends and lost ranges only). A checkpoint record that does not parse is reported on its journal
(:class:`zcluster.InconsistentDataError`'s text), the other journals as usual.

Reading only: nothing here writes to the cluster or the journals: journal stores given by URL are opened
without recovery and without creating anything (a missing root raises
:class:`zcluster.message.JournalNotFoundError`), and the lag is read without recovering what it finds.
With ``failures`` (a list), a shard that fails does not raise: its failures are appended to the list and
the rest is returned (the journals whose checkpoints it holds are missing; their lost-range skips too when
it holds the audit log).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from zcluster.errors import InconsistentDataError, PartialScanError
from zcluster.journal.frames import read_range_frames
from zcluster.journal.store import CONTENT_TYPE_LABEL, JournalStore, close_store
from zcluster.journal.urls import open_store
from zcluster.message.errors import JournalNotFoundError, MessageError
from zcluster.state.store import StateStore, audit_entries
from zcluster.state.txn import PARTITION_MARK, V4, TxnStore, decode_v4
from zcluster.types import ShardFailure, Store

__all__ = ["JournalProgress", "SkippedRange", "applications", "checkpointed_journals", "progress"]

log = logging.getLogger("zcluster.state")

_NAMESPACE = "zcstate:"
_GLOB = str.maketrans({c: "\\" + c for c in "*?[]\\"})


@dataclass(frozen=True)
class SkippedRange:
    """A lost range [``begin``, ``end``) the application went past from checkpoint ``offset``, ``by`` an
    ``operator`` (skip-lost) or the ``applier`` (``fail_on_data_loss=False``), at Unix time ``at``."""

    begin: int
    end: int
    offset: int
    reason: str
    by: str
    at: float


@dataclass(frozen=True)
class JournalProgress:
    """One journal of an application.

    ``offset``: the checkpoint (bytes read through; 0 with no checkpoint, ``checkpointed`` False).
    ``end``: the journal's end now (its write head), ``lag_bytes`` = ``end - offset``, ``lag_frames``: the
    frames in between when asked for (None otherwise, or unknown). ``producers``: producer states held;
    ``open_transactions``: those with a transaction still open (its messages wait for an ACK).
    ``last_moved``: when the checkpoint last moved (Unix time; None for a checkpoint older than that record).
    ``lost``: the journal's lost ranges at or after the checkpoint, as ``(begin, end, reason)``;
    ``skipped``: the lost ranges skipped so far. ``error``: why the application cannot go on in this
    journal (stopped before a lost range, a journal created again, a checkpoint past the end, a journal
    missing from the store), else None. ``ack_intents``: for a publishing application
    (:mod:`zcluster.state.txn`), the journals its last checkpoint holds ACK intents for: appended right after
    that save, unless the process died in between; a process that claims the journal appends them again
    (``generation``: the checkpoint's claim generation, None for a non-publishing application). A publishing
    :class:`zcluster.spark.PositionedSink`'s partitions show as ``~<topic>/<partition>``, ``offset`` the next
    row's offset (no journal to measure a lag in).
    """

    journal: str
    offset: int
    end: int | None
    lag_bytes: int | None
    lag_frames: int | None
    producers: int
    open_transactions: int
    last_moved: float | None
    checkpointed: bool
    journal_id: str
    lost: tuple[tuple[int, int, str], ...] = ()
    skipped: tuple[SkippedRange, ...] = ()
    error: str | None = None
    ack_intents: tuple[str, ...] = ()
    generation: int | None = None


def _state_view(cluster: Store, namespace: str) -> Any:
    return cluster.view(namespace, floors=True)


def _text(key: object) -> str:
    return key.decode("utf-8", "surrogateescape") if isinstance(key, bytes) else str(key)


def _scan(cluster: Store, namespace: str, match: str, failures: list[ShardFailure] | None) -> list[str]:
    """The keys of ``namespace`` matching ``match``; with ``failures``, a shard that fails is appended there."""
    found: list[str] = []
    try:
        for batch in _state_view(cluster, namespace).keys(1000, match=match):
            found.extend(_text(k) for k in batch)
    except PartialScanError as exc:  # the other shards were scanned
        if failures is None:
            raise
        failures.extend(exc.failures)
    return found


def applications(
    cluster: Store, namespace: str = _NAMESPACE, *, failures: list[ShardFailure] | None = None
) -> list[str]:
    """The ids of the applications whose checkpoints ``cluster`` holds, sorted (a SCAN of ``namespace``).
    ``failures``: see the module (those of the shards that could not be scanned are missing)."""
    return sorted(checkpoints(cluster, namespace, failures=failures))


def checkpoints(
    cluster: Store, namespace: str = _NAMESPACE, *, failures: list[ShardFailure] | None = None
) -> dict[str, list[str]]:
    """Each application with checkpoints -> the journals it holds checkpoints of, sorted: one SCAN of
    ``namespace`` for them all (a view of every application reads this once, not one SCAN per application).
    ``failures``: see the module."""
    found: dict[str, set[str]] = {}
    for key in _scan(cluster, namespace, "*/journal/*", failures):
        app, _, rest = key.partition("/")  # as applications name their keys: "<app>/journal/<journal>"
        if rest.startswith("journal/"):
            found.setdefault(app, set()).add(rest[len("journal/") :])
    return {app: sorted(journals) for app, journals in sorted(found.items())}


def checkpointed_journals(
    cluster: Store, app: str, namespace: str = _NAMESPACE, *, failures: list[ShardFailure] | None = None
) -> list[str]:
    """The journals application ``app`` holds checkpoints of, sorted (a SCAN of ``namespace``).
    ``failures``: see the module."""
    prefix = f"{app}/journal/"
    return sorted({k[len(prefix) :] for k in _scan(cluster, namespace, prefix.translate(_GLOB) + "*", failures)})


def progress(
    cluster: Store,
    app: str,
    journals: JournalStore | str | None = None,
    *,
    selector: str | None = None,
    frames: bool = False,
    verify: bool = True,
    namespace: str = _NAMESPACE,
    failures: list[ShardFailure] | None = None,
    checkpointed: Iterable[str] | None = None,
) -> list[JournalProgress]:
    """Where application ``app`` stands in each of its journals (see :class:`JournalProgress`).

    The journals are those it holds checkpoints of, and with ``selector`` (a label selector; "" for all)
    also the journal store's journals that match it (an application that has not reached one yet shows it
    at offset 0). ``journals``: the journal store (or its URL) for the ends, lags and lost ranges; without
    it only the checkpoints are known. ``verify``: read each lag as the consumer will (see the module);
    ``frames``: count the frames of each lag too (that read). ``failures``: see the module.
    ``checkpointed``: the journals ``app`` holds checkpoints of, when the caller read them already
    (:func:`checkpoints`); None: a SCAN of ``namespace`` finds them.
    """
    state = StateStore(cluster, app, namespace)
    if checkpointed is None:
        checkpointed = checkpointed_journals(cluster, app, namespace, failures=failures)
    names = set(checkpointed)
    store: Any = open_store(journals, recover=False, create=False) if isinstance(journals, str) else journals
    try:
        if selector is not None and store is not None:
            names.update(spec.name for spec in store.list(selector))
        ordered = sorted(names)
        keys = [f"{app}/journal/{name}" for name in ordered]
        read = state.cluster.select([*keys, state.audit_key], limit=1_000_000, strict=failures is None)
        if failures is not None:
            failures.extend({id(f): f for f in read.errors.values()}.values())  # one per failed shard call
        skips = _skips(audit_entries(read.get(state.audit_key, [])))
        return [
            _journal(state, store, name, read[key], skips.get(name, ()), frames, verify)
            for name, key in zip(ordered, keys, strict=True)
            if key in read
        ]
    finally:
        if isinstance(journals, str) and store is not None:
            close_store(store)


def _skips(audit: Iterable[dict[str, Any]]) -> dict[str, tuple[SkippedRange, ...]]:
    out: dict[str, list[SkippedRange]] = {}
    for doc in audit:
        if doc.get("action") == "skip":
            skipped = SkippedRange(
                int(doc["begin"]),
                int(doc["end"]),
                int(doc.get("offset", doc["begin"])),
                str(doc.get("reason", "")),
                str(doc.get("by", "")),
                float(doc["at"]),
            )
            out.setdefault(str(doc["journal"]), []).append(skipped)
    return {journal: tuple(found) for journal, found in out.items()}


def _publishing(records: list[Any]) -> dict[str, Any]:
    """``ack_intents`` and ``generation`` of a publishing application's checkpoint records (none: nothing)."""
    newest = TxnStore.newest(records)
    if newest is None or not str(newest.member).startswith(V4):
        return {}
    gen, _, _, _, intents = decode_v4(str(newest.member).split("|")[6:])
    return {"ack_intents": tuple(i.journal for i in intents), "generation": gen}


def _journal(
    state: StateStore,
    store: Any,
    name: str,
    records: list[Any],
    skipped: tuple[SkippedRange, ...],
    frames: bool,
    verify: bool,
) -> JournalProgress:
    app = state.app
    try:
        timed = state.timed(name, records)
    except InconsistentDataError as exc:  # this journal's record only: the others are shown
        return JournalProgress(name, 0, None, None, None, 0, 0, None, True, "", skipped=skipped, error=str(exc))
    checkpoint = timed.checkpoint
    offset = checkpoint.offset
    held = JournalProgress(
        journal=name,
        offset=offset,
        end=None,
        lag_bytes=None,
        lag_frames=None,
        producers=len(checkpoint.states),
        open_transactions=sum(1 for s in checkpoint.states if s.begin >= 0),
        last_moved=timed.saved_at,
        checkpointed=bool(records),
        journal_id=checkpoint.journal_id,
        skipped=skipped,
        **_publishing(records),
    )
    if store is None or name.startswith(PARTITION_MARK):  # a positioned source's partition: no journal to read
        return held
    try:
        info = store.info(name)
        end = store.end(name)
        lost_ranges = getattr(store, "lost_ranges", None)
        lost = tuple((r.begin, r.end, r.reason) for r in lost_ranges(name) if r.end > offset) if lost_ranges else ()
    except JournalNotFoundError:
        return replace(held, error=f"journal {name} is not in the journal store (destroyed, or another store)")
    if checkpoint.journal_id and info.uid and checkpoint.journal_id != info.uid:
        error = (
            f"journal {name} was created again (identity {info.uid}, checkpoint of {checkpoint.journal_id}): "
            f"StateStore({app!r}).restart_journal({name!r}) delivers it from its start"
        )
        return replace(held, end=end, lost=lost, error=error)
    if offset > end:
        return replace(held, end=end, lost=lost, error=f"the checkpoint lies past the journal's end {end}")
    at = next(((b, e) for b, e, _ in lost if b <= offset < e), None)
    stopped = None
    if at is not None:
        stopped = (
            f"stopped before lost range {at[0]}..{at[1]}: to go past it, zcluster consumers {app} skip-lost {name}"
        )
    lag = end - offset
    counted, failed = None, None
    if verify or frames:
        counted, failed = _read_lag(store, name, info.labels.get(CONTENT_TYPE_LABEL, ""), offset, end)
    return replace(
        held, end=end, lag_bytes=lag, lag_frames=counted if frames else None, lost=lost, error=stopped or failed
    )


class _WithoutRecovery:
    """A journal store's reads only: :func:`zcluster.journal.frames.read_range` finds no ``recover`` to call,
    so a read that comes up short raises where the consumer's read would recover (a write) and then fail."""

    def __init__(self, store: Any) -> None:
        self.read = store.read


def _read_lag(store: Any, name: str, content_type: str, begin: int, end: int) -> tuple[int | None, str | None]:
    """Read bytes [begin, end) of journal ``name`` as the consumer's next poll reads them, recovering nothing:
    (the frames read, lost ranges and bytes that do not frame not counted; the error the read met, or None).
    Lost ranges are read past (they are reported on their own), as ``fail_on_data_loss=False`` reads them."""
    counted = 0
    try:
        rows = read_range_frames(_WithoutRecovery(store), name, content_type, begin, end, lost_rows=True)
        for row in rows:
            counted += row.error is None
    except (MessageError, OSError) as exc:  # what the consumer's poll fails on: damage, an unreadable file
        log.warning("journal %s: reading bytes %d..%d failed: %s: %s", name, begin, end, type(exc).__name__, exc)
        return None, f"the lag cannot be read (as the consumer's next poll reads it): {type(exc).__name__}: {exc}"
    return counted, None
