"""The compiled hot path: the exactly-once Consumer's per-message modules, compiled with mypyc.

The modules of :data:`MODULES` are plain, mypy-clean Python; ``python -m zcluster._native_build`` compiles
them with mypyc (it ships with mypy) into extension modules beside their ``.py`` files (and one shared
library, ``zcluster_native__mypyc.*.so``, at the source tree's root), which Python's import then prefers.
Semantics are the source's: the ``.py`` files stay the reference, and ``tests/state/test_native.py``
compares the two paths on random journal traffic.

The build is optional. Without mypy or a C compiler it says why and leaves the package pure Python;
``ZCLUSTER_PURE=1`` makes the build step skip and the package ignore compiled modules (``import zcluster``
installs :class:`_SourceFirst` before any of them loads), so the pure path stays testable beside a build.
``python -m zcluster._native_build status`` says which path an interpreter runs; ``clean`` removes the build.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = ["MODULES", "compiled", "pure"]

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
)
"""What is compiled: every module a committed message passes through from the journal's bytes to the write
script's arguments (frames, decoding, envelope and message, sequencer, applier loop, write buffer, encoder),
and the helpers they call per message (UUID clocks, key layout)."""

GROUP = "zcluster_native"  # the shared library's name: zcluster_native__mypyc.<abi>.so
ROOT = Path(__file__).resolve().parent.parent  # the source tree (or site-packages, for a wheel)


def pure() -> bool:
    """True when ``ZCLUSTER_PURE`` asks for the pure-Python modules (set and not "0")."""
    return os.environ.get("ZCLUSTER_PURE", "") not in ("", "0")


def compiled() -> list[str]:
    """The modules of :data:`MODULES` this interpreter loaded from an extension module (imports them)."""
    out = []
    for name in MODULES:
        module = importlib.import_module(name)
        if not (module.__file__ or "").endswith(".py"):
            out.append(name)
    return out


class _SourceFirst(importlib.abc.MetaPathFinder):
    """Finds the modules of :data:`MODULES` as source, ahead of the path finder (which prefers extensions)."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MODULES:
            return None
        source = ROOT.joinpath(*fullname.split(".")).with_suffix(".py")
        return importlib.util.spec_from_file_location(fullname, source) if source.exists() else None


def install() -> None:
    """Under ``ZCLUSTER_PURE``, make the compiled modules' sources win (called by ``import zcluster``)."""
    if pure() and not any(isinstance(f, _SourceFirst) for f in sys.meta_path):
        sys.meta_path.insert(0, _SourceFirst())
