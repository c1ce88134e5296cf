"""PrometheusInstrumentation attached to a real Cluster: counters per operation and shard errors."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

pytest.importorskip("prometheus_client")
from prometheus_client import CollectorRegistry

from zcluster import Cluster, Insert, KeyMember, KeyScoreMember
from zcluster.farm import Farm
from zcluster.metrics import PrometheusInstrumentation
from zcluster.testing import LocalShards


class Metrics:
    """A PrometheusInstrumentation on its own registry, with a reader for sample values."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.hook = PrometheusInstrumentation(self.registry)

    def value(self, name: str, **labels: str) -> float:
        found = self.registry.get_sample_value(name, labels)
        return 0.0 if found is None else found


@pytest.fixture
def metrics() -> Metrics:
    return Metrics()


@pytest.fixture
def cluster(shards: LocalShards, prefix: str, metrics: Metrics) -> Iterator[Cluster]:
    with Cluster.from_urls(shards.urls, prefix=prefix, instrumentation=metrics.hook) as c:
        yield c


def test_counts_calls_records_and_applied(cluster: Cluster, metrics: Metrics) -> None:
    tuples = [KeyScoreMember(f"k{i}", 1.0, "m") for i in range(5)]
    cluster.insert(tuples)
    cluster.insert([*tuples[:2], KeyScoreMember("k0", 2.0, "m")])  # two stale, one newer
    cluster.delete([KeyScoreMember("k1", 3.0, "m")])
    cluster.select(["k0", "k1", "k2"])
    cluster.select_range(["k0"])
    cluster.score([KeyMember("k0", "m"), KeyMember("k1", "m")])
    list(cluster.keys())

    assert metrics.value("zcluster_calls_total", op="insert") == 2
    assert metrics.value("zcluster_records_total", op="insert") == 8
    assert metrics.value("zcluster_applied_total", op="insert") == 6
    assert metrics.value("zcluster_calls_total", op="delete") == 1
    assert metrics.value("zcluster_applied_total", op="delete") == 1
    assert metrics.value("zcluster_calls_total", op="select") == 1
    assert metrics.value("zcluster_records_total", op="select") == 3
    assert metrics.value("zcluster_calls_total", op="select_range") == 1
    assert metrics.value("zcluster_records_total", op="score") == 2
    assert metrics.value("zcluster_call_seconds_count", op="insert") == 2
    assert metrics.value("zcluster_call_seconds_sum", op="insert") > 0
    assert metrics.value("zcluster_shard_errors_total", op="insert", shard=cluster.shards[0]) == 0


def test_failed_shard_increments_the_error_counter(
    shards: LocalShards, prefix: str, metrics: Metrics, dead_port: int
) -> None:
    dead = f"127.0.0.1:{dead_port}"
    with Cluster.from_urls([shards.urls[0], f"redis://{dead}"], prefix=prefix, instrumentation=metrics.hook) as c:
        tuples = [KeyScoreMember(f"k{i}", 1.0, "m") for i in range(20)]
        result = c.insert(tuples, raise_on_error=False)
        assert [f.shard for f in result.failures] == [dead]
        assert 0 < result.applied_count < 20
        assert metrics.value("zcluster_shard_errors_total", op="insert", shard=dead) == 1
        assert metrics.value("zcluster_applied_total", op="insert") == result.applied_count
        assert metrics.value("zcluster_records_total", op="insert") == 20

        read = c.select([t.key for t in tuples], strict=False)
        assert read.errors and all(f.shard == dead for f in read.errors.values())
        assert metrics.value("zcluster_shard_errors_total", op="select", shard=dead) == 1
        c.score([KeyMember(t.key, "m") for t in tuples], strict=False)
        assert metrics.value("zcluster_shard_errors_total", op="score", shard=dead) == 1
        assert metrics.value("zcluster_shard_errors_total", op="insert", shard=shards.servers[0].url[8:]) == 0


def test_the_error_series_exist_at_zero_before_the_first_error(shards: LocalShards, prefix: str) -> None:
    """Issue 39, item 7: the error series appeared only with the first error (an empty panel; increase()
    blind to that first error)."""
    registry = CollectorRegistry()
    hook = PrometheusInstrumentation(registry)
    with Cluster.from_urls(shards.urls, prefix=prefix, instrumentation=hook) as cluster:
        assert (
            registry.get_sample_value("zcluster_shard_errors_total", {"op": "insert", "shard": cluster.shards[0]})
            is None
        )
        cluster.insert([KeyScoreMember("k", 1.0, "m")])  # one shard addressed, no error
        cluster.select(["k"])
        assert len(cluster.shards) == len(shards.urls) > 1
        for op in ("insert", "select"):
            for shard in cluster.shards:  # every shard, not only those the call reached
                assert registry.get_sample_value("zcluster_shard_errors_total", {"op": op, "shard": shard}) == 0
            for error in ("ConfigError", "InvalidTupleError"):
                assert registry.get_sample_value("zcluster_call_errors_total", {"op": op, "error": error}) == 0


def test_a_farms_error_series_exist_at_zero_for_every_replicas_shards(shards: LocalShards, prefix: str) -> None:
    registry = CollectorRegistry()
    hook = PrometheusInstrumentation(registry)
    replicas = [Cluster.from_urls([u], prefix=prefix) for u in shards.urls]
    with Farm(replicas, instrumentation=hook) as farm:
        farm.apply([Insert("k", 1.0, "m")])
        assert len(farm.shards) == len(shards.urls)
        for shard in farm.shards:  # replica/host:port
            assert registry.get_sample_value("zcluster_shard_errors_total", {"op": "farm.apply", "shard": shard}) == 0
