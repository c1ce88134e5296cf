"""Faults under the exactly-once sink, end to end with real processes; the final state is compared with the model.

Driver killed mid-batch and restarted from its checkpoint; a batch replayed; Redis shards restarted, killed
and script-flushed mid-batch; two queries with the same query name at once (a zombie); task retries.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pyspark import TaskContext, cloudpickle

from zcluster import Cluster, KeyMember
from zcluster._keys import KeyLayout
from zcluster.journal.files import FileJournals
from zcluster.journal.publishing import AsyncPublisher
from zcluster.message.framing import CONTENT_TYPE_NDJSON
from zcluster.message.journals import JournalSpec
from zcluster.message.mapping import modulo_mapping
from zcluster.message.records import JsonMessage
from zcluster.spark import ZClusterSink, run_available_now
from zcluster.state import StateStore
from zcluster.testing import LocalShards, descendants
from zcluster.testing.traffic import Traffic, create_journals, publish, timeline_mapper

pytestmark = pytest.mark.spark
cloudpickle.register_pickle_by_value(sys.modules[__name__])  # executors cannot import this test module

DRIVER = Path(__file__).with_name("driver_job.py")
PREFIX = "zc:"
Expected = dict[str, list[tuple[str, float]]]


# -- helpers ---------------------------------------------------------------------------------------------------


class SlowMapper:
    """The timeline mapper, sleeping a little per message so that a fault lands in the middle of a batch."""

    def __init__(self, seconds: float = 0.01) -> None:
        self.seconds = seconds

    def __call__(self, message: Any) -> list[Any]:
        time.sleep(self.seconds)
        return timeline_mapper(message)


class HeldOnce:
    """The timeline mapper with a kill point: once ``markers/arm`` exists, each task's ``at``-th message (its
    earlier flushes landed) writes ``markers/held-<pid>`` and waits until ``markers/release`` exists, so a
    fault lands mid-batch whatever the machine's speed (marker files: Spark's Python workers are other
    processes). Messages are counted per task attempt; after the release no task holds again."""

    def __init__(self, markers: Path, at: int) -> None:
        self.markers, self.at, self.task, self.seen = markers, at, (-1, -1, -1), 0

    def __call__(self, message: Any) -> list[Any]:
        ctx = TaskContext.get()
        task = (ctx.stageId(), ctx.partitionId(), ctx.attemptNumber()) if ctx is not None else (-1, -1, -1)
        self.task, self.seen = task, (self.seen + 1 if task == self.task else 1)
        release = self.markers / "release"
        if self.seen == self.at and (self.markers / "arm").exists() and not release.exists():
            (self.markers / f"held-{os.getpid()}").touch()
            while not release.exists():
                time.sleep(0.02)
        return timeline_mapper(message)


class FailFirstAttempt:
    """Fails every task's first attempt after ``after`` messages (some writes landed), with a marker file."""

    def __init__(self, markers: Path, after: int) -> None:
        self.markers, self.after, self.seen = markers, after, 0

    def __call__(self, message: Any) -> list[Any]:
        ctx = TaskContext.get()
        self.seen += 1
        if ctx is not None and ctx.attemptNumber() == 0 and self.seen > self.after:
            (self.markers / f"stage{ctx.stageId()}-part{ctx.partitionId()}").touch()
            raise RuntimeError(f"injected failure, partition {ctx.partitionId()} attempt 0")
        return timeline_mapper(message)


class Journals:
    """File journals in a temporary directory."""

    def __init__(self, root: Path, count: int = 4) -> None:
        self.store = FileJournals(root)
        self.names = [f"timelines/part-{i:03d}" for i in range(count)]
        self.url = f"file://{root}"
        create_journals(self.store, self.names)


@pytest.fixture
def journals(tmp_path: Path) -> Journals:
    return Journals(tmp_path / "journals")


@pytest.fixture
def query_name() -> str:
    return f"faults-{uuid.uuid4().hex[:12]}"


def state_of(cluster: Cluster, keys: list[str]) -> Expected:
    return {k: [(str(t.member), t.score) for t in v] for k, v in cluster.select(keys, limit=100000).items()}


