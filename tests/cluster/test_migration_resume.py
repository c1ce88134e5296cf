"""Resuming a migration (issue 28): the mover SIGKILLed right after each of its marker writes, and in its
clean-up, for every kind of target, then run again; a resume into a Redis Cluster after keys left the source;
a wrong source list refused; a client of the target list at a cut-over that goes back; a finished migration
run again. Real servers throughout (helpers in ``migration_helpers.py``)."""

from __future__ import annotations

import itertools
import json
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from migration_helpers import WAIT, Writer, fresh_shard, marker, move_state, mover

from zcluster import Cluster, LayoutMismatchError, LayoutMovedError, MigrationError
from zcluster.migration import Migration
from zcluster.testing.redis_cluster import LocalRedisCluster
from zcluster.testing.servers import LocalShards

_names = itertools.count()


@pytest.fixture
def four() -> Iterator[LocalShards]:
    with LocalShards(4) as s:
        yield s


def sweep(source: list[str], target: list[str], open_target: Any, final_states: list[str]) -> list[str]:
    """For each marker write of a run (then the clean-up), a fresh store under a writer: the mover killed right
    after it, then run again; the writer's model, the markers, the moved keys' clean-up and the notification
    settings (set to ``Ex`` first) checked."""
    for url in source:
        with redis.Redis.from_url(url) as r:
            r.config_set("notify-keyspace-events", "Ex")
    found = {}
    for url in source:
        with redis.Redis.from_url(url) as r:
            found[url] = r.config_get("notify-keyspace-events")["notify-keyspace-events"]
    seen = []
    points = [*(f"write:{n}" for n in range(1, 30)), "clean"]
    while points:
        point = points.pop(0)
        prefix = f"kp{next(_names)}:"
        with Cluster.from_urls(source, prefix=prefix) as cluster:
            writer = Writer(cluster)
            for _ in range(20):
                writer.step()
            with writer:
                writer.advance(2)  # under way when the mover starts
                killed = mover(source, target, prefix, "--keep-others", kill_at=point)
                out, err = killed.communicate(timeout=300)
                if killed.returncode == 0:
                    assert point != "clean"
                    points = ["clean"]  # past the last marker write
                    continue
                assert killed.returncode == -signal.SIGKILL, err.decode()[-2000:]
                left = [move_state(u, prefix) or ("final" if "from" in marker(u, prefix) else None) for u in source]
                time.sleep(0.3)  # the writer meets what the kill left (it may wait: a cut-over half done)
                done = mover(source, target, prefix, "--keep-others")
                out, err = done.communicate(timeout=300)
                assert done.returncode == 0, (point, left, err.decode()[-3000:])
                report = json.loads(out)
                writer.advance(2)  # and goes on against the target
            seen.append(f"{point}: left {left} resumed_from={report['resumed_from']} removed={report['removed']}")
            writer.check(cluster)
            assert writer.reads_back > 0
        with open_target(prefix) as fresh:
            writer.check(fresh)
        with pytest.raises(LayoutMovedError), Cluster.from_urls(source, prefix=prefix) as old:
            old.select(["t:1"])
        states = [move_state(u, prefix) or ("final" if "from" in marker(u, prefix) else None) for u in source]
        assert states == final_states, (point, states)
        for url in source:
            with redis.Redis.from_url(url) as r:
                assert r.config_get("notify-keyspace-events")["notify-keyspace-events"] == found[url], point
        for i, url in enumerate(source):
            if url in target:
                with redis.Redis.from_url(url) as r:
                    away = [k for k in r.scan_iter(match=f"{{{prefix}t:*") if fresh_shard(target, prefix, k) != i]
                assert away == [], point
    return seen


