"""Server-side Lua scripts, read from the package (wheel) or the source tree's ``lua/`` folder."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cache
from pathlib import Path

_HERE = Path(__file__).resolve().parent
# In a wheel the scripts sit inside the package; in a checkout (editable install) beside it.
_SEARCH = (_HERE / "lua", _HERE.parent / "lua")


@dataclass(frozen=True)
class Script:
    """A Lua script; ``optional``: a server may refuse to load it (see :meth:`Transport.load_scripts`)."""

    name: str
    source: bytes
    sha: str
    optional: bool = False


@cache
def load(name: str) -> Script:
    """The script ``lua/<name>.lua``; raises FileNotFoundError naming where it looked."""
    for folder in _SEARCH:
        path = folder / f"{name}.lua"
        if path.is_file():
            source = path.read_bytes()
            return Script(name, source, hashlib.sha1(source).hexdigest())
    raise FileNotFoundError(f"Lua script {name!r} not found in {', '.join(str(p) for p in _SEARCH)}")


def write_script() -> Script:
    """The batched 2P-set insert/delete script."""
    return load("write")


@cache
def node_write_script() -> Script:
    """The write script declaring ``allow-cross-slot-keys`` (Redis >= 7), for calls that carry the keys of
    many slots of one Redis Cluster node in ARGV (the script's "k"/"K" modes). Same source: one set of rules."""
    base = write_script()
    source = b"#!lua flags=allow-cross-slot-keys\n" + base.source
    return Script("write-node", source, hashlib.sha1(source).hexdigest(), optional=True)


def forget_script() -> Script:
    """The retention script behind :meth:`zcluster.Cluster.forget`."""
    return load("forget")


def incr_script() -> Script:
    """The fenced increments script behind :meth:`zcluster.Cluster.increment`."""
    return load("incr")


def aggregate_script() -> Script:
    """Reads an aggregate key's whole state and replaces it (a farm's repair of increments)."""
    return load("aggregate")


def fingerprint_script() -> Script:
    """The read-only script behind :meth:`zcluster.Cluster.fingerprints`."""
    return load("fingerprint")


def fence_script() -> Script:
    """The migration's lease and fenced writes (:mod:`zcluster.migration._fence`)."""
    return load("fence")
