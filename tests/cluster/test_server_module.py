"""zcluster's Redis module (``module/zcluster_module.c``: ``ZCLUSTER.WRITE``) against the write script it stands in for,
on real servers that load it (``--loadmodule``, built by :func:`zcluster._server_module.build`).

The module must decide every tuple as ``lua/write.lua`` does and leave every key as the script would: random
call sequences run through both on one server, each on its own copy of the keys, and whole Clusters with and
without the module take the same random writes. What it must also do as the script does: replicate (a
replica without the module follows), persist (an AOF loads without it), publish keyspace notifications (a
migration's listener hears its writes). A client finds the module by itself, uses the script where a server
lacks it (never loaded, restarted without it, or not allowed to the user), and falls back at once.
"""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from script_calls import MEMBERS, SCORES, SETS, arguments, call, content, held, keys, verdicts

from zcluster import Cluster, Count, Delete, Incr, Insert
from zcluster._scripts import write_script
from zcluster._server_module import PROTOCOL, loadmodule
from zcluster.testing import LocalShards

_ns = itertools.count()


@pytest.fixture(scope="module")
def native() -> Iterator[LocalShards]:
    with LocalShards(2, extra=loadmodule()) as group:
        yield group


@pytest.fixture
def server(native: LocalShards) -> redis.Redis:
    return redis.Redis.from_url(native.urls[0])


def module_call(r: redis.Redis, ns: str, op: str, groups: list[Any], singles: int = 1 << 30) -> bytes:
    declared, argv = arguments(ns, op, groups, 0, False, False, singles)
    reply = r.execute_command("ZCLUSTER.WRITE", len(declared), *declared, *argv)
    assert isinstance(reply, bytes)
    return reply


tuple_ = st.tuples(st.sampled_from(SCORES), st.sampled_from(MEMBERS))
group = st.tuples(
    st.sampled_from(SETS),
    st.one_of(st.lists(tuple_, min_size=1, max_size=3), st.lists(tuple_, min_size=11, max_size=16)),
)
write = st.tuples(st.just("write"), st.sampled_from(["+", "-"]), st.lists(group, min_size=1, max_size=4))
poison = st.tuples(st.just("poison"), st.sampled_from(SETS), st.sampled_from(["sums", "counters"]))
step = st.one_of(write, write, write, poison)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(step, min_size=1, max_size=12), singles=st.integers(0, 4))
def test_the_module_decides_and_writes_as_the_script(server: redis.Redis, steps: list[Any], singles: int) -> None:
    """Same verdicts, same keys after every call, also where a key of another kind (an aggregate's) stops a
    call: the module stops where the script's command on that key fails, after the same writes."""
    run = next(_ns)
    lua, mod = f"sm{run}l:", f"sm{run}m:"
    source = write_script().source
    try:
        for s in steps:
            if s[0] == "poison":  # the set replaced by an aggregate (lua/incr.lua's layouts)
                _, name, kind = s
                for ns in (lua, mod):
                    plus, minus, _floor = keys(ns, name)
                    server.delete(plus, minus)
                    if kind == "sums":  # totals in K+, fences in a K- hash
                        server.zadd(plus, {"m1": 2.0, "m2": 0.0})
                        server.hset(minus, "src", "0:0:1:1")
                    else:  # counters: one hash
                        server.hset(plus, "m1", "1")
                continue
            _, op, groups = s
            expected = verdicts(call(server, source, lua, op, groups, 0, False, False, singles))
            got = verdicts(module_call(server, mod, op, groups, singles))
            assert got == expected, (op, groups)
            assert content(server, mod) == content(server, lua)
    finally:
        for ns in (lua, mod):
            for name in SETS:
                server.delete(*keys(ns, name))


def store(cluster: Cluster, names: list[str]) -> dict[str, Any]:
    held = cluster.select(names, limit=1000)
    return {k: sorted((t.member, t.score) for t in v) for k, v in held.items()}


def random_writes(rng: random.Random, n: int, names: list[str]) -> list[Any]:
    out: list[Any] = []
    for _ in range(n):
        kind = Insert if rng.random() < 0.6 else Delete
        out.append(kind(rng.choice(names), float(rng.randrange(8)), rng.choice(["a", "b", "c", "d"])))
    return out


