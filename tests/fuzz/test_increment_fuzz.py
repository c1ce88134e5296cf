"""Fuzz tier (hypothesis) for the increment API's inputs, against the shared real test servers.

``Cluster.increment`` with any list mixing valid (position, Incr or Count) pairs with bad items (positions of
every type, equal or decreasing positions, pairs that are no pairs, NaN/inf/inexact/non-number deltas, bad
keys) either raises :class:`InvalidTupleError` naming a bad item, with the key space under the test's prefix
unchanged, or applies exactly what a model says: each increment once, the other kind of key (a sums key, a
counters key, a 2P-set) refused with :class:`WriteRefusedError`, a total that would leave the int64 range or
stop being a finite double refused (and the rest of its key's increments in the call with it). Sending the
same call again applies nothing and refuses the same increments. A bad ``ttl`` is a :class:`ConfigError`
with nothing sent.

``ZC_FUZZ_EXAMPLES`` raises the example count for a longer hunt.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_input_fuzz import FUZZ, key_space, raw_clients  # noqa: F401  (raw_clients: a fixture)

from zcluster import Cluster, ConfigError, Count, Incr, InvalidTupleError

_runs = itertools.count()
INT64 = (-(2**63), 2**63 - 1)
KEYS = ["s0", "s1", "c0", "c1", "p0"]  # sums, sums, counters, counters, a 2P-set (made before each run)

sum_delta = st.one_of(
    st.floats(-1e6, 1e6, allow_nan=False),
    st.integers(-(2**53), 2**53),
    st.sampled_from([1e308, -1e308, 1.7e308, -1.7e308, 2.0**1000, 1.7976931348623157e308]),
)
count_delta = st.one_of(st.integers(-1000, 1000), st.sampled_from([2**62, 2**63 - 1, -(2**63), -(2**62)]))
valid = st.one_of(
    st.tuples(st.just("incr"), st.sampled_from(KEYS), st.sampled_from(["a", "b"]), sum_delta),
    st.tuples(st.just("count"), st.sampled_from(KEYS), st.sampled_from(["a", "b"]), count_delta),
)
# How a valid item's position is spelled (its offset c always above the item before's).
form = st.sampled_from(["int", "1", "2", "3", "list"])

bad_position = st.one_of(
    st.sampled_from([1.0, None, b"\x07", "7", (), (1, 2, 3, 4), (1.0,), (True,), True, [1, -2], -1, 2**53]),
    st.sets(st.integers(0, 9), min_size=1, max_size=3),
    st.dictionaries(st.integers(0, 9), st.text(max_size=1), min_size=1, max_size=2),
    st.floats(),
)
bad_delta = st.one_of(
    st.tuples(
        st.just("incr"),
        st.sampled_from([math.nan, math.inf, -math.inf, "3", True, None, 2**60 + 1, b"1", 10**400]),
    ),
    st.tuples(st.just("count"), st.sampled_from([1.5, 2**63, -(2**63) - 1, True, "1", None, math.nan])),
)
bad = st.one_of(
    st.tuples(st.just("position"), bad_position),
    st.tuples(st.just("delta"), bad_delta),
    st.tuples(st.just("key"), st.sampled_from(["", b"", None, 5, 1.5])),
    st.tuples(st.just("pair"), st.sampled_from(["bare", "triple", "none", "str", "one"])),
    st.tuples(st.just("equal"), st.none()),
    st.tuples(st.just("below"), st.none()),
)
spec = st.one_of(valid.map(lambda v: ("valid", v)), bad.map(lambda b: ("bad", b)))
runs = st.tuples(
    st.one_of(st.lists(valid.map(lambda v: ("valid", v)), max_size=12), st.lists(spec, max_size=12)),
    st.lists(form, min_size=12, max_size=12),
    st.lists(st.integers(1, 3), min_size=12, max_size=12),
    st.one_of(st.none(), st.integers(1, 10**10)),
)


def increment_of(kind: str, key: Any, member: str, delta: Any) -> Incr | Count:
    return Incr(key, member, delta) if kind == "incr" else Count(key, member, delta)


def spell(c: int, how: str) -> Any:
    return {"int": c, "1": (c,), "2": (c, 0), "3": (c, 0, 0), "list": [c, 0]}[how]


def build(specs: list[tuple[str, Any]], forms: list[str], steps: list[int], tag: str) -> tuple[list[Any], list[int]]:
    """The call's items, and the indices of the bad ones (each certainly invalid)."""
    items: list[Any] = []
    bad: list[int] = []
    c, last = 0, -1  # the next offset; the last valid item's (its triple is (last, 0, 0))
    for i, (what, value) in enumerate(specs):
        ok = increment_of("incr", tag + "s0", "a", 1)
        if what == "valid":
            kind, key, member, delta = value
            items.append((spell(c, forms[i]), increment_of(kind, tag + key, member, delta)))
            last, c = c, c + steps[i]
            continue
        bad.append(i)
        problem, detail = value
        if problem == "position":
            items.append((detail, ok))
        elif problem == "delta":
            items.append((c, increment_of(detail[0], tag + "s0", "a", detail[1])))
        elif problem == "key":
            items.append((c, Incr(detail, "a", 1)))
        elif problem == "pair":
            items.append(
                {"bare": ok, "triple": (c, ok, 1), "none": None, "str": "ab", "one": (c,)}[detail]  # type: ignore[index]
            )
        elif problem == "equal":
            items.append(((last, 0, 0) if last >= 0 else -1, ok))
        else:  # below the item before (or negative)
            items.append(((last - 1, 5, 5) if last >= 1 else -1, ok))
        if problem in ("delta", "key"):  # a good position: the next item's must be above it
            last, c = c, c + 1
    return items, bad


