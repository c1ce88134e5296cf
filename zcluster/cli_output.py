"""Output and input helpers of the ``zcluster`` command: blob encoding, scores, rich tables.

JSON encoding of keys and members: a value that is valid UTF-8 is a JSON string; any other byte string is
an object ``{"b64": "<standard base64 of the raw bytes>"}``. The same two forms are accepted in JSON-lines
input files, so every value round-trips exactly. Human output escapes non-UTF-8 bytes and control
characters as ``\\xNN`` (readable, but not unambiguous: use ``--json`` for exact values).
"""

from __future__ import annotations

import base64
import binascii
import math
import re
import sys
from collections.abc import Iterable, Sequence
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from zcluster.types import Blob, to_bytes

_MAX_EXACT_INT = 1 << 53
_CONTROL = {c: f"\\x{c:02x}" for c in (*range(32), 127)}
_URL_AUTH = re.compile(r"([a-z]+://[^\s:/@]*):[^\s@/]*@", re.IGNORECASE)


def json_blob(value: Blob) -> str | dict[str, str]:
    """A key or member for JSON: the text when it is valid UTF-8, else ``{"b64": ...}`` of its bytes."""
    raw = to_bytes(value)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return {"b64": base64.b64encode(raw).decode("ascii")}


def parse_json_blob(value: object, what: str) -> Blob:
    """The inverse of :func:`json_blob`; raises :class:`ValueError` naming ``what`` for anything else."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and set(value) == {"b64"} and isinstance(value["b64"], str):
        try:
            return base64.b64decode(value["b64"], validate=True)
        except binascii.Error as exc:
            raise ValueError(f"{what}: invalid base64 ({exc})") from None
    raise ValueError(f'{what} must be a string or {{"b64": "..."}}, got {value!r}')


def parse_score(value: object, where: str) -> float:
    """A finite score from CLI text or a JSON number; integers must be exact as doubles (|x| <= 2**53)."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError(f"{where}: score must be a number, got {value!r}")
    if isinstance(value, str):
        try:
            number: int | float = int(value)
        except ValueError:
            try:
                number = float(value)
            except ValueError:
                raise ValueError(f"{where}: score {value!r} is not a number") from None
    else:
        number = value
    if isinstance(number, int):
        if abs(number) > _MAX_EXACT_INT and float(number) != number:
            raise ValueError(f"{where}: integer score {number} is not exact as a double (|x| > 2**53)")
        return float(number)
    if not math.isfinite(number):
        raise ValueError(f"{where}: score {value!r} must be a finite number")
    return number


def json_score(score: float) -> float | None:
    """A score for JSON (``null`` for NaN, which JSON cannot hold)."""
    return None if math.isnan(score) else score


def human(value: Blob) -> str:
    """A key or member for people: non-UTF-8 bytes and control characters as ``\\xNN``."""
    return to_bytes(value).decode("utf-8", "backslashreplace").translate(_CONTROL)


def human_score(score: float) -> str:
    """Integral scores without ``.0``; others in Python's shortest round-tripping form; NaN as ``-``."""
    if math.isnan(score):
        return "-"
    if score.is_integer() and abs(score) <= _MAX_EXACT_INT:
        return str(int(score))
    return repr(score)


def redact(message: str, secrets: Iterable[str] = ()) -> str:
    """One line, with URL credentials and every known secret replaced by ``***``."""
    out = _URL_AUTH.sub(r"\1:***@", message)
    for secret in sorted({s for s in secrets if s}, key=len, reverse=True):
        out = out.replace(secret, "***")
    return " ".join(out.split())


def console(stderr: bool = False) -> Console:
    """A rich console on the current stdout/stderr; not a terminal: no colours and no line wrapping."""
    file = sys.stderr if stderr else sys.stdout
    probe = Console(file=file, highlight=False)
    if probe.is_terminal:
        return probe
    return Console(file=file, highlight=False, width=100_000, color_system=None)


def print_table(title: str | None, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    """Print a plain table on stdout; cells are shown literally (no rich markup)."""
    table = Table(title=title, box=box.SIMPLE_HEAD, title_justify="left", show_edge=False, pad_edge=False)
    for name in columns:
        table.add_column(name, overflow="fold")
    for row in rows:
        table.add_row(*(cell if isinstance(cell, Text) else Text(str(cell)) for cell in row))
    console().print(table)
