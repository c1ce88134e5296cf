"""Where the cluster is: every way of naming it, parsed in one place.

Forms accepted by :func:`connect` and :meth:`ClusterConfig.of` (also by the CLI, the Spark sink and writer,
and the demo):

* ``"redis://host:port"`` or ``"rediss://..."`` (TLS) — one standalone shard;
* a list of such URLs — standalone shards, routed client-side (their order matters, as for
  :meth:`Cluster.from_urls`);
* ``"redis+cluster://host:port"`` or ``"rediss+cluster://..."`` — a seed node of a native Redis Cluster;
* a :class:`ClusterConfig`.

URLs may carry ACL credentials (``redis://user:password@host``); they never appear in an error message
(see :mod:`zcluster._urls`).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar, cast

from zcluster._following import moved_to
from zcluster._keys import KeyLayout
from zcluster._topology import Routing
from zcluster._urls import is_cluster_url, redact_url, safe_name, seed_url
from zcluster.cluster import Cluster
from zcluster.errors import ConfigError
from zcluster.types import Store

__all__ = ["ClusterConfig", "StoreConfig", "Where", "connect", "store_config"]

_SHARED: dict[Any, Any] = {}
_LOCK = threading.Lock()
T = TypeVar("T")


def shared(config: Hashable, open_: Callable[[], T]) -> T:
    """This process's one store for ``config`` (a config value), opened by ``open_`` on first use and never
    closed; what :meth:`ClusterConfig.shared` and :meth:`zcluster.farm.FarmConfig.shared` keep."""
    with _LOCK:
        store = _SHARED.get(config)
        if store is None:
            store = _SHARED[config] = open_()
        return cast(T, store)


@dataclass(frozen=True)
class ClusterConfig:
    """Standalone shard ``urls`` or a Redis Cluster seed ``cluster_url`` (``redis://`` or
    ``redis+cluster://``, kept as ``redis://``; likewise ``rediss``), plus the Cluster options. A picklable,
    hashable value: Spark ships it to executors, which reconnect from it.
    """

    urls: tuple[str, ...] = ()
    cluster_url: str | None = None
    prefix: str = "zc:"
    max_size: int | None = None
    routing: Routing = "jump"
    options: tuple[tuple[str, Any], ...] = field(default=())
    seeds: tuple[str, ...] = field(default=(), compare=False)
    """A Redis Cluster's other nodes ("host:port"), asked when the seed does not answer; not part of the
    config's identity. Spark sinks fill it from the driver's slot map for their tasks (:meth:`with_nodes`)."""

    def __post_init__(self) -> None:
        if self.cluster_url:  # stored as the seed's plain URL, so both spellings make one (equal) config
            object.__setattr__(self, "cluster_url", seed_url(self.cluster_url))
        if bool(self.urls) == bool(self.cluster_url):
            raise ConfigError("give either standalone shard urls or a cluster_url (a Redis Cluster seed), not both")
        for url in (*self.urls, self.cluster_url or ""):
            if url:
                safe_name(url)  # validates, with a redacted message
        if self.routing not in ("jump", "roshi"):
            raise ConfigError(f"unknown routing {self.routing!r}: use 'jump' or 'roshi'")
        if self.cluster_url and self.routing != "jump":
            raise ConfigError("routing applies to standalone shards only; a Redis Cluster routes by hash slot")
        KeyLayout(self.prefix)  # validates the prefix
        if self.max_size is not None and (
            isinstance(self.max_size, bool) or not isinstance(self.max_size, int) or self.max_size <= 0
        ):
            raise ConfigError(f"max_size must be a positive int or None, got {self.max_size!r}")

    @classmethod
    def of(cls, where: Where, *, cluster: bool = False, **options: Any) -> ClusterConfig:
        """A config from any of the forms in the module docstring; ``options`` are the Cluster options
        (``prefix``, ``max_size``, ``routing``; anything else goes to the Cluster constructor).
        ``cluster=True`` reads one plain ``redis://``/``rediss://`` URL as a Redis Cluster seed."""
        if isinstance(where, ClusterConfig):
            return where
        known = {k: options.pop(k) for k in ("prefix", "max_size", "routing") if k in options}
        extra = tuple(sorted(options.items()))
        if isinstance(where, str):
            if cluster or is_cluster_url(where):
                return cls(cluster_url=where, options=extra, **known)
            return cls(urls=(where,), options=extra, **known)
        if cluster:
            raise ConfigError("cluster=True takes one seed URL, not a list")
        if isinstance(where, Sequence) and all(isinstance(u, str) for u in where):
            clustered = [u for u in where if is_cluster_url(u)]
            if clustered:
                raise ConfigError(f"{redact_url(clustered[0])!r}: a Redis Cluster is given as one seed URL, not a list")
            return cls(urls=tuple(where), options=extra, **known)
        raise ConfigError(f"expected a URL, a list of URLs or a ClusterConfig, not {type(where).__name__}")

    def open(self) -> Cluster:
        """A new Cluster for this config; the caller closes it."""
        options: dict[str, Any] = {"prefix": self.prefix, "max_size": self.max_size, **dict(self.options)}
        if self.cluster_url:
            return Cluster.from_cluster_url(self.cluster_url, seeds=self.seeds, **options)
        return Cluster.from_urls(list(self.urls), routing=self.routing, **options)

    def shared(self) -> Cluster:
        """This process's one Cluster for this config, opened on first use and never closed (Spark
        reuses Python workers, so executors keep their connections across tasks and batches)."""
        return shared(self, self.open)

    def with_nodes(self) -> ClusterConfig:
        """This config as a driver ships it to its tasks: a Redis Cluster's with ``seeds`` set to the nodes this
        process's shared Cluster knows now (a worker started while the seed node is down still reaches the
        cluster); a standalone store's pointing where a migration moved it, once the shared Cluster followed
        it, and following moves (:meth:`following`: a task started after a cut-over is not refused)."""
        if not self.cluster_url:
            where = moved_to(self.shared()) if self in _SHARED else None
            following = self.following()
            if where is None:
                return following
            urls, cluster = where
            if cluster:
                return dataclasses.replace(following, urls=(), cluster_url=urls[0], seeds=tuple(urls[1:]))
            return dataclasses.replace(following, urls=tuple(urls))
        return dataclasses.replace(self, seeds=tuple(self.shared().nodes()))

    def following(self) -> ClusterConfig:
        """This config with ``follow_moves``: its Clusters follow a migrated store even when opened after the
        cut-over (what a driver ships to its tasks: a task started then must not fail the batch)."""
        options = dict(self.options) | {"follow_moves": True}
        return dataclasses.replace(self, options=tuple(sorted(options.items())))

    def with_layout(self, **layout: Any) -> ClusterConfig:
        """This config with ``prefix`` and/or ``max_size`` replaced."""
        return dataclasses.replace(self, **layout)

    def __repr__(self) -> str:
        where = (
            f"cluster_url={redact_url(self.cluster_url)!r}"
            if self.cluster_url
            else (f"urls={tuple(redact_url(u) for u in self.urls)!r}")
        )
        return f"ClusterConfig({where}, prefix={self.prefix!r}, max_size={self.max_size})"


Where = str | Sequence[str] | ClusterConfig


class StoreConfig(Protocol):
    """Where a :class:`zcluster.types.Store` is, as a picklable, hashable value Spark ships to executors: a
    :class:`ClusterConfig` or a :class:`zcluster.farm.FarmConfig`."""

    def open(self) -> Store: ...

    def shared(self) -> Store: ...

    def with_layout(self, **layout: Any) -> StoreConfig: ...


def store_config(where: Where | StoreConfig, *, prefix: str | None = None, max_size: int | None = None) -> StoreConfig:
    """The config of ``where`` (any form :func:`connect` takes, or a :class:`StoreConfig` such as a FarmConfig).

    ``prefix`` and ``max_size``, when given, are set on it (on every replica of a farm), also on a config
    object; when not, a config keeps its own and URL forms get the defaults (``"zc:"``, unbounded).
    """
    layout: dict[str, Any] = {k: v for k, v in (("prefix", prefix), ("max_size", max_size)) if v is not None}
    if isinstance(where, str | Sequence):
        return ClusterConfig.of(where, **layout)
    return where.with_layout(**layout) if layout else where


def connect(where: Where, **options: Any) -> Cluster:
    """A Cluster for ``where`` (see the module docstring); ``options`` as for :class:`Cluster`.

    Raises :class:`ConfigError` for a URL that does not parse (its password redacted). Connections are
    opened lazily, so an unreachable server is reported by the first call that needs it.
    """
    return ClusterConfig.of(where, **options).open()


def with_nodes(config: StoreConfig) -> StoreConfig:
    """``config`` as a driver ships it to its tasks: a Redis Cluster's with the nodes it knows now as
    ``seeds`` (:meth:`ClusterConfig.with_nodes`), any other as is."""
    return config.with_nodes() if isinstance(config, ClusterConfig) else config
