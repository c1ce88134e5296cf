"""Shared fixtures: real Redis servers started through zcluster.local, isolated per test by namespace."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest

from zcluster import Cluster
from zcluster.local import LocalRedisCluster, LocalShards

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