def mismatched(cluster: Cluster, expected: Expected) -> list[str]:
    got = state_of(cluster, list(expected))
    return [k for k in expected if got[k] != expected[k]]


def visible(cluster: Cluster, keys: list[str], tag: str = "") -> int:
    """How many visible members whose name starts with ``tag`` the keys hold now."""
    return sum(1 for v in cluster.select(keys, limit=100000).values() for t in v if str(t.member).startswith(tag))


def expected_count(expected: Expected, tag: str = "") -> int:
    return sum(1 for v in expected.values() for m, _ in v if m.startswith(tag))


def shard_of(cluster: Cluster, key: str) -> int:
    return cluster.shards.index(cluster.shard_of(key))


def open_transaction(j: Journals, pub: AsyncPublisher, users: range, tag: str, ts: float) -> list[dict[str, Any]]:
    """Publish one uncommitted event per user with ``pub`` (left open: commit or roll back later)."""
    specs = [JournalSpec(n, {"content-type": CONTENT_TYPE_NDJSON}) for n in j.names]
    mapping = modulo_mapping(lambda m: m.doc["user"], lambda: specs)
    docs = [{"user": f"u{u}", "event": f"{tag}-{u}", "ts": ts + u, "op": "add"} for u in users]
    for doc in docs:
        pub.publish_uncommitted(mapping, JsonMessage(dict(doc)))
    pub.barrier()
    return docs


def commit(pub: AsyncPublisher, traffic: Traffic, docs: list[dict[str, Any]]) -> None:
    pub.commit()
    pub.barrier()
    for doc in docs:
        traffic.apply(doc)
    traffic.committed += len(docs)


