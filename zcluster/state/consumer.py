"""A plain Python exactly-once consumer: journals into the cluster, no Spark.

It is the same :class:`Applier` the Spark sink runs, driven by a loop: for each journal, read the bytes
from its checkpoint offset to its current end and apply them. Checkpoints live in the cluster, keyed by
``app``, so a consumer that crashes (at any point) and starts again continues exactly once, and a Spark
query with the same ``query_name`` shares the same progress.

Each journal is its own ordered stream: a journal that fails (its mapper raises, a lost range, a journal
created again under its name, a shard that keeps failing) keeps its checkpoint and is reported, and the
other journals go on. :meth:`Consumer.poll` raises :class:`PollError` after trying every journal;
:meth:`Consumer.run` logs it and keeps polling, so the failing journal is reported on every poll.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from zcluster.errors import PollError
from zcluster.journal.store import JournalStore, close_store
from zcluster.journal.urls import open_store
from zcluster.message.errors import JournalListError
from zcluster.state.applier import Applier, Mapper
from zcluster.state.batch import BatchStats
from zcluster.types import Store

__all__ = ["Consumer", "JournalFailure"]

log = logging.getLogger("zcluster.state")


class JournalFailure(NamedTuple):
    """A journal a poll could not apply: it stays at its checkpoint ``offset`` (None if that could not be
    read either; the reason is noted on ``error``) and is tried again by the next poll."""

    journal: str
    offset: int | None
    error: Exception

    @property
    def at(self) -> str:
        """Where the journal stays, for messages: ``at offset 120``; with ``offset`` None (reading the checkpoint
        failed too, e.g. its shard is down), ``at its stored checkpoint (its offset could not be read)``."""
        return (
            f"at offset {self.offset}"
            if self.offset is not None
            else "at its stored checkpoint (its offset could not be read)"
        )


class Consumer:
    """Applies the journals of ``journals`` (a store or its URL) matching ``selector`` into ``cluster``,
    exactly once for application ``app``.

    ``mapper`` turns each committed message into writes (deterministically); ``decode``, ``flush``,
    ``retries``, ``prune_horizon`` and ``fail_on_data_loss`` are the :class:`Applier`'s (the last, False:
    skip the lost ranges of file journals, each logged, counted and audited, instead of stopping before
    them; see :mod:`zcluster.state.lost`). ``metrics``: called with ``(app, stats)`` after every poll,
    also one that failed (e.g. a :class:`zcluster.metrics.ApplierMetrics`). Journals are applied one after
    another (one journal is one ordered stream; run several consumers with disjoint selectors to go wider).
    Several consumers with the same ``app`` on the same journals are safe (each write is idempotent and
    checkpoints only move forward) but do the work twice.

    ``publish``: a journal store (or its URL; may be ``journals`` itself) that the mapper's
    :class:`zcluster.Publish` messages go to, exactly once: each journal's poll is a transaction whose
    messages commit when its checkpoint is saved (:mod:`zcluster.state.txn`). A publishing consumer claims each
    journal on its first poll of it (fencing any other process of the same ``app`` there, whose transaction then
    fails with :class:`zcluster.FencedError`: it commits once if the claim adopted its save, else never), and
    appends the last checkpoint's ACK intents again before anything new. A publishing consumer's ``cluster``
    must not be a farm (:class:`zcluster.ConfigError`: the fencing needs reads that see every acknowledged
    write, see :mod:`zcluster.state.txn`).
    """

    def __init__(
        self,
        cluster: Store,
        journals: JournalStore | str,
        mapper: Mapper,
        app: str,
        *,
        selector: str = "",
        decode: Callable[[Any], Any] | None = None,
        flush: int = 16384,
        retries: int = 5,
        prune_horizon: float | None = None,
        fail_on_data_loss: bool = True,
        metrics: Callable[[str, BatchStats], None] | None = None,
        publish: JournalStore | str | None = None,
    ) -> None:
        self._owned = isinstance(journals, str)
        self.store: JournalStore = open_store(journals) if isinstance(journals, str) else journals
        self._owned_publish = isinstance(publish, str)
        self.publish: JournalStore | None = open_store(publish) if isinstance(publish, str) else publish
        self.selector = selector
        self.metrics = metrics
        self.applier = Applier(
            cluster,
            app,
            mapper,
            self.store,
            decode=decode,
            flush=flush,
            retries=retries,
            prune_horizon=prune_horizon,
            fail_on_data_loss=fail_on_data_loss,
            publish=self.publish,
        )

    def poll(self) -> BatchStats:
        """Apply everything the journals hold now; returns what was done.

        A journal that fails (what the applier raises: :class:`zcluster.MapperError`,
        :class:`zcluster.state.JournalMismatchError`, :class:`zcluster.ShardError`, a lost range's
        :class:`zcluster.message.OffsetOutOfRangeError`, ...) keeps its previous checkpoint and the next poll
        continues from there; the other journals are applied all the same, then :class:`PollError` is
        raised naming every failed journal. A journal directory the store cannot list
        (:class:`zcluster.message.JournalListError`, e.g. no permission) is a failed journal too, named by
        its path under the store's root; any other listing failure raises at once."""
        started = time.perf_counter()
        stats = BatchStats()
        failures: list[JournalFailure] = []
        try:
            specs = self.store.list(self.selector)
        except JournalListError as exc:
            specs = exc.listed
            for where, error in exc.unreadable.items():
                failures.append(JournalFailure(where, self._offset(where, error), error))
        for spec in specs:
            try:
                end = self.store.end(spec.name)
                self.applier.apply_range(self.store, spec.name, spec.labels["content-type"], 0, end, stats)
            except Exception as exc:
                offset = self._offset(spec.name, exc)
                failures.append(JournalFailure(spec.name, offset, exc))
                if offset is not None:  # a journal that stays behind: its lag keeps growing
                    with contextlib.suppress(Exception):
                        stats.lag[spec.name] = max(0, self.store.end(spec.name) - offset)
        stats.seconds = time.perf_counter() - started
        if self.metrics is not None:
            self.metrics(self.applier.app, stats)
        if failures:
            raise PollError(failures, stats)
        return stats

    def _offset(self, journal: str, error: Exception) -> int | None:
        try:
            return self.applier.state().load_journal(journal).offset
        except Exception as exc:  # kept with the journal's own error, which is what gets raised
            error.add_note(f"reading the checkpoint of {journal} failed too: {type(exc).__name__}: {exc}")
            return None

    def run(self, stop: threading.Event, interval: float = 1.0) -> None:
        """Poll until ``stop`` is set, waiting ``interval`` seconds after a poll that found nothing or
        failed. A :class:`PollError` is logged (every failed journal, each poll) and polling goes on; any
        other error (listing the journals) propagates."""
        while not stop.is_set():
            try:
                found = self.poll().frames
            except PollError as exc:
                for f in exc.failures:
                    log.error("journal %s stays %s: %s: %s", f.journal, f.at, type(f.error).__name__, f.error)
                found = 0
            if found == 0:
                stop.wait(interval)

    def close(self) -> None:
        """Close the journal stores this consumer opened from URLs (the cluster is the caller's)."""
        if self._owned:
            close_store(self.store)
        if self._owned_publish and self.publish is not None:
            close_store(self.publish)

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
