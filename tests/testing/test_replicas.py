"""zcluster.testing: replicas and AOF persistence for LocalShards and LocalRedisCluster, on real servers."""

from __future__ import annotations

import os
import time

import pytest
import redis

from zcluster import TlsUnsupported
from zcluster.errors import ZClusterError
from zcluster.testing import LocalRedisCluster, LocalServer, LocalShards, redis_cluster

ACKED_MS = 120_000  # WAIT's bound: it returns once the replicas acknowledged, a loaded machine took over 1 s


def _aof_written(server: LocalServer, timeout: float = 120.0) -> None:
    """Wait until the server has no AOF write pending (it may postpone one behind a slow background fsync)."""
    deadline = time.monotonic() + timeout
    with server.client() as c:
        while int(c.info("persistence")["aof_buffer_length"]) > 0:
            assert time.monotonic() < deadline, "the AOF buffer was never written"
            time.sleep(0.02)


def test_a_write_on_a_master_is_on_its_replica_once_wait_counts_it() -> None:
    with LocalShards(2, replicas=1) as shards:
        assert len(shards.servers) == len(shards.urls) == 2
        for i, master in enumerate(shards.servers):
            (replica,) = shards.replicas_of(i)
            with master.client() as m, replica.client() as r:
                assert r.info("replication")["master_port"] == master.port
                m.set("k", f"v{i}")
                assert m.execute_command("WAIT", 1, ACKED_MS) == 1
                assert r.get("k") == f"v{i}".encode()
                with pytest.raises(redis.ReadOnlyError):
                    r.set("k", "x")


def test_several_replicas_per_master_and_close_stops_them_all() -> None:
    with LocalShards(1, replicas=2) as shards:
        root = shards.root
        replicas = shards.replicas_of(0)
        assert len(replicas) == 2 and shards.replicas_of(0) is not shards.replicas_of(0)
        pids = [s.process.pid for s in [*shards.servers, *replicas] if s.process is not None]
        assert len(pids) == 3
        with shards.servers[0].client() as m:
            assert m.info("replication")["connected_slaves"] == 2
            m.set("k", "v")
            assert m.execute_command("WAIT", 2, ACKED_MS) == 2
    assert not root.exists()
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_aof_data_survives_kill_and_start_and_without_aof_it_does_not() -> None:
    for aof in (True, False):
        with LocalShards(1, aof=aof) as shards, shards.servers[0].client() as c:
            assert c.config_get("appendonly")["appendonly"] == ("yes" if aof else "no")
            c.zadd("z", {"a": 1, "b": 2})
            if aof:
                assert c.config_get("appendfsync")["appendfsync"] == "everysec"
                _aof_written(shards.servers[0])
            shards.kill(0)
            shards.start(0)
            assert c.zrange("z", 0, -1) == ([b"a", b"b"] if aof else [])


def test_aof_replicas_also_log_and_keep_their_data_across_kill_and_start() -> None:
    with LocalShards(1, replicas=1, aof=True) as shards, shards.servers[0].client() as m:
        (replica,) = shards.replicas_of(0)
        m.set("k", "v")
        assert m.execute_command("WAIT", 1, ACKED_MS) == 1
        with replica.client() as r:
            assert r.config_get("appendonly")["appendonly"] == "yes"
            _aof_written(replica)
            replica.kill()
            replica.start()
            assert r.get("k") == b"v"


def test_a_replica_of_a_killed_master_stays_reachable_and_rejoins_it_after_start() -> None:
    with LocalShards(1, replicas=1, aof=True) as shards:
        (replica,) = shards.replicas_of(0)
        with shards.servers[0].client() as m:
            m.set("k", "v")
            assert m.execute_command("WAIT", 1, ACKED_MS) == 1
            _aof_written(shards.servers[0])
        shards.kill(0)
        with replica.client() as r:
            assert r.ping() and r.get("k") == b"v"
            assert r.info("replication")["role"] == "slave"  # nothing promotes it
            with pytest.raises(ZClusterError, match=f"replica on port {replica.port}"):
                shards.wait_replicas(timeout=0.2)  # its master is down: it cannot be online
            shards.start(0)
            shards.wait_replicas()
            with shards.servers[0].client() as m:
                m.set("k2", "v2")
                assert m.execute_command("WAIT", 1, ACKED_MS) == 1
            assert r.mget("k", "k2") == [b"v", b"v2"]


