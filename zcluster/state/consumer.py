"""A plain Python exactly-once consumer: journals into the cluster, no Spark.

It is the same :class:`Applier` the Spark sink runs, driven by a loop: for each journal, read the bytes
from its checkpoint offset to its current end and apply them. Checkpoints live in the cluster, keyed by
``app``, so a consumer that crashes (at any point) and starts again continues exactly once, and a Spark
query with the same ``query_name`` shares the same progress.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from zcluster.farm.config import Store
from zcluster.journal.store import JournalStore, close_store
from zcluster.journal.urls import open_store
from zcluster.state.applier import Applier, BatchStats, Mapper

__all__ = ["Consumer"]


class Consumer:
    """Applies the journals of ``journals`` (a store or its URL) matching ``selector`` into ``cluster``,
    exactly once for application ``app``.

    ``mapper`` turns each committed message into writes (deterministically); ``decode``, ``flush``,
    ``retries`` and ``prune_horizon`` are the :class:`Applier`'s. Journals are applied one after another
    (one journal is one ordered stream; run several consumers with disjoint selectors to go wider).
    Several consumers with the same ``app`` on the same journals are safe (each write is idempotent and
    checkpoints only move forward) but do the work twice.
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
    ) -> None:
        self._owned = isinstance(journals, str)
        self.store: JournalStore = open_store(journals) if isinstance(journals, str) else journals
        self.selector = selector
        self.applier = Applier(
            cluster, app, mapper, self.store, decode=decode, flush=flush, retries=retries, prune_horizon=prune_horizon
        )

    def poll(self) -> BatchStats:
        """Apply everything the journals hold now; returns what was done. Raises what the applier raises
        (:class:`zcluster.state.MapperError`, :class:`zcluster.ShardError`); the journal being applied
        then keeps its previous checkpoint, and the next poll continues from there."""
        stats = BatchStats()
        for spec in self.store.list(self.selector):
            end = self.store.end(spec.name)
            self.applier.apply_range(self.store, spec.name, spec.labels["content-type"], 0, end, stats)
        return stats

    def run(self, stop: threading.Event, interval: float = 1.0) -> None:
        """Poll until ``stop`` is set, waiting ``interval`` seconds after a poll that found nothing."""
        while not stop.is_set():
            if self.poll().frames == 0:
                stop.wait(interval)

    def close(self) -> None:
        """Close the journal store if this consumer opened it from a URL (the cluster is the caller's)."""
        if self._owned:
            close_store(self.store)

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
