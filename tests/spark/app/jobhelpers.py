"""A helper module of the user's job, imported by ``jobs.py``: shipped by value with the mapper as well."""

from __future__ import annotations

import importlib.util
import os
import time


def pause(seconds: float) -> None:
    if seconds:
        time.sleep(seconds)


def record(path: str | None) -> None:
    """Append one line per delivered message: this process, and whether it could import ``jobs`` by name."""
    if path:
        importable = importlib.util.find_spec("jobs") is not None
        with open(path, "a") as f:
            f.write(f"{os.getpid()} {'imported' if importable else 'shipped'}\n")
