"""Redis Cluster failover, with real servers: one long-lived client follows it by itself.

Each test starts its own ``LocalRedisCluster`` (three masters, one replica each; ``cluster-node-timeout``
2 s, so a killed master's replica takes over about 3-4 s later) and kills, fails over or stops nodes under
a client that was in use before. Recovery times (from the fault to the first call that succeeded, on the
same client object) are printed (``pytest -s``); nothing asserts on them. Every wait is on the servers' own
state (a role, ``cluster_state``, a node flagged failed, a refusal counted in ``INFO errorstats``), bounded
only by :data:`WAIT` or ``LocalRedisCluster.FAILOVER_WAIT``: an election on a loaded machine has taken over
20 s.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import zcluster
from zcluster import (
    Cluster,
    ConfigError,
    Durability,
    DurabilityError,
    KeyMember,
    KeyScoreMember,
    PartialWriteError,
    ShardError,
)
from zcluster._keys import KeyLayout
from zcluster._topology import ClusterTopology
from zcluster.journal.files import FileJournals
from zcluster.spark.options import config_from_options
from zcluster.state import Consumer, StateStore
from zcluster.testing import LocalRedisCluster, LocalServer
from zcluster.testing.redis_cluster import held_by_replica
from zcluster.testing.traffic import Traffic, create_journals, publish, timeline_mapper

pytestmark = pytest.mark.cluster

KSM = KeyScoreMember
ONE = Durability(replicas=1, timeout=5.0)
KEYS = [f"user:{i}" for i in range(300)]
REJOIN_AFTER = 15.0  # seconds between a promotion and the killed node's restart: longer than the old retries
WAIT = 180.0  # outer bound of a wait on a server's state: only a broken cluster reaches it, never a slow machine
_names = itertools.count()


def nodes(rc: LocalRedisCluster) -> list[LocalServer]:
    return [*rc.servers, *(r for i in range(len(rc.servers)) for r in rc.replicas_of(i))]


def name(server: LocalServer) -> str:
    return f"127.0.0.1:{server.port}"


def master_index(rc: LocalRedisCluster, c: Cluster, key: str) -> int:
    """Index in ``rc.servers`` of the master holding ``key`` (one of the first masters)."""
    return [name(s) for s in rc.servers].index(c.shard_of(key))


@contextlib.contextmanager
def before_a_kill(
    failover: bool = True, **options: Any
) -> Iterator[tuple[LocalRedisCluster, Cluster, int, LocalServer]]:
    """A 3-master Redis Cluster with a replica each, a client (``options``; ``failover``: it waits out a failover
    for ``FAILOVER_WAIT``) that wrote every key of KEYS at 1.0 ("before"), KEYS[0]'s master (the test's victim)
    and that master's one replica (its heir)."""
    with LocalRedisCluster(3, replicas=1) as rc:
        if failover:
            options["failover_timeout"] = rc.FAILOVER_WAIT
        with Cluster.from_cluster_url(rc.url, **options) as c:
            assert c.insert([KSM(k, 1.0, "before") for k in KEYS]).ok
            victim = master_index(rc, c, KEYS[0])
            (heir,) = rc.replicas_of(victim)
            yield rc, c, victim, heir


def topology(c: Cluster) -> ClusterTopology:
    topo = c._transport.topology
    assert isinstance(topo, ClusterTopology)
    return topo


