"""Growing a running Redis Cluster as an operator does, under an exactly-once consumer and a live client.

A 3-master cluster gets a fourth master (``redis-cli --cluster add-node``) and 4096 slots resharded onto it
(``redis-cli --cluster reshard ... --cluster-slots 4096 --cluster-yes``; without redis-cli, the same
commands sent by :class:`zcluster.testing.LocalRedisCluster`) while a :class:`zcluster.state.Consumer`
applies journals that keep growing (timeline 2P-set writes, ``Incr`` sums and ``Count`` counters fenced per
journal) and another thread's long-lived :class:`zcluster.Cluster` writes and reads its own keys, checking
each read against what it wrote. The clients follow MOVED, ASK and TRYAGAIN: no restart, no error, and at
the end every read equals the model, the checkpoints are at the journals' ends, some keys of every kind
really live on the new master, and replaying every journal from offset 0 applies no increment again.
"""

from __future__ import annotations

import os
import random
import signal
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
from zcluster.testing import LocalRedisCluster, cmdline, descendants
from zcluster.testing.redis_cluster import find_cli
from zcluster.testing.traffic import Traffic, create_journals, publish, timeline_mapper

pytestmark = pytest.mark.cluster

GROUPS = 32  # aggregate keys per kind, spread over the slots
FIRST_STEPS, CHUNK_STEPS, CHUNKS = 2000, 500, 8  # publish steps (3 producers each): ~23k committed messages
RESHARDED = 4096
SUMS, COUNTS = [f"pts:{g}" for g in range(GROUPS)], [f"ev:{g}" for g in range(GROUPS)]
PREFIX = "grow:"


def _hot_tag() -> str:
    """A hash tag whose slot is among the lowest of the first master, so among those redis-cli's reshard moves
    (each source gives its lowest slots); the test checks that it moved."""
    return next(t for t in (f"hot{n}" for n in range(10_000)) if KeyLayout(PREFIX).slot(f"{{{t}}}".encode()) < 1000)


HOT = _hot_tag()
# The live client's own keys, all in the hot slot, beside FILLERS keys that make that slot's migration last
# (redis-cli moves 10 keys per MIGRATE): meanwhile its keys are split between two nodes, and the client's
# calls meet ASK (a key already moved) and TRYAGAIN (a call's keys on both nodes), not only MOVED.
# SplitHolder makes the ASK certain.
LIVE_KEYS = [f"{{{HOT}}}:live:{i}" for i in range(64)]
FILLERS = 6000
HOLD = 120.0  # seconds SplitHolder keeps the hot slot split at most, waiting for the live client's ASK (a bound)


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


