"""Faults under exactly-once increments (:class:`zcluster.Incr` sums, :class:`zcluster.Count` counters), against
real redis-server processes on loopback: SCRIPT FLUSH between and during calls and polls; a shard SIGKILLed
mid-run and started again from its AOF (``appendfsync always``); zombies (a stale writer resending old
increments late, an applier that loaded its checkpoint before a newer one applied the same messages); a
Redis Cluster master killed under a consumer while its replica takes over.

Every test compares the totals with a model computed here: from the items sent, or from the journals by the
message layer's own read-committed reader (independent of the applier). Each also checks that its fault
really happened where it matters (NOSCRIPT replies counted by the servers, the consumer's retries, a zombie
whose late increments were all refused by the fences), so that a fault that missed cannot pass silently.
"""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from zcluster import Cluster, Count, Durability, Incr, PollError
from zcluster.journal import FileJournals
from zcluster.message.journals import JournalSpec
from zcluster.message.readers import ReadCommittedIter
from zcluster.message.sequencer import Sequencer
from zcluster.state import Applier, BatchStats, Consumer, StateStore
from zcluster.testing import LocalRedisCluster, LocalServer, LocalShards
from zcluster.testing.traffic import Traffic, create_journals, publish

_ids = itertools.count()
GROUPS = 5  # keys per kind: spread over the shards
SUMS = [f"pts{g}" for g in range(GROUPS)]
COUNTS = [f"ev{g}" for g in range(GROUPS)]
CT = "application/x-ndjson"
WAIT = 120.0  # outer bound of a wait on a state the run must reach: only a broken run reaches it, not a slow one
Totals = tuple[dict[str, dict[str, float]], dict[str, dict[str, int]]]


def counting(message: Any) -> list[Incr | Count]:
    """One event, one count and a few points for its user, on keys of the user's group (deterministic)."""
    doc = message.doc
    g = int(doc["user"][1:]) % GROUPS
    return [Count(f"ev{g}", doc["user"], 1), Incr(f"pts{g}", doc["user"], 0.5 if doc["op"] == "add" else -1.0)]


def fold(items: Iterable[Incr | Count]) -> Totals:
    """The totals of applying each of ``items`` once."""
    sums: dict[str, dict[str, float]] = {}
    counts: dict[str, dict[str, int]] = {}
    for w in items:
        if isinstance(w, Count):
            held = counts.setdefault(str(w.key), {})
            held[str(w.field)] = held.get(str(w.field), 0) + w.delta
        else:
            total = sums.setdefault(str(w.key), {})
            total[str(w.member)] = total.get(str(w.member), 0.0) + w.delta
    return sums, counts


def journal_model(store: FileJournals, names: list[str]) -> Totals:
    """The totals of every committed message, read by the message layer's read-committed reader."""
    writes: list[Incr | Count] = []
    for name in names:
        for env in ReadCommittedIter(store, JournalSpec(name, {"content-type": CT}), Sequencer(buffer=256)):
            if not env.is_ack:
                writes.extend(counting(env.message))
    return fold(writes)


def totals(c: Cluster) -> Totals:
    sums = {str(k): {str(e.member): e.score for e in v} for k, v in c.select(SUMS, limit=100_000).items() if v}
    counts = {str(k): {str(f): n for f, n in v.items()} for k, v in c.counters(COUNTS).items() if v}
    return sums, counts


def noscripts(servers: Iterable[LocalServer]) -> int:
    """NOSCRIPT replies the servers gave so far (``INFO errorstats``, Redis >= 6.2 and Valkey)."""
    n = 0
    for s in servers:
        with s.client() as r:
            n += int(r.info("errorstats").get("errorstat_NOSCRIPT", {}).get("count", 0))
    return n


