from __future__ import annotations

from collections.abc import Iterator

import pytest

from zcluster.journal import RedisJournals
from zcluster.testing import LocalRedisCluster, LocalShards


@pytest.fixture(params=["standalone", "cluster"])
def rj(request: pytest.FixtureRequest, prefix: str) -> Iterator[RedisJournals]:
    """Redis Streams journals on a shared standalone server, then on the shared Redis Cluster."""
    if request.param == "standalone":
        shards: LocalShards = request.getfixturevalue("shards")
        j = RedisJournals.from_url(shards.urls[0], prefix=prefix)
    else:
        cluster: LocalRedisCluster = request.getfixturevalue("redis_cluster")
        j = RedisJournals.from_url(cluster.url, cluster=True, prefix=prefix)
    yield j
    j.close()
