"""ProgressCollector (the metrics extra): each application's lag per journal, read from the cluster's checkpoints
on every scrape. Real servers, real file journals damaged on disk (a lost range), a dead shard, and a scrape's
cost with many applications (it was one SCAN of the state namespace per application: behind the hundreds of
applications test_poll_boundaries.py leaves on the shared servers, one scrape took minutes)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

pytest.importorskip("prometheus_client")
from prometheus_client import CollectorRegistry
from test_lost_ranges import committed, damage, mapper

from zcluster import Cluster, PollError
from zcluster.metrics import ProgressCollector
from zcluster.state import Consumer, StateStore
from zcluster.testing import LocalShards


@pytest.fixture(scope="module")
def shards() -> Iterator[LocalShards]:
    """Servers of this module's own. A scrape reads every application's checkpoint in the state namespace,
    and the worker's shared servers hold what its earlier tests left (thousands of applications after
    test_poll_boundaries.py): on them a scrape's cost, and this module's time, depended on which files ran
    before it on the same worker (18 s to 39 s of CPU)."""
    with LocalShards(2) as s:
        yield s


def test_the_lag_of_an_application_stopped_before_a_lost_range_then_past_it(
    shards: LocalShards, tmp_path: Path
) -> None:
    app = f"prog{uuid.uuid4().hex[:8]}"
    store, ranges = damage(tmp_path / "journals", committed(10), {4})
    b, e = ranges[4]
    registry = CollectorRegistry()
    with Cluster.from_urls(shards.urls, prefix=f"pm{uuid.uuid4().hex[:8]}:") as cluster:
        registry.register(ProgressCollector(cluster, store))

        def value(name: str, journal: str = "j") -> float | None:
            return registry.get_sample_value(f"zcluster_consumer_{name}", {"app": app, "journal": journal})

        assert value("lag_bytes") is None  # no checkpoint yet: the application is not known
        consumer = Consumer(cluster, store, mapper, app)
        with pytest.raises(PollError):
            consumer.poll()  # stops before the lost range, everything before it checkpointed
        end = store.end("j")
        assert value("offset_bytes") == b
        assert value("journal_end_bytes") == end
        assert value("lag_bytes") == end - b > 0
        assert value("stopped") == 1 and value("lost_ranges_ahead") == 1
        assert value("lost_skipped_ranges") == 0 and value("lost_skipped_bytes") == 0
        assert registry.get_sample_value("zcluster_consumer_progress_failed", {"app": app}) == 0

        StateStore(cluster, app).skip_lost(store, "j", b, e, reason="gone")
        consumer.poll()
        assert value("lag_bytes") == 0 and value("offset_bytes") == end
        assert value("stopped") == 0 and value("lost_ranges_ahead") == 0
        assert value("lost_skipped_ranges") == 1 and value("lost_skipped_bytes") == e - b
        moved = value("checkpoint_timestamp_seconds")
        assert moved is not None and moved > 0

        # More messages arrive: the lag grows on the next scrape, without a poll.
        store.append("j", committed(12)[11])
        assert value("journal_end_bytes") == store.end("j") > end
        assert value("lag_bytes") == store.end("j") - end

        # A journal store that is not there: that application is reported failed, the scrape goes on.
        missing = ProgressCollector(cluster, str(tmp_path / "nowhere"), apps=[app])
        other = CollectorRegistry()
        other.register(missing)
        assert other.get_sample_value("zcluster_consumer_progress_failed", {"app": app}) == 1


def _scans(shards: LocalShards) -> int:
    total = 0
    for url in shards.urls:
        with redis.Redis.from_url(url) as client:
            total += int(client.info("commandstats").get("cmdstat_scan", {}).get("calls", 0))
    return total


def test_a_scrape_scans_the_state_namespace_once_whatever_the_number_of_applications(shards: LocalShards) -> None:
    namespace = f"zcs{uuid.uuid4().hex[:8]}:"
    apps = [f"app{i:02d}" for i in range(40)]
    with Cluster.from_urls(shards.urls, prefix=f"pm{uuid.uuid4().hex[:8]}:") as cluster:
        for app in apps:
            StateStore(cluster, app, namespace).save_journal("j", 7, [])

        def scrape(collector: ProgressCollector) -> tuple[list[tuple[str, float]], int]:
            registry = CollectorRegistry()
            registry.register(collector)
            before = _scans(shards)
            samples = {
                (s.labels["app"], s.value)
                for m in registry.collect()
                for s in m.samples
                if s.name.endswith("offset_bytes")
            }
            return sorted(samples), _scans(shards) - before

        many, many_scans = scrape(ProgressCollector(cluster, state_namespace=namespace))
        one, one_scans = scrape(ProgressCollector(cluster, apps=[apps[0]], state_namespace=namespace))
    assert many == [(a, 7.0) for a in apps] and one == [(apps[0], 7.0)]
    # One SCAN pass of the namespace per scrape, whatever the number of applications (it was one per application).
    assert 0 < many_scans <= 2 * one_scans, (many_scans, one_scans)


def test_a_dead_shard_is_reported_not_raised(shards: LocalShards, dead_port: int) -> None:
    dead = f"127.0.0.1:{dead_port}"
    registry = CollectorRegistry()
    with Cluster.from_urls([shards.urls[0], f"redis://{dead}"], prefix=f"pm{uuid.uuid4().hex[:8]}:") as cluster:
        registry.register(ProgressCollector(cluster))
        assert registry.get_sample_value("zcluster_consumer_shard_failed", {"shard": dead}) == 1
        # Issue 39, item 7: the shard that answered is exported too, at 0 (it was absent until it failed).
        assert registry.get_sample_value("zcluster_consumer_shard_failed", {"shard": shards.urls[0][8:]}) == 0


def test_every_shard_is_exported_at_zero_when_none_failed(shards: LocalShards) -> None:
    registry = CollectorRegistry()
    with Cluster.from_urls(shards.urls, prefix=f"pm{uuid.uuid4().hex[:8]}:") as cluster:
        registry.register(ProgressCollector(cluster))
        assert len(cluster.shards) > 1
        for shard in cluster.shards:
            assert registry.get_sample_value("zcluster_consumer_shard_failed", {"shard": shard}) == 0
