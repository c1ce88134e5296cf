"""The options of the ``zcluster`` data source that say where the store is: its writer's and its reader's."""

from __future__ import annotations

from typing import Any

from zcluster.config import ClusterConfig
from zcluster.errors import ConfigError


def config_from_options(options: dict[str, str]) -> ClusterConfig:
    """Where the store is, from the data source's options (``urls`` or ``cluster_url``, ``prefix``,
    ``max_size``): the writer's and the reader's."""
    extra: dict[str, Any] = {"prefix": options.get("prefix", "zc:")}
    if options.get("max_size"):
        extra["max_size"] = int(options["max_size"])
    if options.get("cluster_url"):  # a seed node's URL
        return ClusterConfig.of(options["cluster_url"], cluster=True, **extra)
    urls = [u.strip() for u in options.get("urls", "").split(",") if u.strip()]
    if not urls:
        raise ConfigError("the zcluster data source needs the 'urls' or 'cluster_url' option")
    return ClusterConfig.of(urls, **extra)