class Flusher(threading.Thread):
    """SCRIPT FLUSH on every server, over and over (a pause of ``every`` seconds between rounds), until stopped."""

    def __init__(self, servers: list[LocalServer], every: float = 0.003) -> None:
        super().__init__(daemon=True)
        self.servers, self.every = servers, every
        self.stop = threading.Event()
        self.flushed = threading.Event()  # set after the first round: a test waits on it before its calls
        self.flushes = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        clients = [s.client() for s in self.servers]
        try:
            while not self.stop.is_set():
                for r in clients:
                    r.script_flush()
                self.flushes += 1
                self.flushed.set()
                self.stop.wait(self.every)
        except BaseException as exc:  # reported by the test
            self.error = exc
        finally:
            for r in clients:
                r.close()


def rounds_of(n: int, seed: int) -> list[list[tuple[tuple[int, int], Incr | Count]]]:
    """``n`` rounds of increments from one source, round r at positions (r, 0..): sums and counters of every
    group, random members and deltas."""
    rng = random.Random(seed)
    out = []
    for r in range(n):
        items: list[tuple[tuple[int, int], Incr | Count]] = []
        for k in range(12):
            g = rng.randrange(GROUPS)
            if rng.random() < 0.5:
                items.append(((r, k), Incr(f"pts{g}", f"m{rng.randrange(6)}", rng.choice([1, 2, 0.5, -1.5]))))
            else:
                items.append(((r, k), Count(f"ev{g}", f"f{rng.randrange(6)}", rng.randrange(-3, 10))))
        out.append(items)
    return out


def send_until_confirmed(
    c: Cluster, source: str, items: list[Any], deadline: float, misses: list[Any] | None = None
) -> int:
    """Send ``items``, then resend the unconfirmed ones (in order, as the contract asks) until none is left;
    returns how many the calls applied. Each call's failures are appended to ``misses``."""
    applied = 0
    while True:
        result = c.increment(source, items, raise_on_error=False)
        assert result.refused is None, result.refused
        applied += result.applied_count
        if result.ok:
            return applied
        if misses is not None:
            misses.append(result.failures)
        assert time.monotonic() < deadline, f"still unconfirmed: {result.failures}"
        items = [items[i] for i in result.failed_indices]
        time.sleep(0.02)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[FileJournals]:
    s = FileJournals(tmp_path / "journals")
    yield s
    s.close()


def traffic_in(store: FileJournals, journals: int = 3, messages: int = 40, seed: int = 1) -> tuple[list[str], Traffic]:
    names = [f"inc/part-{i}" for i in range(journals)]
    create_journals(store, names)
    return names, publish(store, Traffic(names), producers=3, messages=messages, users=20, seed=seed)


# -- 1. SCRIPT FLUSH ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("topology", ["shards", pytest.param("cluster", marks=pytest.mark.cluster)])
def test_script_flush_between_and_during_increment_calls_keeps_totals_exact(topology: str) -> None:
    """Phase 1: every server's script cache is flushed before every other call, and each call resends the
    round before it (a retrying client): the client reloads the script, the fences stayed (they are data), so
    the resent half counts nothing. Phase 2: a thread flushes the caches every few milliseconds while calls
    run (a flush can land between a reload and its resend: that call reports the key unconfirmed, and it is
    resent). Then everything is sent again: fenced. Totals: each position once."""
    rounds = rounds_of(40, seed=7)
    group: LocalShards | LocalRedisCluster = LocalShards(2) if topology == "shards" else LocalRedisCluster(3)
    with group:
        c = (
            Cluster.from_cluster_url(group.url)
            if isinstance(group, LocalRedisCluster)
            else Cluster.from_urls(group.urls)
        )
        with c:
            before = noscripts(group.servers)
            deadline = time.monotonic() + WAIT
            for r in range(20):
                if r % 2:
                    for s in group.servers:
                        with s.client() as rc:
                            rc.script_flush()
                window = (rounds[r - 1] if r else []) + rounds[r]
                applied = send_until_confirmed(c, "src", window, deadline)
                assert applied == len(rounds[r])  # the resent round was fenced, this one applied
            assert totals(c) == fold(w for items in rounds[:20] for _, w in items)
            between = noscripts(group.servers)
            assert between > before  # the flushes were met: NOSCRIPT, reload, resend

            flusher = Flusher(group.servers)
            flusher.start()
            assert flusher.flushed.wait(WAIT)  # so the next call surely meets NOSCRIPT, however slow the thread
            try:
                for r in range(20, 40):
                    window = rounds[r - 1] + rounds[r]
                    applied = send_until_confirmed(c, "src", window, deadline)
                    assert applied == len(rounds[r])
            finally:
                flusher.stop.set()
                flusher.join(WAIT)
            assert flusher.error is None and flusher.flushes > 0
            assert noscripts(group.servers) > between
            everything = [item for items in rounds for item in items]
            assert send_until_confirmed(c, "src", everything, deadline) == 0  # a replay of it all: fenced
            assert totals(c) == fold(w for _, w in everything)


