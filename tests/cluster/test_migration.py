"""Online migration (issue 28, item 2): a standalone store grown and shrunk while a long-lived client writes
2P-set records and fenced increments, every key kept exactly once; the cut-over followed without a restart;
the old list refused afterwards; bad layouts refused before anything moves. Real servers throughout."""

from __future__ import annotations

import itertools
import json
import random
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from click.testing import CliRunner
from migration_helpers import WAIT, Writer, fresh_shard, move_state, mover

from zcluster import (
    Cluster,
    ClusterConfig,
    ConfigError,
    LayoutMismatchError,
    LayoutMovedError,
)
from zcluster._keys import KeyLayout
from zcluster.cli import cli
from zcluster.farm import Farm
from zcluster.journal.files import FileJournals
from zcluster.migration import Migration, Progress, migrate
from zcluster.state import Consumer, StateStore
from zcluster.testing.redis_cluster import LocalRedisCluster
from zcluster.testing.servers import LocalShards
from zcluster.testing.traffic import Traffic, create_journals, publish, timeline_mapper

_names = itertools.count()


@pytest.fixture
def five() -> Iterator[LocalShards]:
    with LocalShards(5) as s:
        yield s


def run_with_writer(
    source: list[str], target: list[str] | str, prefix: str, shards: list[str] | None = None, **options: Any
) -> tuple[Writer, Any]:
    with Cluster.from_urls(source, prefix=prefix) as cluster:
        writer = Writer(cluster)
        for _ in range(30):  # a store with history before the migration starts
            writer.step()
        seen: list[Progress] = []
        with writer:
            writer.advance(2)  # the writer is under way when the migration starts
            report = migrate(source, target, prefix=prefix, namespaces=[prefix], progress=seen.append, **options)
            writer.advance(2)  # the writer goes on against the target
        assert writer.error is None, writer.error
        assert writer.reads_back > 0
        assert cluster.shards == (shards or [u.rpartition("/")[2] for u in target])  # it followed
        writer.check(cluster)
    assert any(p.phase == "copying" for p in seen) and seen[-1].phase == "done"
    return writer, report


def test_a_store_grows_from_two_shards_to_three_under_a_writer_and_keeps_every_key(five: LocalShards) -> None:
    prefix = f"mg{next(_names)}:"
    source, target = five.urls[:2], five.urls[:3]
    writer, report = run_with_writer(source, target, prefix)
    assert report.copied > 0 and report.pause < 30
    with Cluster.from_urls(target, prefix=prefix) as fresh:
        writer.check(fresh)
        moved = [k for k in (f"t:{i}" for i in range(400)) if fresh.shard_of(k) == target[2].rpartition("/")[2]]
        assert moved, "some keys live on the new shard"
    with pytest.raises(LayoutMovedError) as refused, Cluster.from_urls(source, prefix=prefix) as old:
        old.select(["t:1"])
    assert refused.value.to == [u for u in target]
    # The moved keys are gone from the servers they left (no stale copy for a scan to find).
    with redis.Redis.from_url(source[0]) as r0:
        stale = [k for k in r0.scan_iter(match=f"{{{prefix}t:*") if fresh_shard(target, prefix, k) != 0]
    assert stale == []


def test_a_store_shrinks_from_three_shards_to_two_under_a_writer(five: LocalShards) -> None:
    prefix = f"mg{next(_names)}:"
    source, target = five.urls[:3], five.urls[:2]
    _writer, report = run_with_writer(source, target, prefix)
    assert report.copied > 0
    with pytest.raises(LayoutMovedError), Cluster.from_urls(source, prefix=prefix) as old:
        old.select(["t:1"])
    # Growing back onto the retired shard: refused, saying how to clear its marker; once cleared, it grows.
    with pytest.raises(LayoutMismatchError, match=r"was retired .* markers reset --retired`"):
        Migration(target, source, prefix=prefix).run()
    with redis.Redis.from_url(source[2]) as r:  # the retired server's stale copies go first
        r.delete(*r.scan_iter(match=KeyLayout(prefix).scan_pattern(None, include_removed=True), count=1000))
    retired = ["--url", source[2], "--prefix", prefix, "markers", "reset", "--retired", "--yes"]
    reset = CliRunner().invoke(cli, retired)
    assert reset.exit_code == 0, reset.output
    assert Migration(target, source, prefix=prefix).run().copied > 0


