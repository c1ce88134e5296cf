"""The compiled hot path: the exactly-once Consumer's per-message modules, compiled with mypyc.

The modules of :data:`MODULES` are plain, mypy-clean Python; ``python -m zcluster._native_build`` compiles
them with mypyc (it ships with mypy) into extension modules beside their ``.py`` files (and one shared
library, ``zcluster_native__mypyc.*.so``, at the source tree's root), which Python's import then prefers.
Semantics are the source's: the ``.py`` files stay the reference, and ``tests/state/test_native.py``
compares the two paths on random journal traffic.

The build is optional. Without mypy or a C compiler it says why and leaves the package pure Python;
``ZCLUSTER_PURE=1`` makes the build step skip and the package ignore compiled modules (``import zcluster``
installs :class:`_SourceFirst` before any of them loads), so the pure path stays testable beside a build.
A build older than its sources (a compiled module's ``.py`` edited since: its digest differs from the one
the build recorded) is ignored the same way, with a warning: an edit is never silently shadowed.
``python -m zcluster._native_build status`` says which path an interpreter runs; ``clean`` removes the build.

The same build compiles :data:`EXTENSIONS`, written in C. They have no ``.py`` twin: under ``ZCLUSTER_PURE``
or over a stale build importing one is a ModuleNotFoundError, as with no build, and their callers fall
back to a dependency's equivalent (hiredis).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = ["EXTENSIONS", "MODULES", "compiled", "pure"]

MODULES = (
    "zcluster._encode",
    "zcluster._keys",
    "zcluster._writes",
    "zcluster.journal._filefmt",
    "zcluster.journal.frames",
    "zcluster.message.decoding",
    "zcluster.message.envelope",
    "zcluster.message.records",
    "zcluster.message.sequencer",
    "zcluster.message.uuid",
    "zcluster.state.applier",
    "zcluster.state.batch",
    "zcluster.state.layout",
)
"""What is compiled: every module a committed message passes through from the journal's bytes to the write
script's arguments (frames, decoding, envelope and message, sequencer, applier loop, write buffer, encoder),
the helpers they call per message (UUID clocks, key layout), and the producer states' text, which an applier
writes and reads for every producer at each batch."""

EXTENSIONS = (
    "zcluster._resp",
    "zcluster._tuples",
    "zcluster.journal._scan",
    "zcluster.message._uuidhex",
    "zcluster.state._statetext",
)
"""C extension modules of the build (``zcluster/_resp.c``: commands packed into RESP for the pipelines;
``zcluster/journal/_scan.c``: a file journal's open fragment scanned for whole, CRC-valid records;
``zcluster/message/_uuidhex.c``: a UUID's canonical text parsed; ``zcluster/state/_statetext.c``: a
producer state's checkpoint text; ``zcluster/_tuples.c``: the write
NamedTuples made without a Python frame, and those of atomic values, like the Sequencer's rings of ints,
kept off the cyclic garbage collector's lists)."""

GROUP = "zcluster_native"  # the shared library's name: zcluster_native__mypyc.<abi>.so
ROOT = Path(__file__).resolve().parent.parent  # the source tree (or site-packages, for a wheel)
SUMS = "zcluster/_native.sums"
"""Under :data:`ROOT`: each compiled module's source digest at build time (a build's outputs, like the .so)."""

log = logging.getLogger("zcluster")


def pure() -> bool:
    """True when ``ZCLUSTER_PURE`` asks for the pure-Python modules (set and not "0")."""
    return os.environ.get("ZCLUSTER_PURE", "") not in ("", "0")


def source(name: str, root: Path = ROOT) -> Path:
    """The source file of module ``name`` under ``root``: its ``.py``, or its ``.c`` for :data:`EXTENSIONS`."""
    return root.joinpath(*name.split(".")).with_suffix(".c" if name in EXTENSIONS else ".py")


HEADER = "zcluster/_native.h"
"""Under :data:`ROOT`: the C header every module of :data:`EXTENSIONS` includes (their module definition)."""


def digests(root: Path = ROOT) -> dict[str, str]:
    """Each module of :data:`MODULES` and :data:`EXTENSIONS`: the SHA-256 of its source under ``root`` (a C
    module's followed by :data:`HEADER`'s, which it includes: an edit of either makes it stale)."""
    header = (root / HEADER).read_bytes()
    return {
        name: hashlib.sha256(source(name, root).read_bytes() + (header if name in EXTENSIONS else b"")).hexdigest()
        for name in MODULES + EXTENSIONS
    }


def built(root: Path = ROOT) -> bool:
    """True when a build's shared library is under ``root``."""
    return any(root.glob(f"{GROUP}__mypyc.*"))


def stale(root: Path = ROOT) -> list[str]:
    """The modules whose source differs from the build's under ``root`` (none when nothing is built)."""
    if not built(root):
        return []
    try:
        recorded = json.loads((root / SUMS).read_text())
    except (OSError, ValueError):
        recorded = {}
    return [name for name, digest in digests(root).items() if recorded.get(name) != digest]


def compiled() -> list[str]:
    """The modules of :data:`MODULES` this interpreter loaded from an extension module, and those of
    :data:`EXTENSIONS` it can import (imports them)."""
    out = []
    for name in MODULES:
        module = importlib.import_module(name)
        if not (module.__file__ or "").endswith(".py"):
            out.append(name)
    for name in EXTENSIONS:
        try:
            importlib.import_module(name)
        except ImportError:
            continue
        out.append(name)
    return out


class _SourceFirst(importlib.abc.MetaPathFinder):
    """Finds the modules of :data:`MODULES` as source, ahead of the path finder (which prefers extensions),
    and none of :data:`EXTENSIONS` (no source to fall back on: their callers do without)."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname in EXTENSIONS:
            why = "not loaded under ZCLUSTER_PURE or over a stale build"
            raise ModuleNotFoundError(f"{fullname}: {why}", name=fullname)
        if fullname not in MODULES:
            return None
        py = source(fullname)
        return importlib.util.spec_from_file_location(fullname, py) if py.exists() else None


def install() -> None:
    """Make the compiled modules' sources win under ``ZCLUSTER_PURE`` or over a stale build (called by
    ``import zcluster``, before any of them loads)."""
    if any(isinstance(f, _SourceFirst) for f in sys.meta_path):
        return
    if not pure():
        outdated = stale()
        if not outdated:
            return
        log.warning(
            "zcluster: the compiled modules are older than their sources (%s): running pure Python; "
            "rebuild with: python -m zcluster._native_build build",
            ", ".join(outdated),
        )
    sys.meta_path.insert(0, _SourceFirst())