class FaultWhenWritten(threading.Thread):
    """Waits until a task holds (:class:`HeldOnce`, in ``markers``) with members tagged ``tag`` visible, runs
    ``fault`` once, then releases the held tasks: the fault lands mid-batch, some writes in, not all."""

    def __init__(self, cluster: Cluster, keys: list[str], tag: str, fault: Callable[[], None], markers: Path) -> None:
        super().__init__(daemon=True)
        self.cluster, self.keys, self.tag, self.fault, self.markers = cluster, keys, tag, fault, markers
        self.seen_at_fault: int | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline:
                n = visible(self.cluster, self.keys, self.tag)
                if n > 0 and any(self.markers.glob("held-*")):
                    self.seen_at_fault = n
                    self.fault()
                    return
                time.sleep(0.02)
        except BaseException as exc:  # reported by the test
            self.error = exc
        finally:
            (self.markers / "release").touch()  # the held tasks go on (also when this failed: no hang)


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and every process below it (a driver, its JVM and its Python workers: a machine dying),
    and return once each is gone. Waiting is what makes it a kill point: a Python worker outlives its JVM
    until its daemon notices, and one that went on meanwhile could finish the very task it was killed in."""
    killed = descendants(pid)
    for p in killed:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGKILL)
    deadline = time.monotonic() + 120
    while alive := [p for p in killed if _running(p)]:
        assert time.monotonic() < deadline, f"processes {alive} outlived SIGKILL by 120 s"
        time.sleep(0.02)


def _running(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie, dead but not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


# -- 1. the driver process dies in the middle of a batch ----------------------------------------------------------


# On Connect the driver starts a server of its own, killed with it (a server shared by runs would outlive it).
@pytest.mark.parametrize("mode", ["classic", pytest.param("connect", marks=pytest.mark.own_connect_server)])
def test_driver_killed_mid_batch_restarts_from_checkpoint_exactly_once(
    journals: Journals, shards: LocalShards, query_name: str, tmp_path: Path, mode: str
) -> None:
    prefix = f"drv{uuid.uuid4().hex[:8]}:"
    traffic = publish(journals.store, Traffic(journals.names), producers=3, messages=40, seed=11)
    expected = traffic.expected()
    keys = list(expected)
    total = expected_count(expected)
    cluster = Cluster.from_urls(shards.urls, prefix=prefix)
    ckpt = tmp_path / "ckpt"
    cmd = [
        sys.executable,
        str(DRIVER),
        "--journals",
        journals.url,
        "--urls",
        *shards.urls,
        "--checkpoint",
        str(ckpt),
        "--query-name",
        query_name,
        "--prefix",
        prefix,
        "--leaderboard",  # increments too: a rerun must not count what the dead run already added
        *(["--connect"] if mode == "connect" else []),
    ]

    # First run: small write batches, a task held at its 17th message (driver_job.Held: its first two flushes
    # landed); SIGKILL the driver and everything under it there, mid-batch.
    markers = tmp_path / "markers"
    markers.mkdir()
    hold = ["--flush", "8", "--hold-at", "17", "--markers", str(markers)]
    with open(tmp_path / "run1.log", "w") as log1:
        proc = subprocess.Popen([*cmd, *hold], stdout=log1, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not any(markers.glob("held-*")) or visible(cluster, keys) == 0:
            assert proc.poll() is None, (tmp_path / "run1.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "no task reached its hold with writes landed"
            time.sleep(0.02)
        kill_tree(proc.pid)
        proc.wait(120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
    partial = visible(cluster, keys)
    assert 0 < partial < total, "the kill must land mid-batch: some writes, not all"
    assert mismatched(cluster, expected)
    assert (ckpt / "offsets" / "0").exists() and not (ckpt / "commits" / "0").exists()

    # Second run, same checkpoint: Spark runs batch 0 again; the final state is the model's.
    stats, deliveries = tmp_path / "stats.json", tmp_path / "deliveries.txt"
    extra = ["--deliveries", str(deliveries)] + (["--stats", str(stats)] if mode == "classic" else [])
    done = subprocess.run([*cmd, *extra], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert mismatched(cluster, expected) == []
    board = [(str(e.member), e.score) for e in cluster.select(["leaderboard"], limit=1000)["leaderboard"]]
    assert board == traffic.leaderboard()  # every event counted once, although batch 0 ran twice
    # What the dead run had not checkpointed was delivered again; never more than the committed messages.
    delivered = len(deliveries.read_text().split())
    assert 0 < delivered <= traffic.committed
    if mode == "classic":  # the sink's history lives in this driver only on classic Spark
        history = json.loads(stats.read_text())
        assert [b["batch_id"] for b in history] == [0] and not history[0]["skipped"]
        assert history[0]["delivered"] == delivered
        progress = StateStore(cluster, query_name)
        assert progress.committed_batch(history[0]["query_id"]) == 0
    cluster.close()


# -- 2. Spark replays a batch ----------------------------------------------------------------------------------


def test_replayed_batch_is_skipped_and_reapplied_batch_is_harmless(
    spark: Any, journals: Journals, shards: LocalShards, query_name: str, tmp_path: Path
) -> None:
    prefix = f"rep{uuid.uuid4().hex[:8]}:"
    cluster = Cluster.from_urls(shards.urls, prefix=prefix)
    traffic = publish(journals.store, Traffic(journals.names), producers=2, messages=30, seed=21)
    sink = ZClusterSink(shards.urls, timeline_mapper, query_name, journals=journals.url, prefix=prefix)
    ckpt = tmp_path / "ckpt"
    with AsyncPublisher(journals.store) as pub:
        docs = open_transaction(journals, pub, range(6), "span", 1_800_000_000.0)
        run_available_now(spark, sink, journals.url, ckpt)  # batch 0: the transaction is open
        commit(pub, traffic, docs)
    publish(journals.store, traffic, producers=2, messages=30, seed=22)
    run_available_now(spark, sink, journals.url, ckpt)  # batch 1: its ACK, the span replayed from the journal
    expected = traffic.expected()
    assert mismatched(cluster, expected) == []
    first = sink.history[1]
    assert first.batch_id == 1 and first.replays > 0 and not first.skipped

    def lose_commit_marker() -> None:  # as after a crash between the sink's work and Spark's commit
        (ckpt / "commits" / "1").unlink()
        (ckpt / "commits" / ".1.crc").unlink(missing_ok=True)

    lose_commit_marker()
    run_available_now(spark, sink, journals.url, ckpt)
    replay = sink.history[-1]
    assert (replay.batch_id, replay.query_id, replay.skipped) == (1, first.query_id, True)
    assert replay.delivered == 0 and mismatched(cluster, expected) == []

    # A crash before the sink recorded its progress: the batch runs again; the journal checkpoints stored with
    # its effects make the re-run deliver nothing (its ranges are read past them only: not a frame), and the
    # state is unchanged.
    state = StateStore(cluster, query_name)
    assert state.committed_batch(first.query_id) == 1
    progress = f"{query_name}/progress".encode()
    owner = shard_of(state.cluster, progress.decode())
    with shards.servers[owner].client() as r:
        assert r.zrem(KeyLayout(state.cluster.prefix).adds(progress), first.query_id) == 1
    assert state.committed_batch(first.query_id) is None
    lose_commit_marker()
    run_available_now(spark, sink, journals.url, ckpt)
    again = sink.history[-1]
    assert (again.batch_id, again.skipped) == (1, False)
    assert first.frames > 0 and again.frames == 0 and again.delivered == 0
    assert state.committed_batch(first.query_id) == 1
    assert mismatched(cluster, expected) == []
    cluster.close()


# -- 3. Redis shards restarted, killed, script-flushed in the middle of a batch --------------------------------


def _two_rounds_with_fault(
    spark: Any, journals: Journals, shards: LocalShards, query_name: str, ckpt: Path, fault: Callable[[], None]
) -> tuple[Traffic, ZClusterSink, BaseException | None]:
    """Round 1 runs clean; round 2 gets ``fault`` while its tasks hold mid-batch (:class:`HeldOnce`), some of
    its writes landed.

    The sink retries data writes, not its checkpoint reads and writes: if one of those met the outage on
    every task attempt, the query fails loudly naming the shard, and is restarted from its checkpoint (what a
    supervisor does). Returns that error, or None when the run rode the fault out.
    """
    probe = Cluster.from_urls(shards.urls)
    markers = ckpt.parent / "markers"
    markers.mkdir()
    traffic = publish(journals.store, Traffic(journals.names), producers=3, messages=25, seed=1)
    # round 2's tasks hold at their 17th message (two flushes of 8 landed) until the fault is done
    sink = ZClusterSink(shards.urls, HeldOnce(markers, at=17), query_name, journals=journals.url, flush=8)
    run_available_now(spark, sink, journals.url, ckpt)
    assert mismatched(probe, traffic.expected()) == []
    publish(journals.store, traffic, producers=3, messages=25, seed=2)
    (markers / "arm").touch()
    trigger = FaultWhenWritten(probe, list(traffic.expected()), "s2-", fault, markers)
    trigger.start()
    error: BaseException | None = None
    try:
        run_available_now(spark, sink, journals.url, ckpt)
    except Exception as exc:
        error = exc
    trigger.join(300)
    probe.close()
    if error is not None:
        assert "failed shard" in str(error) or "not confirmed" in str(error), error
        run_available_now(spark, sink, journals.url, ckpt)
    assert trigger.error is None and trigger.seen_at_fault is not None
    assert trigger.seen_at_fault < expected_count(traffic.expected(), "s2-"), "the fault must land mid-batch"
    return traffic, sink, error


@pytest.mark.parametrize("fault", ["restart", "script-flush"])
def test_shard_restart_or_script_flush_mid_batch_keeps_exactly_once(
    spark: Any, journals: Journals, query_name: str, tmp_path: Path, fault: str
) -> None:
    with LocalShards(2) as shards:

        def inject() -> None:
            if fault == "restart":
                shards.restart(1)  # graceful: data saved and loaded again, script cache empty
            else:
                for server in shards.servers:
                    with server.client() as r:
                        r.script_flush()

        traffic, sink, error = _two_rounds_with_fault(spark, journals, shards, query_name, tmp_path / "ckpt", inject)
        print(f"{fault}: the faulted run {'failed: ' + str(error)[:300] if error else 'completed'}")
        with Cluster.from_urls(shards.urls) as cluster:
            assert mismatched(cluster, traffic.expected()) == []
        assert [(b.batch_id, b.skipped) for b in sink.history] == [(0, False), (1, False)]
        assert 0 < sink.history[1].delivered <= traffic.committed - sink.history[0].delivered


def test_shard_killed_mid_batch_loses_its_data_only(
    spark: Any, journals: Journals, query_name: str, tmp_path: Path
) -> None:
    """SIGKILL a shard mid-batch and start it empty: what it held (data, journal checkpoints, progress) is gone.

    Exactly-once cannot bring back lost data; what holds: the query does not lose anything on the surviving
    shard, never shows on the killed shard a member or score the model does not have (only members missing),
    and a new query name over the same journals (fresh producer states, fresh checkpoint) rebuilds the model.
    """
    with LocalShards(2) as shards:

        def inject() -> None:
            shards.kill(1)  # SIGKILL, no persistence: everything shard 1 held is gone
            time.sleep(0.3)
            shards.start(1)

        traffic, sink, error = _two_rounds_with_fault(spark, journals, shards, query_name, tmp_path / "ckpt", inject)
        print(f"kill: the faulted run {'failed: ' + str(error)[:300] if error else 'completed'}")
        expected = traffic.expected()
        with Cluster.from_urls(shards.urls) as cluster:
            got = state_of(cluster, list(expected))
            on = {k: shard_of(cluster, k) for k in expected}
            assert {0, 1} <= set(on.values())
            assert all(got[k] == expected[k] for k in expected if on[k] == 0)  # the surviving shard: exact
            lost = [k for k in expected if on[k] == 1 and got[k] != expected[k]]
            assert lost, "round 1's data on the killed shard is gone"
            for k in expected:
                assert set(got[k]) <= set(expected[k])  # only missing members, never wrong ones
            # Recovery: a new query name and checkpoint re-derive everything from the journals.
            again = ZClusterSink(shards.urls, timeline_mapper, f"{query_name}-rebuild", journals=journals.url)
            run_available_now(spark, again, journals.url, tmp_path / "ckpt-rebuild")
            assert mismatched(cluster, expected) == []
        assert [(b.batch_id, b.skipped) for b in sink.history] == [(0, False), (1, False)]


# -- 4. a zombie: two queries with the same query name at once -------------------------------------------------


def _rank(p: Any) -> tuple[float, ...]:
    return (1.0, p.score, 0.0 if p.inserted else 1.0) if p.present else (0.0,)


class Monotonic(threading.Thread):
    """Samples the data and the journal checkpoints until stopped; records anything that moved backwards."""

    def __init__(self, cluster: Cluster, state: StateStore, pairs: list[tuple[str, str]], names: list[str]) -> None:
        super().__init__(daemon=True)
        self.cluster, self.state, self.names = cluster, state, names
        self.pairs = [KeyMember(k, m) for k, m in pairs]
        self.stop = threading.Event()
        self.backwards: list[str] = []
        self.samples = 0

    def run(self) -> None:
        data: dict[Any, tuple[float, ...]] = {}
        producers: dict[tuple[str, bytes], tuple[int, int]] = {}
        offsets: dict[str, int] = {}
        while not self.stop.is_set():
            for km, p in self.cluster.score(self.pairs).items():
                r = _rank(p)
                if r < data.get(km, (0.0,)):
                    self.backwards.append(f"{km}: {data[km]} -> {r}")
                data[km] = r
            for j in self.names:
                cp = self.state.load_journal(j)
                if cp.offset < offsets.get(j, 0):
                    self.backwards.append(f"{j} offset {offsets[j]} -> {cp.offset}")
                offsets[j] = cp.offset
                for s in cp.states:
                    now, held = (s.max_clock or s.last_ack, s.last_ack), producers.get((j, s.producer), (0, 0))
                    if now < held:
                        self.backwards.append(f"{j} producer {s.producer.hex()}: {held} -> {now}")
                    producers[(j, s.producer)] = now
            self.samples += 1
            time.sleep(0.05)

    def sampled(self) -> None:
        """Wait until one more sample was taken from now (a state, not a time)."""
        goal, deadline = self.samples + 1, time.monotonic() + 300
        while self.samples < goal:
            assert self.is_alive() and time.monotonic() < deadline, "the watcher stopped sampling"
            time.sleep(0.01)


def _states(state: StateStore, names: list[str]) -> dict[str, Any]:
    out = {}
    for j in names:
        cp = state.load_journal(j)
        out[j] = (cp.offset, sorted((s.producer.hex(), s.last_ack, s.begin, s.max_clock) for s in cp.states))
    return out


def test_zombie_query_with_the_same_name_never_moves_state_backwards(
    spark: Any, journals: Journals, shards: LocalShards, query_name: str, tmp_path: Path
) -> None:
    prefix = f"zmb{uuid.uuid4().hex[:8]}:"
    cluster = Cluster.from_urls(shards.urls, prefix=prefix)
    state = StateStore(cluster, query_name)
    traffic = Traffic(journals.names)
    sinks = [
        ZClusterSink(shards.urls, SlowMapper(0.005), query_name, journals=journals.url, prefix=prefix, flush=16)
        for _ in range(2)
    ]
    watchers = []
    with AsyncPublisher(journals.store) as pub:
        for seed in (31, 32):
            publish(journals.store, traffic, producers=3, messages=25, seed=seed)
            if seed == 31:
                docs = open_transaction(journals, pub, range(8), "span", 1_800_000_000.0)  # ACKed in round 2
            else:
                commit(pub, traffic, docs)
            watcher = Monotonic(cluster, state, list(traffic.best), journals.names)
            watcher.start()
            watcher.sampled()  # one sample before the queries, one after: however slow the machine
            queries = [
                spark.readStream.format("zcluster-journal")
                .option("journals", journals.url)
                .load()
                .writeStream.foreachBatch(sink)
                .option("checkpointLocation", str(tmp_path / f"ckpt{i}"))
                .trigger(availableNow=True)
                .start()
                for i, sink in enumerate(sinks)
            ]
            for q in queries:
                q.awaitTermination()
            watcher.sampled()
            watcher.stop.set()
            watcher.join(300)
            watchers.append(watcher)
    expected = traffic.expected()
    assert all(w.samples > 1 for w in watchers)
    assert [b for w in watchers for b in w.backwards] == []
    assert mismatched(cluster, expected) == []
    q0, q1 = ({b.query_id for b in s.history} for s in sinks)
    assert len(q0) == len(q1) == 1 and q0 != q1  # two distinct Spark queries, one query name
    # Each message is delivered by one of the two, or both; never by neither.
    assert all(len(s.history) == 2 and not any(b.skipped for b in s.history) for s in sinks)

    # The stored journal checkpoints are the newest: those of one query running alone over the same journals.
    ref_name = f"{query_name}-ref"
    ref = ZClusterSink(shards.urls, timeline_mapper, ref_name, journals=journals.url, prefix=f"ref{prefix}")
    run_available_now(spark, ref, journals.url, tmp_path / "ckpt-ref")
    assert _states(state, journals.names) == _states(StateStore(cluster, ref_name), journals.names)
    assert all(states for _, states in _states(state, journals.names).values())
    with Cluster.from_urls(shards.urls, prefix=f"ref{prefix}") as alone:
        assert mismatched(alone, expected) == []
    cluster.close()


# -- 5. task retries ---------------------------------------------------------------------------------------------


def test_task_retries_after_partial_writes_keep_exactly_once(
    spark: Any, journals: Journals, shards: LocalShards, query_name: str, tmp_path: Path
) -> None:
    assert spark.sparkContext.master == "local[2,4]"  # task retries allowed in local mode
    prefix = f"try{uuid.uuid4().hex[:8]}:"
    markers = tmp_path / "markers"
    markers.mkdir()
    traffic = publish(journals.store, Traffic(journals.names), producers=3, messages=25, seed=41)
    sink = ZClusterSink(
        shards.urls, FailFirstAttempt(markers, after=10), query_name, journals=journals.url, prefix=prefix, flush=4
    )
    run_available_now(spark, sink, journals.url, tmp_path / "ckpt")
    failed = sorted(p.name for p in markers.iterdir())
    assert failed, "every partition's first attempt should have failed"
    with Cluster.from_urls(shards.urls, prefix=prefix) as cluster:
        assert mismatched(cluster, traffic.expected()) == []
    (stats,) = sink.history
    assert stats.delivered == traffic.committed and stats.duplicates > 0 and stats.rollbacks > 0