def test_bad_layouts_are_refused_before_anything_moves(five: LocalShards) -> None:
    prefix = f"mg{next(_names)}:"
    urls = five.urls
    with Cluster.from_urls(urls[:2], prefix=prefix) as c:
        c.insert([(f"k{i}", 1.0, "m") for i in range(100)])
    with pytest.raises(LayoutMismatchError, match="keeps its place"):
        Migration(urls[:2], [urls[1], urls[0], urls[2]], prefix=prefix).run()
    with pytest.raises(ConfigError, match="listed twice"):
        Migration(urls[:2], [urls[0], urls[1], urls[0]], prefix=prefix)
    with pytest.raises(LayoutMismatchError, match="prefix or max_size"):
        Migration(ClusterConfig.of(urls[:2], prefix=prefix), ClusterConfig.of(urls[:3], prefix="other:"))
    with pytest.raises(LayoutMismatchError, match="prefix or max_size"):
        Migration(ClusterConfig.of(urls[:2], prefix=prefix), ClusterConfig.of(urls[:3], prefix=prefix, max_size=5))
    with redis.Redis.from_url(urls[2]) as r:
        r.set(f"{{{prefix}foreign}}+", "x")
    with pytest.raises(LayoutMismatchError, match="already holds keys"):
        Migration(urls[:2], urls[:3], prefix=prefix).run()
    with Cluster.from_urls(urls[3:4], prefix=prefix) as c:
        c.insert([("x", 1.0, "m")])  # urls[3] is a shard of another store of this prefix
    with pytest.raises(LayoutMismatchError, match="another layout"):
        Migration(urls[:2], [*urls[:2], urls[3]], prefix=prefix).run()
    with redis.Redis.from_url(urls[2]) as r:
        r.delete(f"{{{prefix}foreign}}+")
    with redis.Redis.from_url(urls[0]) as r:  # a state store under a namespace the migration was not told of
        r.set("{zcmine:state}+", "x")
    with pytest.raises(LayoutMismatchError, match="of no namespace") as others:
        Migration(urls[:2], urls[:3], prefix=prefix, namespaces=["zcstate:"]).run()
    assert "zcmine:state" in str(others.value) and "1 key(s)" in str(others.value)
    with Cluster.from_urls(urls[:2], prefix=prefix) as c:  # nothing moved: the store is as it was
        assert len(c.select([f"k{i}" for i in range(100)])) == 100
        assert all(c.select([f"k{i}" for i in range(100)]).values())


def test_the_mover_killed_at_random_points_and_in_its_cut_over_resumes_and_loses_nothing(five: LocalShards) -> None:
    prefix = f"mg{next(_names)}:"
    source, target = five.urls[:2], five.urls[:3]
    rng = random.Random(11)
    with Cluster.from_urls(source, prefix=prefix) as cluster:
        writer = Writer(cluster, keys=3000)
        for _ in range(120):
            writer.step()
        with writer:
            for _ in range(2):  # killed mid-copy: right after a random one of its first copies of 100 keys or fewer
                proc = mover(source, target, prefix, "--batch", "100", kill_at=f"copy:{rng.randint(1, 12)}")
                proc.communicate(timeout=WAIT)
                assert proc.returncode == -signal.SIGKILL
                assert move_state(source[0], prefix) == "copying"
                refused = pytest.raises(LayoutMismatchError, match="being moved onto these shards")
                with refused, Cluster.from_urls(target, prefix=prefix) as early:  # not before the cut-over
                    early.select(["t:1"])
            proc = mover(source, target, prefix, kill_at="cutting")  # killed in its cut-over: clients wait
            proc.wait(300)
            cut_short = proc.returncode == -signal.SIGKILL and move_state(source[0], prefix) == "cutting"
            done = mover(source, target, prefix)
            out, err = done.communicate(timeout=300)
            assert done.returncode == 0, err.decode()
            report = json.loads(out)
            writer.advance(2)  # the writer goes on against the target
        assert report["resumed_from"] in ("cutting", "copying", "done")
        assert cut_short, "the third mover was killed while its cut-over ran (clients waiting)"
        assert report["resumed_from"] == "cutting"
        writer.check(cluster)
        assert cluster.shards == [u.rpartition("/")[2] for u in target]
    with Cluster.from_urls(target, prefix=prefix) as fresh:
        writer.check(fresh)
    for url in source:  # every keyspace notification setting the mover changed is back as it was
        with redis.Redis.from_url(url) as r:
            assert r.config_get("notify-keyspace-events")["notify-keyspace-events"] == ""


