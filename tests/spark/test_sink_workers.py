"""The sink's tasks in Spark's reused Python workers: the worker's heap frozen for its collector (issue 30)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from zcluster import Cluster, Insert
from zcluster.journal.files import FileJournals
from zcluster.spark import ZClusterSink, run_available_now
from zcluster.testing.traffic import Traffic, create_journals, publish

pytestmark = pytest.mark.spark


def freeze_count_mapper(message: Any) -> list[Insert]:
    """One write per committed message, saying whether the task's worker had its heap frozen by then."""
    import gc

    return [Insert("frozen", 1.0, "yes" if gc.get_freeze_count() > 0 else "no")]


def test_sink_tasks_freeze_their_workers_heap_and_still_deliver_once(spark: Any, shards: Any, tmp_path: Path) -> None:
    """After every task a reused Python worker runs a full gc.collect() over everything it holds (pyspark's
    daemon); the sink's task freezes the imports first, so that collection walks only what tasks make."""
    store = FileJournals(tmp_path / "journals")
    names = [f"timelines/part-{i:03d}" for i in range(3)]
    create_journals(store, names)
    traffic = publish(store, Traffic(names), producers=3, messages=60, seed=3)
    url = f"file://{tmp_path / 'journals'}"
    for rows in ("ranges", "frames"):
        prefix = f"workers-{rows}:"
        sink = ZClusterSink(shards.urls, freeze_count_mapper, f"workers{rows}", journals=url, prefix=prefix)
        run_available_now(spark, sink, url, tmp_path / f"ckpt-{rows}", rows=rows)
        cluster = Cluster.from_urls(shards.urls, prefix=prefix)
        try:
            assert [t.member for t in cluster.select(["frozen"])["frozen"]] == ["yes"]
        finally:
            cluster.close()
        assert sum(b.delivered for b in sink.history) == traffic.committed  # each committed message once
