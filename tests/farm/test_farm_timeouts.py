"""A hung replica (a real redis-server sent SIGSTOP) costs a farm call ``straggler_wait``, not its socket
timeout; what the late calls leave behind is repaired; Ctrl-C is not held up. And replicas of different
layouts are refused, as FarmConfig refuses them.

Timings are asserted against a socket timeout of 120 s with a bound of half of it: the calls take about
``straggler_wait`` (0.5 s), and before the fix each took the whole socket timeout; the bound is a hundred
times what a call takes, so no machine's load can reach it. Where a test needs the socket timeout to fire
(10 s: twenty times what the call takes, so a loaded machine does not reach it either), the call is shown
not to have waited for it by the replica it reports *late* (still running), not failed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

import pytest
import redis
from farm_helpers import Events, held, pairs

from zcluster import Cluster, ClusterConfig, ConfigError, Insert, KeyMember, KeyScoreMember, ReplicaBusy, ReplicaLate
from zcluster.farm import Farm, FarmConfig, SendAllReadAll, Walker
from zcluster.testing import LocalShards

KSM = KeyScoreMember
P = ParamSpec("P")
R = TypeVar("R")
SOCKET_TIMEOUT = 120.0
BOUND = SOCKET_TIMEOUT / 2  # generous: the calls take about straggler_wait (0.5 s)


def _farm(urls: list[str], socket_timeout: float = SOCKET_TIMEOUT, **options: Any) -> Farm:
    connection = {"socket_connect_timeout": 2.0, "socket_timeout": socket_timeout}
    return Farm([Cluster.from_urls([u], connection=connection) for u in urls], **options)


@contextmanager
def stopped(shards: LocalShards, i: int) -> Iterator[int]:
    """Server ``i`` stopped (SIGSTOP: connections open, nothing answered), always resumed on the way out."""
    process = shards.servers[i].process
    assert process is not None
    os.kill(process.pid, signal.SIGSTOP)
    try:
        yield process.pid
    finally:
        os.kill(process.pid, signal.SIGCONT)


def unread_request(port: int) -> bool:
    """Whether a client's bytes wait unread on a connection to the server on ``port`` (a stopped server: the
    kernel accepted the connection and queues what the client sent, so that client is blocked on it).
    From ``/proc/net/tcp``: an established socket of local port ``port`` with a non-empty receive queue."""
    for row in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = row.split()
        local, state, queues = fields[1], fields[3], fields[4]
        if int(local.split(":")[1], 16) == port and state == "01" and int(queues.split(":")[1], 16) > 0:
            return True
    return False


def timed(fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> tuple[float, R]:
    started = time.monotonic()
    result = fn(*args, **kwargs)
    return time.monotonic() - started, result


# -- item 5: layouts ------------------------------------------------------------------------------------------


def test_a_farm_refuses_replicas_of_different_layouts_as_farm_config_does(trio: LocalShards, prefix: str) -> None:
    a, b, c = trio.urls
    differing: list[dict[str, Any]] = [
        {"max_size": 2},  # trims where the others do not: every walk would find the key diverged
        {"floors": True},  # keeps floors the others do not fingerprint
        {"prefix": prefix + "other:"},
    ]
    for options in differing:
        layout: dict[str, Any] = {"prefix": prefix, **options}
        clusters = [
            Cluster.from_urls([a], prefix=prefix),
            Cluster.from_urls([b], prefix=prefix),
            Cluster.from_urls([c], **layout),
        ]
        try:
            with pytest.raises(ConfigError, match="replicas must share prefix, max_size and floors"):
                Farm(clusters)
        finally:
            for cluster in clusters:
                cluster.close()
        configs = (
            ClusterConfig.of(a, prefix=prefix),
            ClusterConfig.of(b, prefix=prefix),
            ClusterConfig.of(c, **layout),
        )
        with pytest.raises(ConfigError, match="replicas must share prefix, max_size and floors"):
            FarmConfig(configs)
    # the same layout spelled differently is one layout: floors default to on with a max_size
    same = [Cluster.from_urls([a], prefix=prefix, max_size=3), Cluster.from_urls([b], prefix=prefix, max_size=3)]
    same.append(Cluster.from_urls([c], prefix=prefix, max_size=3, floors=True))
    with Farm(same) as farm:
        farm.insert([KSM("k", float(i), f"m{i}") for i in range(5)])
        assert Walker(farm).run().diverged == 0
    FarmConfig(tuple(ClusterConfig.of(u, prefix=prefix, max_size=3) for u in (a, b)))


# -- item 6: a hung replica -----------------------------------------------------------------------------------


def test_a_quorum_write_returns_without_a_hung_replica_which_then_converges() -> None:
    with LocalShards(3) as shards, _farm(shards.urls, read=SendAllReadAll()) as farm:
        farm.insert([KSM("before", 1.0, "m")])  # every connection open and every script loaded
        batches = [[KSM(f"k{b}:{i}", float(b), f"m{i}") for i in range(50)] for b in range(6)]
        with stopped(shards, 2):
            seconds, result = timed(farm.insert, batches[0])
            assert seconds < BOUND, seconds
            assert result.ok and result.confirmed == [2] * 50 and result.applied == [True] * 50
            assert result.late == ["replica2"]
            [failure] = result.replica_failures["replica2"]
            assert isinstance(failure.error, ReplicaLate) and failure.shard == "replica2/*"
            # more writes: each waits straggler_wait until the replica has 4 late calls, then it is skipped
            outcomes = []
            for batch in batches[1:]:
                seconds, result = timed(farm.insert, batch)
                assert seconds < BOUND, seconds
                assert result.ok
                [failure] = result.replica_failures["replica2"]
                outcomes.append(type(failure.error))
            assert outcomes == [ReplicaLate] * 3 + [ReplicaBusy] * 2
            counts = farm.late_calls
            assert (counts.late, counts.running, counts.skipped) == (4, 4, 2)
            # reads answer from the two others meanwhile (the busy replica is not even asked)
            seconds, got = timed(farm.select, ["k0:0", "k5:1"])
            assert seconds < BOUND and {k: pairs(v) for k, v in got.items()} == {
                "k0:0": [("m0", 0.0)],
                "k5:1": [("m1", 5.0)],
            }
        # resumed: the four late writes complete (the server reads them off its sockets)...
        assert farm.flush_repairs(timeout=120)
        counts = farm.late_calls
        assert (counts.running, counts.failed) == (0, 0)
        keys = [f"k{b}:{i}" for b in range(6) for i in range(50)]
        late_keys = keys[:200]
        assert all(held(farm.clusters[2], late_keys).values())
        # ... the two skipped ones are not there: the walker brings them
        reference = held(farm.clusters[0], keys)
        assert held(farm.clusters[1], keys) == reference and held(farm.clusters[2], keys) != reference
        report = Walker(farm).run()
        assert report.diverged == 100 and report.failures == []
        assert held(farm.clusters[2], keys) == reference


def test_a_late_write_that_fails_is_handed_to_read_repair() -> None:
    """The late call times out (socket timeout 10 s); its tuples are resent to the replica by the repair
    strategy, which succeeds once the server is resumed."""
    events = Events()
    with LocalShards(3) as shards, _farm(shards.urls, socket_timeout=10.0, instrumentation=events) as farm:
        farm.insert([KSM("before", 1.0, "m")])
        keys = [f"k{i}" for i in range(30)]
        tuples = [KSM(k, 1.0, "m") for k in keys]
        with stopped(shards, 2):
            result = farm.insert(tuples)
            # late: its call still running, so this one returned before the 10 s socket timeout fired
            assert result.ok and result.late == ["replica2"]
            deadline = time.monotonic() + 120
            while not events.named("farm.late"):  # the late call timed out: its repair is under way
                assert time.monotonic() < deadline
                time.sleep(0.01)
        [late] = events.named("farm.late")
        assert late.failed_shards == (f"replica2/{farm.clusters[2].shards[0]}",) and late.records == 30
        assert farm.flush_repairs(timeout=120)
        repairs = farm.repairs
        assert (repairs.requested, repairs.done, repairs.failed, repairs.dropped) == (30, 30, 0, 0)
        assert farm.late_calls.failed == 1
        assert held(farm.clusters[2], keys) == held(farm.clusters[0], keys)


def test_send_all_read_all_reads_return_without_a_hung_replica() -> None:
    with LocalShards(3) as shards, _farm(shards.urls, read=SendAllReadAll()) as farm:
        farm.apply([Insert("k", 1.0, "a"), Insert("k", 2.0, "b"), Insert("j", 3.0, "c")])
        farm.clusters[0].delete([KSM("k", 5.0, "a")])  # one replica diverges: the merge asks for records
        with stopped(shards, 2):
            seconds, got = timed(farm.select, ["k", "j"])
            assert seconds < BOUND, seconds
            assert {k: pairs(v) for k, v in got.items()} == {"k": [("b", 2.0)], "j": [("c", 3.0)]}
            seconds, scores = timed(farm.score, [KeyMember("k", "a"), KeyMember("j", "c")])
            assert seconds < BOUND, seconds
            assert [(p.inserted, p.score) for p in scores.values()] == [(False, 5.0), (True, 3.0)]
            assert farm.late_calls.late == 2
        assert farm.flush_repairs(timeout=120) and farm.late_calls.running == 0
        # the late replica's answers were not merged: the next read repairs it
        farm.select(["k"])
        assert ("a", False, 5.0) in held(farm.clusters[2], ["k"])["k"]


def test_ctrl_c_is_not_held_up_by_hung_replicas() -> None:
    """The CLI's write waits for two hung replicas of three (no quorum without them); Ctrl-C ends it at
    once, where it used to wait the socket timeout (a pool's threads are joined at exit)."""
    with LocalShards(3) as shards:
        urls = [f"{u}?socket_timeout={SOCKET_TIMEOUT:g}" for u in shards.urls]
        args = [a for u in urls for a in ("--replica", u)]
        code = "import signal; signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        code += "from zcluster.cli import main\nmain()\n"
        probe = redis.Redis.from_url(shards.urls[0])
        before = len(probe.client_list())
        with stopped(shards, 1), stopped(shards, 2):
            child = subprocess.Popen(
                [sys.executable, "-c", code, *args, "insert", "k", "1", "m"],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            try:
                deadline = time.monotonic() + 120
                hung = [s.port for s in shards.servers[1:]]
                # replica0 got the write, and the CLI waits on both hung replicas (its requests sit unread)
                while len(probe.client_list()) <= before or not all(unread_request(port) for port in hung):
                    assert child.poll() is None and time.monotonic() < deadline, child.communicate()
                    time.sleep(0.05)
                child.send_signal(signal.SIGINT)
                interrupted = time.monotonic()
                _, stderr = child.communicate(timeout=SOCKET_TIMEOUT + 60)
                seconds = time.monotonic() - interrupted
            finally:
                if child.poll() is None:
                    child.kill()
                    child.wait()
        assert child.returncode != 0 and "Aborted" in stderr, stderr
        assert seconds < BOUND, seconds
        probe.close()


def test_straggler_wait_is_checked_and_carried_by_farm_config(trio: LocalShards, prefix: str) -> None:
    for bad in (-1, float("nan"), float("inf"), "1", True, None):
        with pytest.raises(ConfigError, match="straggler_wait"):
            FarmConfig.of(trio.urls, prefix=prefix, straggler_wait=bad)
        with pytest.raises(ConfigError, match="straggler_wait"):
            Farm([Cluster.from_urls([u], prefix=prefix) for u in trio.urls], straggler_wait=bad)
    config = FarmConfig.of(trio.urls, prefix=prefix, straggler_wait=0)
    assert config.straggler_wait == 0 and {r.prefix for r in config.replicas} == {prefix}
    with config.open() as farm:
        assert farm._shared.replicas.straggler_wait == 0.0
        result = farm.insert([KSM("k", 1.0, "m")])
        assert result.ok and result.confirmed[0] >= 2 and result.late in ([], ["replica0"], ["replica1"], ["replica2"])