def test_script_flush_during_and_between_consumer_polls_keeps_totals_exact(store: FileJournals) -> None:
    """A consumer applies journals of increments (transactions, rollbacks, duplicates) in small flushes while a
    thread flushes every script cache every few milliseconds. Without retries, a call whose script was flushed
    again between its reload and its resend fails the poll (the first reload is followed by such a flush in
    the client itself, so one poll surely fails), and the next poll delivers again everything past
    the journal's checkpoint (the increments of the failed poll's earlier flushes too: fenced). Then the
    caches are flushed between polls, the stored checkpoints are deleted (a lost checkpoint: every message
    is delivered again), and the re-delivery is refused increment by increment by the fences that outlived
    the flushes: nothing applied. The totals are the model's throughout."""
    names, traffic = traffic_in(store, messages=40, seed=3)
    expected = journal_model(store, names)
    app = f"flush{next(_ids)}"
    with LocalShards(2) as shards, Cluster.from_urls(shards.urls, prefix="fl:") as c:
        transport, flushed_after_reload = c._transport, threading.Event()
        reload = transport.load_scripts

        def reload_then_flush(shard: Any) -> None:  # once: a flush lands between a reload and its resend
            reload(shard)
            if not flushed_after_reload.is_set():
                flushed_after_reload.set()
                shard.client.script_flush()

        transport.load_scripts = reload_then_flush  # type: ignore[method-assign]
        flusher = Flusher(shards.servers)
        consumer = Consumer(c, store, counting, app, flush=6, retries=0)
        flusher.start()
        assert flusher.flushed.wait(WAIT)  # the first call meets NOSCRIPT and reloads
        failed_polls = 0
        deadline = time.monotonic() + WAIT
        try:
            while True:
                try:
                    consumer.poll()
                    break
                except PollError:
                    failed_polls += 1
                    if failed_polls == 10:  # enough: let the next polls get through
                        flusher.stop.set()
                    assert time.monotonic() < deadline, "the consumer never got through"
        finally:
            flusher.stop.set()
            flusher.join(WAIT)
        assert flusher.error is None and flusher.flushes > 0
        assert noscripts(shards.servers) > 0 and failed_polls > 0
        assert totals(c) == expected
        assert consumer.poll().delivered == 0

        deleted = 0
        for s in shards.servers:
            with s.client() as r:
                r.script_flush()
                deleted += sum(r.delete(k) for k in list(r.scan_iter(match=f"*zcstate:{app}/journal/*")))
        assert deleted >= len(names)
        again = consumer.poll()
        assert again.delivered == traffic.committed  # every message delivered again...
        assert again.increments == 2 * traffic.committed == again.fenced and again.applied == 0  # ...all fenced
        assert totals(c) == expected
        print(f"{failed_polls} poll(s) failed under the flusher, {flusher.flushes} flushes")


# -- 2. a shard killed and started again from its AOF ---------------------------------------------------------


AOF_ALWAYS = ["--appendfsync", "always"]  # after the aof=True defaults: every write fsynced before its reply


