"""``zcluster``: the operator command (keys, select, score, insert, delete, info, markers; walk and diff for farms);
the ``cli`` extra.

Connection, from flags or the environment (flags win; the environment is read only when no connection
flag is given):

* ``--url URL`` (repeatable; env ``ZCLUSTER_URLS``, comma-separated): standalone shards, routed client-side
  (``--routing jump|roshi``, env ``ZCLUSTER_ROUTING``; the order of the URLs matters, as for the library);
* ``--cluster-url URL`` (env ``ZCLUSTER_CLUSTER_URL``): a seed node of a native Redis Cluster;
* ``--replica WHERE`` (repeatable, one per replica; env ``ZCLUSTER_REPLICAS``, replicas separated by ``;``):
  a farm of replicas (:class:`zcluster.farm.Farm`), each a shard URL, comma-separated shard URLs or a
  ``redis+cluster://`` seed. Not with ``--url``/``--cluster-url`` (a usage error). Replicas are named
  ``replica0``, ``replica1``, ... in the order given, and their shards ``replicaN/host:port``;
* ``--prefix`` (env ``ZCLUSTER_PREFIX``, default ``zc:``) and ``--max-size`` (env ``ZCLUSTER_MAX_SIZE``;
  writes must use the size bound of every other writer), for every replica alike.

Every command works on a farm: writes go to every replica and are confirmed by a majority (a replica that
missed a confirmed write is a warning), reads merge the replicas' answers and repair what differs.
``walk`` (sweep every replica and repair every difference, resumable) and ``diff`` (what each replica holds
for some keys) need a farm of two or more replicas (:mod:`zcluster.cli.replicas`). ``consumers`` shows the
exactly-once applications' progress and lag and skips lost ranges (:mod:`zcluster.cli.consumers`; the journal
store from ``--journals URL`` or ``ZCLUSTER_JOURNALS``). ``migrate --to URL...`` (or ``--to-cluster URL``) moves
the standalone store of ``--url`` online to another layout, resumable (:mod:`zcluster.cli.migrate`). ``markers``
shows each listed shard's layout marker of the store and the migration they describe; ``markers reset``
deletes them, refused while a migration is under way (:mod:`zcluster.cli.markers`). ``server-module`` builds
zcluster's Redis module and prints its path, for ``--loadmodule`` (:mod:`zcluster.cli.module`); it needs no
connection.

URLs are parsed by :class:`zcluster.ClusterConfig`, the library's one parser. They may carry credentials
(``redis://user:password@host:port``); prefer the environment over flags for them (process lists show
flags). Passwords never appear in output or error messages (:func:`zcluster._urls.redact`).

Output is a human table by default and one JSON document with ``--json`` (before or after the subcommand);
keys and members that are not UTF-8 are ``{"b64": ...}`` objects there (see :mod:`zcluster.cli.output`).
Expected errors (bad input, unreachable or failing shards) print one ``Error:`` line on stderr and exit
non-zero: 2 for usage errors (bad flags, arguments, input files, URLs, a command given the wrong kind of
store), 1 otherwise, also when only some shards failed (their part is reported, and the failed shards are
named). ``diff`` exits 3 when replicas differ, ``consumers --max-lag`` when a journal lags too far or cannot
go on; ``walk`` exits 130 when stopped by Ctrl-C.

Modules: :mod:`~zcluster.cli.app` (the click group, error handling, :func:`main`),
:mod:`~zcluster.cli.context` (the settings every command gets, the Cluster or Farm they open),
:mod:`~zcluster.cli.reads` (keys, select, score), :mod:`~zcluster.cli.writes` (insert, delete, tuple files),
:mod:`~zcluster.cli.replicas` (walk, diff), :mod:`~zcluster.cli.consumers` (consumers),
:mod:`~zcluster.cli.migrate` (migrate), :mod:`~zcluster.cli.markers` (markers, markers reset),
:mod:`~zcluster.cli.module` (server-module),
:mod:`~zcluster.cli.info` and :mod:`~zcluster.cli.output`
(encodings, scores, tables). click and rich are the ``cli`` extra: this package imports neither until
:func:`main` runs, which says how to install them when they are missing.
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
