"""zcluster's Redis module's ``ZCLUSTER.INCR`` against the fenced increments script it stands in for
(``lua/incr.lua``), on one real server that loads it, each on its own copy of the keys.

Random call sequences: sums and counters, two sources, positions that repeat and go back (resends, replays,
zombies: at or below the fence), deltas that overflow a counter or carry a sum past the largest double, keys
made with a time to live, and keys of another kind put in the way (a 2P-set, a string, the other kind of
aggregate, a counters key of the two-key layout made before the one-key one, a counter whose total is not a
number). After every call the replies must be equal (an error for an error), and so must every key's content
and whether it expires. Then a Cluster whose server has the module counts exactly once through it.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from script_calls import held

from zcluster import Cluster, Count, Incr
from zcluster._aggregate_keys import FENCE
from zcluster._scripts import incr_script
from zcluster._server_module import loadmodule
from zcluster.testing import LocalShards

NAMES = ["a", "b", "c"]
_ns = itertools.count()


@pytest.fixture(scope="module")
def native() -> Iterator[LocalShards]:
    with LocalShards(1, extra=loadmodule()) as group:
        yield group


@pytest.fixture
def server(native: LocalShards) -> redis.Redis:
    return redis.Redis.from_url(native.urls[0])


def keys(ns: str, name: str) -> tuple[str, str]:
    return f"{{{ns}{name}}}+", f"{{{ns}{name}}}-"


position = st.tuples(st.integers(0, 3), st.integers(0, 1), st.integers(0, 2))
sum_delta = st.sampled_from([1.0, -2.5, 0.5, 3.0, 2.0**1000, -(2.0**1000), 1.7e308, -1.7e308])
count_delta = st.sampled_from([1, -1, 5, 2**62, -(2**62), 2**63 - 1, -(2**63)])
member = st.sampled_from(["m1", "m2"])


@st.composite
def call(draw: Any) -> tuple[Any, ...]:
    kind = draw(st.sampled_from(["s", "c"]))
    delta = sum_delta if kind == "s" else count_delta
    groups = []
    for name in draw(st.lists(st.sampled_from(NAMES), min_size=1, max_size=3, unique=True)):
        positions = sorted(set(draw(st.lists(position, min_size=1, max_size=4))))
        groups.append((name, [(p, draw(member), draw(delta)) for p in positions]))
    return ("incr", kind, draw(st.sampled_from([0, 0, 100])), draw(st.sampled_from(["src1", "src2"])), groups)


poison = st.tuples(
    st.just("poison"), st.sampled_from(NAMES), st.sampled_from(["2p", "string", "legacy", "notint", "gone"])
)
step = st.one_of(call(), call(), call(), poison)


def arguments(ns: str, kind: str, ttl: int, source: str, groups: list[Any]) -> list[Any]:
    declared: list[str] = []
    argv: list[Any] = [kind, ttl]
    for name, incs in groups:
        declared += keys(ns, name)
        argv += [source, len(incs)]
        for (c, m, j), mem, d in incs:
            argv += [c, m, j, mem, repr(d) if isinstance(d, float) else d]
    return [len(declared), *declared, *argv]


def reply(r: redis.Redis, *command: Any) -> Any:
    try:
        return r.execute_command(*command)
    except redis.ResponseError as exc:
        return ("error", "not an integer" in str(exc))


def content(r: redis.Redis, ns: str) -> dict[str, Any]:
    """Every key's type, value and whether it expires."""
    return {key[len(ns) + 1 :]: (*held(r, key), r.ttl(key) > 0) for name in NAMES for key in keys(ns, name)}


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(step, min_size=1, max_size=10))
def test_the_module_counts_as_the_script(server: redis.Redis, steps: list[Any]) -> None:
    run = next(_ns)
    lua, mod = f"si{run}l:", f"si{run}m:"
    source = incr_script().source
    try:
        for s in steps:
            if s[0] == "poison":
                _, name, what = s
                for ns in (lua, mod):
                    plus, minus = keys(ns, name)
                    server.delete(plus, minus)
                    if what == "2p":
                        server.zadd(plus, {"m1": 1.0})
                        server.zadd(minus, {"m2": 2.0})
                    elif what == "string":
                        server.set(plus, "x")
                    elif what == "legacy":  # counters of the two-key layout: fences in a K- hash
                        server.hset(plus, "m1", "4")
                        server.hset(minus, "src1", "1:0:0:2")
                    elif what == "notint":  # a counter whose total is not a number, beside a fence
                        server.hset(plus, mapping={"m1": "x", FENCE + b"src1": "0:0:0:1"})
                continue
            _, kind, ttl, src, groups = s
            expected = reply(server, "EVAL", source, *arguments(lua, kind, ttl, src, groups))
            got = reply(server, "ZCLUSTER.INCR", *arguments(mod, kind, ttl, src, groups))
            assert got == expected, (kind, ttl, src, groups)
            assert content(server, mod) == content(server, lua), (kind, ttl, src, groups)
    finally:
        for ns in (lua, mod):
            for name in NAMES:
                server.delete(*keys(ns, name))


def test_a_cluster_counts_exactly_once_through_the_module(native: LocalShards) -> None:
    """Through the client: the increments go to the module, and a replay of the same positions changes
    nothing (sums and counters)."""
    with Cluster.from_urls(native.urls, prefix=f"sic{next(_ns)}:") as c:
        items = [(i, Incr("board", f"p{i % 7}", 1.5)) for i in range(200)]
        counts = [(i, Count("hits", f"u{i % 5}", 2)) for i in range(200)]
        assert all(c.increment("job", items).applied) and all(c.increment("job", counts).applied)
        assert not any(c.increment("job", items).applied) and not any(c.increment("job", counts).applied)
        assert c.top(["board"], limit=10)["board"][0].score == pytest.approx(1.5 * 29)
        assert c.counters(["hits"])["hits"] == {f"u{i}": 80 for i in range(5)}
        assert list(c._transport.native.values()) == [True]