class Killer(threading.Thread):
    """For each of ``victims``, once its ``go`` event is set: SIGKILL that shard a random few milliseconds later
    (so it lands anywhere: in a script call, before its reply, in a checkpoint save, between flushes) and set
    its ``killed`` event (the run waits on it a little further on, so the kill always lands inside the run);
    start it again from its AOF once ``met()`` (the failures the run met so far) has grown since the kill, so
    a run always meets the dead shard, however slow the machine; record its key count and set its
    ``restarted`` event."""

    def __init__(self, shards: LocalShards, victims: list[int], seed: int, met: Callable[[], int]) -> None:
        super().__init__(daemon=True)
        self.shards, self.victims, self.met = shards, victims, met
        self.rng = random.Random(seed)
        self.go = [threading.Event() for _ in victims]
        self.killed = [threading.Event() for _ in victims]
        self.restarted = [threading.Event() for _ in victims]
        self.reloaded: list[int] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            for go, killed, restarted, victim in zip(self.go, self.killed, self.restarted, self.victims, strict=True):
                if not go.wait(WAIT):
                    raise TimeoutError("the run never reached its kill point")
                time.sleep(self.rng.uniform(0, 0.02))
                met = self.met()
                self.shards.kill(victim)
                killed.set()
                deadline = time.monotonic() + WAIT
                while self.met() == met:
                    if time.monotonic() > deadline:
                        raise TimeoutError("the run never met the killed shard")
                    time.sleep(0.01)
                self.shards.start(victim)
                with self.shards.servers[victim].client() as r:
                    self.reloaded.append(int(r.dbsize()))
                restarted.set()
        except BaseException as exc:  # reported by the test
            self.error = exc


