"""Cluster API beyond the 2P-set rules: views, apply, stats, failure reporting per call, bad arguments."""

from __future__ import annotations

import os
import signal

import pytest

from zcluster import (
    Cluster,
    Delete,
    Insert,
    InvalidTupleError,
    KeyScoreMember,
    OpEvent,
    PartialReadError,
    PartialScanError,
    PartialWriteError,
    ShardError,
)
from zcluster.testing import LocalRedisCluster, LocalShards


def test_a_view_shares_connections_and_instrumentation_but_not_ownership(any_cluster: Cluster) -> None:
    events: list[OpEvent] = []
    owner = any_cluster.view(any_cluster.prefix)  # a view of a view is a view too
    any_cluster.instrumentation = events.append
    state = any_cluster.view(b"state:" + any_cluster.prefix, floors=True)
    assert state.instrumentation is any_cluster.instrumentation and state.floors and not owner.floors
    state.insert([KeyScoreMember("k", 1.0, "a")])
    assert any_cluster.select(["k"])["k"] == []  # another namespace
    assert [e.op for e in events] == ["insert", "select"]
    state.close()
    owner.close()
    assert state.select(["k"])["k"][0].member == "a"  # closing a view closed nothing
    assert any_cluster.shards == state.shards


def test_apply_mixes_inserts_and_deletes_in_the_callers_order(any_cluster: Cluster) -> None:
    any_cluster.insert([("k", 5.0, "old")])
    r = any_cluster.apply(
        [Insert("k", 2.0, "a"), Delete("k", 1.0, "b"), Delete("k", 9.0, "old"), Insert("k", 0.5, "c")]
    )
    assert r.applied == [True, True, True, True]
    assert [(m.member, m.score) for m in any_cluster.select(["k"])["k"]] == [("a", 2.0), ("c", 0.5)]
    # the visible state does not depend on the order within the call (a member both inserted and deleted)
    r = any_cluster.apply([Insert("k", 10.0, "a"), Delete("k", 10.0, "a"), Delete("k", 0.1, "c")])
    assert r.applied[2] is False  # older than c's insert
    assert [m.member for m in any_cluster.select(["k"])["k"]] == ["c"]
    with pytest.raises(InvalidTupleError, match="Insert or a Delete") as info:
        any_cluster.apply([Insert("k", 1.0, "x"), KeyScoreMember("k", 1.0, "y")])
    assert info.value.index == 1


def test_every_call_reports_one_event_also_when_it_fails(any_cluster: Cluster) -> None:
    events: list[OpEvent] = []
    any_cluster.instrumentation = events.append
    with pytest.raises(InvalidTupleError):
        any_cluster.insert([("k", float("nan"), "m")])
    with pytest.raises(ValueError):
        any_cluster.select(["k"], limit=0)
    assert list(any_cluster.keys(batch_size=10)) == []
    floors = any_cluster.view(any_cluster.prefix, floors=True)
    assert floors.forget(["k"], 5.0) == 0
    assert [(e.op, type(e.error).__name__ if e.error else None) for e in events] == [
        ("insert", "InvalidTupleError"),
        ("select", "ConfigError"),  # a ValueError too: one rule for positive ints
        ("keys", None),
        ("forget", None),
    ]


def test_bad_arguments_are_clear_errors(any_cluster: Cluster) -> None:
    with pytest.raises(TypeError, match="single str"):
        any_cluster.select("abc")  # would otherwise read keys 'a', 'b', 'c'
    with pytest.raises(TypeError, match="single bytes"):
        any_cluster.select_range(b"abc")
    with pytest.raises(InvalidTupleError, match=r"tuple #1 .*\(key, member\) pair"):
        any_cluster.score([("k", "m"), ("k",)])
    with pytest.raises(TypeError, match="match must be str or bytes"):
        any_cluster.keys(match=5)  # type: ignore[arg-type]
    with pytest.raises(InvalidTupleError, match="range of a double") as info:
        any_cluster.insert([("k", 1.0, "m"), ("k", 2**1024, "m")])
    assert info.value.index == 1
    with pytest.raises(InvalidTupleError) as big:
        any_cluster.insert([("x" * 1_000_000, float("inf"), "m")])
    assert len(str(big.value)) < 1000 and "chars" in str(big.value)


def test_stats_per_shard(any_cluster: Cluster) -> None:
    any_cluster.insert([KeyScoreMember(f"s{i}", 1.0, "m") for i in range(20)])
    any_cluster.delete([KeyScoreMember("gone", 1.0, "m")])
    stats = any_cluster.stats()
    assert sorted(s.shard for s in stats) == sorted(any_cluster.shards)
    assert sum(s.keys or 0 for s in stats) == 20 and sum(s.removed_only or 0 for s in stats) == 1
    assert all(s.error is None and s.script_loaded and s.version for s in stats)
    assert all(s.module_version is None for s in stats)  # these servers load no zcluster module
    assert all(s.keys is None for s in any_cluster.stats(scan=False))


