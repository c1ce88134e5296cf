"""pytest fixtures over real local Redis servers, isolated per test by namespace prefix.

Load it from a ``conftest.py``::

    pytest_plugins = ["zcluster.testing.plugin"]

``shards`` and ``redis_cluster`` start their servers once per session, on first use; tests share them and
must not kill them (start a :class:`~zcluster.testing.LocalShards` of their own for faults). ``prefix`` is
a namespace unique to the test, so tests sharing servers never see each other's keys; ``any_cluster`` runs
a test twice, on a :class:`zcluster.Cluster` over the shards and over the Redis Cluster; ``dead_port`` is a
loopback port that nothing listens on, and nothing can take, for the test (a shard down for certain).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest

from zcluster.cluster import Cluster
from zcluster.testing._process import closed_port
from zcluster.testing.redis_cluster import LocalRedisCluster
from zcluster.testing.servers import LocalShards

__all__ = ["any_cluster", "prefix", "redis_cluster", "shards"]

_counter = itertools.count()


@pytest.fixture(scope="session")
def shards() -> Iterator[LocalShards]:
    """Two standalone redis-server processes for the whole session (tests must not kill these)."""
    with LocalShards(2) as s:
        yield s


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[LocalRedisCluster]:
    """A three-master Redis Cluster for the whole session (tests must not kill these nodes)."""
    with LocalRedisCluster(3) as c:
        yield c


@pytest.fixture
def dead_port() -> Iterator[int]:
    """A loopback port nothing listens on and no other process can take during the test (:func:`closed_port`):
    a shard that is down, for certain."""
    with closed_port() as port:
        yield port


@pytest.fixture
def prefix() -> str:
    """A namespace prefix unique to the test, so tests sharing servers never see each other's keys."""
    return f"t{next(_counter)}:"


@pytest.fixture(params=["shards", "cluster"])
def any_cluster(request: pytest.FixtureRequest, prefix: str) -> Iterator[Cluster]:
    """A Cluster over the shared standalone shards, then over the shared Redis Cluster."""
    if request.param == "shards":
        c = Cluster.from_urls(request.getfixturevalue("shards").urls, prefix=prefix)
    else:
        c = Cluster.from_cluster_url(request.getfixturevalue("redis_cluster").url, prefix=prefix)
    yield c
    c.close()