def test_replicas_authenticate_to_a_password_protected_master() -> None:
    with LocalShards(1, replicas=1, extra=["--requirepass", "s3cret"]) as shards:
        (replica,) = shards.replicas_of(0)
        with shards.servers[0].client(password="s3cret") as m, replica.client(password="s3cret") as r:
            m.set("k", "v")
            assert m.execute_command("WAIT", 1, ACKED_MS) == 1
            assert r.get("k") == b"v"


def test_replicas_of_a_tls_master_replicate_over_tls() -> None:
    try:
        shards = LocalShards(1, replicas=1, tls=True)
    except TlsUnsupported as exc:
        pytest.skip(str(exc))
    with shards, shards.servers[0].client() as m, shards.replicas_of(0)[0].client() as r:
        assert shards.replicas_of(0)[0].url.startswith("rediss://")
        m.set("k", "v")
        assert m.execute_command("WAIT", 1, ACKED_MS) == 1
        assert r.get("k") == b"v"


def test_a_replica_that_never_comes_online_is_a_clear_error() -> None:
    # The master waits a minute before its first full sync: far longer than the half second allowed.
    with pytest.raises(ZClusterError, match=r"replica on port \d+ of the master on port \d+: "):
        LocalShards(1, replicas=1, extra=["--repl-diskless-sync-delay", "60"], timeout=0.5)


def _cluster_nodes(rc: LocalRedisCluster) -> list[list[str]]:
    with rc.servers[0].client() as c:
        return [line.split() for line in c.execute_command("CLUSTER", "NODES").decode().splitlines()]


def test_a_redis_cluster_with_one_replica_per_master() -> None:
    with LocalRedisCluster(3, replicas=1, aof=True) as rc:
        assert len(rc.servers) == 3
        rows = _cluster_nodes(rc)
        masters = {r[0] for r in rows if "master" in r[2]}
        slaves = [r for r in rows if "slave" in r[2]]
        assert masters == {rc.node_id(i) for i in range(3)}
        assert sorted(r[3] for r in slaves) == sorted(masters)  # each master has exactly one slave
        for i in range(3):
            (replica,) = rc.replicas_of(i)
            port = int(next(r[1] for r in slaves if r[3] == rc.node_id(i)).split("@")[0].rsplit(":", 1)[1])
            assert port == replica.port
            with replica.client() as r:
                assert r.config_get("appendonly")["appendonly"] == "yes"
                assert r.info("replication")["master_link_status"] == "up"
        slot = 0
        owner = rc.slot_owner(slot)
        assert owner == 0
        with rc.servers[owner].client() as m, rc.replicas_of(owner)[0].client() as r:
            key = "{06S}k"  # hash slot 0
            assert m.execute_command("CLUSTER", "KEYSLOT", key) == slot
            m.set(key, "v")
            assert m.execute_command("WAIT", 1, ACKED_MS) == 1
            r.execute_command("READONLY")
            assert r.get(key) == b"v"


def test_a_redis_cluster_replica_takes_over_a_killed_master() -> None:
    with LocalRedisCluster(3, replicas=1) as rc:
        (replica,) = rc.replicas_of(0)
        rc.kill(0)
        deadline = time.monotonic() + rc.FAILOVER_WAIT
        with replica.client() as r:  # the replica notices the dead link first (not failed over yet)
            while r.info("replication").get("master_link_status") == "up":
                assert time.monotonic() < deadline, "the replica never saw its master's link drop"
                time.sleep(0.02)
        rc.wait_ok(rc.FAILOVER_WAIT)  # returns once failover has promoted the replica and every node agrees
        with replica.client() as r:
            assert r.info("replication")["role"] == "master"
        with pytest.raises(ZClusterError, match=f"owned by port {replica.port}"):
            rc.slot_owner(0)
        rc.start(0)  # the old master rejoins as a replica of the new one
        rc.wait_ok()
        with rc.servers[0].client() as c:
            info = c.info("replication")
            assert info["role"] == "slave" and info["master_port"] == replica.port


