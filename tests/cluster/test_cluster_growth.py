"""Growing a running Redis Cluster as an operator does, under an exactly-once consumer and a live client.

A 3-master cluster gets a fourth master (``redis-cli --cluster add-node``), the slot of a live client's keys
held split between the old master and the new one, then 4096 more slots resharded onto it
(``redis-cli --cluster reshard ... --cluster-slots 4096 --cluster-yes``; without redis-cli, the same
commands sent by :class:`zcluster.testing.LocalRedisCluster`) while a :class:`zcluster.state.Consumer`
applies journals that keep growing (timeline 2P-set writes, ``Incr`` sums and ``Count`` counters fenced per
journal) and another thread's long-lived :class:`zcluster.Cluster` writes and reads its own keys, checking
each read against what it wrote. The clients follow MOVED, ASK and TRYAGAIN: no restart, no error, and at
the end every read equals the model, the checkpoints are at the journals' ends, some keys of every kind
really live on the new master, and replaying every journal from offset 0 applies no increment again.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from zcluster import Cluster, Count, Delete, Incr, Insert, _transport
from zcluster._follow import redirected as follow_redirect
from zcluster._keys import KeyLayout
from zcluster.journal import FileJournals
from zcluster.state import BatchStats, Consumer, StateStore
from zcluster.testing import LocalRedisCluster
from zcluster.testing.traffic import Traffic, create_journals, publish, timeline_mapper

pytestmark = pytest.mark.cluster

GROUPS = 32  # aggregate keys per kind, spread over the slots
FIRST_STEPS, CHUNK_STEPS, CHUNKS = 2000, 500, 8  # publish steps (3 producers each): ~23k committed messages
RESHARDED = 4096
SUMS, COUNTS = [f"pts:{g}" for g in range(GROUPS)], [f"ev:{g}" for g in range(GROUPS)]
PREFIX = "grow:"


HOT = "hot"  # the hash tag of the live client's keys: the hot slot, split while the clients run
# The live client's own keys, all in the hot slot, beside FILLERS keys left on the old master while
# hold_split keeps the slot split: the client's calls meet ASK (a key already moved) and TRYAGAIN (a key created
# on the importing node), not only MOVED.
LIVE_KEYS = [f"{{{HOT}}}:live:{i}" for i in range(64)]
FILLERS = 500
HOLD = 120.0  # seconds hold_split keeps the hot slot split at most, waiting for the live client's ASK (a bound)


def growth_mapper(message: Any) -> list[Insert | Delete | Incr | Count]:
    """The timeline write of an event, half a point and one event counted for its user in the user's group."""
    user = str(message.doc["user"])
    g = int(user[1:]) % GROUPS
    return [*timeline_mapper(message), Incr(f"pts:{g}", user, 0.5), Count(f"ev:{g}", user, 1)]


def aggregates(traffic: Traffic) -> tuple[dict[str, list[tuple[str, float]]], dict[str, dict[str, int]]]:
    """What :func:`growth_mapper` must have made of ``traffic``'s committed events, each counted once: the
    sums keys as ``select`` reads them and the counters keys as ``counters`` does."""
    sums: dict[str, dict[str, float]] = {k: {} for k in SUMS}
    counts: dict[str, dict[str, int]] = {k: {} for k in COUNTS}
    for user, n in traffic.events.items():
        g = int(user[1:]) % GROUPS
        sums[SUMS[g]][user], counts[COUNTS[g]][user] = 0.5 * n, n
    return {k: in_order(v) for k, v in sums.items()}, counts


def in_order(members: dict[str, float]) -> list[tuple[str, float]]:
    """Members as ``select`` returns them: score descending, ties member descending."""
    return sorted(members.items(), key=lambda ms: (ms[1], ms[0]), reverse=True)


def read_all(c: Cluster, keys: list[str]) -> dict[str, list[tuple[str, float]]]:
    return {str(k): [(str(e.member), e.score) for e in v] for k, v in c.select(keys, limit=100_000).items()}


class Worker(threading.Thread):
    """A thread running ``body`` whose exception is kept for the test (never swallowed)."""

    def __init__(self, body: Callable[[], None]) -> None:
        super().__init__(daemon=True)
        self.body = body
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.body()
        except BaseException as exc:  # reported by the test
            self.error = exc


