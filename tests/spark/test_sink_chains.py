"""Exactly-once chains through the Spark sink (classic local Spark, real redis-server shards, file journals):
stage A is a ``ZClusterSink`` whose mapper publishes (``publish=``), stage B a ``Consumer`` reading A's output
read-committed into a leaderboard (tests/state/chain_helpers.py). The board must equal the model after a task
failing once after appending 4,096 of its messages (retried by Spark), every batch replayed from a new
checkpoint directory, and more input; and with stage A in a driver process (``driver_job.py --chain``) after the
driver SIGKILLed mid-batch, and after an executor JVM SIGKILLed mid-batch on ``local-cluster``."""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from test_deploy import _spark_home, stop
from test_spark_faults import kill_tree

from zcluster import Cluster
from zcluster.journal import FileJournals
from zcluster.message.framing import CONTENT_TYPE_NDJSON
from zcluster.message.journals import JournalSpec
from zcluster.message.readers import ReadCommittedIter, ReadUncommittedIter
from zcluster.message.sequencer import Sequencer
from zcluster.spark import ZClusterSink, run_available_now
from zcluster.state import Consumer
from zcluster.testing import cmdline, descendants

sys.path.insert(0, str(Path(__file__).parents[1] / "state"))
from chain_helpers import (
    A_SELECTOR,
    B_SELECTOR,
    OUTPUTS,
    board,
    create,
    events,
    feed,
    model,
    stage_a,
    stage_b,
)

pytestmark = pytest.mark.spark


def read(store: FileJournals, journal: str, committed: bool) -> list[Any]:
    spec = JournalSpec(journal, {"content-type": CONTENT_TYPE_NDJSON})
    it = ReadCommittedIter(store, spec, Sequencer()) if committed else ReadUncommittedIter(store, spec)
    return [e for e in it if not e.is_ack]


_ids = itertools.count()


def failing_once(marker: str, at: int) -> Any:
    """stage A's mapper, raising on event ``at`` the first time any task meets it (``marker``: a file that says
    it did), after earlier events of that task's transaction were published (appended uncommitted: a
    transaction appends every 4,096 messages)."""

    def mapper(message: Any) -> list[Any]:
        if message.doc["id"] == at and not Path(marker).exists():
            Path(marker).write_text("failed once")
            raise RuntimeError("injected task failure")
        return stage_a(message)

    return mapper


@pytest.fixture
def chain(tmp_path: Path, shards: Any) -> Any:
    root = tmp_path / "journals"
    store = FileJournals(root)
    create(store)
    prefix = f"sc{next(_ids)}:"
    cluster = Cluster.from_urls(shards.urls, prefix=prefix)
    yield store, f"file://{root}", cluster, prefix, shards.urls
    cluster.close()
    store.close()


def test_a_spark_stage_publishes_exactly_once_through_retries_and_replays(
    spark: Any, chain: Any, tmp_path: Path
) -> None:
    store, url, cluster, prefix, urls = chain
    app = f"sa{next(_ids)}"
    docs = events(0, 5000)
    feed(store, docs, ["in/0"])  # one journal: one task's transaction publishes all of it
    marker = str(tmp_path / "failed")
    sink = ZClusterSink(urls, failing_once(marker, 4500), app, journals=url, prefix=prefix, publish=url)
    run_available_now(spark, sink, url, tmp_path / "ckpt", selector=A_SELECTOR)
    assert Path(marker).exists()  # a task failed once and Spark ran it again
    assert sum(b.published for b in sink.history) == 5000
    committed = [e.message.doc["src"] for j in OUTPUTS for e in read(store, j, committed=True)]
    uncommitted = sum(len(read(store, j, committed=False)) for j in OUTPUTS)
    assert sorted(committed) == list(range(5000))
    assert uncommitted >= 5000 + 4096  # the failed attempt's messages are in the journals, never committed
    with Consumer(cluster, store, stage_b, f"sb{next(_ids)}", selector=B_SELECTOR) as b:
        b.poll()
        assert board(cluster) == model(docs)
        # A new checkpoint directory replays every batch: nothing is published again.
        replay = ZClusterSink(urls, stage_a, app, journals=url, prefix=prefix, publish=url)
        run_available_now(spark, replay, url, tmp_path / "ckpt2", selector=A_SELECTOR)
        assert sum(x.published for x in replay.history) == 0
        more = events(5000, 16)
        feed(store, more)
        run_available_now(spark, replay, url, tmp_path / "ckpt2", selector=A_SELECTOR)
        assert sum(x.published for x in replay.history) == 16
        b.poll()
    assert board(cluster) == model(docs + more)