@pytest.mark.parametrize("above", [1, 0], ids=["saved-epoch-above", "saved-epoch-tied"])
def test_a_killed_master_is_not_started_over_a_successor_whose_epoch_is_not_above_its_saved_one(above: int) -> None:
    """What a CI run met: a master killed, its replica promoted, and the master (no persistence: it comes back
    empty) started again with a saved config epoch at or above its successor's. Redis Cluster gives it its
    slots back (higher epoch; a tie goes to the lower node id) and the successor resyncs from it: every key of
    the shard lost. A master's saved epoch ends above the one its replica is promoted with when it bumped it
    (settling a collision) just before it died, unheard; here its nodes.conf is given that epoch. ``start``
    refuses, and the shard keeps its data on the promoted replica. (Before, the node started and took the slots
    back: the shard came out empty; with the tie, whenever the killed node's id was the lower.)"""
    with LocalRedisCluster(3, replicas=1) as rc:
        (heir,) = rc.replicas_of(0)
        with rc.servers[0].client() as m:
            keys = [f"{{06S}}k{i}" for i in range(100)]  # hash slot 0: master 0's
            m.mset(dict.fromkeys(keys, "v"))
            assert m.execute_command("WAIT", 1, ACKED_MS) == 1
        rc.kill(0)
        rc.wait_ok(rc.FAILOVER_WAIT)  # the replica promoted, every live node agrees
        with heir.client() as r:
            epoch = int(r.execute_command("CLUSTER", "INFO").decode().split("cluster_my_epoch:")[1].split()[0])
        conf = rc.servers[0].directory / "nodes.conf"
        rows = [line.split(" ") for line in conf.read_text().splitlines()]
        for row in rows:
            if len(row) > 8 and "myself" in row[2]:
                assert int(row[6]) < epoch  # as the failover left it: below the successor's
                row[6] = str(epoch + above)
            elif row[0] == "vars":
                row[row.index("currentEpoch") + 1] = str(epoch + above)
        conf.write_text("\n".join(" ".join(row) for row in rows) + "\n")

        with pytest.raises(ZClusterError, match=f"claims slot 0 with config epoch {epoch + above}.*epoch {epoch};"):
            rc.start(0)
        assert rc.servers[0].process is None  # nothing started
        rc.wait_ok()
        with heir.client() as r:
            assert r.info("replication")["role"] == "master"
            assert r.exists(*keys) == len(keys)


def test_wait_ok_returns_once_a_config_epoch_collision_is_settled() -> None:
    """A node joins as a master carrying the config epoch of one already there (``CLUSTER SET-CONFIG-EPOCH``
    before its ``MEET``): Redis settles the collision by bumping one of them at their first gossip, and
    ``wait_ok`` returns only after that, when every node sees every master's epoch alike and no two alike.
    (Settled epochs are what keep a later failover from promoting a replica with the epoch its dead master
    saved: see the test above.)"""
    with LocalRedisCluster(3) as rc:
        with rc.servers[1].client() as c:
            taken = int(c.execute_command("CLUSTER", "INFO").decode().split("cluster_my_epoch:")[1].split()[0])
        node = rc._new_server(redis_cluster._NODE_OPTIONS)
        with node.client() as c:
            c.execute_command("CLUSTER", "SET-CONFIG-EPOCH", taken)
            c.execute_command("CLUSTER", "MEET", "127.0.0.1", rc.servers[0].port)
        rc.wait_ok()
        views = []
        for s in [*rc.servers]:
            with s.client() as c:
                views.append(redis_cluster._epochs(c.execute_command("CLUSTER", "NODES").decode()))
        assert len(views[0]) == 4 and all(v == views[0] for v in views)
        assert len(set(views[0].values())) == 4
