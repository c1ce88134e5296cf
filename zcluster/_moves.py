"""Following a store that a migration (:mod:`zcluster.migration`) moves to another layout: what a client reads
in the layout marker while the store moves, how it waits out the cut-over, and how it learns where the store
went, without a restart.

The move state lives in the layout markers (:mod:`zcluster._markers`):

* each shard of the source layout: ``"move": {"id", "state", "to"}``, ``state`` one of ``copying`` (the
  mover copies; clients go on reading and writing the source), ``cutting`` (clients wait: the last changes
  are being copied), ``done`` (the store lives in ``to``);
* each shard only of the target layout, until the cut-over: the target's marker with ``"incoming"``;
* every shard of the target layout, after the cut-over: the target's marker with ``"from"`` (the source's
  id and shards; the migration's id and the source's notification settings, for a resumed mover), so that a
  client of the old list that connects to a shard of both layouts learns where the store went.

``to`` describes the target as a client can reach it: ``routing`` (``jump`` or ``cluster``), ``urls`` (the
target's URLs without credentials or query: a follower adds its own, see :func:`with_credentials`) and the
target layout ``id``.

A client that had settled its layout before the cut-over (a long-lived one) follows: the guard raises
:class:`StoreMoved`, the Cluster builds a client of the target on the same options and runs the call again
there (writes are idempotent). A client opened on the old list after the cut-over is refused with
:class:`zcluster.LayoutMovedError`, which names the target.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import urlsplit

from zcluster._urls import safe_name
from zcluster.errors import LayoutMismatchError, LayoutMovedError, ZClusterError

log = logging.getLogger("zcluster")

CUTOVER_WAIT = 120.0
"""Seconds a client waits for a cut-over to end before it raises (a mover killed in its cut-over: resume it)."""
POLL = 0.02
"""Seconds between two reads of the marker while a cut-over runs."""

T = TypeVar("T")


class StoreMoved(ZClusterError):
    """The shards of this client were retired by a migration; ``to`` describes the target (see the module).

    Not a redis-py error nor a :class:`zcluster.ShardError`: no shard-failure handler takes it for a failed
    shard; the Cluster's call wrapper catches it, follows, and runs the call again.
    """

    runs_again = True  # not a call's outcome: no event reports it (zcluster._reporting)

    def __init__(self, to: dict[str, Any], source: str) -> None:
        super().__init__(f"the store moved to {describe(to)}")
        self.to = to
        self.source = source


def describe(to: dict[str, Any]) -> str:
    urls = to.get("urls") or []
    if to.get("routing") == "cluster":
        return f"the Redis Cluster at {', '.join(urls)}"
    return f"{len(urls)} standalone shard(s) [{', '.join(urls)}]"


def public_url(url: str) -> str:
    """``url`` as a marker may hold it: scheme, host, port and database; no credentials, no query."""
    parts = urlsplit(url)
    host = parts.hostname or "localhost"
    port = parts.port or 6379
    db = parts.path.strip("/")
    return f"{parts.scheme}://{host}:{port}" + (f"/{db}" if db and db != "0" else "")


def with_credentials(public: str, source: str) -> str:
    """``public`` (a marker's URL) with the user-info and query of ``source`` (the follower's own URL)."""
    src, pub = urlsplit(source), urlsplit(public)
    auth = src.netloc.rpartition("@")[0]
    netloc = f"{auth}@{pub.netloc}" if auth else pub.netloc
    return pub._replace(netloc=netloc, query=src.query).geturl()


def judge(
    stored: dict[str, Any],
    names: list[str],
    settled: bool,
    reread: Callable[[], dict[str, Any] | None],
) -> dict[str, Any] | None:
    """What a client listing ``names`` makes of a marker ``stored``: returns the marker to compare as usual
    (re-read after a cut-over ended), or raises.

    Waits while the cut-over of a move from ``names``, or onto them, runs (a shard of both lists holds the
    source's marker until the last writes of the cut-over).

    Raises :class:`StoreMoved` (``settled``: a long-lived client follows) or :class:`LayoutMovedError` (a new
    client is refused) when this list's layout was retired, or ``stored`` is the marker of a shard a finished
    migration retired (whatever the list); :class:`LayoutMismatchError` when ``names`` is the
    target of a migration still copying (use the source until its cut-over), or a cut-over lasted over
    :data:`CUTOVER_WAIT` seconds.
    """
    deadline = time.monotonic() + CUTOVER_WAIT
    while True:
        move = stored.get("move")
        ours = list(stored.get("shards", ())) == names
        # The cut-over of a move from (ours) or onto (a shard of both lists, not yet re-marked) these shards.
        if isinstance(move, dict) and move.get("state") == "cutting" and (ours or _lists(move.get("to", {})) == names):
            if time.monotonic() > deadline:
                raise LayoutMismatchError(
                    f"the store {stored.get('prefix')} has been in the cut-over of migration {move.get('id')} to "
                    f"{describe(move['to'])} for over {CUTOVER_WAIT:.0f} s: its mover stopped? Resume it "
                    "(run the same zcluster migrate command, or Migration.run(), again); clients wait for it"
                )
            time.sleep(POLL)
            again = reread()
            if again is None:
                return None
            stored = again
            continue
        if isinstance(move, dict) and ours:
            if move.get("state") == "done":
                moved(move["to"], names, settled, stored)
            return stored
        if isinstance(move, dict) and move.get("state") == "done":
            # A shard a migration retired (of the source only), listed in another list than the source's (e.g.
            # alone): the store moved, whatever else the list gets wrong.
            moved(move["to"], names, settled, stored)
        origin = stored.get("from")
        if isinstance(origin, dict) and list(origin.get("shards", ())) == names and stored.get("shards") != names:
            to = {"routing": stored.get("routing"), "urls": stored.get("urls", []), "id": stored.get("id")}
            moved(to, names, settled, stored)
        if isinstance(move, dict) and move.get("state") != "done" and _lists(move.get("to", {})) == names:
            raise_incoming(stored, str(move.get("id")))
        incoming = stored.get("incoming")
        if isinstance(incoming, dict) and list(stored.get("shards", ())) == names:
            raise_incoming(stored, str(incoming.get("id")))
        return stored


def _lists(to: dict[str, Any]) -> list[str]:
    return [safe_name(u) for u in to.get("urls", [])] if to.get("routing") != "cluster" else []


def raise_incoming(stored: dict[str, Any], migration: str) -> None:
    raise LayoutMismatchError(
        f"the store {stored.get('prefix')} is being moved onto these shards by migration {migration}, which has not "
        "cut over yet: until it does, open the store with its current (source) list; clients of that list follow "
        "the move by themselves"
    )


def moved(to: dict[str, Any], names: list[str], settled: bool, stored: dict[str, Any]) -> None:
    if settled:
        raise StoreMoved(to, ", ".join(names))
    raise LayoutMovedError(
        f"the store {stored.get('prefix')} no longer lives on [{', '.join(names)}]: a migration moved it to "
        f"{describe(to)}. Open it there (with the same credentials and options)",
        to=list(to.get("urls", [])),
        cluster=to.get("routing") == "cluster",
    )


class Successor:
    """The one client of the target that every Cluster sharing a transport follows to (built once)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._value: Any = None

    def get(self, build: Callable[[], T]) -> T:
        with self._lock:
            if self._value is None:
                self._value = build()
            return self._value  # type: ignore[no-any-return]

    @property
    def value(self) -> Any:
        return self._value


def log_follow(source: str, to: dict[str, Any]) -> None:
    log.warning(
        "layout: the store moved from [%s] to %s (a migration cut over); this client follows it. Update the "
        "configuration: a client opened on the old list is refused",
        source,
        describe(to),
    )