def test_a_dead_shard_is_reported_by_every_kind_of_call() -> None:
    with LocalShards(3) as s:
        c = Cluster.from_urls(s.urls, floors=True, connection={"socket_connect_timeout": 0.5})
        keys = [f"k{i}" for i in range(300)]
        c.insert([KeyScoreMember(k, 1.0, "m") for k in keys])
        dead = c.shards[1]
        on_dead = {k for k in keys if c.shard_of(k) == dead}
        s.kill(1)
        # keys(): every reachable shard is scanned and yielded, then the dead one is named
        found: list[str] = []
        with pytest.raises(PartialScanError) as scan:
            for batch in c.keys(batch_size=50):
                found.extend(str(k) for k in batch)
        assert set(found) == set(keys) - on_dead and len(found) == len(set(found))
        assert [f.shard for f in scan.value.failures] == [dead] and dead in str(scan.value)
        assert isinstance(scan.value, ShardError)
        # forget() is a write: PartialWriteError, one entry per key
        with pytest.raises(PartialWriteError) as forget:
            c.forget(keys, 0.5)
        assert {keys[i] for i in forget.value.result.failed_indices} == on_dead
        # stats() and ping() report instead of raising
        assert [st.shard for st in c.stats() if st.error] == [dead]
        assert [name for name, err in c.ping().items() if err is not None] == [dead]
        c.close()


def test_a_hung_shard_fails_select_range_once_per_call_not_once_per_key() -> None:
    with LocalShards(2) as s:
        c = Cluster.from_urls(s.urls, connection={"socket_timeout": 0.5})
        keys = [f"k{i}" for i in range(40)]
        c.insert([KeyScoreMember(k, 1.0, "m") for k in keys])
        hung = c.shards[1]
        on_hung = {k for k in keys if c.shard_of(k) == hung}
        process = s.servers[1].process
        assert process is not None
        os.kill(process.pid, signal.SIGSTOP)
        try:
            with pytest.raises(PartialReadError) as info:
                c.select_range(keys)
        finally:
            os.kill(process.pid, signal.SIGCONT)
        errors = info.value.errors
        assert set(errors) == on_hung and len(on_hung) > 1
        # one timeout for the whole shard: every key carries the same failure
        assert len({id(f.error) for f in errors.values()}) == 1
        assert set(info.value.results) == set(keys) - on_hung
        c.close()


def test_from_cluster_url_takes_the_redis_cluster_scheme_that_connect_takes(
    redis_cluster: LocalRedisCluster, prefix: str
) -> None:
    from zcluster import ClusterConfig, connect

    seed = redis_cluster.url.replace("redis://", "redis+cluster://", 1)
    with Cluster.from_cluster_url(seed, prefix=prefix) as c:
        assert c.insert([KeyScoreMember(f"k{i}", 1.0, "m") for i in range(50)]).applied_count == 50
    upper = redis_cluster.url.replace("redis://", "REDIS+CLUSTER://", 1)
    with Cluster.from_cluster_url(upper, prefix=prefix) as c, connect(seed, prefix=prefix) as d:
        assert c.select([f"k{i}" for i in range(50)]) == d.select([f"k{i}" for i in range(50)])
        assert sum(len(v) for v in c.select([f"k{i}" for i in range(50)]).values()) == 50
    # one config whichever way the seed is spelled (Spark ships it; equal configs share one Cluster)
    plain = ClusterConfig.of(redis_cluster.url, cluster=True)
    assert ClusterConfig(cluster_url=seed) == ClusterConfig.of(seed) == ClusterConfig.of(upper) == plain


def test_a_cluster_whose_seed_is_down_is_reached_through_the_nodes_a_driver_shipped(
    redis_cluster: LocalRedisCluster, prefix: str, dead_port: int
) -> None:
    # A Spark worker process started mid-failover opens its Cluster from the shipped config; its seed may be
    # the master just killed. A port nothing listens on stands for it here.
    from zcluster import ClusterConfig, ConfigError, ShardError

    live = ClusterConfig.of(redis_cluster.url, cluster=True, prefix=prefix)
    shipped = live.with_nodes()
    assert set(shipped.seeds) >= set(live.shared().shards) and shipped == live  # seeds are not its identity
    dead = f"redis://127.0.0.1:{dead_port}"
    with pytest.raises(ShardError, match="no Redis Cluster node answered"):
        Cluster.from_cluster_url(dead, prefix=prefix)
    with Cluster.from_cluster_url(dead, seeds=shipped.seeds, prefix=prefix) as c:
        assert c.insert([KeyScoreMember(f"k{i}", 1.0, "m") for i in range(20)]).applied_count == 20
        assert sorted(c.shards) == sorted(live.shared().shards)
    with pytest.raises(ConfigError, match="a seed node must be 'host:port'"):
        Cluster.from_cluster_url(dead, seeds=["nowhere"], prefix=prefix)