def test_clusters_with_and_without_the_module_end_equal(native: LocalShards, shards: LocalShards) -> None:
    """The same random writes (spread keys: most tuples alone in their set; hot keys: many per set; inserts
    and deletes mixed in a call; ties) through a Cluster whose servers have the module and one whose servers
    do not: the same tuples take effect and the stores read back equal."""
    rng = random.Random(7)
    names = [f"u{i}" for i in range(400)] + ["hot1", "hot2", "hot3"]
    prefix = f"sme{next(_ns)}:"
    with Cluster.from_urls(native.urls, prefix=prefix) as fast, Cluster.from_urls(shards.urls, prefix=prefix) as lua:
        seen = set()
        for size in (1, 30, 500, 2000, 500):
            calls = random_writes(rng, size, names[:3] if size == 30 else names)
            a, b = fast.apply(calls), lua.apply(calls)
            assert a.applied == b.applied and not a.failures and not b.failures
            seen.update(a.applied)
        assert seen == {True, False}
        assert store(fast, names) == store(lua, names)
        assert set(fast._transport.native.values()) == {True}
        assert set(lua._transport.native.values()) == {False}
        # after each server's first write, the calls went to the module
        for url in native.urls:
            stats = redis.Redis.from_url(url).info("commandstats")
            assert stats["cmdstat_zcluster.write"]["calls"] >= 4


@pytest.mark.parametrize("options", [{"floors": True}, {"max_size": 50}])
def test_calls_the_module_does_not_serve_go_to_the_script(native: LocalShards, options: dict[str, Any]) -> None:
    """Floors (a store that forgets), a bound (and waits, likewise): the module refuses these calls, so the client never
    sends them there; writes to such a store on a server with the module still take effect."""
    with Cluster.from_urls(native.urls, prefix=f"smo{next(_ns)}:", **options) as c:
        writes = random_writes(random.Random(5), 300, [f"k{i}" for i in range(40)])
        result = c.apply(writes)
        assert not result.failures and any(result.applied)
        assert c._transport.native == {}  # never asked: no call of this store could go to the module


def test_a_farm_of_replicas_with_and_without_the_module(
    native: LocalShards, shards: LocalShards, caplog: pytest.LogCaptureFixture
) -> None:
    """A farm prepares a write once for replicas of the same shape. The first write, before the client knows
    which servers have the module, goes by the script to both (each server is asked as it is written to);
    after it the replicas' shapes differ, each gets calls made for it, and none falls back. Every replica
    ends equal, every write confirmed by both."""
    from zcluster._writes import plan_of
    from zcluster.farm import Farm

    prefix = f"smfarm{next(_ns)}:"
    rng = random.Random(11)
    names = [f"f{i}" for i in range(100)]
    fast = Cluster.from_urls(native.urls[:1], prefix=prefix)
    lua = Cluster.from_urls(shards.urls[:1], prefix=prefix)
    with Farm([fast, lua]) as farm:
        assert plan_of(fast).shape() == plan_of(lua).shape()
        for _ in range(4):
            assert not farm.apply(random_writes(rng, 300, names)).failures
        assert plan_of(fast).shape() != plan_of(lua).shape()
        assert fast._transport.native == {f"127.0.0.1:{native.servers[0].port}": True}
        assert lua._transport.native == {f"127.0.0.1:{shards.servers[0].port}": False}
        assert store(fast, names) == store(lua, names) and store(fast, names)
    assert not [r for r in caplog.records if "no longer serves" in r.message]


def dump(r: redis.Redis, prefix: str) -> dict[bytes, Any]:
    """Every key of the store but its marker: type, whole value, and when it expires (ms since the epoch)."""
    found = sorted(k for k in r.scan_iter(match=f"{{{prefix}*") if not k.endswith(b"layout"))
    return {k: (*held(r, k.decode()), r.pexpiretime(k)) for k in found}


