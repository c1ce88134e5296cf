"""The exactly-once sink on a farm of three clusters, one of which is SIGKILLed in the middle of a batch."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
from pyspark import cloudpickle

from zcluster import ConfigError
from zcluster.farm import Farm, FarmConfig, Walker
from zcluster.journal.files import FileJournals
from zcluster.spark import PositionedSink, ZClusterSink, run_available_now
from zcluster.state import StateStore
from zcluster.testing import LocalShards
from zcluster.testing.traffic import Traffic, create_journals, leaderboard_mapper, publish, timeline_mapper

pytestmark = pytest.mark.spark
cloudpickle.register_pickle_by_value(sys.modules[__name__])  # executors cannot import this test module

PREFIX = "farm:"


class KillReplicaMidBatch:
    """The timeline mapper; the first task to map its ``after``-th message of round 2 SIGKILLs ``pid`` (a
    replica's only server) once, leaving a marker, and goes on mapping: the rest of the batch, its
    checkpoints and its progress are written with that replica dead."""

    def __init__(self, pid: int, marker: Path, after: int) -> None:
        self.pid, self.marker, self.after, self.seen = pid, marker, after, 0

    def __call__(self, message: Any) -> list[Any]:
        if str(message.doc["event"]).startswith("s2-"):
            self.seen += 1
            if self.seen == self.after:
                try:
                    fd = os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
                except FileExistsError:
                    pass  # another task (or a retry) did it
                else:
                    os.kill(self.pid, signal.SIGKILL)
                    os.close(fd)
        return timeline_mapper(message)


def visible(farm: Farm, keys: list[str]) -> dict[str, list[tuple[str, float]]]:
    return {k: [(str(t.member), t.score) for t in v] for k, v in farm.select(keys, limit=100_000).items()}


def replicas_equal(farm: Farm) -> int:
    """Asserts that every replica holds the same keys and records; returns how many keys."""
    keys = [sorted(str(k) for batch in c.keys(include_removed=True) for k in batch) for c in farm.clusters]
    assert keys[1] == keys[0] and keys[2] == keys[0]
    per = [
        {k: sorted((type(w).__name__, str(w.member), w.score) for w in v) for k, v in rs.items()}
        for rs in farm.records(keys[0])
    ]
    assert per[1] == per[0] and per[2] == per[0]
    return len(keys[0])


def three_journals(tmp_path: Path) -> tuple[FileJournals, list[str], str]:
    """Three file journals under ``tmp_path``: the store, their names and the store's URL."""
    store = FileJournals(tmp_path / "journals")
    names = [f"timelines/part-{i:03d}" for i in range(3)]
    create_journals(store, names)
    return store, names, f"file://{tmp_path / 'journals'}"


def test_sink_on_a_farm_survives_a_replica_killed_mid_batch(spark: Any, tmp_path: Path) -> None:
    store, names, url = three_journals(tmp_path)
    with LocalShards(3) as servers:
        config = FarmConfig.of(servers.urls)
        marker = tmp_path / "killed"
        mapper = KillReplicaMidBatch(servers.servers[1].process.pid, marker, after=10)  # type: ignore[union-attr]
        sink = ZClusterSink(config, mapper, "farmq", journals=url, prefix=PREFIX, flush=8)
        traffic = publish(store, Traffic(names), producers=3, messages=40, seed=1)
        with FarmConfig.of(servers.urls, prefix=PREFIX).open() as farm:
            run_available_now(spark, sink, url, tmp_path / "ckpt")  # batch 0: every replica up
            assert not marker.exists()
            assert visible(farm, list(traffic.expected())) == traffic.expected()

            publish(store, traffic, producers=3, messages=40, seed=2)
            run_available_now(spark, sink, url, tmp_path / "ckpt")  # batch 1: replica1 dies in its middle
            assert marker.exists(), "the mapper never killed the replica"
            assert servers.servers[1].process is not None and servers.servers[1].process.poll() is not None
            expected = traffic.expected()
            keys = list(expected)
            # exactly once, read from the surviving majority
            assert visible(farm, keys) == expected
            assert [(b.batch_id, b.skipped) for b in sink.history] == [(0, False), (1, False)]
            assert sum(b.delivered for b in sink.history) == traffic.committed
            assert sink.history[1].delivered > 10
            state = StateStore(farm, "farmq")  # type: ignore[arg-type]
            assert state.committed_batch(sink.history[1].query_id) == 1
            assert all(state.load_journal(n).offset == store.end(n) for n in names)

            servers.kill(1)  # already dead: reaps it
            servers.start(1)  # empty: no persistence
            assert not any(batch for batch in farm.clusters[1].keys(include_removed=True))
            data = Walker(farm, batch_size=50).run()
            states = Walker(farm.view("zcstate:", floors=True)).run()
            assert data.position is None and data.failures == [] and data.diverged >= len(keys)
            assert states.position is None and states.failures == [] and states.diverged > 0
            assert replicas_equal(farm) >= len(keys)
            assert replicas_equal(farm.view("zcstate:", floors=True)) >= len(names) + 1
            for c in farm.clusters:  # each replica alone now answers the model
                alone = {k: [(str(t.member), t.score) for t in v] for k, v in c.select(keys, limit=100_000).items()}
                assert alone == expected


class KillReplicaMidLeaderboard(KillReplicaMidBatch):
    """:class:`KillReplicaMidBatch` over :func:`leaderboard_mapper`: timelines and one point per event."""

    def __call__(self, message: Any) -> list[Any]:
        super().__call__(message)
        return leaderboard_mapper(message)


def test_a_leaderboard_on_a_farm_stops_while_a_replica_is_dead_and_ends_exact_on_every_replica(
    spark: Any, tmp_path: Path
) -> None:
    """Increments need every replica (``Farm.increment``): the batch in which a replica is SIGKILLed fails
    (nothing later of its journals is sent, its checkpoint does not move); once the replica is back, empty,
    the next run replays the batch, the farm reads each key from the replica whose copy leads, and the
    walker copies those onto the emptied replica: every replica alone then holds the exact board."""
    store, names, url = three_journals(tmp_path)
    with LocalShards(3) as servers:
        config = FarmConfig.of(servers.urls)
        marker = tmp_path / "killed"
        mapper = KillReplicaMidLeaderboard(servers.servers[1].process.pid, marker, after=10)  # type: ignore[union-attr]
        sink = ZClusterSink(config, mapper, "farmlb", journals=url, prefix=PREFIX, flush=8, retries=1)
        traffic = publish(store, Traffic(names), producers=3, messages=40, seed=1)
        with FarmConfig.of(servers.urls, prefix=PREFIX).open() as farm:
            run_available_now(spark, sink, url, tmp_path / "ckpt")  # batch 0: every replica up
            assert board(farm) == traffic.leaderboard()

            publish(store, traffic, producers=3, messages=40, seed=2)  # events "s2-...": the mapper kills
            with pytest.raises(Exception, match="replica1"):
                run_available_now(spark, sink, url, tmp_path / "ckpt")  # batch 1: replica1 dies in it
            assert marker.exists(), "the mapper never killed the replica"
            state = StateStore(farm, "farmlb")  # type: ignore[arg-type]
            assert any(state.load_journal(n).offset < store.end(n) for n in names)  # batch 1 not checkpointed

            servers.kill(1)  # already dead: reaps it
            servers.start(1)  # empty: no persistence
            # A task of the failed batch that Spark cancelled may still be running its write retries (its
            # Python worker outlives the cancel): it can put some of batch 1's increments and their fences on
            # the new server, never batch 0's, which every other replica holds. The replay and the walker
            # below must converge from there too.
            points = [sum(score for _, score in board(c)) for c in farm.clusters]
            assert points[1] < min(points[0], points[2]), points
            run_available_now(spark, sink, url, tmp_path / "ckpt")  # batch 1 again, replica1 back
            assert all(state.load_journal(n).offset == store.end(n) for n in names)
            assert board(farm) == traffic.leaderboard()  # exactly once, read from a leading replica

            report = Walker(farm, batch_size=50).run()
            assert report.failures == [] and report.unsettled == []
            for c in farm.clusters:  # each replica alone holds the exact board and the same fences
                assert board(c) == traffic.leaderboard()
                assert c.fences(["leaderboard"]) == farm.clusters[0].fences(["leaderboard"])


def board(store: Any) -> list[tuple[str, float]]:
    return [(str(t.member), t.score) for t in store.top(["leaderboard"], limit=100_000)["leaderboard"]]


def test_a_publishing_sink_on_a_farm_is_refused_when_made(tmp_path: Path) -> None:
    """Refused on the driver, before any task (each task's applier would refuse it too); without ``publish``
    the same farm is a sink's store as before."""
    with LocalShards(3) as servers:
        config = FarmConfig.of(servers.urls)
        url = str(tmp_path / "journals")
        with pytest.raises(ConfigError, match=r"application farmpub publishes .*farm of replicas"):
            ZClusterSink(config, timeline_mapper, "farmpub", journals=url, prefix=PREFIX, publish=url)
        with pytest.raises(ConfigError, match=r"application farmpos publishes .*farm of replicas"):
            PositionedSink(config, timeline_mapper, "farmpos", prefix=PREFIX, publish=url)
        assert PositionedSink(config, timeline_mapper, "farmpos", prefix=PREFIX).job.publish is None
        assert ZClusterSink(config, timeline_mapper, "farmplain", journals=url, prefix=PREFIX).query_name == "farmplain"