@pytest.mark.parametrize("shape", ["grow", "shrink", "disjoint", "redis-cluster"])
def test_the_mover_killed_after_each_marker_write_or_in_its_clean_up_resumes_and_loses_nothing(shape: str) -> None:
    if shape == "redis-cluster":
        with LocalShards(2) as s, LocalRedisCluster(3) as rc:
            seed = "redis+cluster://" + rc.url.partition("://")[2]
            sweep(s.urls, [seed], lambda p: Cluster.from_cluster_url(rc.url, prefix=p), ["done", "done"])
        return
    with LocalShards(4) as s:
        source, target, final = {
            "grow": (s.urls[:2], s.urls[:3], ["final", "final"]),
            "shrink": (s.urls[:3], s.urls[:2], ["final", "final", "done"]),
            "disjoint": (s.urls[:2], s.urls[2:4], ["done", "done"]),
        }[shape]
        seen = sweep(source, target, lambda p: Cluster.from_urls(target, prefix=p), final)
    assert len(seen) >= 8  # every marker write of a run, and the clean-up


def test_a_migration_into_a_redis_cluster_stopped_in_its_cut_over_resumes_after_keys_left_the_source() -> None:
    """The resumed pass first deletes from the target the copies whose key the source no longer holds: on a
    Redis Cluster node those keys lie in many slots (a DEL of them all was refused: CROSSSLOT)."""
    prefix = f"rs{next(_names)}:"
    with LocalShards(2) as shards, LocalRedisCluster(3) as rc:
        seed = "redis+cluster://" + rc.url.partition("://")[2]
        with Cluster.from_urls(shards.urls, prefix=prefix) as cluster:
            cluster.insert([(f"t:{i}", 1.0, "m") for i in range(200)])
            with Migration(shards.urls, seed, prefix=prefix, namespaces=[prefix]) as first:

                def failing(*_: object) -> int:
                    raise MigrationError("a server failed in the cut-over")

                first._last_copy = failing  # type: ignore[method-assign]
                with pytest.raises(MigrationError):
                    first.run()
            assert [move_state(u, prefix) for u in shards.urls] == ["copying", "copying"]  # clients go on
            cluster.delete([(f"t:{i}", 2.0, "m") for i in range(100)])  # their records' keys leave the source
            with Migration(shards.urls, seed, prefix=prefix, namespaces=[prefix]) as again:
                report = again.run()
            assert report.resumed_from == "copying" and report.deleted >= 100
            got = cluster.select([f"t:{i}" for i in range(200)])
        assert all(got[f"t:{i}"] == [] for i in range(100)) and all(got[f"t:{i}"] for i in range(100, 200))
        with Cluster.from_cluster_url(rc.url, prefix=prefix) as fresh:
            assert fresh.select([f"t:{i}" for i in range(200)]) == got


def test_a_mover_given_the_list_a_later_migration_moved_the_store_from_is_refused_before_it_writes(
    four: LocalShards,
) -> None:
    """[A, B] grown to [A, B, C], whose own move to [A, B, C, D] stopped in its cut-over: a mover run with the
    first list ([A, B] -> [A, B, C, D]) must not take the later migration's markers (which keep the first's
    ``from``) for its own final ones, re-mark C and D and leave A and B in the cut-over."""
    prefix = f"rs{next(_names)}:"
    a_b, a_b_c, a_b_c_d = four.urls[:2], four.urls[:3], four.urls[:4]
    with Cluster.from_urls(a_b, prefix=prefix) as cluster:
        cluster.insert([(f"t:{i}", 1.0, "m") for i in range(200)])
    assert mover(a_b, a_b_c, prefix).wait(300) == 0
    killed = mover(a_b_c, a_b_c_d, prefix, kill_at="cutting")
    assert killed.wait(300) == -signal.SIGKILL
    before = [marker(u, prefix) for u in a_b_c_d]
    wrong = mover(a_b, a_b_c_d, prefix)
    _out, err = wrong.communicate(timeout=300)
    assert wrong.returncode != 0 and "do not hold one layout" in err.decode(), err.decode()[-2000:]
    assert [marker(u, prefix) for u in a_b_c_d] == before  # nothing written
    right = mover(a_b_c, a_b_c_d, prefix)  # the later migration still resumes
    _out, err = right.communicate(timeout=300)
    assert right.returncode == 0, err.decode()[-2000:]
    with Cluster.from_urls(a_b_c_d, prefix=prefix) as fresh:
        assert all(fresh.select([f"t:{i}" for i in range(200)]).values())


