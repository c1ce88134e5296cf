"""Output and input encodings of the ``zcluster`` command: blobs, scores, JSON, rich tables.

JSON encoding of keys and members: a value that is valid UTF-8 is a JSON string; any other byte string is
an object ``{"b64": "<standard base64 of the raw bytes>"}``. The same two forms are accepted in JSON-lines
input files, so every value round-trips exactly. Human output escapes non-UTF-8 bytes and control
characters as ``\\xNN`` (readable, but not unambiguous: use ``--json`` for exact values).

Scores are JSON numbers when finite; a score that is not (a sums total that overflowed to infinity, written
before the library refused that, or a NaN) is the string ``"inf"``, ``"-inf"`` or ``"nan"`` (JSON has no
such numbers), and ``inf``, ``-inf``, ``nan`` in tables. Where a score is absent (``score`` of a member never
written), JSON has ``null`` and tables ``-``.

Scores given as text are decimal numbers (``12``, ``-2.5``, ``1e3``, ``.5``); the rules for what a score
may be (finite, integers exact as doubles) are the library's (:func:`zcluster._encode.check_score`).
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
import sys
from collections.abc import Iterable, Sequence
from typing import Any

import click
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from zcluster._encode import MAX_EXACT_INT, check_score
from zcluster.types import Blob, to_bytes

__all__ = [
    "console",
    "emit_json",
    "human",
    "human_score",
    "json_blob",
    "json_score",
    "one_line",
    "parse_json_blob",
    "parse_score",
    "print_table",
]

_CONTROL = {c: f"\\x{c:02x}" for c in (*range(32), 127)}
# ASCII digits only, no '_' separators, no hex: what a decimal score looks like outside Python too.
_INT = re.compile(r"[+-]?[0-9]+")
_FLOAT = re.compile(r"[+-]?(?:(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|inf|infinity|nan)", re.IGNORECASE)


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
    """A score from command-line text or a JSON value; raises :class:`ValueError` naming ``where``.

    Text must be a decimal number (``inf`` and ``nan`` parse, and are then refused by the rules); Python-only
    spellings such as ``1_000`` or non-ASCII digits are not numbers. Whether the number is a valid score is
    :func:`zcluster._encode.check_score`'s decision, the same as for the library's writes.
    """
    number: int | float
    if isinstance(value, str):
        text = value.strip()
        try:
            if _INT.fullmatch(text):
                number = int(text)
            elif _FLOAT.fullmatch(text):
                number = float(text)
            else:
                raise ValueError
        except ValueError:  # also int()'s limit on the number of digits
            raise ValueError(f"{where}: score {value!r} is not a number") from None
    elif isinstance(value, int | float) and not isinstance(value, bool):
        number = value
    else:
        raise ValueError(f"{where}: score must be a number, got {value!r}")
    try:
        return check_score(number)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{where}: {value!r}: {exc}") from None


def json_score(score: float) -> float | str:
    """A score for JSON: the number when finite, else ``"inf"``, ``"-inf"`` or ``"nan"`` (not JSON numbers)."""
    return score if math.isfinite(score) else "nan" if math.isnan(score) else "inf" if score > 0 else "-inf"


def human(value: Blob) -> str:
    """A key or member for people: non-UTF-8 bytes and control characters as ``\\xNN``."""
    return to_bytes(value).decode("utf-8", "backslashreplace").translate(_CONTROL)


def human_score(score: float) -> str:
    """Integral scores without ``.0``; others in Python's shortest round-tripping form (``inf``, ``-inf``,
    ``nan`` for those that are not finite)."""
    if score.is_integer() and abs(score) <= MAX_EXACT_INT:
        return str(int(score))
    return repr(score)


def human_duration(seconds: float) -> str:
    """A duration for people, 3 significant digits: milliseconds below a second (``25 ms``, ``1.5 ms``; below a
    microsecond ``0 ms``), seconds below 1000 s (``1.23 s``, ``123 s``), whole seconds above (``4321 s``)."""
    if not math.isfinite(seconds) or seconds < 0:
        return f"{seconds} s"
    ms = f"{seconds * 1000:.3g}" if seconds >= 1e-6 else "0"
    if float(ms) < 1000:
        return f"{ms} ms"
    text = f"{seconds:.3g}"
    return f"{text} s" if float(text) < 1000 else f"{seconds:.0f} s"


def one_line(message: str) -> str:
    """``message`` with every run of whitespace (newlines too) as one space."""
    return " ".join(message.split())


def emit_json(document: Any) -> None:
    """Print one JSON document on stdout (non-ASCII as is; NaN is not JSON and is refused)."""
    click.echo(json.dumps(document, ensure_ascii=False, allow_nan=False))


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
