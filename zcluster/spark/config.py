"""Where the cluster is, as a picklable value Spark can ship to executors (which reconnect from it)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from zcluster.cluster import Cluster

_CACHE: dict[ClusterConfig, Cluster] = {}
_LOCK = threading.Lock()


@dataclass(frozen=True)
class ClusterConfig:
    """Standalone shard ``urls`` or a Redis Cluster ``cluster_url``, plus the Cluster options.

    ``connect()`` returns one Cluster per process and config: Spark reuses Python workers, so executors
    keep their connections across tasks and batches.
    """

    urls: tuple[str, ...] = ()
    cluster_url: str | None = None
    prefix: str = "zc:"
    max_size: int | None = None
    routing: str = "jump"
    options: tuple[tuple[str, Any], ...] = field(default=())

    def __post_init__(self) -> None:
        if bool(self.urls) == bool(self.cluster_url):
            raise ValueError("give either shard urls or a cluster_url")

    @classmethod
    def of(cls, where: str | list[str] | tuple[str, ...] | ClusterConfig, **options: Any) -> ClusterConfig:
        """A config from a list of shard URLs, a ``redis+cluster://`` seed URL, one shard URL, or a config."""
        if isinstance(where, ClusterConfig):
            return where
        if isinstance(where, str):
            if where.startswith("redis+cluster://"):
                return cls(cluster_url="redis://" + where.removeprefix("redis+cluster://"), **options)
            return cls(urls=(where,), **options)
        return cls(urls=tuple(where), **options)

    def connect(self) -> Cluster:
        with _LOCK:
            cluster = _CACHE.get(self)
            if cluster is None:
                extra: dict[str, Any] = dict(self.options)
                if self.cluster_url:
                    cluster = Cluster.from_cluster_url(
                        self.cluster_url, prefix=self.prefix, max_size=self.max_size, **extra
                    )
                else:
                    cluster = Cluster.from_urls(
                        list(self.urls), prefix=self.prefix, max_size=self.max_size, routing=self.routing, **extra
                    )  # type: ignore[arg-type]
                _CACHE[self] = cluster
            return cluster