@pytest.mark.parametrize(
    ("shape", "kill_at", "left", "resumed"),
    [
        ("grow", "final:1", [None, "cutting"], "cutting"),  # the first shard re-marked, the second's clients wait
        ("grow", "clean", [None, None], "done"),  # the cut-over done, the moved keys not yet deleted
        ("shrink", "final:2", [None, None, "cutting"], "cutting"),  # the retired shard's clients still wait
    ],
)
def test_the_mover_killed_among_its_cut_overs_last_writes_finishes_them_when_run_again(
    five: LocalShards, shape: str, kill_at: str, left: list[str | None], resumed: str
) -> None:
    prefix = f"mg{next(_names)}:"
    source, target = (five.urls[:2], five.urls[:3]) if shape == "grow" else (five.urls[:3], five.urls[:2])
    with Cluster.from_urls(source, prefix=prefix) as cluster:
        writer = Writer(cluster)
        for _ in range(30):
            writer.step()
        with writer:
            killed = mover(source, target, prefix, kill_at=kill_at)
            killed.communicate(timeout=300)
            assert killed.returncode == -signal.SIGKILL
            assert [move_state(url, prefix) for url in source] == left
            time.sleep(0.5)  # the writer meets the half-written cut-over
            done = mover(source, target, prefix)
            out, err = done.communicate(timeout=300)
            assert done.returncode == 0, err.decode()
            report = json.loads(out)
            writer.advance(2)  # and goes on against the target
        assert report["resumed_from"] == resumed
        writer.check(cluster)
        assert writer.reads_back > 0
        assert cluster.shards == [u.rpartition("/")[2] for u in target]
    with Cluster.from_urls(target, prefix=prefix) as fresh:
        writer.check(fresh)
    with pytest.raises(LayoutMovedError), Cluster.from_urls(source, prefix=prefix) as old:
        old.select(["t:1"])
    for i, url in enumerate(source[: len(target)]):  # the keys that moved away are gone from the shared servers
        with redis.Redis.from_url(url) as r:
            assert [k for k in r.scan_iter(match=f"{{{prefix}t:*") if fresh_shard(target, prefix, k) != i] == []
            assert r.config_get("notify-keyspace-events")["notify-keyspace-events"] == ""
    if shape == "grow":
        assert report["removed"] > 0


def test_a_resumed_mover_refuses_to_finish_onto_a_target_server_restarted_empty(five: LocalShards) -> None:
    prefix = f"mg{next(_names)}:"
    source, target = five.urls[:2], five.urls[:3]

    def bound_for_the_new_server() -> int:  # keys on the source servers that the target routes to the new one
        count = 0
        for url in source:
            with redis.Redis.from_url(url) as r:
                count += sum(1 for k in r.scan_iter(match=f"{{{prefix}t:*") if fresh_shard(target, prefix, k) == 2)
        return count

    with Cluster.from_urls(source, prefix=prefix) as cluster:
        cluster.insert([(f"t:{i}", 1.0, "m") for i in range(300)])
    before = bound_for_the_new_server()
    killed = mover(source, target, prefix, kill_at="final:1")
    killed.communicate(timeout=300)
    assert killed.returncode == -signal.SIGKILL
    five.kill(2)  # the new server restarted empty: the keys copied there are gone from it
    five.servers[2].start()
    again = mover(source, target, prefix)
    _, err = again.communicate(timeout=300)
    assert again.returncode != 0 and "holds no layout marker" in err.decode()
    assert bound_for_the_new_server() == before > 0  # no clean-up ran: the source's copies are all still there


def test_a_standalone_store_moves_into_a_redis_cluster_under_a_writer() -> None:
    prefix = f"mg{next(_names)}:"
    with LocalShards(2) as shards, LocalRedisCluster(3) as rc:
        seed = "redis+cluster://" + rc.url.partition("://")[2]
        with Cluster.from_cluster_url(rc.url) as probe:
            masters = probe.shards
        writer, report = run_with_writer(shards.urls, seed, prefix, shards=masters)
        assert report.copied > 0
        with Cluster.from_cluster_url(rc.url, prefix=prefix) as fresh:
            writer.check(fresh)
            owners = {fresh.shard_of(f"t:{i}") for i in range(400)}
            assert owners == set(masters), "the keys spread over the Redis Cluster's masters"
        with pytest.raises(LayoutMovedError) as refused, Cluster.from_urls(shards.urls, prefix=prefix) as old:
            old.select(["t:1"])
        assert refused.value.cluster and refused.value.to == [rc.url]