def test_a_replica_and_the_aof_follow_without_the_module() -> None:
    """The module replicates plain commands (ZADD, ZREM, ZINCRBY, HSET, and its keys' time to live as the
    server's own EXPIRE): a replica that lacks it holds what the master holds, expiring at the same
    millisecond, and the master's AOF loads on a server started without it."""
    prefix = f"smr{next(_ns)}:"
    with LocalShards(1, extra=loadmodule(), aof=True) as master, LocalShards(1) as replica:
        m, r = master.servers[0].client(), replica.servers[0].client()
        r.replicaof("127.0.0.1", master.servers[0].port)
        deadline = time.monotonic() + 60
        while r.info("replication")["master_link_status"] != "up":
            assert time.monotonic() < deadline, "the replica never synced"
            time.sleep(0.05)
        rng = random.Random(3)
        names = [f"k{i}" for i in range(50)]
        with Cluster.from_urls(master.urls, prefix=prefix) as c:
            for round_ in range(5):
                assert not c.apply(random_writes(rng, 300, names)).failures
                increments = [(round_ * 100 + i, Incr(f"s{i % 7}", f"p{i % 3}", 1.5)) for i in range(100)]
                counts = [(round_ * 100 + i, Count(f"c{i % 7}", f"p{i % 3}", 2)) for i in range(100)]
                assert all(c.increment("job", increments, ttl=3600).applied)
                assert all(c.increment("job", counts, ttl=3600).applied)
            assert c._transport.native == {f"127.0.0.1:{master.servers[0].port}": True}
        m.set("probe", "1")
        assert m.wait(1, 30_000) == 1  # the replication stream is ordered: everything before it is there
        written = dump(m, prefix)
        assert written and dump(r, prefix) == written
        assert {kind for kind, _, _ in written.values()} == {b"zset", b"hash"}
        assert sum(1 for *_, expires in written.values() if expires > 0) == 14 + 7  # sums: both keys; counters: one
        assert r.info("replication")["master_link_status"] == "up"
        master.kill(0)
        master.servers[0].extra = ()
        master.start(0)
        assert dump(master.servers[0].client(), prefix) == written


def test_its_writes_publish_keyspace_notifications(native: LocalShards) -> None:
    """A migration's listener learns which keys changed from keyspace notifications (zcluster.migration):
    the module's inserts and deletes publish them as ZADD and ZREM do."""
    r = redis.Redis.from_url(native.urls[0])
    before = r.config_get("notify-keyspace-events")["notify-keyspace-events"]
    r.config_set("notify-keyspace-events", "KA")
    prefix = f"smn{next(_ns)}:"
    listener = r.pubsub()
    try:
        listener.psubscribe(f"__keyspace@0__:{{{prefix}*")
        assert listener.get_message(timeout=10)["type"] == "psubscribe"
        r.execute_command("ZCLUSTER.WRITE", 2, f"{{{prefix}k}}+", f"{{{prefix}k}}-", "+", 0, 0, 1, 1, "m")
        r.execute_command("ZCLUSTER.WRITE", 2, f"{{{prefix}k}}+", f"{{{prefix}k}}-", "-", 0, 0, 1, 2, "m")
        wanted = [(f"{{{prefix}k}}+", "zadd"), (f"{{{prefix}k}}-", "zadd"), (f"{{{prefix}k}}+", "zrem")]
        heard: list[tuple[str, str]] = []
        deadline = time.monotonic() + 30
        while len(heard) < len(wanted) and time.monotonic() < deadline:
            message = listener.get_message(timeout=1)
            if message is not None and message["type"] == "pmessage":
                heard.append((message["channel"].decode().split(":", 1)[1], message["data"].decode()))
        assert heard[: len(wanted)] == wanted
    finally:
        listener.close()
        r.config_set("notify-keyspace-events", before)


def test_a_server_restarted_without_the_module_gets_the_script() -> None:
    """A client that found the module keeps writing when its server comes back without it: the call is
    answered as an unknown command, sent again as the script, and the store is exact."""
    prefix = f"smf{next(_ns)}:"
    with LocalShards(1, extra=loadmodule()) as group, Cluster.from_urls(group.urls, prefix=prefix) as c:
        name = f"127.0.0.1:{group.servers[0].port}"
        assert c.apply([Insert("k", 1.0, "a"), Delete("k", 2.0, "b")]).applied == [True, True]
        assert c._transport.native == {name: True}
        group.stop(0)
        group.servers[0].extra = ()
        group.start(0)
        result = c.apply([Insert("k", 3.0, "b"), Insert("k", 0.5, "a"), Insert("j", 1.0, "x")])
        assert result.applied == [True, False, True] and not result.failures
        assert c._transport.native == {name: False}
        assert store(c, ["k", "j"]) == {"k": [("a", 1.0), ("b", 3.0)], "j": [("x", 1.0)]}


