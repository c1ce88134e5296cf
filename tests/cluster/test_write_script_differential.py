"""The 2P-set write script (``lua/write.lua``) against its earlier version, kept here as the oracle
(``oracle/write_before.lua``: the script before the EXISTS survey and the one-ZADD paths of issue #40).
The oracle carries one later change of rules, made to both scripts alike (docs/faults.md, "bounded set
replays"): a full set's refused insert removes the member's older tombstone, and a delete at or below the
floor raises the member's older tombstone (before, both left it as it was). Run against the unchanged
oracle, this test finds exactly those differences (with 1,500 examples: a bounded set's refused insert,
an unbounded set with a floor set from outside, and the same in a call stopped by ``WRONGTYPE``), so
the oracle still checks that the survey and the one-ZADD paths decide as the plain paths do.

Random call sequences (hypothesis) run through both scripts on one real server, each on its own copy of the
keys: inserts and deletes, ties and equal scores, deletes after inserts, re-inserts, members repeated within
a call and sets repeated within a call, groups of one to sixteen tuples (both sides of the script's
per-group thresholds), with and without floors, unbounded and bounded (trimming, the full-set rule), keys
declared or carried in ARGV (the node script's modes), floors set from outside (as ``forget`` does) and sets
replaced by aggregates (sums: totals in K+ and a fences hash in K-; counters: a hash in K+; the WRONGTYPE
stop). After every call the replies' verdicts must be equal (but for the one intended difference, below),
and so must every key's content, exactly (members, scores, floors, types).
"""

from __future__ import annotations

import itertools
import os
import random
from pathlib import Path
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from script_calls import MEMBERS, SCORES, SETS, call, content, keys, verdicts

from zcluster._encode import blob
from zcluster._scripts import write_script

ORACLE = (Path(__file__).parent / "oracle" / "write_before.lua").read_bytes()
_ns = itertools.count()

tuple_ = st.tuples(st.sampled_from(SCORES), st.sampled_from(MEMBERS))
group = st.tuples(
    st.sampled_from(SETS),
    st.one_of(st.lists(tuple_, min_size=1, max_size=3), st.lists(tuple_, min_size=11, max_size=16)),
)
# "+!" / "-!": a call a wait follows, which writes a record again as it is when it took nothing (lua/write.lua,
# "Waits"); the oracle gets the plain op: the verdicts and every key's content must not differ.
write = st.tuples(st.just("write"), st.sampled_from(["+", "-", "+!", "-!"]), st.lists(group, min_size=1, max_size=4))
floor_ = st.tuples(st.just("floor"), st.sampled_from(SETS), st.sampled_from(SCORES))
poison = st.tuples(st.just("poison"), st.sampled_from(SETS), st.sampled_from(["sums", "counters"]))
step = st.one_of(write, write, write, write, floor_, poison)