def asks(old: Any) -> int:
    """The ASK replies a server gave so far (its ``errorstat_ASK``: a call may meet ASK inside a redirect loop,
    where the test's spy does not look)."""
    return int(old.info("errorstats").get("errorstat_ASK", {}).get("count", 0))


def hold_split(rc: LocalRedisCluster, dst: int, midway: threading.Event, meanwhile: Callable[[], bool]) -> int:
    """Split the hot slot between its master and server ``dst`` while the clients run; returns the ASK replies
    its old master gave meanwhile.

    The slot's migration is opened as redis-cli opens one (IMPORTING, MIGRATING) and the live client's keys
    moved (``MIGRATE``), the fillers left behind: the live calls find their keys gone from the old master,
    which answers ``ASK``, and a call creating a key on the importing node meets ``TRYAGAIN``. Held open,
    not raced: catching redis-cli's own migration of the slot mid-way (an earlier version paused it with
    ``SIGSTOP`` once the new master counted some keys) failed on a loaded machine, where the whole slot moved
    between two looks. ``midway`` is set once the split is open; it stays open until the old master answered
    an ``ASK`` and ``meanwhile()`` holds, or ``HOLD`` seconds (a bound, within the clients'
    ``failover_timeout``), then the slot's migration ends as redis-cli ends it: the other keys moved, the
    slot assigned to ``dst`` on every node."""
    slot = KeyLayout(PREFIX).slot(f"{{{HOT}}}".encode())
    src = rc.slot_owner(slot)
    with rc.servers[src].client() as old:
        before = asks(old)
        keys = old.execute_command(
            "CLUSTER", "GETKEYSINSLOT", slot, old.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot)
        )
        rc.open_slot(slot, dst, *[k for k in keys if b":fill:" not in k])
        midway.set()
        deadline = time.monotonic() + HOLD
        while (asks(old) == before or not meanwhile()) and time.monotonic() < deadline:
            time.sleep(0.01)
        asked = asks(old) - before
    rc.migrate_slot(slot, dst)
    return asked


class LiveClient:
    """One long-lived Cluster object: inserts and deletes on its own keys (scores rising, so its model is
    simply the last write per member), a fenced ``Incr`` and ``Count`` per write, and after each write reads
    of the key written and of a random other one, each compared with the model then (only this thread writes
    these keys: any difference is a lost or misrouted write). Runs until ``stop`` or ``max_steps``."""

    def __init__(self, c: Cluster, stop: threading.Event, max_steps: int = 20_000) -> None:
        self.c, self.stop, self.max_steps = c, stop, max_steps
        self.model: dict[str, dict[str, tuple[float, bool]]] = {k: {} for k in LIVE_KEYS}
        self.counts: dict[str, int] = {}
        self.increments: list[tuple[int, Incr | Count]] = []
        self.steps = 0
        self.mismatches: list[str] = []

    def visible(self, key: str) -> list[tuple[str, float]]:
        return in_order({m: s for m, (s, removed) in self.model[key].items() if not removed})

    def run(self) -> None:
        rng = random.Random(5)
        while not self.stop.is_set() and self.steps < self.max_steps:
            self.steps += 1
            step, key = self.steps, rng.choice(LIVE_KEYS)
            held = self.model[key]
            present = [m for m, (_, removed) in held.items() if not removed]
            if present and rng.random() < 0.3:
                member = rng.choice(present)
                assert self.c.delete([(key, float(step), member)]).applied == [True]
                held[member] = (float(step), True)
            else:
                member = f"m{step}"
                assert self.c.insert([(key, float(step), member)]).applied == [True]
                held[member] = (float(step), False)
            items: list[tuple[int, Incr | Count]] = [
                (step, Incr(f"{key}:p", "n", 2)),
                (step, Count(f"{key}:c", "n", 1)),
            ]
            assert self.c.increment("live", items).applied == [True, True]
            self.increments += items
            self.counts[key] = self.counts.get(key, 0) + 1
            for k in (key, rng.choice(LIVE_KEYS)):
                got = read_all(self.c, [k])[k]
                if got != self.visible(k):
                    self.mismatches.append(f"step {step}, {k}: read {got[:3]}..., wrote {self.visible(k)[:3]}...")
                n = self.counts.get(k, 0)
                total = read_all(self.c, [f"{k}:p"])[f"{k}:p"]
                counted = self.c.counters([f"{k}:c"])[f"{k}:c"]
                if total != ([("n", 2.0 * n)] if n else []) or counted != ({"n": n} if n else {}):
                    self.mismatches.append(f"step {step}, {k}: totals {total} and {counted}, {n} increments sent")