def test_a_spark_connect_stage_publishes_exactly_once_across_runs_and_a_new_checkpoint(
    chain: Any, tmp_path: Path
) -> None:
    """On Spark Connect (a driver process per run, ``driver_job.py --connect --chain``)."""
    store, url, cluster, prefix, urls = chain
    driver = Path(__file__).with_name("driver_job.py")
    cmd = [sys.executable, str(driver), "--journals", url, "--urls", *urls, "--prefix", prefix, "--connect"]
    cmd += ["--chain", "--query-name", f"sx{next(_ids)}"]
    docs = events(0, 40)
    feed(store, docs)
    for checkpoint in ("ckpt", "ckpt", "fresh-ckpt"):  # again from the same checkpoint, then from a new one
        done = subprocess.run(
            [*cmd, "--checkpoint", str(tmp_path / checkpoint)], capture_output=True, text=True, timeout=600
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    committed = sorted(e.message.doc["src"] for j in OUTPUTS for e in read(store, j, committed=True))
    assert committed == list(range(40))  # published once over three runs
    with Consumer(cluster, store, stage_b, f"sb{next(_ids)}", selector=B_SELECTOR) as b:
        b.poll()
    assert board(cluster) == model(docs)


def test_a_spark_stage_driver_sigkilled_mid_batch_publishes_each_message_once_after_restart(
    chain: Any, tmp_path: Path
) -> None:
    """Classic Spark, a driver process (``driver_job.py --chain``) SIGKILLed with its JVM and Python workers
    once stage A's counts of batch 0 land (the batch running: nothing committed in Spark's checkpoint), then
    run again from the same checkpoint: batch 0 runs again; downstream, read-committed, each derived message
    is there once and the board equals the model."""
    store, url, cluster, prefix, urls = chain
    driver = Path(__file__).with_name("driver_job.py")
    ckpt = tmp_path / "ckpt"
    cmd = [sys.executable, str(driver), "--journals", url, "--urls", *urls, "--prefix", prefix, "--chain"]
    cmd += ["--query-name", f"sk{next(_ids)}", "--checkpoint", str(ckpt)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1] / "state"), *sys.path])}
    docs = events(0, 60)
    feed(store, docs)

    def seen() -> float:
        return sum(cluster.counters(["seen"])["seen"].values())

    markers = tmp_path / "markers"  # a task holds at its 9th message (driver_job.Held): two flushes of counts landed
    markers.mkdir()
    with open(tmp_path / "run1.log", "w") as log1:
        proc = subprocess.Popen(
            [*cmd, "--flush", "4", "--hold-at", "9", "--markers", str(markers)],
            stdout=log1,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 300
        while not any(markers.glob("held-*")) or seen() == 0:
            assert proc.poll() is None, (tmp_path / "run1.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "no task reached its hold with counts landed"
            time.sleep(0.02)
        kill_tree(proc.pid)  # the driver, its JVM and the Python workers
        proc.wait(120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
    assert (ckpt / "offsets" / "0").exists() and not (ckpt / "commits" / "0").exists()  # killed inside batch 0
    # Mid-transaction: some counts landed (written every 4), not all; not every derived message is committed
    # (here none is even appended: a transaction appends its messages every 4,096 and at its end).
    assert 0 < seen() < len(docs)
    assert sum(len(read(store, j, committed=True)) for j in OUTPUTS) < len(docs)
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert seen() == len(docs)  # stage A's own state: each event counted once
    committed = sorted(e.message.doc["src"] for j in OUTPUTS for e in read(store, j, committed=True))
    assert committed == list(range(60))
    with Consumer(cluster, store, stage_b, f"sb{next(_ids)}", selector=B_SELECTOR) as b:
        b.poll()
    assert board(cluster) == model(docs)


def test_a_spark_stage_executor_jvm_sigkilled_mid_batch_publishes_each_message_once(chain: Any, tmp_path: Path) -> None:
    """``local-cluster[2,1,1024]`` (each executor a JVM of its own; ``driver_job.py --chain``): the executor JVM
    whose Python worker has mapped 30 messages of its task is SIGKILLed (its daemon and workers with it), after
    its transaction appended messages uncommitted (``--queued 8``); Spark runs the task again elsewhere, the
    query finishes. A's counts equal the events, read-committed each derived message is there once (the dead
    attempt's appended messages stay uncommitted), B's board equals the model."""
    store, url, cluster, prefix, urls = chain
    driver = Path(__file__).with_name("driver_job.py")
    deliveries, log = tmp_path / "deliveries.txt", tmp_path / "driver.log"
    cmd = [sys.executable, str(driver), "--journals", url, "--urls", *urls, "--prefix", prefix, "--chain"]
    cmd += ["--query-name", f"se{next(_ids)}", "--checkpoint", str(tmp_path / "ckpt")]
    markers = tmp_path / "markers"  # a task holds at its 31st message (driver_job.Held) until the kill
    markers.mkdir()
    cmd += ["--master", "local-cluster[2,1,1024]", "--flush", "4", "--queued", "8"]
    cmd += ["--deliveries", str(deliveries), "--hold-at", "31", "--markers", str(markers)]
    # The executors' Python workers import chain_helpers by name (it is shipped by value too): on their path.
    path = os.pathsep.join([str(Path(__file__).parents[1] / "state"), *sys.path])
    env = {**os.environ, "PYTHONPATH": path, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
    docs = events(0, 120)
    feed(store, docs)  # two input journals, 60 events each: a task each, one per executor

    def seen() -> float:
        return sum(cluster.counters(["seen"])["seen"].values())

    def mapped() -> Counter[int]:  # messages mapped per Python worker (pid), complete lines only
        text = deliveries.read_text() if deliveries.exists() else ""
        return Counter(int(line) for line in text.split("\n")[:-1] if line)

    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        deadline, target = time.monotonic() + 300, None
        while target is None:  # a task holds, having mapped 30 messages
            assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
            assert time.monotonic() < deadline, "no task got far enough\n" + log.read_text(errors="replace")[-3000:]
            time.sleep(0.05)
            held = {int(m.name.split("-")[1]) for m in markers.glob("held-*")}
            executors = [p for p in descendants(proc.pid) if "CoarseGrainedExecutorBackend" in cmdline(p)]
            target = next((e for e in executors if held & set(descendants(e))), None)
        kill_tree(target)  # the executor JVM dies mid-task, its Python daemon and workers with it
        appended = sum(len(read(store, j, committed=False)) for j in OUTPUTS)
        committed_at_kill = sum(len(read(store, j, committed=True)) for j in OUTPUTS)
        assert len(executors) == 2 and 0 < seen() < len(docs), "the kill must land mid-batch"
        assert appended > committed_at_kill, "the kill must land with messages appended uncommitted"
        (markers / "release").touch()  # the other task goes on, and the killed one runs again elsewhere
        assert proc.wait(300) == 0, log.read_text(errors="replace")[-3000:]
    finally:
        stop(proc)
        app_id = next(
            (line.split()[1] for line in log.read_text().splitlines() if line.startswith("application ")), None
        )
        home = os.environ.get("SPARK_HOME") or _spark_home()
        work = Path(home) / "work" / app_id if app_id and home else None
        if work is not None and work.exists():  # the executors' logs, kept with the test's files
            shutil.move(work, tmp_path / "spark-work")
    assert "Lost executor" in log.read_text(errors="replace")  # Spark saw its executor die, and ran its task again
    assert seen() == len(docs)  # stage A's own state: each event counted once
    committed = sorted(e.message.doc["src"] for j in OUTPUTS for e in read(store, j, committed=True))
    assert committed == list(range(len(docs)))
    # The dead attempt's appended messages are in the journals, never committed (its producer id is never ACKed).
    assert sum(len(read(store, j, committed=False)) for j in OUTPUTS) >= len(docs) + 8
    assert sum(mapped().values()) > len(docs)  # the killed task's messages were mapped again
    print(f"killed with {appended - committed_at_kill} messages appended uncommitted; {sum(mapped().values())} mapped")
    with Consumer(cluster, store, stage_b, f"sb{next(_ids)}", selector=B_SELECTOR) as b:
        b.poll()
    assert board(cluster) == model(docs)
