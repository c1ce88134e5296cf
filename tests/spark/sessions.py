"""The Spark session a test process shares between its modules (``conftest.py``'s ``spark`` fixture), and a
session of a module's own (:func:`own_session`) for the modules that need another kind."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

SHARED: list[Any] = []  # this test process's shared session, once started


def alive(session: Any) -> bool:
    return session.sparkContext._jsc is not None  # None once stopped (by a test's own ``spark.stop()`` too)


@contextmanager
def own_session(master: str) -> Iterator[Any]:
    """A session of this process's own on ``master``, stopped after; the shared session is stopped first."""
    from zcluster.spark import local_session

    if SHARED and alive(SHARED[0]):
        SHARED[0].stop()
    session = local_session(master)
    try:
        yield session
    finally:
        session.stop()
