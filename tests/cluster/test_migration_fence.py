"""The fenced mover (issue 37): one mover at a time holds a migration. A second run while the first is alive is
refused; a mover paused (SIGSTOP) and taken over writes nothing when it wakes (SIGCONT), whatever it was doing;
a stale lease is taken by the next run; a finished migration leaves no fence but the lease. Real servers and
movers in their own processes throughout (helpers in ``migration_helpers.py``)."""

from __future__ import annotations

import itertools
import signal
import time

import pytest
import redis
from migration_helpers import Writer, marker, mover, stopped

from zcluster import Cluster, LayoutMovedError
from zcluster.migration._fence import fence_key
from zcluster.testing.servers import LocalShards

_names = itertools.count()


def _lease(url: str, prefix: str) -> dict[str, str]:
    with redis.Redis.from_url(url, decode_responses=True) as r:
        return r.hgetall(fence_key(prefix.encode()))  # type: ignore[return-value]


def _fences(url: str) -> list[bytes]:
    with redis.Redis.from_url(url) as r:
        return sorted(r.scan_iter(match="{zcfence:*"))


def _run(proc: object) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=300)  # type: ignore[attr-defined]
    return proc.returncode, out.decode(), err.decode()  # type: ignore[attr-defined]


def test_a_second_mover_is_refused_while_the_first_holds_the_lease_and_the_first_finishes() -> None:
    prefix = f"fl{next(_names)}:"
    with LocalShards(4) as s:
        source, target = s.urls[:2], s.urls[2:]
        with Cluster.from_urls(source, prefix=prefix) as cluster, Writer(cluster) as writer:
            writer.advance(5)
            first = mover(source, target, prefix, kill_at="stop:copy")
            stopped(first)
            before = [marker(u, prefix) for u in source + target]
            code, _, err = _run(mover(source, target, prefix))
            assert code == 1, err[-3000:]
            assert "is held by mover" in err and f":{first.pid}:" in err and "--take-over" in err, err[-3000:]
            assert [marker(u, prefix) for u in source + target] == before  # the second one wrote nothing
            first.send_signal(signal.SIGCONT)
            code, _, err = _run(first)
            assert code == 0, err[-3000:]
            writer.advance(5)
        writer.check(cluster)
        with Cluster.from_urls(target, prefix=prefix) as fresh:
            writer.check(fresh)


@pytest.mark.parametrize("shape", ["disjoint-copying", "shrink-copying", "disjoint-cutting"])
def test_a_paused_mover_taken_over_writes_nothing_when_it_wakes(shape: str) -> None:
    """The first mover stops itself (mid-copy, or in its cut-over with clients waiting); a second takes the lease
    over and finishes; the writer writes on the target; the first, continued, is refused at its first write:
    every write made after the cut-over stays (before the fence, 600 of 600 keys lost theirs)."""
    prefix = f"fz{next(_names)}:"
    kind, _, point = shape.partition("-")
    with LocalShards(4) as s:
        source, target = (s.urls[:2], s.urls[2:]) if kind == "disjoint" else (s.urls[:3], s.urls[:2])
        with Cluster.from_urls(source, prefix=prefix) as cluster, Writer(cluster) as writer:
            writer.advance(10)
            zombie = mover(source, target, prefix, kill_at=f"stop:{point}")
            stopped(zombie)
            code, _, err = _run(mover(source, target, prefix, "--take-over"))
            assert code == 0, err[-3000:]
            assert "taken from mover" in err and f":{zombie.pid}:" in err, err[-3000:]
            writer.advance(20)  # written on the target, after the cut-over
            zombie.send_signal(signal.SIGCONT)
            code, _, err = _run(zombie)
            writer.advance(5)
        writer.check(cluster)  # first: what a waking mover without a fence did to the data
        with Cluster.from_urls(target, prefix=prefix) as fresh:
            writer.check(fresh)
        assert code == 1 and "lost its lease" in err, err[-3000:]
        with pytest.raises(LayoutMovedError), Cluster.from_urls(source, prefix=prefix) as old:
            old.select(["t:1"])
        lease = _lease(source[0], prefix)
        assert lease["holder"] == "" and int(lease["gen"]) == 2, lease
        others = [u for u in set(source + target) if u != source[0]]
        assert all(fence_key(prefix.encode()) not in _fences(u) for u in others)  # dropped: a later waker finds none


def test_a_stale_lease_is_taken_by_the_next_run() -> None:
    prefix = f"fs{next(_names)}:"
    with LocalShards(4) as s:
        source, target = s.urls[:2], s.urls[2:]
        with Cluster.from_urls(source, prefix=prefix) as cluster:
            cluster.insert([(f"t:{i}", 1.0, "m") for i in range(300)])
            zombie = mover(source, target, prefix, "--lease", "1", kill_at="stop:copy")
            stopped(zombie)
            with redis.Redis.from_url(source[0]) as r:  # until its last beat is over a second old (server time)
                deadline = time.monotonic() + 300
                while True:
                    now = r.time()
                    if now[0] + now[1] / 1e6 - float(_lease(source[0], prefix)["beat"]) > 1.0:
                        break
                    assert time.monotonic() < deadline
                    time.sleep(0.05)
            code, _, err = _run(mover(source, target, prefix))  # no --take-over: the lease lapsed
            assert code == 0, err[-3000:]
            zombie.send_signal(signal.SIGCONT)
            code, _, err = _run(zombie)
            assert code == 1 and "lost its lease" in err, err[-3000:]
        with Cluster.from_urls(target, prefix=prefix) as fresh:
            got = fresh.select([f"t:{i}" for i in range(300)])
            assert all([m.member for m in got[f"t:{i}"]] == ["m"] for i in range(300))
