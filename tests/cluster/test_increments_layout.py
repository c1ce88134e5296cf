"""The counters keys' one-key layout (``lua/incr.lua``): a counters key keeps its fences in its totals hash
(fields ``FENCE + source``), no second key; counters keys made before it (fences in a K- hash) keep counting
exactly once; the kinds still refuse each other's writes both ways; every reader hides the fence fields."""

from __future__ import annotations

from typing import Any

import pytest

from zcluster import Cluster, Count, Delete, Fence, Incr, Insert, InvalidTupleError, WriteRefusedError
from zcluster._aggregate_keys import FENCE, whole_keys_of


def raw(c: Cluster, key: str) -> tuple[Any, bytes, bytes]:
    """The client of the server holding ``key``, and its K+ and K- names."""
    ((shard, kb),) = c._encoder.keys([key])
    adds, removes = c._layout.script_keys(kb, False)
    return c._transport.topology.shards[shard].client, adds, removes


def test_a_new_counters_key_is_one_key_its_fences_hidden_from_its_totals(any_cluster: Cluster) -> None:
    c = any_cluster
    c.increment("app/j", [(1, Count("hits", "a", 2)), (2, Count("hits", "b", 3)), (3, Count("hits", "a", 1))])
    c.increment("app/k", [(7, Count("hits", "a", 10))])
    client, adds, removes = raw(c, "hits")
    assert client.exists(removes) == 0
    assert client.hgetall(adds) == {
        b"a": b"13",
        b"b": b"3",
        FENCE + b"app/j": b"3:0:0:3",
        FENCE + b"app/k": b"7:0:0:1",
    }
    assert c.counters(["hits"])["hits"] == {"a": 13, "b": 3}
    assert c.fences(["hits"])["hits"] == {"app/j": Fence((3, 0, 0), 3), "app/k": Fence((7, 0, 0), 1)}
    # exactly once: a replay and a resend change nothing
    assert c.increment("app/j", [(3, Count("hits", "a", 1)), (4, Count("hits", "b", 1))]).applied == [False, True]
    assert c.increment("app/j", [(4, Count("hits", "b", 1))]).applied == [False]
    assert c.counters(["hits"])["hits"] == {"a": 13, "b": 4}
    # its state, dump and fingerprint read the fences apart from the totals
    state = whole_keys_of(c).states(["hits"], dump=True)["hits"]
    assert state.kind == "c" and state.fences == {b"app/j": Fence((4, 0, 0), 4), b"app/k": Fence((7, 0, 0), 1)}
    assert dict(zip(state.totals[0::2], state.totals[1::2], strict=True)) == {b"a": b"13", b"b": b"4"}  # type: ignore[index]
    assert c.fingerprints(["hits"])["hits"].startswith(b"a")


def test_a_one_key_counters_key_costs_less_memory_than_two(any_cluster: Cluster) -> None:
    c = any_cluster
    c.increment("app/j", [(1, Count("one", "u1", 1))])
    client, adds, removes = raw(c, "one")
    one = client.memory_usage(adds, samples=0)
    # the same key in the two-key layout, written by hand as the script wrote it before
    client2, adds2, removes2 = raw(c, "{one}two")
    client2.hset(adds2, "u1", 1)
    client2.hset(removes2, "app/j", "1:0:0:1")
    two = client2.memory_usage(adds2, samples=0) + client2.memory_usage(removes2, samples=0)
    assert client.exists(removes) == 0 and one < two