def test_a_consumer_applying_a_journal_during_a_migration_stays_exactly_once(five: LocalShards, tmp_path: Path) -> None:
    prefix = f"mg{next(_names)}:"
    app = f"app{next(_names)}"
    source, target = five.urls[:2], five.urls[:3]
    journals = FileJournals(tmp_path / "journals")
    names = [f"timelines/part-{i:03d}" for i in range(3)]
    create_journals(journals, names)
    traffic = Traffic(names)
    stop, polled, errors = threading.Event(), [0], []
    with Cluster.from_urls(source, prefix=prefix) as cluster, Consumer(cluster, journals, timeline_mapper, app) as c:

        def consume() -> None:
            try:
                while not stop.is_set():
                    polled[0] += c.poll().delivered
            except BaseException as exc:  # reported below
                errors.append(exc)

        thread = threading.Thread(target=consume, daemon=True)
        publish(journals, traffic, producers=3, messages=400, seed=1)
        thread.start()
        for seed in range(2, 6):  # published while the store moves (checkpoints move with it)
            publish(journals, traffic, producers=3, messages=400, seed=seed)
            if seed == 3:
                report = migrate(source, target, prefix=prefix)  # the default namespaces: the state store's too
        publish(journals, traffic, producers=3, messages=400, seed=9)
        deadline = time.monotonic() + WAIT
        while polled[0] < traffic.committed and not errors and time.monotonic() < deadline:
            time.sleep(0.05)
        stop.set()
        thread.join(WAIT)
        assert not errors, errors
        assert report.copied > 0 and cluster.shards == [u.rpartition("/")[2] for u in target]
        assert polled[0] == traffic.committed  # each committed message delivered once, across the cut-over
        expected = traffic.expected()
        got = {k: [(t.member, t.score) for t in v] for k, v in cluster.select(list(expected), limit=10**5).items()}
        assert got == expected
        assert c.poll().delivered == 0
    with Cluster.from_urls(target, prefix=prefix) as fresh:  # a restarted consumer finds its checkpoints moved
        assert all(StateStore(fresh, app).load_journal(n).offset == journals.end(n) for n in names)
        with Consumer(fresh, journals, timeline_mapper, app) as again:
            assert again.poll().delivered == 0


def test_a_target_restarted_empty_and_a_source_restarted_mid_copy_are_waited_for_and_nothing_is_lost(
    five: LocalShards, caplog: pytest.LogCaptureFixture
) -> None:
    prefix = f"mg{next(_names)}:"
    source, target = five.urls[:2], five.urls[:3]
    with Cluster.from_urls(source, prefix=prefix) as cluster:
        writer = Writer(cluster, keys=3000)
        for _ in range(120):
            writer.step()
        reports: list[Any] = []
        faulted = threading.Event()
        before: list[int] = []  # how many records were logged before the faults were both done

        def faults(p: Progress) -> None:  # in the mover's thread: it is held mid-copy while the faults land
            if p.phase == "copying" and p.copied > 100 and not faulted.is_set():
                five.kill(2)  # the new shard: what was copied to it is lost
                five.stop(0)  # a source shard restarted gracefully (its data saved): its listener is cut
                before.append(len(caplog.records))
                faulted.set()

        def said(text: str, since: int = 0) -> bool:
            return any(text in r.getMessage() for r in list(caplog.records)[since:])

        with writer:
            mover = threading.Thread(
                target=lambda: reports.append(migrate(source, target, prefix=prefix, rate=3000, progress=faults)),
                daemon=True,
            )
            mover.start()
            try:
                assert faulted.wait(WAIT), "the mover never copied"
                deadline = time.monotonic() + WAIT
                # both servers stay down until the mover met them (it retried since) and its listener lost its link
                while not (said("retrying", before[0]) and said("lost its subscription")):
                    assert mover.is_alive() and time.monotonic() < deadline, "the mover never met the faults"
                    time.sleep(0.01)
            finally:  # back in any case: the writer retries until they are
                five.start(2)
                five.start(0)
            mover.join(WAIT)
            writer.advance(2)
        assert reports, "the mover finished"
        assert reports[0].passes >= 2  # everything copied again after the losses
        writer.check(cluster)
        assert cluster.shards == [u.rpartition("/")[2] for u in target]
    messages = " ".join(r.getMessage() for r in caplog.records)
    assert "lost its data" in messages or "lost its subscription" in messages
    assert "retrying" in messages  # the mover said it waited
    with Cluster.from_urls(target, prefix=prefix) as fresh:
        writer.check(fresh)


def test_a_farm_replica_migrated_under_farm_writes_follows_and_the_farm_reads_every_write(five: LocalShards) -> None:
    prefix = f"mg{next(_names)}:"
    with (
        Cluster.from_urls(five.urls[:1], prefix=prefix) as a,
        Cluster.from_urls(five.urls[3:4], prefix=prefix) as b,
        Farm([a, b], write_quorum=2) as farm,
    ):
        writer = Writer(farm, keys=300)  # type: ignore[arg-type]
        for _ in range(20):
            writer.step()
        with writer:
            writer.advance(2)
            report = migrate(five.urls[:1], five.urls[:2], prefix=prefix, namespaces=[prefix])
            writer.advance(2)
        assert report.copied > 0
        assert a.shards == [u.rpartition("/")[2] for u in five.urls[:2]]  # the replica followed its store
        writer.check(farm)  # type: ignore[arg-type]
    for replica in (five.urls[:2], five.urls[3:4]):  # each replica holds every write on its own
        with Cluster.from_urls(replica, prefix=prefix) as alone:
            writer.check(alone)
