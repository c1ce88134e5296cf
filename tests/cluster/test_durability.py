"""Durability (WAIT / WAITAOF after each shard's writes) against real masters, replicas and AOF files.

Runs on whatever server binary zcluster.testing finds (Redis 7.0 here: WAIT only; with
``ZCLUSTER_REDIS_SERVER`` pointing at valkey-server: WAITAOF too); the AOF cases branch on the server.
"""

from __future__ import annotations

import os
import pickle
import signal
import socket
import time
from collections.abc import Iterator

import pytest

from zcluster import (
    Cluster,
    ClusterConfig,
    ConfigError,
    Count,
    Delete,
    Durability,
    DurabilityError,
    Incr,
    Insert,
    KeyScoreMember,
    PartialWriteError,
    ShardFailure,
)
from zcluster._keys import KeyLayout
from zcluster._retry import retrying
from zcluster._writes import plan_of
from zcluster.message.sequencer import ProducerState
from zcluster.message.uuid import ProducerID
from zcluster.state import BatchStats, StateStore
from zcluster.state.batch import WriteBuffer
from zcluster.testing import LocalRedisCluster, LocalServer, LocalShards
from zcluster.testing.redis_cluster import held_by_replica

KSM = KeyScoreMember
P1 = ProducerID(bytes.fromhex("010203040506"))
# Writes expected to be confirmed wait long: a replica that just came online may ack its first write only
# with its once-a-second REPLCONF ACK (Redis 7.0 streams to a disk-synced replica after its first ACK).
ONE = Durability(replicas=1, timeout=5.0)
SHORT = Durability(replicas=1, timeout=0.2, deadline=0.2)  # for writes expected to fall short: asked once


def has_waitaof(server: LocalServer) -> bool:
    """Redis >= 7.2 and every Valkey have WAITAOF."""
    with server.client() as c:
        info = c.info("server")
    if "valkey_version" in info:
        return True
    major, minor = (int(x) for x in str(info["redis_version"]).split(".")[:2])
    return (major, minor) >= (7, 2)


def on(
    server: LocalServer, prefix: str, keys: list[str], max_size: int | None = None
) -> dict[str, list[KeyScoreMember]]:
    """What ``server`` alone holds of ``keys`` (a master or a replica: reads work on both)."""
    with Cluster.from_urls([server.url], prefix=prefix, max_size=max_size) as c:
        return dict(c.select(keys, limit=100000))


@pytest.fixture(scope="module")
def replicated() -> Iterator[LocalShards]:
    """One master with one live replica, shared by the tests that kill nothing."""
    with LocalShards(1, replicas=1) as s:
        yield s


