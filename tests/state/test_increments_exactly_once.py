"""Exactly-once increments through the applier (the plain Consumer's and the Spark sink's): totals equal the
model of delivered messages whatever the poll boundaries, crashes, resends and replays; a transaction's
increments count although other producers' later messages were delivered first (fenced by delivery
position, not by the message's own offset); a fault between two flushes loses nothing."""

from __future__ import annotations

import contextlib
import itertools
import random
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_poll_boundaries import CT, History, _frame, cuts_of, make_history, write_journal

from zcluster import Cluster, Count, Incr, Insert, MapperError, PollError
from zcluster.journal import FileJournals
from zcluster.message import Flags
from zcluster.state import Applier, BatchStats, Consumer
from zcluster.testing import LocalShards

_ids = itertools.count()


def counting_mapper(message: Any) -> list[Incr | Count]:
    """Every message counts once on a leaderboard and a counter, by a key of its id (deterministic)."""
    ident = message.doc["id"]
    n = int(ident.lstrip("m")) if ident.startswith("m") else 0
    return [Incr(f"lb{n % 3}", f"u{n % 4}", 1.5), Count("views", f"f{n % 2}", 1), Incr("lb0", "all", 1)]


def model(delivered: list[str]) -> tuple[dict[str, dict[str, float]], dict[str, int]]:
    sums: dict[str, dict[str, float]] = {}
    counts: dict[str, int] = {}
    for ident in delivered:
        n = int(ident.lstrip("m")) if ident.startswith("m") else 0
        sums.setdefault(f"lb{n % 3}", {}).setdefault(f"u{n % 4}", 0.0)
        sums[f"lb{n % 3}"][f"u{n % 4}"] += 1.5
        sums.setdefault("lb0", {}).setdefault("all", 0.0)
        sums["lb0"]["all"] += 1
        counts[f"f{n % 2}"] = counts.get(f"f{n % 2}", 0) + 1
    return sums, counts


def state_of(c: Cluster) -> tuple[dict[str, dict[str, float]], dict[str, int]]:
    sums = {k: {str(e.member): e.score for e in v} for k, v in c.select(["lb0", "lb1", "lb2"], limit=1000).items() if v}
    return sums, c.counters(["views"])["views"]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[FileJournals]:
    s = FileJournals(tmp_path / "journals")
    yield s
    s.close()


def test_a_transaction_delivered_after_later_messages_counts(store: FileJournals, shards: LocalShards) -> None:
    """Trap 1: P1's transaction (offset 0) is delivered at its ACK, after P2's message at a higher offset.
    Fencing by the message's own offset would drop it; the delivery position counts it."""
    p1, p2 = b"\x01" * 6, b"\x02" * 6
    h = History()
    h.frames = [
        _frame(p1, 10, Flags.CONTINUE_TXN, "m1"),
        _frame(p2, 10, Flags.OUTSIDE_TXN, "m2"),
        _frame(p2, 11, Flags.OUTSIDE_TXN, "m5"),
        _frame(p1, 12, Flags.ACK_TXN, "ack"),
    ]
    h.delivered = ["m2", "m5", "m1"]
    name, ends = write_journal(store, h)
    for polls in ([ends[-1]], [ends[1], ends[-1]], [ends[2], ends[-1]], list(ends)):
        with Cluster.from_urls(shards.urls, prefix=f"inc{next(_ids)}:") as c:
            applier = Applier(c, f"app{next(_ids)}-{uuid.uuid4().hex[:8]}", counting_mapper, store, flush=1)
            for end in polls:
                applier.apply_range(store, name, CT, 0, end, BatchStats())
            applier.apply_range(store, name, CT, 0, ends[-1], BatchStats())  # a replay changes nothing
            assert state_of(c) == model(h.delivered), polls