SETTINGS = settings(
    max_examples=int(os.environ.get("ZC_EXAMPLES", "150")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@pytest.fixture
def server(shards: Any) -> redis.Redis:
    return redis.Redis.from_url(shards.urls[0])


@SETTINGS
@given(
    steps=st.lists(step, min_size=1, max_size=12),
    mode=st.sampled_from([(0, False), (0, True), (2, True), (3, True)]),
    inline=st.booleans(),
    singles=st.integers(0, 4),
)
def test_write_script_equals_its_earlier_version(
    server: redis.Redis, steps: list[Any], mode: tuple[int, bool], inline: bool, singles: int
) -> None:
    bound, floors = mode
    run = next(_ns)
    old, new = f"dw{run}o:", f"dw{run}n:"
    source = write_script().source
    try:
        for s in steps:
            if s[0] == "floor":
                if not floors:
                    continue
                _, name, score = s
                for ns in (old, new):
                    server.set(keys(ns, name)[2], repr(score))
            elif s[0] == "poison":  # the set replaced by an aggregate (lua/incr.lua's layouts)
                _, name, kind = s
                for ns in (old, new):
                    plus, minus, floor = keys(ns, name)
                    server.delete(plus, minus, floor)
                    if kind == "sums":  # totals in K+, fences in a K- hash
                        server.zadd(plus, {"m1": 2.0, "m2": 0.0})
                        server.hset(minus, "src", "0:0:1:1")
                    else:  # counters: one hash
                        server.hset(plus, "m1", "1")
            else:
                _, op, groups = s
                before = verdicts(call(server, ORACLE, old, op[0], groups, bound, floors, inline, None))
                after = verdicts(call(server, source, new, op, groups, bound, floors, inline, singles))
                stop = b"|WRONGTYPE"
                if before.endswith(stop) and after.endswith(stop) and any(len(t) > 12 for _, t in groups):
                    # The one intended difference: the earlier script read a group of more than 12 tuples
                    # whole before deciding any; now each tuple goes in order, so deletes found stale in a
                    # sums key's totals before its first write (to K-: the fences' hash) say so ("0").
                    done, extra = before[: -len(stop)], after[len(before) - len(stop) : -len(stop)]
                    assert after.startswith(done) and set(extra) <= {ord("0")}, (op, groups, after)
                else:
                    assert after == before, (op, groups)
            assert content(server, new) == content(server, old)
    finally:
        for ns in (old, new):
            for name in SETS:
                server.delete(*keys(ns, name))


@pytest.mark.parametrize("op", ["+", "-"])
def test_calls_of_many_one_tuple_groups_decide_as_the_earlier_script(server: redis.Redis, op: str) -> None:
    """Spread keys: calls of 150 one-tuple groups (three survey blocks; a block is one ZADD loop only when all
    of its groups are clean one-tuple groups), some followed by groups of three, against sets of which none,
    a few, many or all hold a record that judges the op (a block clean, mixed, or not clean at all). Same
    verdicts and the same sets as the oracle, which gets every count."""
    rng = random.Random(40)
    source = write_script().source
    judge = 1 if op == "+" else 0  # an insert is judged by K-, a delete by K+

    def sets(ns: str, names: list[str]) -> list[Any]:
        return [server.zrange(k, 0, -1, withscores=True) for n in names for k in keys(ns, n)[:2]]

    seen: set[int] = set()
    for trial, held in enumerate([0, 1, 5, 70, 150, 0, 3, 150]):
        old, new = f"dm{trial}{op}o:", f"dm{trial}{op}n:"
        names = [f"s{i}" for i in range(150)]
        more = [f"t{i}" for i in range(20)] if trial >= 5 else []
        judged = rng.sample(range(150), held)
        own = rng.sample(sorted(set(range(150)) - set(judged)), min(30, 150 - held))  # ZADD GT decides these
        for ns in (old, new):
            for i in judged:
                server.zadd(keys(ns, names[i])[judge], {"m": 5.0})
            for i in own:
                server.zadd(keys(ns, names[i])[1 - judge], {"m": 5.0})
        groups = [(n, [(rng.choice([1.0, 5.0, 9.0]), "m")]) for n in names]
        groups += [(n, [(rng.choice([1.0, 5.0, 9.0]), rng.choice("mn")) for _ in range(3)]) for n in more]
        before = call(server, ORACLE, old, op, groups, 0, False, False, None)
        after = call(server, source, new, op, groups, 0, False, False)
        assert after == before and len(after) == 150 + 3 * len(more), trial
        assert sets(new, names + more) == sets(old, names + more), trial
        seen.update(after)
    assert seen == {ord("0"), ord("1")}  # stale and taken both decided (not all one way)


def test_the_oracle_is_the_earlier_script_not_the_current_one() -> None:
    """The differential test compares two different scripts (a copy of the current one would prove nothing)."""
    assert write_script().source != ORACLE
    assert b"local function grouped" in ORACLE and b'redis.call("EXISTS"' in ORACLE


@pytest.mark.parametrize("inline", [False, True])
@pytest.mark.parametrize("mode", [(0, False), (3, True)])
@pytest.mark.parametrize("op", ["+", "-"])
def test_a_waited_call_that_took_nothing_writes_one_record_again_as_it_is(
    server: redis.Redis, op: str, mode: tuple[int, bool], inline: bool
) -> None:
    """Counted in the server's dirty counter (``rdb_changes_since_last_save``: writes that propagate): a
    call marked "!" that takes no tuple writes exactly one record again (two ZADD XX: 2), the first found,
    and leaves every key as it was; unmarked, or with a tuple taken, nothing more."""
    bound, floors = mode
    ns = f"dw{next(_ns)}w:"
    source = write_script().source
    other = "-" if op == "+" else "+"

    def run(o: str, groups: list[Any]) -> bytes:
        return call(server, source, ns, o, groups, bound, floors, inline)

    def dirty() -> int:
        return int(server.info("persistence")["rdb_changes_since_last_save"])

    try:
        assert run(op, [("b", [(2.0, "m2")])]) == b"1"  # its record in its own set
        assert run(other, [("a", [(5.0, "m1")]), ("b", [(5.0, "m4")])]) == b"11"  # newer, in the other set
        before = dirty()
        assert run(op, [("b", [(2.0, "m2")])]) == b"0" and dirty() == before  # unmarked: nothing written
        held = content(server, ns)
        assert run(op + "!", [("a", [(1.0, "m1")]), ("b", [(2.0, "m4"), (2.0, "m2")])]) == b"000"
        assert dirty() == before + 2 and content(server, ns) == held  # b's m2, written again as it was
        assert run(op + "!", [("c", [(1.0, "m5")])]) == b"1" and dirty() == before + 3  # taken: no more
        held = content(server, ns)
        assert run(op + "!", [("a", [(1.0, "m1")])]) == b"0"  # stale: its record is in the other set
        assert dirty() == before + 5 and content(server, ns) == held  # that record, written again
    finally:
        for name in SETS:
            server.delete(*keys(ns, name))


@pytest.mark.parametrize("inline", [False, True])
def test_a_waited_call_that_took_nothing_rewrites_any_record_it_finds_and_no_other_kind(
    server: redis.Redis, inline: bool
) -> None:
    """The rewrite takes any record of the call: a member in the other set of its group, else a floor set
    again to its own value (a delete at or below the floor leaves no tombstone of its own); keys of another
    kind (an aggregate's hash) are passed over, never a WRONGTYPE after the verdicts."""
    ns = f"dw{next(_ns)}r:"
    source = write_script().source
    plus, minus, floor = keys(ns, "a")

    def run(op: str, groups: list[Any]) -> bytes:
        return call(server, source, ns, op, groups, 3, True, inline)

    def dirty() -> int:
        return int(server.info("persistence")["rdb_changes_since_last_save"])

    try:
        server.zadd(plus, {"m1": 1.0})
        server.set(floor, "5")
        assert run("-!", [("a", [(2.0, "m1")])]) == b"1"  # at or below the floor: m1 leaves K+, no tombstone
        before, held = dirty(), content(server, ns)
        assert run("-!", [("a", [(2.0, "m1")])]) == b"0" and dirty() == before + 1  # the floor, set again
        assert content(server, ns) == held and server.ttl(floor) == -1
        server.zadd(plus, {"m2": 9.0})
        before, held = dirty(), content(server, ns)
        assert run("-!", [("a", [(6.0, "m2")])]) == b"0"  # stale: m2 is in K+ at 9, K- holds nothing of it
        assert dirty() == before + 2 and content(server, ns) == held  # found in the other set, written again
        server.delete(plus, minus, floor)
        server.zadd(plus, {"m1": 2.0, "m2": 0.0})  # a sums key: totals in K+, fences in a K- hash
        server.hset(minus, "src", "0:0:1:1")
        before = dirty()
        assert run("-!", [("a", [(1.0, "m1")])]) == b"0"  # stale against its total: no WRONGTYPE after it
        assert dirty() == before + 2 and server.zscore(plus, "m1") == 2.0 and server.type(minus) == b"hash"
    finally:
        server.delete(plus, minus, floor)


def test_a_bytes_subclass_key_or_member_is_encoded_as_exact_bytes() -> None:
    """The encoder's lists hold exact bytes only (they are off the collector's lists): a subclass's value."""

    class Tagged(bytes):
        pass

    assert type(blob(Tagged(b"k"), 0, None, "key")) is bytes and blob(Tagged(b"k"), 0, None, "key") == b"k"
