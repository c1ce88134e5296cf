"""``zcluster``: the operator command (keys, select, score, insert, delete, info); the ``cli`` extra.

Connection, from flags or the environment (flags win):

* ``--url URL`` (repeatable; env ``ZCLUSTER_URLS``, comma-separated): standalone shards, routed client-side
  (``--routing jump|roshi``, env ``ZCLUSTER_ROUTING``; the order of the URLs matters, as for the library);
* ``--cluster-url URL`` (env ``ZCLUSTER_CLUSTER_URL``): a seed node of a native Redis Cluster;
* ``--prefix`` (env ``ZCLUSTER_PREFIX``, default ``zc:``) and ``--max-size`` (env ``ZCLUSTER_MAX_SIZE``;
  writes must use the size bound of every other writer).

URLs are parsed by :class:`zcluster.ClusterConfig`, the library's one parser. They may carry credentials
(``redis://user:password@host:port``); prefer the environment over flags for them (process lists show
flags). Passwords never appear in output or error messages (:func:`zcluster._urls.redact`).

Output is a human table by default and one JSON document with ``--json`` (before or after the subcommand);
keys and members that are not UTF-8 are ``{"b64": ...}`` objects there (see :mod:`zcluster.cli.output`).
Expected errors (bad input, unreachable or failing shards) print one ``Error:`` line on stderr and exit
non-zero: 2 for usage errors (bad flags, arguments, input files, URLs), 1 otherwise, also when only some
shards failed (their part is reported, and the failed shards are named).

Modules: :mod:`~zcluster.cli.app` (the click group, error handling, :func:`main`),
:mod:`~zcluster.cli.context` (the settings every command gets), :mod:`~zcluster.cli.reads` (keys, select,
score), :mod:`~zcluster.cli.writes` (insert, delete, tuple files), :mod:`~zcluster.cli.info` and
:mod:`~zcluster.cli.output` (encodings, scores, tables). click and rich are the ``cli`` extra: this package
imports neither until :func:`main` runs, which says how to install them when they are missing.
"""

from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from zcluster.cli.app import cli

__all__ = ["cli", "main"]

INSTALL_HINT = "Error: the zcluster command needs click and rich: pip install 'zcluster[cli]'"


def main() -> None:
    """Entry point of the ``zcluster`` command (exit 2 with one line when the ``cli`` extra is missing)."""
    try:
        importlib.import_module("click")
        importlib.import_module("rich")
    except ImportError:
        print(INSTALL_HINT, file=sys.stderr)
        sys.exit(2)
    from zcluster.cli.app import main as run

    run()


def __getattr__(name: str) -> Any:
    if name != "cli":
        raise AttributeError(f"module 'zcluster.cli' has no attribute {name!r}")
    value = importlib.import_module("zcluster.cli.app").cli
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
