"""What a migration reports: its progress while it runs, and what it did when it ends."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Progress:
    """Where a migration is: ``phase`` (``copying``, ``catching up``, ``cutting``, ``cleaning``, ``done``),
    keys scanned and copied so far, keys deleted on the target (gone from the source), the copy rate
    (keys scanned per second), an estimate of the seconds left in the pass (None when unknown)."""

    phase: str
    scanned: int = 0
    copied: int = 0
    deleted: int = 0
    rate: float = 0.0
    eta: float | None = None


@dataclass
class MigrationReport:
    """What a finished :meth:`Migration.run` did. ``pause``: seconds clients waited at the cut-over (from the first
    source marker set to ``cutting`` to the last set to ``done``; a run that finished the cut-over of a mover killed in
    it reports only its own part, and no keys copied); ``final_keys``: keys copied during it; ``rounds``: catch-up
    rounds before it; ``passes``: copy passes (more than one when a listener lost its subscription); ``removed``: keys
    deleted from servers of both layouts after the cut-over; ``others``: keys laid out as zcluster's (``{...``) in none
    of the namespaces, left in place (``keep_others``)."""

    migration: str
    target_layout: str
    scanned: int = 0
    copied: int = 0
    deleted: int = 0
    rounds: int = 0
    passes: int = 0
    final_keys: int = 0
    pause: float = 0.0
    removed: int = 0
    others: int = 0
    seconds: float = 0.0
    resumed_from: str | None = None
    urls: list[str] = field(default_factory=list)
