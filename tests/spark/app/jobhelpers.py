"""A helper module of the user's job, imported by ``jobs.py``: shipped by value with the mapper as well."""

from __future__ import annotations

import importlib.util
import os
import time


def pause(seconds: float) -> None:
    if seconds:
        time.sleep(seconds)


def hold(markers: str) -> None:
    """The tests' kill point: write ``held-<pid>`` in ``markers``, then wait until ``markers/release`` exists."""
    release = os.path.join(markers, "release")
    if os.path.exists(release):
        return
    open(os.path.join(markers, f"held-{os.getpid()}"), "w").close()
    while not os.path.exists(release):
        time.sleep(0.02)


def record(path: str | None) -> None:
    """Append one line per delivered message: this process, and whether it could import ``jobs`` by name."""
    if path:
        importable = importlib.util.find_spec("jobs") is not None
        with open(path, "a") as f:
            f.write(f"{os.getpid()} {'imported' if importable else 'shipped'}\n")
