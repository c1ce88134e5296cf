"""A Redis Cluster write carries the keys of many slots of one node per script call ("k"/"K" modes); a call
that meets a key its node does not serve stops there, and the tuples it did not get to are resent one slot
per call, each with its exact verdict."""

from __future__ import annotations

import hashlib
import logging
import random
import threading
import time

import pytest
import redis

from zcluster import Cluster, KeyScoreMember, RedirectLoopError, ShardError, WriteResult
from zcluster._keys import KeyLayout
from zcluster._scripts import Script, node_write_script
from zcluster.testing import LocalRedisCluster, LocalShards

KSM = KeyScoreMember
pytestmark = pytest.mark.cluster


def script_calls(rc: LocalRedisCluster) -> int:
    """EVALSHA calls the masters served so far."""
    total = 0
    for s in rc.servers:
        with s.client() as r:
            total += int(r.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))
    return total


def error_count(rc: LocalRedisCluster, prefix: str) -> int:
    """Error replies starting with ``prefix`` that the masters gave (counted by prefix)."""
    total = 0
    for s in rc.servers:
        with s.client() as r:
            total += int(r.info("errorstats").get(f"errorstat_{prefix}", {}).get("count", 0))
    return total


def test_spread_keys_take_one_call_per_node_not_one_per_slot() -> None:
    keys = [f"user:{i}" for i in range(600)]
    with LocalRedisCluster(3) as rc, Cluster.from_cluster_url(rc.url) as c:
        layout = KeyLayout(c.prefix)
        assert len({layout.slot(k.encode()) for k in keys}) > 500  # spread: about a key per slot
        c.load_scripts()  # else the first calls count twice: NOSCRIPT, then again
        before = script_calls(rc)
        assert c.insert([KSM(k, 1.0, "a") for k in keys]).applied_count == len(keys)
        # 600 tuples in calls of at most batch_size (256) per node: a handful of calls, not one per slot
        assert script_calls(rc) - before <= 3 + len(keys) // c.batch_size
        assert c.delete([KSM(k, 2.0, "a") for k in keys[:300]]).applied_count == 300
        again = c.insert([KSM(k, 1.0, "a") for k in keys])  # stale everywhere: deleted later, or equal
        assert again.applied_count == 0 and again.ok
        got = c.select(keys)
        assert all(got[k] == [] for k in keys[:300])
        assert all(got[k] == [KSM(k, 1.0, "a")] for k in keys[300:])
        for k in keys[:3]:  # the keys live on the node that owns their slot, in the usual layout
            owner = rc.servers[rc.slot_owner(layout.slot(k.encode()))]
            with owner.client() as r:
                assert r.zscore(layout.removes(k.encode()), "a") == 2.0


@pytest.mark.parametrize("op", [b"+", b"-"])
def test_a_node_call_stops_at_a_key_its_node_does_not_serve_and_says_how_far_it_got(op: bytes) -> None:
    with LocalRedisCluster(2) as rc, Cluster.from_cluster_url(rc.url) as c:
        layout = KeyLayout(c.prefix)
        names = [f"user:{i}" for i in range(50)]
        here = [k for k in names if rc.slot_owner(layout.slot(k.encode())) == 0][:3]
        there = next(k for k in names if rc.slot_owner(layout.slot(k.encode())) == 1)
        argv: list[object] = []
        for k in (here[0], here[1], there, here[2]):
            argv += [*layout.script_keys(k.encode(), False), 1, 5.0, "m"]
        script = node_write_script()
        with rc.servers[0].client() as r:
            r.script_load(script.source)
            reply = r.evalsha(script.sha, 0, op, 0, "k", 0, *argv)
            assert reply.startswith(b"11|NOTLOCAL ") and b"non local key" in reply
            written = layout.adds if op == b"+" else layout.removes
            assert [r.zscore(written(k.encode()), "m") for k in here] == [5.0, 5.0, None]  # stopped there


