"""The options of the ``zcluster`` data source that say where the store is: its writer's and its reader's."""

from __future__ import annotations

import json
from typing import Any

from zcluster._topology import checked_failover_timeout
from zcluster.config import ClusterConfig, StoreConfig
from zcluster.errors import ConfigError
from zcluster.farm.config import FarmConfig

STORE_OPTIONS = ("urls", "cluster_url", "replicas", "read", "prefix", "max_size", "routing", "failover_timeout")
"""The options :func:`config_from_options` reads (lowercase: Spark's options are case-insensitive): every
option that says where the store is and how it is laid out, so that the layout guard opens it."""


def config_from_options(options: dict[str, str]) -> StoreConfig:
    """Where the store is, from the data source's options (:data:`STORE_OPTIONS`): ``urls`` (standalone
    shards, comma-separated), ``cluster_url`` (a Redis Cluster seed) or ``replicas`` (a farm: a JSON list, one
    replica each in any form :func:`zcluster.connect` takes, with ``read``, the farm's read strategy);
    ``prefix``, ``max_size`` (a positive integer), ``routing`` (standalone shards: ``jump``, the default, or
    ``roshi``); with ``cluster_url``, ``failover_timeout`` (seconds a call waits for the Redis Cluster to fail
    a dead master over, default 20: :meth:`zcluster.Cluster.from_cluster_url`). The writer's and the reader's:
    a store is read with the options it is written with. A bad value is a :class:`ConfigError` naming it."""
    extra: dict[str, Any] = {"prefix": options.get("prefix", "zc:")}
    if options.get("max_size"):
        try:
            extra["max_size"] = int(options["max_size"])
        except ValueError:
            raise ConfigError(f"option max_size must be a positive integer, not {options['max_size']!r}") from None
    if options.get("routing"):
        extra["routing"] = options["routing"]  # checked by ClusterConfig
    given = [name for name in ("urls", "cluster_url", "replicas") if options.get(name)]
    if len(given) > 1:
        raise ConfigError(f"give the zcluster data source one of 'urls', 'cluster_url', 'replicas', not {given}")
    if "read" in options and given != ["replicas"]:
        raise ConfigError("option read (a farm's read strategy) goes with option replicas")
    if options.get("failover_timeout"):
        if given != ["cluster_url"]:
            raise ConfigError("option failover_timeout goes with option cluster_url (a Redis Cluster)")
        try:
            seconds = float(options["failover_timeout"])
        except ValueError:
            raise ConfigError(
                f"option failover_timeout must be a number of seconds, not {options['failover_timeout']!r}"
            ) from None
        extra["failover_timeout"] = checked_failover_timeout(seconds)  # here, in the driver: not in every task
    if options.get("replicas"):
        try:
            replicas = json.loads(options["replicas"])
        except ValueError as error:
            raise ConfigError(f"option replicas: not a JSON list ({error})") from None
        if not isinstance(replicas, list) or not replicas:
            raise ConfigError("option replicas: a JSON list of replicas (URLs, or lists of shard URLs) is needed")
        return FarmConfig.of(replicas, read=options.get("read", "all"), **extra)
    if options.get("cluster_url"):  # a seed node's URL
        return ClusterConfig.of(options["cluster_url"], cluster=True, **extra)
    urls = [u.strip() for u in options.get("urls", "").split(",") if u.strip()]
    if not urls:
        raise ConfigError("the zcluster data source needs the 'urls', 'cluster_url' or 'replicas' option")
    return ClusterConfig.of(urls, **extra)