def test_a_fault_between_two_flushes_loses_and_doubles_nothing(store: FileJournals, shards: LocalShards) -> None:
    """Trap 2: the shard of every aggregate key refuses writes after the second flush (NOREPLICAS); the
    poll fails and keeps the checkpoint; once the shard takes writes again, the next poll is exact."""
    h = make_history(7, 40)
    write_journal(store, h)
    with LocalShards(1) as one, Cluster.from_urls(one.urls, prefix="trap2:") as c:
        client = one.servers[0].client()
        calls = itertools.count()

        def faulty(message: Any) -> list[Incr | Count]:
            if next(calls) == 6:  # flush=2: the writes of messages 0-5 were sent, the rest will fail
                client.config_set("min-replicas-to-write", 1)
            return counting_mapper(message)

        with pytest.raises(PollError) as info:
            Consumer(c, store, faulty, "app", flush=2, retries=1).poll()
        assert "NOREPLICAS" in str(info.value.failures[0].error)
        partial = state_of(c)
        assert partial != model(h.delivered)  # some increments were applied before the fault
        client.config_set("min-replicas-to-write", 0)
        Consumer(c, store, counting_mapper, "app", flush=2).poll()
        assert state_of(c) == model(h.delivered)


def test_an_increment_to_a_2p_set_key_names_the_message(store: FileJournals, shards: LocalShards) -> None:
    h = make_history(3, 12)
    name, _ = write_journal(store, h)
    with Cluster.from_urls(shards.urls, prefix=f"inc{next(_ids)}:") as c:
        c.insert([("set", 1.0, "taken")])

        def mixed(message: Any) -> list[Any]:
            return [Insert("other", 1.0, message.doc["id"]), Incr("set", message.doc["id"], 1)]

        with pytest.raises(PollError) as info:
            Consumer(c, store, mixed, f"app{next(_ids)}-{uuid.uuid4().hex[:8]}").poll()
        error = info.value.failures[0].error
        assert (
            isinstance(error, MapperError) and f"journal {name} offset" in str(error) and "another kind" in str(error)
        )
        assert info.value.failures[0].offset == 0  # nothing checkpointed


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**31), steps=st.integers(4, 30), ring=st.sampled_from([1, 3, 8192]))
def test_totals_equal_the_model_through_cuts_crashes_and_replays(
    store: FileJournals, shards: LocalShards, seed: int, steps: int, ring: int
) -> None:
    """Random histories (transactions, rollbacks, duplicates) read in pieces, with crashes at random points
    (the mapper raises: the journal's checkpoint stays, some flushes were sent) and replays from offset 0."""
    rng = random.Random(seed)
    h = make_history(seed, steps)
    name, ends = write_journal(store, h)
    if not ends:
        return
    polls = rng.choice(list(cuts_of(ends)))
    app = f"app{next(_ids)}-{uuid.uuid4().hex[:8]}"
    with Cluster.from_urls(shards.urls, prefix=f"incp{next(_ids)}:") as c:
        for end in polls:
            for _ in range(rng.randint(0, 2)):  # crashes: the poll dies after some of its flushes
                crash_at = rng.randrange(1, 3 * len(h.frames) + 2)
                calls = itertools.count()

                def crashing(message: Any, crash_at: int = crash_at, calls: Any = calls) -> list[Incr | Count]:
                    if next(calls) == crash_at:
                        raise RuntimeError("crash")
                    return counting_mapper(message)

                with contextlib.suppress(MapperError):  # the crash: nothing of this journal checkpointed
                    Applier(c, app, crashing, store, ring=ring, flush=rng.choice([1, 2, 5])).apply_range(
                        store, name, CT, 0, end, BatchStats()
                    )
            Applier(c, app, counting_mapper, store, ring=ring, flush=rng.choice([1, 3, 100])).apply_range(
                store, name, CT, 0, end, BatchStats()
            )
        replay = Applier(c, app, counting_mapper, store, ring=ring)
        replay.apply_range(store, name, CT, 0, ends[-1], BatchStats())  # nothing new: fenced and skipped
        assert state_of(c) == model(h.delivered)