def test_a_fourth_master_and_a_reshard_of_4096_slots_under_a_consumer_and_a_live_client(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = FileJournals(tmp_path / "journals")
    names = [f"grow/part-{i}" for i in range(3)]
    create_journals(store, names)
    traffic = publish(store, Traffic(names), producers=3, messages=FIRST_STEPS, users=400, seed=0)
    app, prefix = "grow", PREFIX
    mapped = [0]  # messages the consumer's mapper saw (a list: the mapper closes over it)

    def mapper(message: Any) -> list[Insert | Delete | Incr | Count]:
        mapped[0] += 1
        return growth_mapper(message)

    with (
        store,
        LocalRedisCluster(3) as rc,
        # failover_timeout: a call meets TRYAGAIN for as long as the hold keeps the hot slot split (HOLD at most)
        Cluster.from_cluster_url(rc.url, prefix=prefix, failover_timeout=rc.FAILOVER_WAIT) as c,
        Cluster.from_cluster_url(rc.url, prefix=prefix, failover_timeout=rc.FAILOVER_WAIT) as live_c,
    ):
        live_c.insert([(f"{{{HOT}}}:fill:{i}", 1.0, "x") for i in range(FILLERS)])
        redirects: list[str] = []  # the redirects the clients followed (a spy: the real code still runs)

        def spy(topology: Any, shard: Any, command: Any, error: Exception, *rest: Any) -> Any:
            redirects.append(type(error).__name__)
            return follow_redirect(topology, shard, command, error, *rest)

        monkeypatch.setattr(_transport, "redirected", spy)
        resharded, published, stop = threading.Event(), threading.Event(), threading.Event()
        midway = threading.Event()  # the hot slot is split (or the growth over): the last chunk may go
        polls: list[BatchStats] = []

        def produce() -> (
            None
        ):  # a chunk a second, all at once after the reshard, the last one while the hot slot is split
            for chunk in range(1, CHUNKS + 1):
                if chunk < CHUNKS:
                    resharded.wait(1.0)
                else:
                    assert midway.wait(HOLD + 600), "the hot slot was never split"
                publish(store, traffic, producers=3, messages=CHUNK_STEPS, users=400, seed=chunk)
            published.set()

        def consume() -> None:
            with Consumer(c, store, mapper, app, flush=512) as consumer:
                while True:
                    last = published.is_set()  # set before the poll: a poll reading nothing then is the end
                    polls.append(consumer.poll())
                    if last and polls[-1].frames == 0:
                        return
                    if polls[-1].frames == 0:
                        time.sleep(0.05)

        live = LiveClient(live_c, stop)
        workers = [Worker(produce), Worker(consume), Worker(live.run)]
        for w in workers:
            w.start()
        at_start: list[int] = []  # messages mapped when the growth began

        def mapped_since_start() -> bool:
            return bool(at_start) and mapped[0] > at_start[0]

        try:
            deadline = time.monotonic() + 120
            while not polls and time.monotonic() < deadline:  # the consumer is under way before the growth
                time.sleep(0.05)
            new = rc.add_master()
            before = (mapped[0], live.steps)
            at_start.append(before[0])
            asked = hold_split(rc, new, midway, mapped_since_start)  # the hot slot first, then redis-cli's reshard
            gained = rc.reshard(RESHARDED, new)
            during = (mapped[0] - before[0], live.steps - before[1])
        finally:
            resharded.set()
            midway.set()
            workers[0].join(300)
            workers[1].join(300)
            stop.set()
            workers[2].join(120)
        for w in workers:
            assert not w.is_alive(), f"{w.body} did not finish"
            assert w.error is None, w.error
        assert during[0] > 0 and during[1] > 0, f"nothing ran during the growth: {during}"
        met = {kind: redirects.count(kind) for kind in ("MovedError", "AskError", "TryAgainError")}
        print(f"during the growth: {during[0]} messages mapped, {during[1]} live client steps; redirects {met}")
        print(f"ASK replies of the hot slot's old master while it was split: {asked}")
        assert met["MovedError"] > 0, met
        assert asked > 0, "the hot slot's old master answered no ASK while it was split"
        assert gained == RESHARDED, gained

        # Every read equals the model: timelines (2P-set members and scores), sums and counters exactly.
        timelines = sorted(traffic.expected())
        want_sums, want_counts = aggregates(traffic)
        assert read_all(c, timelines) == traffic.expected()
        assert read_all(c, SUMS) == want_sums
        assert {str(k): {str(f): n for f, n in v.items()} for k, v in c.counters(COUNTS).items()} == want_counts
        assert not live.mismatches, live.mismatches[:5]
        assert read_all(live_c, LIVE_KEYS) == {k: live.visible(k) for k in LIVE_KEYS}

        # The new master holds 4096 slots and keys of every kind; the clients, having followed the redirects of
        # the reads above, route every key where the cluster says it is: for some keys, the new master.
        owner = [0] * 16384  # slot -> port of its master, from the cluster itself
        with rc.servers[0].client() as r:
            for lo, hi, master, *_ in r.execute_command("CLUSTER", "SLOTS"):
                owner[lo : hi + 1] = [int(master[1])] * (hi - lo + 1)
        assert owner.count(rc.servers[new].port) == RESHARDED + 1  # the hot slot too
        layout, name = KeyLayout(prefix), f"127.0.0.1:{rc.servers[new].port}"
        for client, kinds in ((c, [timelines, SUMS, COUNTS]), (live_c, [LIVE_KEYS])):
            for keys in kinds:
                routed = {k: client.shard_of(k) for k in keys}
                assert routed == {k: f"127.0.0.1:{owner[layout.slot(k.encode())]}" for k in keys}
                assert name in routed.values(), f"no key of {keys[:3]}... routed to the new master"

        # Checkpoints at the journals' ends; every committed message delivered once.
        state = StateStore(c, app)
        assert all(state.load_journal(j).offset == store.end(j) for j in names)
        assert sum(p.delivered for p in polls) == traffic.committed > 20_000

        # Exactly once: the checkpoints lost (their keys deleted on every master, the new one too), so every
        # journal is delivered again from offset 0 with no producer states; every increment is refused by its
        # fence, which moved with its key. (restart_journal would not do: it fences a journal created again
        # above the old positions, so its increments count.)
        deleted = 0
        for server in rc.servers:
            with server.client() as r:
                deleted += sum(r.delete(k) for k in list(r.scan_iter(match=f"*zcstate:{app}/journal/*")))
        assert deleted >= len(names)
        with Consumer(c, store, growth_mapper, app, flush=4096) as replay:
            again = replay.poll()
        assert again.delivered == traffic.committed
        assert again.increments == again.fenced == 2 * traffic.committed
        assert live_c.increment("live", live.increments).applied_count == 0
        assert read_all(c, SUMS) == want_sums and read_all(c, timelines) == traffic.expected()
        assert all(state.load_journal(j).offset == store.end(j) for j in names)


def test_the_helpers_grow_a_cluster_without_redis_cli_too() -> None:
    """``add_master(cli=False)`` and ``reshard(..., cli=False)``: CLUSTER MEET and slot-by-slot migration, the
    way taken where no redis-cli is installed; a client opened before follows, every record still there."""
    with LocalRedisCluster(3) as rc, Cluster.from_cluster_url(rc.url, prefix=PREFIX) as c:
        keys = [f"k{i}" for i in range(3000)]
        c.insert([(k, 1.0, "m") for k in keys])
        new = rc.add_master(cli=False)
        assert rc.reshard(48, new, cli=False) == 48
        with rc.servers[new].client() as r:
            assert r.dbsize() > 0
            slots = r.execute_command("CLUSTER", "SLOTS")
        # 16 of each master's slots (5461, 5461, 5462 of them: the remainders round the 5461s up), its lowest first
        mine = sorted((lo, hi) for lo, hi, master, *_ in slots if int(master[1]) == rc.servers[new].port)
        assert mine == [(0, 15), (5461, 5476), (10922, 10937)]
        assert c.select(keys) == {k: [(k, 1.0, "m")] for k in keys}
        assert any(c.shard_of(k) == f"127.0.0.1:{rc.servers[new].port}" for k in keys)