@pytest.mark.parametrize(
    "args",
    [
        ["+", 0, 0, 0, 2, 1, "m"],  # a count past the arguments
        ["+", 0, 0, 1, "x", "m"],  # a score that is not a number
        ["+", 0, 0, 1, "nan", "m"],
        ["+", 0, 0, 1, 1, "m", "extra"],  # arguments past the last group
        ["+!", 0, 0, 1, 1, "m"],  # a wait's op: the script's
        ["+", 5, 0, 1, 1, "m"],  # a bound: the script's
        ["+", 0, 1, 1, 1, "m"],  # floors: the script's
        ["+", 0, 0, 2, 1, "m"],  # more one-tuple groups than groups
        ["+", 0, 0, 0, -1],  # a negative count
    ],
)
def test_a_malformed_call_is_refused_whole(server: redis.Redis, args: list[Any]) -> None:
    """Nothing of a call the module cannot read is written: its first group is valid, and stays unwritten."""
    prefix = f"smb{next(_ns)}:"
    ks = [f"{{{prefix}a}}+", f"{{{prefix}a}}-"]
    with pytest.raises(redis.ResponseError, match=r"zcluster\.write"):
        server.execute_command("ZCLUSTER.WRITE", 2, *ks, *args)
    assert server.exists(*ks) == 0


@pytest.mark.parametrize("command", ["write", "incr"])
def test_one_key_named_twice_in_a_group_is_refused(server: redis.Redis, command: str) -> None:
    """A group's two keys must be two keys: one named twice would be opened twice (a crash of the server in
    the first version of the module). Refused whole; the server lives on."""
    key = f"{{smk{next(_ns)}:a}}+"
    server.zadd(key, {"m": 1.0})
    args = ["+", 0, 0, 1, 2, "m"] if command == "write" else ["s", 0, "src", 1, 0, 0, 1, "m", 1]
    with pytest.raises(redis.ResponseError, match="one key"):
        server.execute_command(f"ZCLUSTER.{command.upper()}", 2, key, key, *args)
    assert server.ping() and server.zrange(key, 0, -1, withscores=True) == [(b"m", 1.0)]


def test_the_version_is_the_clients_protocol(server: redis.Redis) -> None:
    """The client uses the module only when it answers the client's protocol; its keys are declared (what a
    Redis Cluster routes by, and ACL key patterns check)."""
    assert server.execute_command("ZCLUSTER.VERSION") == PROTOCOL
    server.set_response_callback("COMMAND", lambda reply, **_: reply)  # raw: redis-py parses COMMAND's shape
    assert server.execute_command("COMMAND", "GETKEYS", "ZCLUSTER.WRITE", 2, "a+", "a-", "+", 0, 0, 1, 1, "m") == [
        b"a+",
        b"a-",
    ]


def test_a_user_not_allowed_the_module_writes_through_the_script(native: LocalShards) -> None:
    """Other credentials: an ACL user denied the module's commands is served by the script, correctly."""
    admin = redis.Redis.from_url(native.urls[0])
    user = f"nomod{next(_ns)}"
    admin.acl_setuser(
        user, enabled=True, passwords=["+pw"], keys=["*"], channels=["*"], commands=["+@all", "-zcluster.version"]
    )
    try:
        port = native.servers[0].port
        with Cluster.from_urls([f"redis://{user}:pw@127.0.0.1:{port}"], prefix=f"sma{next(_ns)}:") as c:
            assert c.apply([Insert("k", 1.0, "a"), Delete("k", 0.5, "a")]).applied == [True, False]
            assert c._transport.native == {f"127.0.0.1:{port}": False}
            assert store(c, ["k"]) == {"k": [("a", 1.0)]}
        # allowed at first, then denied the module's command (an ACL changed): the next write falls back
        admin.acl_setuser(
            user, reset=True, enabled=True, passwords=["+pw"], keys=["*"], channels=["*"], commands=["+@all"]
        )
        with Cluster.from_urls([f"redis://{user}:pw@127.0.0.1:{port}"], prefix=f"sma{next(_ns)}:") as c:
            assert c.apply([Insert("k", 1.0, "a")]).applied == [True]
            assert c.apply([Insert("j", 1.0, "a")]).applied == [True]  # packed for the module
            assert c._transport.native == {f"127.0.0.1:{port}": True}
            admin.acl_setuser(user, commands=["-zcluster.write"])
            assert c.apply([Insert("k", 2.0, "a"), Delete("j", 3.0, "a")]).applied == [True, True]
            assert c._transport.native == {f"127.0.0.1:{port}": False}
            assert store(c, ["k", "j"]) == {"k": [("a", 2.0)], "j": []}
    finally:
        admin.acl_deluser(user)
