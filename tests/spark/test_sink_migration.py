"""A running exactly-once sink through an online migration of its store (issue 28), in local classic Spark.

The sink writes timelines and fenced leaderboard increments into two standalone shards; while the query
applies a batch, ``migrate`` moves the store to three shards. The driver's Cluster and the executors' follow
the store at the cut-over without a restart (the driver ships the new layout to later tasks), the query lives
on, and the store equals the model: every record and every increment exactly once, checkpoints at the ends of
the journals, all on the new layout."""

from __future__ import annotations

import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark import cloudpickle
from running_query import journals, start_query, state, wait_for

from zcluster import Cluster, ClusterConfig, LayoutMovedError
from zcluster.migration import migrate
from zcluster.spark import ZClusterSink
from zcluster.state import StateStore
from zcluster.testing.servers import LocalShards
from zcluster.testing.traffic import leaderboard_mapper, publish

pytestmark = [pytest.mark.spark]
cloudpickle.register_pickle_by_value(sys.modules[__name__])  # executors cannot import this test module

PREFIX = "mgs:"


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    from zcluster.spark import local_session

    session = local_session("local[2]")  # no task retries: a task that failed would fail the batch
    yield session
    session.stop()


class SlowMapper:
    """The leaderboard mapper, a little slow per message, so that the cut-over lands inside a batch."""

    def __call__(self, message: Any) -> list[Any]:
        time.sleep(0.002)
        return leaderboard_mapper(message)


def test_a_running_sink_follows_its_store_through_an_online_migration(spark: Any, tmp_path: Path) -> None:
    store, names, url, traffic = journals(tmp_path, "moving")
    query_name = f"moving{uuid.uuid4().hex[:8]}"
    with LocalShards(3) as shards, Cluster.from_urls(shards.urls[:2], prefix=PREFIX) as probe:
        source, target = shards.urls[:2], shards.urls
        sink = ZClusterSink(ClusterConfig.of(source, prefix=PREFIX), SlowMapper(), query_name, journals=url, flush=64)
        query = start_query(spark, sink, url, tmp_path)
        try:
            first = (traffic.expected(), traffic.leaderboard())
            wait_for("round 1 applied", lambda: state(probe, traffic) == first, query)
            publish(store, traffic, producers=3, messages=300, seed=2)
            keys = list(traffic.expected())

            def visible() -> bool:
                held = probe.select(keys, limit=100_000).values()
                return any(str(t.member).startswith("s2-") for v in held for t in v)

            wait_for("round 2 under way", visible, query)
            batches_before = len(sink.history)
            reports: list[Any] = []
            mover = threading.Thread(target=lambda: reports.append(migrate(source, target, prefix=PREFIX)))
            mover.start()
            publish(store, traffic, producers=3, messages=40, seed=3)
            mover.join(240)
            assert reports and reports[0].copied > 0
            publish(store, traffic, producers=3, messages=40, seed=4)  # applied on the new layout only
            model = (traffic.expected(), traffic.leaderboard())
            wait_for("every round applied", lambda: state(probe, traffic) == model, query, timeout=300)
            for name in names:
                wait_for(
                    f"{name} checkpointed to its end",
                    lambda name=name: StateStore(probe, query_name).load_journal(name).offset == store.end(name),
                    query,
                )
            assert probe.shards == [u.rpartition("/")[2] for u in target]
            assert len(sink.history) > batches_before and query.isActive and query.exception() is None
        finally:
            query.stop()
        with Cluster.from_urls(target, prefix=PREFIX) as fresh:
            assert state(fresh, traffic) == (traffic.expected(), traffic.leaderboard())
        with pytest.raises(LayoutMovedError), Cluster.from_urls(source, prefix=PREFIX) as old:
            old.select(["x"])