def test_a_two_key_counters_key_made_before_keeps_counting_exactly_once(any_cluster: Cluster) -> None:
    c = any_cluster
    client, adds, removes = raw(c, "old")
    client.hset(adds, mapping={"a": 5, "b": 1})  # the old layout, as lua/incr.lua wrote it before
    client.hset(removes, mapping={"app/j": "3:0:0:2", "app/k": "9:0:0"})  # fences of 2 and of 1 increments
    assert c.fences(["old"])["old"] == {"app/j": Fence((3, 0, 0), 2), "app/k": Fence((9, 0, 0), 0)}
    replay = [(2, Count("old", "a", 100)), (3, Count("old", "b", 100)), (4, Count("old", "a", 1))]
    assert c.increment("app/j", replay).applied == [False, False, True]
    assert c.increment("app/j", replay).applied == [False, False, False]  # a resend
    assert c.increment("app/k", [(9, Count("old", "a", 100)), (10, Count("old", "b", 2))]).applied == [False, True]
    assert c.increment("app/new", [(1, Count("old", "b", 4))]).applied == [True]  # a new source of an old key
    assert c.increment("app/new", [(1, Count("old", "b", 4))]).applied == [False]
    assert c.counters(["old"])["old"] == {"a": 6, "b": 7}
    # it stays two keys: its fences all in K-, none in K+
    assert client.hgetall(removes) == {b"app/j": b"4:0:0:3", b"app/k": b"10:0:0:1", b"app/new": b"1:0:0:1"}
    assert sorted(client.hkeys(adds)) == [b"a", b"b"]
    assert c.fences(["old"])["old"]["app/new"] == Fence((1, 0, 0), 1)
    # and the kinds still refuse each other on it
    with pytest.raises(WriteRefusedError, match="another kind"):
        c.increment("app/j", [(9, Incr("old", "a", 1.0))])
    with pytest.raises(WriteRefusedError, match="aggregate"):
        c.insert([("old", 1.0, "a")])


@pytest.mark.parametrize("max_size", [None, 10])
def test_2p_set_writes_and_counters_refuse_each_other_on_the_one_key_layout(
    any_cluster: Cluster, prefix: str, max_size: int | None
) -> None:
    # a bounded store (floors) writes another way through write.lua (its ZCARD first, a floor read)
    c = any_cluster if max_size is None else any_cluster.view(prefix, max_size=max_size)
    c.increment("app/j", [(1, Count("hits", "f", 3))])
    client, adds, removes = raw(c, "hits")
    before = client.hgetall(adds)
    for call in (
        lambda: c.insert([("hits", 9.0, "f")]),
        lambda: c.insert([("hits", 9.0, "g"), ("hits", 8.0, "h")]),
        lambda: c.apply([Insert("hits", 9.0, "x")] * 1 + [Insert("hits", float(i), f"m{i}") for i in range(20)]),
        lambda: c.delete([("hits", 9.0, "f")]),
        lambda: c.apply([Delete("hits", float(i), f"m{i}") for i in range(20)]),
    ):
        with pytest.raises(WriteRefusedError, match="aggregate") as info:
            call()
        assert info.value.index == 0
    assert client.hgetall(adds) == before and client.exists(removes) == 0
    # the other way: a Count refused by a 2P-set, also one holding only tombstones (no K+ to answer WRONGTYPE)
    c.insert([("set", 1.0, "m")])
    c.delete([("gone", 5.0, "m")])
    for key in ("set", "gone"):
        for position in (1, 2):  # at or below the fence of app/j, and above it
            with pytest.raises(WriteRefusedError, match="another kind"):
                c.increment("app/j", [(position, Count(key, "f", 1))])
    assert [t.member for t in c.select(["set"])["set"]] == ["m"]
    assert c.records(["gone"])["gone"] == [Delete("gone", 5.0, "m")]
    # and a sums increment on the counters key, at, below and above its fence
    for position in (0, 1, 2):
        with pytest.raises(WriteRefusedError, match="another kind"):
            c.increment("app/j", [(position, Incr("hits", "f", 1.0))])
    assert client.hgetall(adds) == before


def test_a_counters_field_with_the_fences_prefix_is_refused_before_anything_is_sent(any_cluster: Cluster) -> None:
    c = any_cluster
    for field in (FENCE + b"app/j", FENCE.decode() + "x"):
        with pytest.raises(InvalidTupleError, match="prefix"):
            c.increment("app/j", [(1, Count("k", "ok", 1)), (2, Count("k", field, 1))])
    c.increment("app/j", [(1, Incr("s", FENCE + b"x", 1.0))])  # a sums member may: it is no hash field
    assert c.counters(["k"])["k"] == {}