# -- the value ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {},  # asks for nothing
        {"replicas": -1},
        {"replicas": True},
        {"replicas": 1.0},
        {"replicas": 1, "timeout": 0},
        {"replicas": 1, "timeout": -1.0},
        {"replicas": 1, "timeout": float("nan")},
        {"replicas": 1, "timeout": float("inf")},
        {"local_aof": 1},
        {"replicas": 1, "deadline": 0},
        {"replicas": 1, "deadline": float("inf")},
        {"replicas": 1, "deadline": "60"},
    ],
)
def test_invalid_durability_is_a_config_error(kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        Durability(**kwargs)  # type: ignore[arg-type]


def test_durability_is_a_hashable_picklable_value_carried_by_cluster_config() -> None:
    d = Durability(replicas=2, local_aof=True, timeout=0.25)
    assert d == Durability(2, True, 0.25) and hash(d) == hash(Durability(2, True, 0.25))
    assert pickle.loads(pickle.dumps(d)) == d and d.timeout_ms == 250
    error = DurabilityError("127.0.0.1:7000", d, 1, False, "why")
    again = pickle.loads(pickle.dumps(error))
    assert str(again) == str(error) and (again.shard, again.asked, again.replicas, again.local_aof) == (
        "127.0.0.1:7000",
        d,
        1,
        False,
    )
    assert Durability(local_aof=True, timeout=0.0001).timeout_ms == 1  # never 0, which WAIT reads as "forever"
    config = ClusterConfig.of("redis://127.0.0.1:1", durability=d)
    assert hash(config) == hash(ClusterConfig.of("redis://127.0.0.1:1", durability=Durability(2, True, 0.25)))
    assert pickle.loads(pickle.dumps(config)) == config
    with config.open() as c:  # connections are lazy: nothing listens there, nothing is sent
        assert c.durability == d
        assert c.view("v:").durability == d  # a view waits as its cluster does...
        assert c.view("v:", durability=ONE).durability == ONE  # ...unless it asks for its own
    with Cluster.from_urls(["redis://127.0.0.1:1"]) as c:
        assert c.durability is None and c.view("v:", durability=ONE).durability == ONE
    with pytest.raises(ConfigError):
        Cluster.from_urls(["redis://127.0.0.1:1"], durability={"replicas": 1})


# -- replicas ----------------------------------------------------------------------------------------------


def test_writes_are_on_the_replica_when_the_call_returns(replicated: LocalShards, prefix: str) -> None:
    replica = replicated.replicas_of(0)[0]
    # 3 calls per pipeline chunk, 2 tuples per call: the streamed pipeline spans many chunks, the wait
    # must follow the last one on the same connection
    with Cluster.from_urls(replicated.urls, prefix=prefix, durability=ONE, batch_size=2, pipeline_calls=3) as c:
        keys = [f"k{i}" for i in range(50)]
        result = c.insert([KSM(k, float(j), f"m{j}") for k in keys for j in range(3)])
        assert result.ok and result.applied_count == 150
        held = on(replica, prefix, keys)
        assert all(len(held[k]) == 3 for k in keys)
        c.apply([Delete("k0", 9.0, "m0"), Insert("k1", 9.0, "new")])
        held = on(replica, prefix, ["k0", "k1"])
        assert [m.member for m in held["k0"]] == ["m2", "m1"] and held["k1"][0] == KSM("k1", 9.0, "new")
        c.delete([KSM("k2", 9.0, "m1")])
        assert "m1" not in {m.member for m in on(replica, prefix, ["k2"])["k2"]}


def test_a_lost_script_cache_resends_and_waits_on_the_resending_connection(
    replicated: LocalShards, prefix: str
) -> None:
    replica = replicated.replicas_of(0)[0]
    with Cluster.from_urls(replicated.urls, prefix=prefix, durability=ONE) as c:
        c.insert([KSM("warm", 1.0, "m")])
        with replicated.servers[0].client() as r:
            r.script_flush()  # the next write gets NOSCRIPT, reloads, resends on a pipeline of its own
        assert c.insert([KSM("after-flush", 1.0, "m")]).applied == [True]
        assert on(replica, prefix, ["after-flush"])["after-flush"] == [KSM("after-flush", 1.0, "m")]


def test_a_dead_replica_is_a_durability_error_naming_the_shard_and_the_data_is_on_the_master() -> None:
    with LocalShards(1, replicas=1, extra=["--requirepass", "s3cr3t"]) as s:
        master = s.servers[0]
        url = f"redis://:s3cr3t@127.0.0.1:{master.port}"
        with Cluster.from_urls([url], durability=SHORT) as c:
            assert c.view("zc:", durability=ONE).insert([KSM("k", 1.0, "before")]).ok
            s.replicas_of(0)[0].kill()
            tuples = [KSM("k", 2.0, "a"), KSM("j", 2.0, "b")]
            started = time.monotonic()
            with pytest.raises(PartialWriteError) as info:
                c.insert(tuples)
            assert time.monotonic() - started < 60  # bounded by the 0.2 s timeout, not a hang (a generous bound)
            [failure] = info.value.result.failures
            assert failure.shard == f"127.0.0.1:{master.port}" and failure.indices == (0, 1)
            error = failure.error
            assert isinstance(error, DurabilityError)
            assert error.shard == f"127.0.0.1:{master.port}" and error.asked == SHORT
            assert error.replicas == 0 and error.local_aof is None
            text = str(info.value)
            assert f"127.0.0.1:{master.port}" in str(error) and "s3cr3t" not in text + repr(error)
            assert "durability not confirmed within 0.2s: 1 replica(s) asked, 0 acknowledged" in str(error)
            assert "executed on the master" in str(error) and "resending them is safe" in str(error)
            # the writes were executed: the master holds them
            assert {m.member for m in c.select(["k", "j"])["k"]} == {"before", "a"}
            # raise_on_error=False returns the same failure; a cluster not asking for durability is not hurt
            kept = c.insert([KSM("k", 3.0, "c")], raise_on_error=False)
            assert not kept.ok and isinstance(kept.failures[0].error, DurabilityError)
            with Cluster.from_urls([url]) as plain:
                assert plain.insert([KSM("k", 4.0, "d")]).ok


def test_the_wait_runs_on_the_connection_that_wrote() -> None:
    # A replica that is connected but busy acknowledges nothing: only a WAIT on the connection that wrote
    # notices. WAIT on a new connection covers none of the call's writes and says 1 at once. Busy: stopped
    # (SIGSTOP) for as long as the test needs, where a DEBUG SLEEP begun from a thread lasted a guessed time.
    with LocalShards(1, replicas=1) as s, Cluster.from_urls(s.urls, durability=ONE) as c:
        assert c.insert([KSM("warm", 1.0, "m")]).ok
        replica = s.replicas_of(0)[0]
        assert replica.process is not None
        os.kill(replica.process.pid, signal.SIGSTOP)
        try:
            result = c.view("zc:", durability=SHORT).insert([KSM("k", 1.0, "m")], raise_on_error=False)
            [failure] = result.failures
            assert isinstance(failure.error, DurabilityError) and failure.error.replicas == 0
            with socket.create_connection(("127.0.0.1", s.servers[0].port)) as other:  # a bare new connection
                other.sendall(b"WAIT 1 200\r\n")
                assert other.recv(16) == b":1\r\n"  # the trap: "acknowledged by 1", yet nothing was
        finally:
            os.kill(replica.process.pid, signal.SIGCONT)
        assert c.insert([KSM("k", 2.0, "m")]).ok
        assert on(replica, "zc:", ["k"])["k"] == [KSM("k", 2.0, "m")]


def test_increments_found_at_their_fences_are_confirmed_only_once_the_replica_holds_them() -> None:
    """Increments applied on the master by a call whose WAIT fell short (the replica stopped), then resent on
    another connection (a reconnect after a dropped connection, a redis-py retry, a pool's other connection):
    the script finds them at their fences ("0": applied before) and used to write nothing, so the WAIT on the
    resending connection covered none of the first call's writes and said 1 at once on Valkey (Redis 7.0
    advances a connection's offset on any command): confirmed, though the replica held nothing of them (a
    failover then would lose them, past the checkpoint that trusted the call). The script now writes the
    fence again as it is, so that WAIT covers the first call's writes: unconfirmed while the replica is
    stopped, confirmed once it holds them. Sums (fences in K-) and counters (fences in K+) alike."""
    items = [(1, Count("ev", "f", 2)), (1, Incr("pts", "m", 0.5))]
    with LocalShards(1, replicas=1) as s, Cluster.from_urls(s.urls, prefix="d:", durability=SHORT) as c:
        sure = c.view("d:", durability=ONE)
        assert sure.increment("src", [(0, Count("ev", "f", 1)), (0, Incr("pts", "m", 1.0))]).ok
        replica = s.replicas_of(0)[0]
        assert replica.process is not None
        os.kill(replica.process.pid, signal.SIGSTOP)
        try:
            first = c.increment("src", items, raise_on_error=False)
            assert first.failed_indices == [0, 1] and _short(first.failures)
            c._transport.topology.shards[0].client.connection_pool.disconnect()  # the resend: a new connection
            resent = c.increment("src", items, raise_on_error=False)
            assert not any(resent.applied)  # at their fences: applied by the first call
            assert resent.failed_indices == [0, 1] and _short(resent.failures)  # not confirmed: not replicated
        finally:
            os.kill(replica.process.pid, signal.SIGCONT)
        resent = sure.increment("src", items)
        assert resent.ok and not any(resent.applied)
        with Cluster.from_urls([replica.url], prefix="d:") as r:  # what the replica alone holds
            assert r.counters(["ev"])["ev"] == {"f": 3}
            assert r.select(["pts"])["pts"] == [KSM("pts", 1.5, "m")]


@pytest.mark.parametrize("max_size", [None, 100])
@pytest.mark.parametrize("op", ["insert", "delete"])
def test_2p_set_writes_found_applied_are_confirmed_only_once_the_replica_holds_them(
    op: str, max_size: int | None
) -> None:
    """The 2P-set twin of the increments' test above. Inserts (or deletes) applied on the master by a call
    whose WAIT fell short, then resent on another connection: the script finds them applied ("0") and used to
    write nothing, so on Valkey the resend's WAIT said 1 at once (confirmed; the replica held nothing). A
    waited call that takes no tuple now writes one of its records again as it is (lua/write.lua, "Waits"):
    unconfirmed while the replica is stopped, confirmed once it holds them; the sets end as written."""
    items = [KSM("k", 2.0, "m"), KSM("k", 3.0, "n"), KSM("other", 2.0, "m")]
    with (
        LocalShards(1, replicas=1) as s,
        Cluster.from_urls(s.urls, prefix="d:", durability=SHORT, max_size=max_size) as c,
    ):
        sure = c.view("d:", durability=ONE)
        assert sure.insert([KSM("k", 1.0, "m"), KSM("k", 1.0, "n"), KSM("other", 1.0, "m")]).ok
        write = getattr(c, op)
        replica = s.replicas_of(0)[0]
        assert replica.process is not None
        os.kill(replica.process.pid, signal.SIGSTOP)
        try:
            first = write(items, raise_on_error=False)
            assert first.failed_indices == [0, 1, 2] and _short(first.failures)  # applied on the master only
            c._transport.topology.shards[0].client.connection_pool.disconnect()  # the resend: a new connection
            resent = write(items, raise_on_error=False)
            assert resent.failed_indices == [0, 1, 2] and _short(resent.failures)  # not confirmed: not replicated
        finally:
            os.kill(replica.process.pid, signal.SIGCONT)
        resent = getattr(sure, op)(items)
        assert resent.ok and not any(resent.applied)  # found applied: by the first call
        want = {"k": [KSM("k", 3.0, "n"), KSM("k", 2.0, "m")], "other": [KSM("other", 2.0, "m")]}
        if op == "delete":
            want = {"k": [], "other": []}
        assert on(s.servers[0], "d:", ["k", "other"], max_size) == want  # records written again are as they were
        assert on(replica, "d:", ["k", "other"], max_size) == want
        with Cluster.from_urls([replica.url], prefix="d:", max_size=max_size) as r:
            scored = r.score([("k", "m"), ("k", "n"), ("other", "m")])
            assert [p.score for p in scored.values()] == [2.0, 3.0, 2.0]  # the tombstones, for deletes


def test_only_a_waited_call_that_took_nothing_writes_a_record_again() -> None:
    """The rewrite (a stored record moved to another score and back: two ZADD XX) happens only where a wait
    follows and no tuple of the call took effect, once per call; counted in the master's dirty counter
    (``rdb_changes_since_last_save``: the writes that propagate)."""
    with LocalShards(1) as s, Cluster.from_urls(s.urls, prefix="w:") as plain:
        waited = plain.view("w:", durability=Durability(local_aof=True, timeout=0.2, deadline=0.2))
        server = s.servers[0].client()

        def dirty() -> int:
            return int(server.info("persistence")["rdb_changes_since_last_save"])

        items = [KSM("k", 1.0, "m"), KSM("k", 1.0, "n")]
        assert plain.insert(items).applied == [True, True]
        before = dirty()
        assert plain.insert(items).applied == [False, False] and dirty() == before  # no wait: nothing written
        waited.insert(items, raise_on_error=False)  # WAITAOF may be refused (no AOF): the script ran all the same
        assert dirty() == before + 2  # took nothing, a wait follows: one record written again (two ZADD XX)
        waited.insert([*items, KSM("k", 2.0, "o")], raise_on_error=False)
        assert dirty() == before + 3  # one tuple took effect: its write already moves the offset, nothing more
        assert plain.select(["k"])["k"] == [KSM("k", 2.0, "o"), KSM("k", 1.0, "n"), KSM("k", 1.0, "m")]
        assert plain.insert([KSM("solo", 0.0, "m")]).ok and server.expire("{w:solo}+", 1000)  # an operator's TTL
        waited.insert([KSM("solo", 0.0, "m")], raise_on_error=False)
        assert dirty() == before + 7  # the insert, the EXPIRE, then the rewrite: its one member moved and back
        assert 0 < server.ttl("{w:solo}+") <= 1000 and plain.select(["solo"])["solo"] == [KSM("solo", 0.0, "m")]
        assert plain.increment("src", [(0, Incr("pts", "m", 5.0))]).ok  # a sums key: a hash of fences in its K-
        stale = waited.delete([KSM("pts", 1.0, "m")], raise_on_error=False)  # below the total: "0", K- untouched
        assert stale.applied == [False] and plain.select(["pts"])["pts"] == [KSM("pts", 5.0, "m")]


def test_plans_with_and_without_waits_never_share_packed_calls() -> None:
    """A Farm packs a write once per replica shape: a replica with waits must not get calls packed without
    the script's "!" (lua/write.lua, "Waits"), so the waits are part of the shape."""
    with LocalShards(1) as s, Cluster.from_urls(s.urls, prefix="w:") as plain:
        waited = plain.view("w:", durability=ONE)
        assert plan_of(plain).shape() != plan_of(waited).shape()
        assert plan_of(plain).shape() == plan_of(plain.view("w:")).shape()


def _short(failures: list[ShardFailure]) -> bool:
    """Every failure a shortfall of the replica's acknowledgement."""
    return all(isinstance(f.error, DurabilityError) and f.error.replicas == 0 for f in failures)


def test_a_view_asks_for_durability_its_cluster_does_not() -> None:
    with LocalShards(1, replicas=1) as s:
        with Cluster.from_urls(s.urls) as c:
            assert c.insert([KSM("k", 1.0, "m")]).ok and c.view("ck:", durability=ONE).insert([KSM("k", 1.0, "m")]).ok
            s.replicas_of(0)[0].kill()
            assert c.insert([KSM("k", 2.0, "m")]).ok  # the bulk writes do not wait
            with pytest.raises(PartialWriteError) as info:
                c.view("ck:", durability=SHORT).insert([KSM("k", 2.0, "m")])
            assert isinstance(info.value.result.failures[0].error, DurabilityError)
        with Cluster.from_urls(s.urls, durability=SHORT) as durable, pytest.raises(PartialWriteError):
            durable.view("other:").insert([KSM("k", 3.0, "m")])  # a view without its own waits as its cluster


def test_more_replicas_than_exist_are_never_met(replicated: LocalShards, prefix: str) -> None:
    with Cluster.from_urls(
        replicated.urls, prefix=prefix, durability=Durability(replicas=2, timeout=0.1, deadline=0.1)
    ) as c:
        result = c.insert([KSM("k", 1.0, "m")], raise_on_error=False)
        [failure] = result.failures
        assert isinstance(failure.error, DurabilityError) and failure.error.replicas == 1
        assert "2 replica(s) asked, 1 acknowledged" in str(failure.error)


# -- the local AOF -----------------------------------------------------------------------------------------


def test_local_aof_is_confirmed_by_waitaof_or_reported_unconfirmable() -> None:
    with LocalShards(1, aof=True) as s:
        master = s.servers[0]
        with Cluster.from_urls(s.urls, durability=Durability(local_aof=True, timeout=5.0)) as c:
            if has_waitaof(master):  # Redis >= 7.2, Valkey
                assert c.insert([KSM("k", 1.0, "m")]).applied == [True]
                return
            with pytest.raises(PartialWriteError) as info:
                c.insert([KSM("k", 1.0, "m")])
            error = info.value.result.failures[0].error
            assert isinstance(error, DurabilityError) and error.local_aof is False
            assert "AOF fsync asked, not confirmed (the server has no WAITAOF (Redis < 7.2)" in str(error)
            assert c.select(["k"])["k"] == [KSM("k", 1.0, "m")]  # executed all the same


def test_local_aof_without_appendonly_is_reported_not_met() -> None:
    with LocalShards(1) as s, Cluster.from_urls(s.urls, durability=Durability(local_aof=True, timeout=0.5)) as c:
        result = c.insert([KSM("k", 1.0, "m")], raise_on_error=False)  # appendonly no
        [failure] = result.failures
        assert isinstance(failure.error, DurabilityError) and failure.error.local_aof is False
        expected = "appendonly" if has_waitaof(s.servers[0]) else "no WAITAOF"
        assert expected in str(failure.error)


def test_local_aof_and_a_replica_together() -> None:
    with LocalShards(1, replicas=1, aof=True) as s:
        durability = Durability(replicas=1, local_aof=True, timeout=5.0)
        with Cluster.from_urls(s.urls, durability=durability) as c:
            result = c.insert([KSM("k", 1.0, "m")], raise_on_error=False)
            assert on(s.replicas_of(0)[0], "zc:", ["k"])["k"] == [KSM("k", 1.0, "m")]
            if has_waitaof(s.servers[0]):
                assert result.ok
            else:
                [failure] = result.failures
                assert isinstance(failure.error, DurabilityError)
                assert failure.error.replicas == 1 and failure.error.local_aof is False


# -- the state store ---------------------------------------------------------------------------------------


def test_state_store_checkpoints_wait_for_the_replica() -> None:
    with LocalShards(1, replicas=1) as s, Cluster.from_urls(s.urls) as c:
        replica = s.replicas_of(0)[0]
        store = StateStore(c, "app", durability=ONE)
        state = ProducerState("j/1", P1, last_ack=10, begin=-1, max_clock=10)
        assert store.save_journal("j/1", 100, [state]) is True
        assert store.commit_batch("q", 1) is True
        with Cluster.from_urls([replica.url]) as on_replica:
            assert StateStore(on_replica, "app").load_journal("j/1")[:2] == (100, [state])  # there already
            assert StateStore(on_replica, "app").committed_batch("q") == 1
        replica.kill()
        assert c.insert([KSM("bulk", 1.0, "m")]).ok  # the cluster's own writes do not wait
        later = ProducerState("j/1", P1, last_ack=20, begin=-1, max_clock=20)
        store = StateStore(c, "app", durability=SHORT)
        with pytest.raises(PartialWriteError) as info:
            store.save_journal("j/1", 200, [later])
        assert isinstance(info.value.result.failures[0].error, DurabilityError)
        assert store.load_journal("j/1")[:2] == (200, [later])  # written on the master, not confirmed
        assert StateStore(c, "app").load_journal("j/1").offset == 200


# -- a Redis Cluster: redirects wait on the node they land on ------------------------------------------------


@pytest.mark.cluster
def test_redis_cluster_waits_on_each_master_and_after_a_redirect() -> None:
    with LocalRedisCluster(2, replicas=1) as rc, Cluster.from_cluster_url(rc.url, durability=ONE) as c:
        keys = [f"k{i}" for i in range(40)]
        layout = KeyLayout("zc:")
        assert c.insert([KSM(k, 1.0, "m") for k in keys]).ok
        for k in keys:  # on the replica of the key's master when the call returned
            slot = layout.slot(k.encode())
            assert held_by_replica(rc.replicas_of(rc.slot_owner(slot))[0], layout.adds(k.encode())) == {b"m": 1.0}
        key = keys[0].encode()
        slot = layout.slot(key)
        dst = 1 - rc.slot_owner(slot)
        rc.migrate_slot(slot, dst)  # the client's slot map is now stale: its next write is MOVED, then resent
        assert c.insert([KSM(key, 2.0, "moved")]).ok
        assert held_by_replica(rc.replicas_of(dst)[0], layout.adds(key)) == {b"m": 1.0, b"moved": 2.0}
        # again, towards a master whose replica is dead: the redirected write's wait falls short there
        rc.replicas_of(dst)[0].kill()
        other = next(k for k in keys if rc.slot_owner(layout.slot(k.encode())) != dst)
        rc.migrate_slot(layout.slot(other.encode()), dst)
        with pytest.raises(PartialWriteError) as info:
            c.view("zc:", durability=SHORT).insert([KSM(other, 3.0, "x")])
        [failure] = info.value.result.failures
        assert failure.shard == f"127.0.0.1:{rc.servers[1 - dst].port}"  # where the call was sent...
        error = failure.error
        assert isinstance(error, DurabilityError) and error.shard == f"127.0.0.1:{rc.servers[dst].port}"  # ...not met
        with rc.servers[dst].client() as r:
            assert r.zscore(layout.adds(other.encode()), "x") == 3.0


def test_the_write_buffer_and_state_retries_do_not_resend_what_waited_out_its_deadline() -> None:
    # The call asked for the confirmation until Durability.deadline already: a resend would only wait as
    # long again (six times with the default 5 retries), so the DurabilityError is raised after one send.
    with LocalShards(1, replicas=1) as s, Cluster.from_urls(s.urls, durability=SHORT) as c:
        # The scripts loaded on the server, so no NOSCRIPT below; by a client without Durability: under load a
        # fresh replica's first acknowledgement can take longer than SHORT's 0.2 s (seen once in CI).
        with Cluster.from_urls(s.urls) as warm:
            assert warm.insert([KSM("warm", 1.0, "m")]).ok
        s.replicas_of(0)[0].kill()
        with s.servers[0].client() as r:
            r.config_resetstat()
            buffer = WriteBuffer(c, size=100, retries=5, stats=BatchStats())
            buffer.add([Insert("k", 1.0, "m")])
            with pytest.raises(PartialWriteError) as info:
                buffer.flush()
            assert isinstance(info.value.result.failures[0].error, DurabilityError)
            assert r.info("commandstats")["cmdstat_evalsha"]["calls"] == 1  # sent once, not resent
            r.config_resetstat()
            later = ProducerState("j/1", P1, last_ack=20, begin=-1, max_clock=20)
            with pytest.raises(PartialWriteError):
                retrying(lambda: StateStore(c, "app").save_journal("j/1", 200, [later]), 5, "save")
            assert r.info("commandstats")["cmdstat_evalsha"]["calls"] == 1