def wait_role(server: LocalServer, role: str, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with server.client(socket_timeout=2) as r:
                if r.info("replication")["role"] == role:
                    return
        except OSError:
            pass
        assert time.monotonic() < deadline, f"port {server.port} never became {role}"
        time.sleep(0.05)


def refusals(servers: list[LocalServer]) -> int:
    """How many error replies ``servers`` gave so far (``total_error_replies``; Redis 7.0 counts CLUSTERDOWN
    under ``errorstat_ERR``)."""
    total = 0
    for s in servers:
        with s.client(socket_timeout=5) as r:
            total += int(r.info("stats")["total_error_replies"])
    return total


def flagged_failed(observer: LocalServer, node: LocalServer) -> bool:
    """Whether ``observer``'s ``CLUSTER NODES`` flags ``node`` as failed (``fail``, not the mere ``fail?``)."""
    with observer.client(socket_timeout=5) as r:
        rows = [line.split() for line in r.execute_command("CLUSTER", "NODES").decode().splitlines() if line]
    return any(row[1].split("@")[0].endswith(f":{node.port}") and "fail" in row[2].split(",") for row in rows)


def members(c: Cluster, keys: list[str]) -> dict[str, list[str]]:
    return {k: [str(t.member) for t in v] for k, v in c.select(keys, limit=100).items()}


def report(what: str, seconds: float) -> None:
    print(f"\n[failover] {what}: {seconds:.2f} s")


def test_a_killed_master_is_followed_and_writes_confirmed_by_a_replica_survive() -> None:
    with (
        LocalRedisCluster(3, replicas=1) as rc,
        Cluster.from_cluster_url(rc.url, failover_timeout=rc.FAILOVER_WAIT) as c,
    ):
        durable = c.view(c.prefix, durability=ONE)
        assert durable.insert([KSM(k, 1.0, "before") for k in KEYS]).ok  # on every master's replica too

        # 1. SIGKILL a master; the next write call waits for the failover and goes to the promoted replica
        victim = master_index(rc, c, KEYS[0])
        (heir,) = rc.replicas_of(victim)
        rc.kill(victim)
        start = time.monotonic()
        result = c.insert([KSM(k, 2.0, "after") for k in KEYS])
        report("master killed, first write call (same client) confirmed after", time.monotonic() - start)
        assert result.ok and result.applied_count == len(KEYS)
        assert members(c, KEYS) == {k: ["after", "before"] for k in KEYS}  # nothing confirmed was lost
        assert name(heir) in c.shards and name(rc.servers[victim]) not in c.shards
        assert len(c.shards) == 3

        # the killed node comes back (empty) as the replica of its heir: durable writes are confirmed again
        rc.start(victim)
        rc.wait_ok()
        assert durable.insert([KSM(k, 3.0, "back") for k in KEYS]).ok

        # 2. the same again on another master, the first call after the kill being a read
        second = next(i for i in range(3) if i != victim and name(rc.servers[i]) in c.shards)
        on_second = [k for k in KEYS if c.shard_of(k) == name(rc.servers[second])]
        rc.kill(second)
        start = time.monotonic()
        got = members(c, KEYS)
        report("master killed, first read call (same client) answered after", time.monotonic() - start)
        assert got == {k: ["back", "after", "before"] for k in KEYS}
        assert all(p.present for p in c.score([KeyMember(k, "back") for k in on_second]).values())
        assert all(len(v) == 3 for v in c.records(on_second).values())
        assert sorted(str(k) for batch in c.keys() for k in batch) == sorted(KEYS)
        assert all(s.error is None for s in c.stats()) and set(c.ping().values()) == {None}
        assert c.delete([KSM(k, 4.0, "before") for k in KEYS]).ok


def test_a_hung_master_times_out_and_is_followed() -> None:
    # socket_timeout: short enough to notice the hung master, long enough for a live node on a loaded machine
    with before_a_kill(connection={"socket_timeout": 5.0}) as (rc, c, victim, heir):
        process = rc.servers[victim].process
        assert process is not None
        os.kill(process.pid, signal.SIGSTOP)  # connections open, nothing answers: every call times out
        try:
            start = time.monotonic()
            result = c.insert([KSM(k, 2.0, "after") for k in KEYS])
            report("master hung (SIGSTOP), first write call (same client) confirmed after", time.monotonic() - start)
        finally:
            os.kill(process.pid, signal.SIGCONT)
        assert result.ok and name(heir) in c.shards
        wait_role(rc.servers[victim], "slave")  # it wakes up failed over, and follows its heir
        assert c.insert([KSM(k, 3.0, "later") for k in KEYS]).ok
        assert members(c, KEYS) == {k: ["later", "after", "before"] for k in KEYS}


def test_a_call_waits_out_clusterdown_until_a_replica_takes_over() -> None:
    with before_a_kill() as (rc, c, victim, heir):
        survivors = [s for i, s in enumerate(rc.servers) if i != victim]
        survivor = survivors[0]
        on_survivors = [k for k in KEYS if c.shard_of(k) != name(rc.servers[victim])]
        with heir.client() as r:
            r.config_set("cluster-replica-no-failover", "yes")  # no automatic failover: the cluster stays down
        rc.kill(victim)
        deadline = time.monotonic() + WAIT
        with survivor.client() as r:  # the dead master is marked failed: every node answers CLUSTERDOWN
            while "cluster_state:fail" not in r.execute_command("CLUSTER", "INFO").decode():
                assert time.monotonic() < deadline, "the cluster never noticed the dead master"
                time.sleep(0.05)
        outcome: list[Any] = []
        caller = threading.Thread(target=lambda: outcome.append(c.insert([KSM(k, 2.0, "x") for k in on_survivors])))
        refused = refusals(survivors)
        start = time.monotonic()
        caller.start()
        while refusals(survivors) == refused:  # the call has met CLUSTERDOWN: it resends, with backoff
            assert caller.is_alive() and time.monotonic() < start + WAIT, "the call never met CLUSTERDOWN"
            time.sleep(0.05)
        with heir.client() as r:
            r.execute_command("CLUSTER", "FAILOVER", "FORCE")  # an operator promotes the replica
        caller.join(rc.FAILOVER_WAIT + WAIT)
        report("cluster down (no automatic failover), call returned after", time.monotonic() - start)
        assert outcome and outcome[0].ok and outcome[0].applied_count == len(on_survivors)
        assert c.insert([KSM(k, 3.0, "y") for k in KEYS]).ok
        assert name(heir) in c.shards


def test_a_bad_failover_timeout_is_a_config_error() -> None:
    for bad in (-1, "5", True, float("nan")):
        with pytest.raises(ConfigError, match="failover_timeout"):
            Cluster.from_cluster_url("redis://127.0.0.1:1", failover_timeout=bad)  # type: ignore[arg-type]


def test_failover_timeout_is_a_spark_option_of_a_redis_cluster_only() -> None:
    config = config_from_options({"cluster_url": "redis://127.0.0.1:1", "failover_timeout": "90"})
    assert dict(config.options)["failover_timeout"] == 90.0  # what the Cluster is opened with
    with pytest.raises(ConfigError, match="failover_timeout must be a number of seconds, not 'soon'"):
        config_from_options({"cluster_url": "redis://127.0.0.1:1", "failover_timeout": "soon"})
    with pytest.raises(ConfigError, match="failover_timeout goes with option cluster_url"):
        config_from_options({"urls": "redis://127.0.0.1:1", "failover_timeout": "5"})
    for bad in ("-1", "nan", "1e9"):  # refused in the driver, not in every task that opens the Cluster
        with pytest.raises(ConfigError, match="failover_timeout must be >= 0 seconds"):
            config_from_options({"cluster_url": "redis://127.0.0.1:1", "failover_timeout": bad})


def test_a_killed_replica_does_not_disturb_the_client() -> None:
    with LocalRedisCluster(3, replicas=1) as rc, Cluster.from_cluster_url(rc.url) as c:
        assert c.insert([KSM(k, 0.0, "seed") for k in KEYS]).ok
        refreshes = topology(c).refreshes
        replica = rc.replicas_of(1)[0]
        replica.kill()
        # the calls go on until every master has flagged the replica failed, and a few rounds beyond
        deadline, n, after = time.monotonic() + WAIT, 0, 0
        while after < 5:
            n += 1
            assert c.insert([KSM(k, float(n), f"m{n}") for k in KEYS]).ok  # raises on any failure
            assert all(v[0] == KSM(k, float(n), f"m{n}") for k, v in c.select(KEYS).items())
            if after or all(flagged_failed(s, replica) for s in rc.servers):
                after += 1
            assert time.monotonic() < deadline, "the masters never flagged the killed replica failed"
        assert sorted(str(k) for batch in c.keys() for k in batch) == sorted(KEYS)
        assert topology(c).refreshes == refreshes  # not even a slot-map reload


def test_a_manual_cluster_failover_is_followed_through_moved_and_readonly() -> None:
    with LocalRedisCluster(3, replicas=1) as rc, Cluster.from_cluster_url(rc.url) as c:
        assert c.view(c.prefix, durability=ONE).insert([KSM(k, 1.0, "before") for k in KEYS]).ok
        for i, first in ((0, "read"), (1, "write")):
            old = rc.servers[i]
            (heir,) = rc.replicas_of(i)
            with heir.client() as r:
                r.execute_command("CLUSTER", "FAILOVER")  # coordinated: the replica catches up, then takes over
            wait_role(heir, "master")
            wait_role(old, "slave")
            rc.wait_ok()
            refreshes = topology(c).refreshes
            start = time.monotonic()
            if first == "read":  # keyed reads: the old master answers MOVED
                assert members(c, KEYS) == {k: ["before"] for k in KEYS}
            else:  # node write calls (keys in ARGV): the old master answers READONLY
                assert c.insert([KSM(k, 2.0, "after") for k in KEYS]).ok
            elapsed = time.monotonic() - start
            report(f"manual CLUSTER FAILOVER, first {first} call (same client) done after", elapsed)
            # The map reload the MOVED asked for may reach a node that has not heard of the failover yet: the
            # client then keeps the MOVED's answer, and reloads again (rate-limited) until the map agrees.
            deadline = time.monotonic() + WAIT
            while name(old) in c.shards and time.monotonic() < deadline:
                time.sleep(0.1)
            assert name(heir) in c.shards and name(old) not in c.shards
            assert topology(c).refreshes - refreshes <= 5  # a whole node's slots moving is no reload storm
        assert c.insert([KSM(k, 2.0, "after") for k in KEYS]).ok
        assert members(c, KEYS) == {k: ["after", "before"] for k in KEYS}


def test_a_dead_master_causes_no_refresh_storm() -> None:
    # failover_timeout=0.2: calls give up quickly, so many calls fail while the master is down; the replica
    # takes over (an operator's forced failover) only once 20 calls failed, however slow the machine
    with LocalRedisCluster(3, replicas=1) as rc, Cluster.from_cluster_url(rc.url, failover_timeout=0.2) as c:
        assert c.insert([KSM(k, 0.0, "seed") for k in KEYS]).ok
        victim = master_index(rc, c, KEYS[0])
        dead = name(rc.servers[victim])
        (heir,) = rc.replicas_of(victim)
        live = [s for s in nodes(rc) if s is not rc.servers[victim]]
        for s in live:
            with s.client() as r:
                r.config_resetstat()
        with heir.client() as r:
            r.config_set("cluster-replica-no-failover", "yes")
        refreshes = topology(c).refreshes
        rc.kill(victim)
        start = time.monotonic()
        calls, errors = itertools.count(), []
        failures: list[int] = []  # the thread of each failed call
        recovered = threading.Event()

        def hammer(n: int) -> None:
            while not recovered.is_set() and time.monotonic() - start < rc.FAILOVER_WAIT + WAIT:
                next(calls)
                result = c.insert([KSM(k, 1.0, f"t{n}") for k in KEYS], raise_on_error=False)
                if result.ok:
                    recovered.set()
                else:
                    failures.append(n)
                    errors.extend(f.error for f in result.failures if f.shard == dead)

        threads = [threading.Thread(target=hammer, args=(n,)) for n in range(8)]
        for t in threads:
            t.start()
        while len(failures) < 20:
            assert all(t.is_alive() for t in threads) and time.monotonic() < start + WAIT, "the calls did not fail"
            time.sleep(0.05)
        with heir.client() as r:
            r.execute_command("CLUSTER", "FAILOVER", "FORCE")
        for t in threads:
            t.join()
        elapsed = time.monotonic() - start
        made = topology(c).refreshes - refreshes
        answered = 0
        for s in live:
            with s.client() as r:
                answered += int(r.info("commandstats").get("cmdstat_cluster|slots", {}).get("calls", 0))
        n_calls, n_failed = next(calls), len(failures)
        report(f"dead master, {n_calls} calls from 8 threads ({n_failed} failed): recovered after", elapsed)
        print(f"[failover] slot-map reloads meanwhile: {made} (CLUSTER SLOTS answered by live nodes: {answered})")
        assert recovered.is_set()
        assert n_failed >= 20  # many calls failed while the master was down...
        assert made <= 3 + elapsed / ClusterTopology.REFRESH_MIN and made * 4 < n_failed  # ...few reloads
        assert answered <= made
        error = next(e for e in errors if isinstance(e, ShardError))
        assert dead in str(error) and "failover_timeout" in str(error) and "redis://" not in str(error)


def test_a_master_without_replicas_is_reported_at_once() -> None:
    with (
        LocalRedisCluster(3) as rc,
        zcluster.connect(rc.url.replace("redis:", "redis+cluster:"), failover_timeout=WAIT) as c,
    ):
        assert c.insert([KSM(k, 0.0, "seed") for k in KEYS]).ok
        victim = master_index(rc, c, KEYS[0])
        dead = name(rc.servers[victim])
        rc.kill(victim)
        start = time.monotonic()
        with pytest.raises(PartialWriteError) as info:
            c.insert([KSM(k, 1.0, "late") for k in KEYS])
        assert time.monotonic() - start < WAIT  # no waiting out failover_timeout for a failover that cannot come
        [failure] = info.value.result.failures
        assert failure.shard == dead and dead in str(info.value)
        assert set(failure.indices) == {i for i, k in enumerate(KEYS) if c.shard_of(k) == dead}


def test_a_map_read_just_before_a_promotion_is_not_taken_for_a_master_without_replicas(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The node a client reloads its map from answers ``CLUSTER SLOTS`` before it hears of the promotion (the
    dead master still owns its slots) and ``CLUSTER NODES`` after (its replica is a master now, serving
    them). The client once counted the dead master's replicas alone there: none, so a failover that had
    already happened was taken for one that cannot come, and the call failed at once (seen twice under
    stress-ng, a durable write giving up in 56 ms). Forced here: the first ``CLUSTER SLOTS`` after the kill
    is answered with the map from before it; the call waits for the next map and lands on the heir."""
    with before_a_kill() as (rc, c, victim, heir):
        topology = c._transport.topology
        assert isinstance(topology, ClusterTopology)
        other = next(s for i, s in enumerate(rc.servers) if i != victim and s.process is not None)
        stale = topology._probe(name(other)).execute_command("CLUSTER", "SLOTS")
        rc.kill(victim)
        wait_role(heir, "master")
        rc.wait_ok()  # every live node knows the heir serves the slots now
        probe, answered = ClusterTopology._probe, []

        class Late:  # a node answering CLUSTER SLOTS before the promotion reached it, the rest after
            def __init__(self, client: Any) -> None:
                self.client = client

            def execute_command(self, *args: Any) -> Any:
                if args == ("CLUSTER", "SLOTS") and not answered:
                    answered.append(args)
                    return stale
                return self.client.execute_command(*args)

        monkeypatch.setattr(ClusterTopology, "_probe", lambda self, node: Late(probe(self, node)))
        assert c.insert([KSM(k, 2.0, "after") for k in KEYS]).ok
        assert answered  # the stale map was given
        assert members(c, KEYS) == {k: ["after", "before"] for k in KEYS}
        assert name(heir) in {c.shard_of(k) for k in KEYS}


def test_the_exactly_once_consumer_runs_through_a_failover_mid_poll(tmp_path: Path) -> None:
    store = FileJournals(tmp_path / "journals")
    journals = [f"timelines/part-{i:03d}" for i in range(3)]
    create_journals(store, journals)
    traffic = publish(store, Traffic(journals), producers=3, messages=150, seed=3)
    app = f"failover{next(_names)}"
    # effects and checkpoints on a replica before a poll goes on; deadline: the heir has no replica until the
    # killed node is back, after an election that may take long on a loaded machine
    durability = Durability(replicas=1, timeout=2.0, deadline=WAIT)
    with (
        LocalRedisCluster(3, replicas=1) as rc,
        Cluster.from_cluster_url(
            rc.url, prefix="fo:", durability=durability, failover_timeout=rc.FAILOVER_WAIT
        ) as cluster,
    ):
        victim = 0
        (heir,) = rc.replicas_of(victim)
        mapped = itertools.count()
        killed_at: list[float] = []

        def heal() -> None:  # the killed node is replaced: started again, it rejoins as its heir's replica
            wait_role(heir, "master")
            rc.start(victim)

        healer = threading.Thread(target=heal)

        def mapper(message: Any) -> Any:
            if next(mapped) == 200:  # mid-poll, with writes of this journal still to be flushed
                rc.kill(victim)
                killed_at.append(time.monotonic())
                healer.start()
            return timeline_mapper(message)

        with Consumer(cluster, store, mapper, app, flush=64, retries=12) as consumer:
            stats = consumer.poll()
            report("consumer poll through a master kill, done after (from the kill)", time.monotonic() - killed_at[0])
            healer.join()
            rc.wait_ok()
            assert stats.delivered == traffic.committed
            assert consumer.poll().delivered == 0
        expected = traffic.expected()
        held = cluster.select(list(expected), limit=10_000)
        got = {k: [(str(t.member), t.score) for t in v] for k, v in held.items()}
        assert got == expected
        assert all(StateStore(cluster, app).load_journal(j).offset == store.end(j) for j in journals)
        assert name(heir) in cluster.shards


def test_a_durable_write_rides_out_a_failover_until_the_killed_master_rejoins_as_a_replica() -> None:
    # Issue 27 (3b): after a failover the promoted replica has no replica of its own, so WAIT 1 cannot be
    # acknowledged until the killed node is back (as its replica). The call keeps asking, within
    # Durability.deadline, instead of failing after one WAIT timeout. The deadline (and failover_timeout)
    # cover an election on a loaded machine plus REJOIN_AFTER; the default deadline (60 s) did not always.
    durable = Durability(replicas=1, deadline=WAIT)
    with (
        LocalRedisCluster(3, replicas=1) as rc,
        Cluster.from_cluster_url(rc.url, durability=durable, failover_timeout=rc.FAILOVER_WAIT) as c,
    ):
        layout = KeyLayout(c.prefix)
        assert c.insert([KSM(k, 1.0, "before") for k in KEYS]).ok
        victim = master_index(rc, c, KEYS[0])
        (heir,) = rc.replicas_of(victim)
        on_victim = [k for k in KEYS if c.shard_of(k) == name(rc.servers[victim])]
        promoted: list[float] = []

        def heal() -> None:  # an operator brings the node back a while after the failover; it rejoins as a replica
            wait_role(heir, "master")
            promoted.append(time.monotonic())
            time.sleep(REJOIN_AFTER)
            rc.start(victim)

        healer = threading.Thread(target=heal)
        rc.kill(victim)
        killed = time.monotonic()
        healer.start()
        try:
            result = c.insert([KSM(k, 2.0, "after") for k in KEYS])
            confirmed = time.monotonic()
        finally:
            healer.join()
        report("master killed: promoted after", promoted[0] - killed)
        report(
            f"durable write confirmed after (the node restarted {REJOIN_AFTER:g} s after promotion)", confirmed - killed
        )
        assert result.ok and result.applied_count == len(KEYS)
        assert confirmed - promoted[0] >= REJOIN_AFTER  # confirmed by the rejoined node, not by luck
        # the rejoined node (started empty) holds the writes: they were confirmed on it
        replica = rc.servers[victim]
        wait_role(replica, "slave")
        for k in on_victim[:20]:
            assert held_by_replica(replica, layout.adds(k.encode())) == {b"before": 1.0, b"after": 2.0}
        assert members(c, KEYS) == {k: ["after", "before"] for k in KEYS}


def test_a_durable_write_whose_shard_never_gets_a_replica_back_fails_after_the_deadline_saying_what_to_do() -> None:
    durable = Durability(replicas=1, timeout=0.5, deadline=3.0)
    with before_a_kill(failover=False, durability=durable) as (rc, c, victim, heir):
        rc.kill(victim)
        wait_role(heir, "master")
        started = time.monotonic()
        with pytest.raises(PartialWriteError) as info:
            c.insert([KSM(k, 2.0, "after") for k in KEYS])
        failures = info.value.result.failures
        # it kept asking for the whole deadline (what it failed with, if not)
        assert time.monotonic() - started >= durable.deadline, [(f.shard, repr(f.error)) for f in failures]
        [failure] = failures
        assert set(failure.indices) == {i for i, k in enumerate(KEYS) if c.shard_of(k) == name(heir)}
        error = failure.error  # the failure is the shard the call was sent to; its error names the node that fell short
        assert isinstance(error, DurabilityError) and error.shard == name(heir) and error.replicas == 0
        text = str(error)
        assert f"{name(heir)}: durability not confirmed within 3s: 1 replica(s) asked, 0 acknowledged" in text
        assert "fewer replicas" in text and "restore a replica" in text and "Durability(replicas=...)" in text
        # the writes were executed on the promoted master: only their confirmation is missing
        assert members(c, KEYS) == {k: ["after", "before"] for k in KEYS}