def model(items: list[Any], totals: dict[tuple[str, str], Any]) -> tuple[list[bool], set[int]]:
    """What a valid call does to ``totals`` ((key, member) -> total, updated): applied per item, refused."""
    applied = [False] * len(items)
    refused: set[int] = set()
    stopped: set[tuple[str, str]] = set()  # (kind, key) groups whose increment was refused for its total
    for i, (_, inc) in enumerate(items):
        kind = "incr" if isinstance(inc, Incr) else "count"
        key = str(inc.key)
        if KIND_OF[key.rsplit("/", 1)[1]] != kind:
            refused.add(i)
            continue
        if (kind, key) in stopped:
            refused.add(i)
            continue
        now = totals.get((key, str(inc[1])), 0 if kind == "count" else 0.0) + inc.delta
        if (kind == "count" and not INT64[0] <= now <= INT64[1]) or (kind == "incr" and not math.isfinite(now)):
            refused.add(i)
            stopped.add((kind, key))
            continue
        totals[(key, str(inc[1]))] = now
        applied[i] = True
    return applied, refused


KIND_OF = {"s0": "incr", "s1": "incr", "c0": "count", "c1": "count", "p0": "2p"}


def read_totals(c: Cluster, tag: str) -> dict[tuple[str, str], Any]:
    out: dict[tuple[str, str], Any] = {}
    for key in ("s0", "s1"):
        out.update(((tag + key, str(e.member)), e.score) for e in c.top([tag + key], limit=10)[tag + key])
    for key in ("c0", "c1"):
        out.update(((tag + key, str(f)), n) for f, n in c.counters([tag + key])[tag + key].items())
    return out


@FUZZ
@given(run=runs)
def test_increment_applies_exactly_the_model_or_names_a_bad_item_and_sends_nothing(
    any_cluster: Cluster,
    raw_clients: list[Any],  # noqa: F811  (the fixture imported above)
    prefix: str,
    run: Any,
) -> None:
    specs, forms, steps, ttl = run
    tag = f"r{next(_runs)}/"
    c = any_cluster
    # The keys' kinds, made by another source (whose fences do not touch this one's).
    c.increment("setup", [(0, Incr(tag + "s0", "z", 1)), (1, Incr(tag + "s1", "z", 1))])
    c.increment("setup", [(2, Count(tag + "c0", "z", 1)), (3, Count(tag + "c1", "z", 1))])
    c.insert([(tag + "p0", 1.0, "z")])
    items, bad = build(specs, forms, steps, tag)
    if bad:
        before = key_space(raw_clients, prefix)
        with pytest.raises(InvalidTupleError) as info:
            c.increment("src", items, ttl=ttl)
        assert info.value.index in bad, (info.value, items)
        assert "nothing of this call was sent" in str(info.value)
        assert key_space(raw_clients, prefix) == before
        return
    totals = read_totals(c, tag)
    applied, refused = model(items, totals)
    for attempt in range(2):  # the call, then the same call again: nothing more applied
        result = c.increment("src", items, ttl=ttl, raise_on_error=False)
        error = result.refused
        assert result.applied == (applied if attempt == 0 else [False] * len(items)), (attempt, items)
        assert set(error.refused if error is not None else ()) == refused, (attempt, items, result)
        assert all(f.error is error for f in result.failures)  # no shard failed
        assert read_totals(c, tag) == totals, (attempt, items)


@FUZZ
@given(ttl=st.one_of(st.integers(10**10 + 1, 10**20), st.integers(-(10**6), 0), st.floats(), st.booleans(), st.text()))
def test_a_bad_ttl_is_a_config_error_and_nothing_is_sent(any_cluster: Cluster, prefix: str, ttl: Any) -> None:
    key = f"ttl{next(_runs)}"
    with pytest.raises(ConfigError, match="ttl"):
        any_cluster.increment("src", [(1, Incr(key, "a", 1))], ttl=ttl)
    assert any_cluster.fences([key])[key] is None and any_cluster.select([key])[key] == []