def test_a_client_of_the_target_list_waits_out_a_cut_over_and_is_refused_when_it_goes_back_to_copying(
    four: LocalShards,
) -> None:
    """A shard of both lists holds the source's ``cutting`` marker: a client of the target list opened then
    waits (as a client of the source does); when the cut-over goes back to ``copying`` (a server failed in
    it) it is refused as before the cut-over, not kept waiting."""
    prefix = f"rs{next(_names)}:"
    source, target = four.urls[:2], four.urls[:3]
    with Cluster.from_urls(source, prefix=prefix) as cluster:
        cluster.insert([(f"t:{i}", 1.0, "m") for i in range(200)])
    cutting, release = threading.Event(), threading.Event()
    with Migration(source, target, prefix=prefix, namespaces=[prefix]) as migration:

        def stopped(*_: object) -> int:
            cutting.set()
            release.wait(WAIT)
            raise MigrationError("a server failed in the cut-over")

        migration._last_copy = stopped  # type: ignore[method-assign]
        failed: list[BaseException] = []

        def cut_over() -> None:
            try:
                migration.run()
            except MigrationError as exc:  # what the test checks
                failed.append(exc)

        run = threading.Thread(target=cut_over)
        run.start()
        assert cutting.wait(WAIT)
        outcome: list[BaseException | None] = []

        def early() -> None:
            try:
                with Cluster.from_urls(target, prefix=prefix) as client:
                    client.select(["t:1"])
                outcome.append(None)
            except BaseException as exc:  # what the test checks
                outcome.append(exc)

        opener = threading.Thread(target=early)
        opener.start()
        opener.join(1.0)
        assert opener.is_alive() and not outcome  # waiting on the shared shard's cut-over
        release.set()
        opener.join(WAIT)
        run.join(WAIT)
    assert failed and [move_state(u, prefix) for u in source] == ["copying", "copying"]
    assert isinstance(outcome[0], LayoutMismatchError) and "being moved onto these shards" in str(outcome[0])


def test_a_migration_finished_long_ago_run_again_changes_nothing(four: LocalShards) -> None:
    """The same command run again after the store moved (its markers all final): it reports ``done``, deletes
    nothing, and leaves alone a notification setting an operator made since."""
    prefix = f"rs{next(_names)}:"
    source, target = four.urls[:2], four.urls[:3]
    with Cluster.from_urls(source, prefix=prefix) as cluster:
        cluster.insert([(f"t:{i}", 1.0, "m") for i in range(200)])
    assert mover(source, target, prefix).wait(300) == 0
    with Cluster.from_urls(target, prefix=prefix) as fresh:
        fresh.insert([(f"t:{i}", 2.0, "n") for i in range(200)])
    with redis.Redis.from_url(source[0]) as r:
        r.config_set("notify-keyspace-events", "Ex")  # another application's, set since
        later = r.config_get("notify-keyspace-events")["notify-keyspace-events"]
    again = mover(source, target, prefix)
    out, err = again.communicate(timeout=300)
    assert again.returncode == 0, err.decode()[-2000:]
    report = json.loads(out)
    assert report["resumed_from"] == "done" and report["removed"] == 0
    with redis.Redis.from_url(source[0]) as r:
        assert r.config_get("notify-keyspace-events")["notify-keyspace-events"] == later
    with Cluster.from_urls(target, prefix=prefix) as fresh:
        got = fresh.select([f"t:{i}" for i in range(200)])
    assert all([m.member for m in got[f"t:{i}"]] == ["n", "m"] for i in range(200))
    elsewhere = mover(source, four.urls[:4], prefix)  # another target from the old list: it names where the store is
    _out, err = elsewhere.communicate(timeout=300)
    assert elsewhere.returncode != 0 and "already moved to" in err.decode(), err.decode()[-2000:]
