"""How far behind is it: the progress and lag of the applications whose checkpoints the cluster holds.

What ``zcluster consumers`` prints, as an API a health check can call:

* :func:`applications`: the application ids with checkpoints (a SCAN of the state namespace; no registry);
* :func:`progress`: per journal of one application, a :class:`JournalProgress`: its checkpoint (offset,
  producer states, open transactions, when it last moved), the journal's end (its write head) and the lag
  between them in bytes (and frames, on request: that reads the lag), the lost ranges ahead, the lost
  ranges skipped (from the audit log), and what stops the application there, if anything.

Reading only: nothing here writes to the cluster or the journals (journal stores given by URL are opened
without recovery).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from zcluster.journal.frames import read_frames
from zcluster.journal.store import CONTENT_TYPE_LABEL, JournalStore, close_store
from zcluster.journal.urls import open_store
from zcluster.message.errors import JournalNotFoundError
from zcluster.state.store import StateStore, TimedCheckpoint
from zcluster.types import Store

__all__ = ["JournalProgress", "SkippedRange", "applications", "checkpointed_journals", "lag_frames", "progress"]

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
    missing from the store), else None.
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


def _state_view(cluster: Store, namespace: str) -> Any:
    return cluster.view(namespace, floors=True)


def _text(key: object) -> str:
    return key.decode("utf-8", "surrogateescape") if isinstance(key, bytes) else str(key)


def applications(cluster: Store, namespace: str = _NAMESPACE) -> list[str]:
    """The ids of the applications whose checkpoints ``cluster`` holds, sorted (a SCAN of ``namespace``)."""
    found: set[str] = set()
    for batch in _state_view(cluster, namespace).keys(1000, match="*/journal/*"):
        found.update(_text(k).split("/", 1)[0] for k in batch)
    return sorted(found)


def checkpointed_journals(cluster: Store, app: str, namespace: str = _NAMESPACE) -> list[str]:
    """The journals application ``app`` holds checkpoints of, sorted (a SCAN of ``namespace``)."""
    prefix = f"{app}/journal/"
    found: set[str] = set()
    for batch in _state_view(cluster, namespace).keys(1000, match=prefix.translate(_GLOB) + "*"):
        found.update(_text(k)[len(prefix) :] for k in batch)
    return sorted(found)


def progress(
    cluster: Store,
    app: str,
    journals: JournalStore | str | None = None,
    *,
    selector: str | None = None,
    frames: bool = False,
    namespace: str = _NAMESPACE,
) -> list[JournalProgress]:
    """Where application ``app`` stands in each of its journals (see :class:`JournalProgress`).

    The journals are those it holds checkpoints of, and with ``selector`` (a label selector; "" for all)
    also the journal store's journals that match it (an application that has not reached one yet shows it
    at offset 0). ``journals``: the journal store (or its URL) for the ends, lags and lost ranges; without
    it only the checkpoints are known. ``frames``: count the frames of each lag too (reads them).
    """
    state = StateStore(cluster, app, namespace)
    names = set(checkpointed_journals(cluster, app, namespace))
    store: Any = open_store(journals, recover=False) if isinstance(journals, str) else journals
    try:
        if selector is not None and store is not None:
            names.update(spec.name for spec in store.list(selector))
        ordered = sorted(names)
        keys = [f"{app}/journal/{name}" for name in ordered]
        records = state.cluster.select(keys, limit=1_000_000) if keys else {}
        skips = _skips(state.audit())
        return [
            _journal(app, store, name, state.timed(name, records[key]), bool(records[key]), skips.get(name, ()), frames)
            for name, key in zip(ordered, keys, strict=True)
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


def _journal(
    app: str,
    store: Any,
    name: str,
    timed: TimedCheckpoint,
    checkpointed: bool,
    skipped: tuple[SkippedRange, ...],
    frames: bool,
) -> JournalProgress:
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
        checkpointed=checkpointed,
        journal_id=checkpoint.journal_id,
        skipped=skipped,
    )
    if store is None:
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
    counted = lag_frames(store, name, info.labels.get(CONTENT_TYPE_LABEL, ""), offset, end) if frames else None
    return replace(held, end=end, lag_bytes=lag, lag_frames=counted, lost=lost, error=stopped)


def lag_frames(store: Any, name: str, content_type: str, begin: int, end: int) -> int | None:
    """The frames of bytes [begin, end) of journal ``name`` (lost ranges and bytes that do not frame not
    counted), or None if reading them failed (logged)."""
    if begin >= end:
        return 0
    try:
        return sum(1 for row in read_frames(store, name, content_type, begin, end, lost_rows=True) if row.error is None)
    except Exception as exc:  # a count is a nicety: say why it is missing, show the rest
        log.warning("journal %s: counting the frames of bytes %d..%d failed: %s", name, begin, end, exc)
        return None