def test_bounded_writes_go_per_node_too_and_keep_their_floors() -> None:
    keys = [f"user:{i}" for i in range(300)]
    with LocalRedisCluster(3) as rc, Cluster.from_cluster_url(rc.url, max_size=2) as c:
        c.load_scripts()
        before = script_calls(rc)
        for score in (1.0, 2.0, 3.0):  # the third insert trims the first: its score becomes the floor
            assert c.insert([KSM(k, score, f"m{score}") for k in keys]).applied_count == len(keys)
        assert script_calls(rc) - before <= 3 * (3 + len(keys) // c.batch_size)
        assert c.insert([KSM(k, 1.0, "m1.0") for k in keys]).applied_count == 0  # below the floor: stays out
        got = c.select(keys)
        assert all(got[k] == [KSM(k, 3.0, "m3.0"), KSM(k, 2.0, "m2.0")] for k in keys)
        layout = KeyLayout(c.prefix)
        key = keys[7].encode()
        with rc.servers[rc.slot_owner(layout.slot(key))].client() as r:
            assert float(r.get(layout.script_keys(key, True)[2])) == 1.0


def seed_and_move_a_slot(rc: LocalRedisCluster, c: Cluster, keys: list[str]) -> tuple[str, int]:
    """Insert a "seed" member into every key, then move the slot of one of them to the next master behind
    the client's back (its slot map still names the old owner); returns that key and its slot."""
    assert c.insert([KSM(k, 1.0, "seed") for k in keys]).ok
    moved = keys[17]
    slot = KeyLayout(c.prefix).slot(moved.encode())
    rc.migrate_slot(slot, (rc.slot_owner(slot) + 1) % 3)
    return moved, slot


def test_a_stale_slot_map_stops_the_node_call_and_the_rest_goes_a_slot_per_call() -> None:
    keys = [f"user:{i}" for i in range(200)]
    with LocalRedisCluster(3) as rc, Cluster.from_cluster_url(rc.url) as c:
        seed_and_move_a_slot(rc, c, keys)
        moved_before = error_count(rc, "MOVED")
        result = c.insert([KSM(k, 2.0, "fresh") for k in keys])
        assert error_count(rc, "MOVED") > moved_before  # what the node call did not get to went a slot per call
        # Exact: a tuple written twice (by the stopped call and the resend) would come back stale.
        assert result.ok and result.applied == [True] * len(keys)
        got = c.select(keys)
        assert all(got[k] == [KSM(k, 2.0, "fresh"), KSM(k, 1.0, "seed")] for k in keys)
        # the map was refreshed by the resend's MOVED: the next call goes per node again, straight there
        moved_before = error_count(rc, "MOVED")
        assert c.insert([KSM(k, 3.0, "later") for k in keys]).applied_count == len(keys)
        assert error_count(rc, "MOVED") == moved_before


def test_tuples_whose_resend_cannot_be_routed_fail_and_the_others_stand() -> None:
    keys = [f"user:{i}" for i in range(100)]
    with LocalRedisCluster(3) as rc, Cluster.from_cluster_url(rc.url) as c:
        moved, slot = seed_and_move_a_slot(rc, c, keys)
        topology = c._transport.topology
        route, seen = topology.shard_of, []

        def unserved_on_resend(key: bytes, s: int) -> int:  # as if the slot had no owner by the resend
            if s == slot:
                seen.append(s)
                if len(seen) > 1:
                    raise ShardError(f"hash slot {s} is not served by any node of the Redis Cluster", [])
            return route(key, s)

        topology.shard_of = unserved_on_resend  # type: ignore[method-assign]
        result = c.insert([KSM(k, 2.0, "fresh") for k in keys], raise_on_error=False)
        [failure] = result.failures
        assert failure.shard == "routing" and keys.index(moved) in failure.indices
        assert all(result.applied[i] for i in range(len(keys)) if i not in failure.indices)
        assert all(c.select([k])[k][0] == KSM(k, 2.0, "fresh") for i, k in enumerate(keys) if i not in failure.indices)


def open_migration(rc: LocalRedisCluster, slot: int, *moving: bytes) -> tuple[int, int]:
    """Opens ``slot`` for migration to the next master, moving the Redis keys ``moving``; returns (src, dst)."""
    dst = (rc.slot_owner(slot) + 1) % 3
    return rc.open_slot(slot, dst, *moving), dst


def test_a_slot_mid_migration_is_written_through_ask() -> None:
    keys = [f"user:{i}" for i in range(200)]
    with LocalRedisCluster(3) as rc, Cluster.from_cluster_url(rc.url) as c:
        layout = KeyLayout(c.prefix)
        assert c.insert([KSM(k, 1.0, "seed") for k in keys]).ok
        assert c.delete([KSM(keys[5], 1.0, "gone")]).ok  # the key has both sets
        key = keys[5].encode()
        slot = layout.slot(key)
        _, dst = open_migration(rc, slot, layout.adds(key), layout.removes(key))
        # src no longer holds the key: the node call to src refuses it, and its slot's call is ASKed to dst
        asked = error_count(rc, "ASK")
        result = c.insert([KSM(k, 2.0, "mid") for k in keys] + [KSM(keys[5], 0.5, "old")])
        assert result.ok and result.applied == [True] * (len(keys) + 1)
        assert error_count(rc, "ASK") > asked
        with rc.servers[dst].client() as dc:
            dc.execute_command("ASKING")
            held = dc.zrange(layout.adds(key), 0, -1, withscores=True)
        assert held == [(b"old", 0.5), (b"seed", 1.0), (b"mid", 2.0)]
        rc.close_slot(slot, dst)
        got = c.select(keys)
        assert all(got[k][:2] == [KSM(k, 2.0, "mid"), KSM(k, 1.0, "seed")] for k in keys)


def test_a_call_whose_keys_a_migration_split_waits_for_the_migration_not_for_a_count_of_tries() -> None:
    """A slot of many or large keys migrates for seconds; meanwhile a write on a key whose two sets the
    migration split meets TRYAGAIN on every try. It waits (up to failover_timeout), then lands."""
    # failover_timeout: the write must still be waiting after 40 tries however slow the machine makes them
    with LocalRedisCluster(3) as rc, Cluster.from_cluster_url(rc.url, failover_timeout=rc.FAILOVER_WAIT) as c:
        layout = KeyLayout(c.prefix)
        assert c.insert([KSM("k", 1.0, "seed")]).ok and c.delete([KSM("k", 1.0, "gone")]).ok
        key = b"k"  # its adds set moved, its removes set not: a call on both meets TRYAGAIN on either node
        slot = layout.slot(key)
        src, dst = open_migration(rc, slot, layout.adds(key))
        tried = error_count(rc, "TRYAGAIN")
        done: list[object] = []
        writer = threading.Thread(target=lambda: done.append(c.insert([KSM("k", 2.0, "mid")], raise_on_error=False)))
        writer.start()
        deadline = time.monotonic() + rc.FAILOVER_WAIT / 2  # well within the write's own failover_timeout
        while not done and error_count(rc, "TRYAGAIN") < tried + 40:  # more tries than a count-bounded follower's (32)
            assert time.monotonic() < deadline, "the write never tried 40 times"
            time.sleep(0.05)
        assert not done, "the write ended while its keys were still split"
        with rc.servers[src].client() as sc:
            sc.execute_command("MIGRATE", "127.0.0.1", rc.servers[dst].port, "", 0, 5000, "KEYS", layout.removes(key))
        rc.close_slot(slot, dst)
        writer.join(rc.FAILOVER_WAIT)
        [result] = done
        assert isinstance(result, WriteResult) and result.ok, result
        assert c.select(["k"])["k"] == [KSM("k", 2.0, "mid"), KSM("k", 1.0, "seed")]


def test_keys_split_longer_than_failover_timeout_fail_the_call_with_a_clear_error() -> None:
    with LocalRedisCluster(3) as rc, Cluster.from_cluster_url(rc.url, failover_timeout=0.5) as c:
        assert c.insert([KSM("k", 1.0, "seed")]).ok and c.delete([KSM("k", 1.0, "gone")]).ok
        layout = KeyLayout(c.prefix)
        open_migration(rc, layout.slot(b"k"), layout.adds(b"k"))
        result = c.insert([KSM("k", 2.0, "mid")], raise_on_error=False)
        [failure] = result.failures
        assert isinstance(failure.error, RedirectLoopError), failure.error
        assert "split between two nodes by a slot migration for 0.5s (failover_timeout)" in str(failure.error)
        assert "redis-cli --cluster fix" in str(failure.error)


def test_a_server_that_refuses_the_cross_slot_script_gets_one_call_per_slot(caplog: pytest.LogCaptureFixture) -> None:
    keys = [f"user:{i}" for i in range(100)]
    with LocalRedisCluster(3) as rc, Cluster.from_cluster_url(rc.url) as c:
        # As Redis 6 would: it knows no script flags. Stand in a script this server refuses to load.
        bad = b"#!lua flags=no-such-flag\nreturn 1"
        transport = c._transport
        node = Script("write-node", bad, hashlib.sha1(bad).hexdigest(), optional=True)
        transport.scripts = (*transport.scripts[:3], node)
        c._node_script = node
        with caplog.at_level(logging.WARNING, logger="zcluster"):
            result = c.insert([KSM(k, 1.0, "a") for k in keys])
        assert result.ok and result.applied_count == len(keys)
        assert "refused the optional script write-node" in caplog.text
        assert transport.refused == {"write-node"}
        before = script_calls(rc)
        assert c.insert([KSM(k, 2.0, "b") for k in keys]).applied_count == len(keys)
        assert script_calls(rc) - before == len({KeyLayout(c.prefix).slot(k.encode()) for k in keys})
        with pytest.raises(redis.ResponseError):  # what the server said, for the record
            rc.servers[0].client().script_load(bad)


def test_inline_keys_decide_as_declared_keys() -> None:
    """The same random calls, keys declared on one server and inline on another: same verdicts, same sets."""
    rng = random.Random(7)
    script = node_write_script()
    with LocalShards(2) as shards, shards.servers[0].client() as declared, shards.servers[1].client() as inline:
        for r in (declared, inline):
            r.script_load(script.source)
        for trial in range(400):
            for r in (declared, inline):
                r.flushall()
            bound = rng.choice([0, 0, 1, 2, 3])
            floors = bound > 0 or trial % 2 == 1
            keys = ["k1", "k2"][: rng.randint(1, 2)]
            if floors and not bound:  # floors without a bound: as left by forget()
                for k in keys:
                    floor = rng.randint(0, 5)
                    declared.set(f"{k}f", floor)
                    inline.set(f"{k}f", floor)
            for _ in range(rng.randint(1, 10)):
                op = rng.choice("+-")
                names: list[str] = []
                sizes = [rng.choice([1, rng.randint(1, 16)]) for _ in keys]
                groups = [
                    [(rng.randint(1, 8) + rng.choice([0, 0.5]), rng.choice("abcde")) for _ in range(n)] for n in sizes
                ]
                # the first groups of one tuple, written without their count (ARGV[4])
                lead = next((i for i, tuples in enumerate(groups) if len(tuples) > 1), len(groups))
                singles = rng.randint(0, lead)
                argv_declared: list[object] = [op, bound, "1" if floors else "0", singles]
                argv_inline: list[object] = [op, bound, "K" if floors else "k", singles]
                for i, (k, tuples) in enumerate(zip(keys, groups, strict=True)):
                    mine = [f"{k}+", f"{k}-"] + ([f"{k}f"] if floors else [])
                    names += mine
                    pairs = [x for t in tuples for x in t]
                    count = [] if i < singles else [len(tuples)]
                    argv_declared += [*count, *pairs]
                    argv_inline += [*mine, *count, *pairs]
                got = declared.evalsha(script.sha, len(names), *names, *argv_declared)
                assert inline.evalsha(script.sha, 0, *argv_inline) == got, (trial, argv_inline)
            for k in keys:
                for suffix in ("+", "-"):
                    assert inline.zrange(k + suffix, 0, -1, withscores=True) == declared.zrange(
                        k + suffix, 0, -1, withscores=True
                    ), trial
                assert inline.get(f"{k}f") == declared.get(f"{k}f"), trial
