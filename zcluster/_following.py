"""How a :class:`zcluster.Cluster` follows its store to the layout a migration moved it to (see
:mod:`zcluster._moves` for the marker's side).

A Cluster is a chain of incarnations: the object the caller holds, then one per layout it followed. Each
incarnation is built whole (its transport, encoder and write plan) and never changed afterwards, so a call
that started on the old one finishes on the old one's objects: its shards were retired, so it fails with
:class:`StoreMoved`, and the call runs again, whole, on the newest incarnation. Writes are idempotent, so
running a call again is safe; reads ran again read the target, which holds everything the source held at
the cut-over. Scans (``keys``, ``scan``) cannot carry a position across layouts: they raise
:class:`zcluster.LayoutMismatchError` saying the store moved, after the client followed it.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterator
from typing import Any, Protocol, TypeVar

from zcluster import _guard
from zcluster._moves import StoreMoved, describe, log_follow, with_credentials
from zcluster._topology import FAILOVER_TIMEOUT, ClusterTopology, StandaloneTopology, Topology
from zcluster._transport import Transport
from zcluster._urls import safe_name
from zcluster.errors import LayoutMismatchError

MAX_MOVES = 3
"""Moves one call follows before it raises (each is a whole migration: more means something is wrong)."""

_LOCK = threading.Lock()
F = TypeVar("F", bound=Callable[..., Any])


class Incarnation(Protocol):
    _next: Any
    _transport: Transport

    def _live(self) -> Any: ...

    def _follow(self, moved: StoreMoved) -> None: ...


def live(first: Incarnation) -> Any:
    """The newest incarnation of a Cluster."""
    current = first
    while current._next is not None:
        current = current._next
    return current


def successor(transport: Transport, moved: StoreMoved) -> Transport:
    """The transport of the layout ``moved`` names, built once for every Cluster sharing ``transport`` (a
    cluster and its views): the same connection options and credentials, its own layout guard."""

    def build() -> Transport:
        old = transport.topology
        to = moved.to
        source_url, options = _source_of(old)
        urls = [with_credentials(u, source_url) for u in to.get("urls", [])]
        topology: Topology
        if to.get("routing") == "cluster":
            seeds = [safe_name(u) for u in urls[1:]]
            timeout = getattr(old, "failover_timeout", 0.0) or FAILOVER_TIMEOUT
            topology = ClusterTopology(urls[0], timeout, seeds, **options)
        else:
            topology = StandaloneTopology(urls, "jump", **options)
        follower = Transport(topology, transport.scripts, transport.pipeline_calls)
        guard = transport.guard
        follower.guard = _guard.install(topology, guard.layout, guard.max_size, guard.follow)
        log_follow(moved.source, to)
        return follower

    return transport.successor.get(build)


def _source_of(topology: Topology) -> tuple[str, dict[str, Any]]:
    if isinstance(topology, StandaloneTopology):
        return topology.urls[0], topology.options
    if isinstance(topology, ClusterTopology):
        return topology._seed_url, topology._options
    raise LayoutMismatchError(f"cannot follow a move from a {type(topology).__name__}")


def link(current: Incarnation, build: Callable[[Transport], Any], moved: StoreMoved) -> None:
    """Give ``current`` its next incarnation, ``build(successor transport)``, unless another thread did."""
    follower = successor(current._transport, moved)
    with _LOCK:
        if current._next is None:
            current._next = build(follower)


def following(method: F) -> F:
    """``method`` run on the newest incarnation, and again on the next one when the store moved under it."""

    @functools.wraps(method)
    def call(self: Incarnation, *args: Any, **kwargs: Any) -> Any:
        for _ in range(MAX_MOVES):
            current = live(self)
            try:
                return method(current, *args, **kwargs)
            except StoreMoved as moved:
                current._follow(moved)
        raise LayoutMismatchError(f"the store moved {MAX_MOVES} times during one call: is a migration looping?")

    return call  # type: ignore[return-value]


def scanning(method: F) -> F:
    """``method`` (a scan) on the newest incarnation; a move under it follows, then raises (see the module)."""

    @functools.wraps(method)
    def call(self: Incarnation, *args: Any, **kwargs: Any) -> Any:
        current = live(self)
        try:
            result = method(current, *args, **kwargs)
        except StoreMoved as moved:
            current._follow(moved)
            raise _scan_moved(moved) from None
        if isinstance(result, Iterator):
            return _guarded(current, result)
        return result

    return call  # type: ignore[return-value]


def _guarded(current: Incarnation, scan: Iterator[Any]) -> Iterator[Any]:
    try:
        yield from scan
    except StoreMoved as moved:
        current._follow(moved)
        raise _scan_moved(moved) from None


def _scan_moved(moved: StoreMoved) -> LayoutMismatchError:
    return LayoutMismatchError(
        f"the store moved to {describe(moved.to)} during this scan (a migration cut over): this client follows "
        "it now; scan again from the start (a position of the old layout means nothing in the new one)"
    )


def moved_to(first: Incarnation) -> tuple[list[str], bool] | None:
    """Where a Cluster's store lives now when it followed a move: (its URLs, with this client's credentials;
    whether they are a Redis Cluster's), else None."""
    current = live(first)
    if current is first:
        return None
    topology = current._transport.topology
    if isinstance(topology, ClusterTopology):
        return [topology._seed_url, *topology.nodes()], True
    return list(getattr(topology, "urls", [])), False