def test_a_consumer_through_shards_sigkilled_and_restarted_from_their_aof_counts_each_increment_once(
    store: FileJournals,
) -> None:
    """Both shards are SIGKILLed in turn while a consumer applies increments from journals (its mapper says
    when; the kill lands a few random milliseconds later, mid-call or between calls), each started again from
    its AOF (fsync always: whatever a reply confirmed is on disk) once a poll failed on it (past the consumer's
    one retry), so the next poll delivers again everything past the journal's checkpoint: increments
    applied by the failed poll's earlier flushes come again, and the fences restored from the AOF refuse
    them. Totals and fences are one script call, so one AOF entry: an increment whose reply the kill lost is
    either in the AOF with its fence (fenced when sent again) or in neither (applied then). The totals are
    the model's: nothing lost, nothing counted twice."""
    names, traffic = traffic_in(store, messages=60, seed=5)
    expected = journal_model(store, names)
    app = f"aof{next(_ids)}"
    with (
        LocalShards(2, aof=True, extra=AOF_ALWAYS) as shards,
        Cluster.from_urls(shards.urls, prefix="aof:", connection={"socket_connect_timeout": 0.5}) as c,
    ):
        failed_polls = 0
        killer = Killer(shards, [0, 1], seed=5, met=lambda: failed_polls)
        points = [traffic.committed // 4, traffic.committed // 2]
        mapped = itertools.count()

        def mapper(message: Any) -> list[Incr | Count]:
            n = next(mapped)
            for at, go, killed in zip(points, killer.go, killer.killed, strict=True):
                if n == at:
                    go.set()
                if n == at + 16:  # two flushes later the kill has landed, wherever it did: inside the run
                    assert killed.wait(WAIT), "the kill never landed"
            time.sleep(0.002)  # spreads the kill's landing over those flushes
            return counting(message)

        killer.start()
        consumer = Consumer(c, store, mapper, app, flush=8, retries=1)
        deadline = time.monotonic() + 2 * WAIT
        while True:
            try:
                stats = consumer.poll()
                if stats.frames == 0:
                    if not killer.is_alive():
                        break
                    time.sleep(0.05)
            except PollError:
                failed_polls += 1
                time.sleep(0.1)
            assert time.monotonic() < deadline, "the consumer never got through"
        killer.join(WAIT)
        assert killer.error is None, killer.error
        assert len(killer.reloaded) == 2 and all(n > 0 for n in killer.reloaded)  # each came back with its data
        assert failed_polls > 0, "no poll met a killed shard"
        assert totals(c) == expected
        # a replay of everything from offset 0 (checkpoints deleted): every increment refused by its fence
        for s in shards.servers:
            with s.client() as r:
                for k in list(r.scan_iter(match=f"*zcstate:{app}/journal/*")):
                    r.delete(k)
        again = Consumer(c, store, counting, app).poll()
        assert again.delivered == traffic.committed and again.applied == 0
        assert totals(c) == expected
        print(f"{failed_polls} poll(s) failed")


def test_increment_calls_with_resends_through_sigkills_and_aof_restarts_count_each_position_once() -> None:
    """A writer sends rounds of increments, each call resending the round before (as a client that lost a
    reply would) and resending what came back unconfirmed, while each shard is SIGKILLed at a random moment
    and started again from its AOF once a call failed on it. After each restart everything sent so far is sent
    again: the fences came back with the AOF, so nothing applies, and the totals came back too. At the end the
    totals are each position's once: nothing lost, nothing counted twice."""
    rounds = rounds_of(120, seed=11)
    with (
        LocalShards(2, aof=True, extra=AOF_ALWAYS) as shards,
        Cluster.from_urls(shards.urls, prefix="aofw:", connection={"socket_connect_timeout": 0.5}) as c,
    ):
        misses: list[Any] = []
        killer = Killer(shards, [0, 1], seed=11, met=lambda: len(misses))
        killer.start()
        applied_per_round: list[int] = []
        replays = 0
        deadline = time.monotonic() + 2 * WAIT
        for r, items in enumerate(rounds):
            if r in (30, 70):
                killer.go[0 if r == 30 else 1].set()
            if r in (40, 80):  # ten rounds later the kill has landed, wherever it did: inside the run
                assert killer.killed[0 if r == 40 else 1].wait(WAIT), "the kill never landed"
            window = (rounds[r - 1] if r else []) + items
            applied_per_round.append(send_until_confirmed(c, "w", window, deadline, misses))
            for restarted in killer.restarted:
                if restarted.is_set():  # once after each restart: everything so far, again
                    restarted.clear()
                    replays += 1
                    sent = [item for items in rounds[: r + 1] for item in items]
                    assert send_until_confirmed(c, "w", sent, deadline) == 0
                    assert totals(c) == fold(w for _, w in sent)
            time.sleep(0.005)
        killer.join(WAIT)
        assert killer.error is None, killer.error
        assert len(killer.reloaded) == 2 and all(n > 0 for n in killer.reloaded)
        assert replays == 2 and misses, "no call met a killed shard"
        # The resent round before never counts again; of a round, an increment applied before its reply was
        # lost is fenced on the resend (so not counted here), one the kill lost is applied by the resend.
        assert all(a <= len(items) for a, items in zip(applied_per_round, rounds, strict=True))
        lost_replies = sum(len(items) - a for a, items in zip(applied_per_round, rounds, strict=True))
        everything = [item for items in rounds for item in items]
        assert c.increment("w", everything).applied_count == 0
        assert totals(c) == fold(w for _, w in everything)
        print(f"{lost_replies} increment(s) applied whose reply the kills lost")


# -- 3. zombies ------------------------------------------------------------------------------------------------


def test_a_stale_writer_resending_old_increments_late_changes_nothing(shards: LocalShards, prefix: str) -> None:
    """A zombie (its own client, the same source) resends rounds that the live writer had confirmed before the
    zombie picked them, at random moments while the live writer goes on with newer rounds: every one of the
    zombie's increments is refused by the fences, and the totals are each round's once. Then one more zombie
    sends a stale batch long after: nothing."""
    rounds = rounds_of(80, seed=13)
    confirmed = 0  # rounds below it are confirmed by the live writer
    lock = threading.Lock()
    stop = threading.Event()
    zombie_calls: list[int] = []  # how many of each zombie call's increments applied
    errors: list[BaseException] = []

    def zombie() -> None:
        rng = random.Random(13)
        try:
            with Cluster.from_urls(shards.urls, prefix=prefix) as z:
                while not stop.is_set():
                    with lock:
                        upto = confirmed
                    if upto == 0:
                        time.sleep(0.001)
                        continue
                    lo = rng.randrange(upto)
                    hi = rng.randrange(lo, upto) + 1
                    batch = [item for items in rounds[lo:hi] for item in items]
                    zombie_calls.append(z.increment("w", batch).applied_count)
        except BaseException as exc:  # reported below
            errors.append(exc)

    with Cluster.from_urls(shards.urls, prefix=prefix) as c:
        t = threading.Thread(target=zombie, daemon=True)
        t.start()
        for r, items in enumerate(rounds):
            assert c.increment("w", items).applied_count == len(items)
            with lock:
                confirmed = r + 1
            if r % 10 == 9:  # the zombie resent rounds since the last wait: it runs beside the writer, however slow
                calls, deadline = len(zombie_calls), time.monotonic() + WAIT
                while len(zombie_calls) == calls and not errors:
                    assert time.monotonic() < deadline, "the zombie never resent"
                    time.sleep(0.001)
            time.sleep(0.002)
        stop.set()
        t.join(WAIT)
        assert not errors, errors
        assert len(zombie_calls) > 3 and sum(zombie_calls) == 0
        late = [item for items in rounds[:40] for item in items]
        with Cluster.from_urls(shards.urls, prefix=prefix) as z:
            assert not any(z.increment("w", late).applied)
        assert totals(c) == fold(w for items in rounds for _, w in items)


def test_an_applier_that_finishes_late_with_a_stale_checkpoint_counts_nothing_twice(store: FileJournals) -> None:
    """A zombie applier (a task that stalled) loads the journal's checkpoint, applies the first flushes of its
    range, then stalls in its mapper. Meanwhile its replacement applies the same range from the same
    checkpoint, and later traffic too. The zombie then wakes and finishes: it delivers the rest of its range
    again, and every one of those increments is refused by the fences (its checkpoint, older than the stored
    one, is not saved). The replacement's first increments were refused too (the zombie had applied them).
    Between them each increment is applied exactly once; the totals are the model's."""
    names, traffic = traffic_in(store, journals=1, messages=40, seed=17)
    (name,) = names
    end1 = store.end(name)
    with LocalShards(2) as shards, Cluster.from_urls(shards.urls, prefix="zmb:") as c:
        app = f"zombie{next(_ids)}"
        stalled, resume = threading.Event(), threading.Event()
        mapped = itertools.count()

        def stalling(message: Any) -> list[Incr | Count]:
            if next(mapped) == 25:  # after a few flushes of 8 increments
                stalled.set()
                assert resume.wait(WAIT), "never resumed"
            return counting(message)

        zombie_stats = BatchStats()
        errors: list[BaseException] = []

        def run_zombie() -> None:
            try:
                Applier(c, app, stalling, store, flush=8).apply_range(store, name, CT, 0, end1, zombie_stats)
            except BaseException as exc:  # reported below
                errors.append(exc)

        z = threading.Thread(target=run_zombie, daemon=True)
        z.start()
        assert stalled.wait(WAIT)
        assert zombie_stats.applied > 0 and totals(c) != ({}, {})  # it applied its first flushes, then stalled

        live = BatchStats()
        Applier(c, app, counting, store, flush=8).apply_range(store, name, CT, 0, end1, live)
        assert live.delivered == traffic.committed
        publish(store, traffic, producers=2, messages=20, users=20, seed=18)  # a later batch, applied too
        later = BatchStats()
        Applier(c, app, counting, store, flush=8).apply_range(store, name, CT, end1, store.end(name), later)
        assert later.delivered > 0 and later.applied == later.increments
        expected = journal_model(store, names)
        assert totals(c) == expected

        resume.set()
        z.join(WAIT)
        assert not errors, errors
        assert zombie_stats.delivered == live.delivered  # the zombie delivered its whole range...
        assert zombie_stats.applied > 0 and zombie_stats.applied + live.applied == live.increments  # ...once
        assert StateStore(c, app).load_journal(name).offset == store.end(name)  # its older checkpoint not saved
        assert totals(c) == expected


# -- 4. a Redis Cluster master killed, its replica promoted -----------------------------------------------------


@pytest.mark.cluster
def test_a_consumer_counts_increments_once_through_a_master_kill_and_failover(store: FileJournals) -> None:
    """A consumer applies increments with replica durability (WAIT 1: an increment confirmed is on the replica
    too) when the master holding most of the totals is SIGKILLed mid-poll; the calls wait out the failover (a
    few seconds) and go on to the promoted replica, and the killed node comes back as its replica. Later in
    the same journal the consumer crashes (its mapper raises once), so the next poll delivers that journal
    again from its checkpoint: the increments applied on the old master before the kill and on the new one
    after it come again, and the fences, replicated with the totals, refuse them. Totals: the model's."""
    names, traffic = traffic_in(store, messages=50, seed=19)
    expected = journal_model(store, names)
    per_journal = [sum(n for held in journal_model(store, [j])[1].values() for n in held.values()) for j in names]
    assert sum(per_journal) == traffic.committed  # messages delivered per journal (one Count each)
    first, second = per_journal[0], per_journal[1]
    kill_at, crash_at = first + second // 4, first + second // 2  # both in the second journal, in that order
    app = f"failover{next(_ids)}"
    # deadline: the heir has no replica of its own until the killed node is back, after an election that may
    # take long on a loaded machine (bounds only: nothing here waits on a clock)
    durability = Durability(replicas=1, timeout=2.0, deadline=LocalRedisCluster.FAILOVER_WAIT)
    with (
        LocalRedisCluster(3, replicas=1) as rc,
        Cluster.from_cluster_url(rc.url, prefix="fo:", durability=durability, failover_timeout=rc.FAILOVER_WAIT) as c,
    ):
        held = [c.shard_of(k) for k in SUMS + COUNTS]
        victim = max(range(3), key=lambda i: held.count(f"127.0.0.1:{rc.servers[i].port}"))
        (heir,) = rc.replicas_of(victim)
        mapped = itertools.count()
        healer_errors: list[BaseException] = []

        def heal() -> None:  # the killed node is replaced: started again once its heir is master
            try:
                deadline = time.monotonic() + rc.FAILOVER_WAIT
                while True:
                    try:
                        with heir.client(socket_timeout=2) as r:
                            if r.info("replication")["role"] == "master":
                                break
                    except OSError:
                        pass
                    assert time.monotonic() < deadline, "the replica was never promoted"
                    time.sleep(0.05)
                rc.start(victim)
            except BaseException as exc:  # reported below
                healer_errors.append(exc)

        healer = threading.Thread(target=heal, daemon=True)

        def mapper(message: Any) -> list[Incr | Count]:
            n = next(mapped)
            if n == kill_at:  # mid-poll, mid-journal: increments of this journal applied, more to come
                rc.kill(victim)
                healer.start()
            elif n == crash_at:
                raise RuntimeError("the consumer crashes after the failover")
            return counting(message)

        stats: list[BatchStats] = []
        with Consumer(c, store, mapper, app, flush=16) as consumer:
            deadline = time.monotonic() + rc.FAILOVER_WAIT
            while True:
                try:
                    stats.append(consumer.poll())
                    break
                except PollError as exc:
                    stats.append(exc.stats)
                    assert time.monotonic() < deadline, "the consumer never got through"
                    time.sleep(0.2)
            healer.join(rc.FAILOVER_WAIT)
            assert not healer_errors, healer_errors
            rc.wait_ok()
            assert consumer.poll().delivered == 0
        assert totals(c) == expected
        assert f"127.0.0.1:{heir.port}" in c.shards  # the failover happened under the consumer
        with heir.client() as r:  # and the killed node came back as its replica, never over it
            assert r.info("replication")["role"] == "master"
        assert len(stats) >= 2 and stats[-1].applied < stats[-1].increments  # the crash's replay: partly fenced
