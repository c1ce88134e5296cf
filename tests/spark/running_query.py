"""What the tests of a sink under a continuous query share: the query started on the journal source with
the sink, a wait that fails at once when the query died, and the store's state as the traffic model has it."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from zcluster import Cluster
from zcluster.journal.files import FileJournals
from zcluster.testing.traffic import Traffic, create_journals, publish


def start_query(spark: Any, sink: Any, journals: str, tmp_path: Path) -> Any:
    """A continuous query: the journals' ranges through ``sink``, one trigger a second."""
    return (
        spark.readStream.format("zcluster-journal")
        .option("journals", journals)
        .option("rows", "ranges")
        .load()
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(processingTime="1 second")
        .start()
    )


def wait_for(what: str, done: Callable[[], bool], query: Any, timeout: float = 240.0) -> None:
    """Until ``done()``, failing at once if the query died."""
    deadline = time.monotonic() + timeout
    while not done():
        assert query.exception() is None, f"the query died while waiting for {what}: {query.exception()}"
        assert query.isActive, f"the query stopped while waiting for {what}"
        assert time.monotonic() < deadline, f"{what}: not after {timeout:g} s"
        time.sleep(0.1)


def state(cluster: Cluster, traffic: Traffic) -> tuple[dict[str, list[tuple[str, float]]], list[tuple[str, float]]]:
    """The timelines and the leaderboard ``cluster`` holds, in the form of :func:`model`."""
    held = cluster.select(list(traffic.expected()), limit=100_000)
    board = cluster.top(["leaderboard"], limit=100_000)["leaderboard"]
    return (
        {k: [(str(t.member), t.score) for t in v] for k, v in held.items()},
        [(str(t.member), t.score) for t in board],
    )


def model(traffic: Traffic) -> tuple[dict[str, list[tuple[str, float]]], list[tuple[str, float]]]:
    return traffic.expected(), traffic.leaderboard()


def journals(tmp_path: Path, stem: str) -> tuple[FileJournals, list[str], str, Traffic]:
    """Three file journals under ``tmp_path`` holding a first round of traffic (40 messages per producer):
    the store, the journal names, its ``file://`` URL, the traffic's model."""
    root = tmp_path / "journals"
    store = FileJournals(root)
    names = [f"{stem}/part-{i}" for i in range(3)]
    create_journals(store, names)
    return store, names, f"file://{root}", publish(store, Traffic(names), producers=3, messages=40, seed=1)
