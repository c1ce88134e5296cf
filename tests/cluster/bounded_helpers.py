"""What the bounded-set tests share (``test_semantics.py``, ``test_bounded_replays.py``): a size-bounded
:class:`zcluster.Cluster` over the session's shards or its Redis Cluster, by the fixture's parameter."""

from __future__ import annotations

import pytest

from zcluster import Cluster


def bounded_cluster(request: pytest.FixtureRequest, prefix: str, max_size: int) -> Cluster:
    """A Cluster with ``max_size`` over the shared shards (param ``shards``) or the shared Redis Cluster."""
    if request.param == "shards":
        return Cluster.from_urls(request.getfixturevalue("shards").urls, prefix=prefix, max_size=max_size)
    return Cluster.from_cluster_url(request.getfixturevalue("redis_cluster").url, prefix=prefix, max_size=max_size)