class SplitHolder:
    """Keeps the hot slot split while the live client runs, so that it surely meets ``ASK``.

    Timing alone did not: on a loaded machine the slot's own migration (600 ``MIGRATE`` calls) once passed
    between two of the live client's calls, and it met one ``TRYAGAIN`` and no ``ASK``. So: once redis-cli's
    reshard has moved some of the hot slot's keys (the new master counts some, the old one still has some),
    redis-cli is paused (``SIGSTOP``); the live client's keys (all but the fillers) are moved with ``MIGRATE``
    as redis-cli moves keys, so the live calls find their keys gone from the old master, which answers ``ASK``;
    redis-cli goes on (``SIGCONT``) once the old master answered one since the reshard began (its
    ``errorstat_ASK``; a call may meet it inside a redirect loop, where the test's spy does not look), or after
    ``HOLD`` seconds, well within the client's ``failover_timeout``: a call creating a key on the importing node
    meets ``TRYAGAIN`` until the slot's migration ends. The hold also lasts until ``meanwhile()`` (within the
    same bound), and sets ``midway`` once held: the reshard is surely under way while the test's other work
    goes on. ``held`` says whether the hold happened (``missed``: why not); ``asked``: the ``ASK`` replies the
    old master gave from before the reshard to the end of the hold."""

    def __init__(
        self,
        rc: LocalRedisCluster,
        src: int,
        dst: int,
        stop: threading.Event,
        midway: threading.Event,
        meanwhile: Callable[[], bool],
    ) -> None:
        self.rc, self.src, self.dst, self.stop = rc, src, dst, stop
        self.midway, self.meanwhile = midway, meanwhile
        self.slot = KeyLayout(PREFIX).slot(f"{{{HOT}}}".encode())
        self.held, self.missed, self.asked = False, "", 0
        # Counted from before the reshard: a live call ASKed to the new master before the pause and waiting there
        # (TRYAGAIN: it creates a key) until the slot is closed makes no new one.
        self.before = self.asks()

    def asks(self) -> int:
        """The ASK replies the old master gave so far."""
        with self.rc.servers[self.src].client() as old:
            return int(old.info("errorstats").get("errorstat_ASK", {}).get("count", 0))

    def hold(self) -> None:
        """Run in a :class:`Worker` beside the reshard (see the class)."""
        cli: list[int] = []
        while not cli and not self.stop.is_set():  # redis-cli, once the main thread started it
            cli = [p for p in descendants(os.getpid()) if "--cluster reshard" in cmdline(p)]
            time.sleep(0.005)
        with self.rc.servers[self.src].client() as old, self.rc.servers[self.dst].client() as new:
            while not self.stop.is_set() and new.execute_command("CLUSTER", "COUNTKEYSINSLOT", self.slot) == 0:
                time.sleep(0.001)
            if self.stop.is_set():
                self.missed = "the reshard ended before the hot slot was seen split"
                return
            for p in cli:
                os.kill(p, signal.SIGSTOP)
            try:
                if old.execute_command("CLUSTER", "COUNTKEYSINSLOT", self.slot) == 0:
                    self.missed = "the hot slot's migration ended before redis-cli was paused"
                    return
                keys = old.execute_command("CLUSTER", "GETKEYSINSLOT", self.slot, 2 * FILLERS)
                live = [k for k in keys if b":fill:" not in k]
                if live:
                    port = self.rc.servers[self.dst].port
                    old.execute_command("MIGRATE", "127.0.0.1", port, "", 0, 5000, "KEYS", *live)
                self.held, deadline = True, time.monotonic() + HOLD
                self.midway.set()
                while (self.asks() == self.before or not self.meanwhile()) and time.monotonic() < deadline:
                    time.sleep(0.01)
                self.asked = self.asks() - self.before
            finally:
                for p in cli:
                    os.kill(p, signal.SIGCONT)


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
        midway = threading.Event()  # the reshard is under way (or over): the last chunk may go
        polls: list[BatchStats] = []

        def produce() -> None:  # a chunk a second, all at once after the reshard, the last one only midway in it
            for chunk in range(1, CHUNKS + 1):
                if chunk < CHUNKS:
                    resharded.wait(1.0)
                else:
                    assert midway.wait(HOLD + 600), "the reshard never got under way"
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
        holder: SplitHolder | None = None
        holding: Worker | None = None
        at_start: list[int] = []  # messages mapped when the reshard began

        def mapped_since_start() -> bool:
            return bool(at_start) and mapped[0] > at_start[0]

        try:
            deadline = time.monotonic() + 120
            while not polls and time.monotonic() < deadline:  # the consumer is under way before the growth
                time.sleep(0.05)
            new = rc.add_master()
            if find_cli() is not None:  # the hold pauses redis-cli; the built-in reshard runs in this thread
                src = next(
                    i for i in range(new) if rc.servers[i].port == int(live_c.shard_of(LIVE_KEYS[0]).split(":")[1])
                )
                holder = SplitHolder(rc, src, new, resharded, midway, mapped_since_start)
                holding = Worker(holder.hold)
                holding.start()
            before = (mapped[0], live.steps)
            at_start.append(before[0])
            if holder is None:  # no hold: the last chunk goes as the reshard starts
                midway.set()
            assert rc.reshard(RESHARDED, new) == RESHARDED
            during = (mapped[0] - before[0], live.steps - before[1])
        finally:
            resharded.set()
            midway.set()
            if holding is not None:
                holding.join(HOLD + 60)
            workers[0].join(300)
            workers[1].join(300)
            stop.set()
            workers[2].join(120)
        for w in workers:
            assert not w.is_alive(), f"{w.body} did not finish"
            assert w.error is None, w.error
        assert during[0] > 0 and during[1] > 0, f"nothing ran during the reshard: {during}"
        met = {kind: redirects.count(kind) for kind in ("MovedError", "AskError", "TryAgainError")}
        asked = holder.asked if holder is not None else None
        print(f"during the reshard: {during[0]} messages mapped, {during[1]} live client steps; redirects {met}")
        print(f"ASK replies of the hot slot's old master, from before the reshard to the end of the hold: {asked}")
        assert met["MovedError"] > 0, met
        if holder is not None and holding is not None:
            assert not holding.is_alive() and holding.error is None, holding.error
            assert holder.held, holder.missed
            assert holder.asked > 0, "the hot slot's old master answered no ASK while it was held split"

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
        assert owner.count(rc.servers[new].port) == RESHARDED
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
