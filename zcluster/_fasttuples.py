"""The compiled build's tuple helpers (zcluster/_tuples.c): ``construct`` and ``untrack``, or None.

Each function returns its helper, or None without a build, over a stale one or under ZCLUSTER_PURE (the
import fails): NamedTuples then keep their own constructors and objects stay tracked, which costs time only.
zcluster/_tuples.c says what each does and why it is safe. Callers keep ``native_untrack()`` in a ``Final``
of their own: compiled (zcluster._native), that is a C static, where a name imported from this module would
be looked up at each use.
"""

from __future__ import annotations

from collections.abc import Callable


def native_construct() -> Callable[[type], None] | None:
    """``zcluster._tuples.construct``, or None when the compiled build is not in use."""
    try:
        from zcluster._tuples import construct
    except ImportError:
        return None
    return construct


def native_untrack() -> Callable[[object], bool] | None:
    """``zcluster._tuples.untrack``, or None when the compiled build is not in use."""
    try:
        from zcluster._tuples import untrack
    except ImportError:
        return None
    return untrack
