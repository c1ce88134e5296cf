"""Beyond one JVM: the user's mapper in a module of its own, shipped by the sink wherever Spark runs it.

The job is ``tests/spark/app`` (``driver.py`` next to ``jobs.py``, which imports ``jobhelpers.py``), copied
into a temporary directory and started as a user would, ``python .../app/driver.py``, from another
directory: only the driver's ``sys.path`` has the job's directory. On ``local-cluster[2,1,1024]`` (a
standalone master and two workers, each executor its own JVM) an executor JVM is SIGKILLed while a batch
runs; on a local Spark Connect server the mapper's module is not on the server's path. Spark binds to
loopback only (``SPARK_LOCAL_IP=127.0.0.1``, ``spark.driver.host=127.0.0.1``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark import cloudpickle
from test_spark_faults import kill_tree

from zcluster import Cluster
from zcluster.errors import ConfigError
from zcluster.journal.files import FileJournals
from zcluster.spark.shipping import explain_missing_module, ship_by_value
from zcluster.testing import LocalShards, cmdline, descendants
from zcluster.testing.traffic import Traffic, create_journals, publish, timeline_mapper

pytestmark = pytest.mark.spark
APP = Path(__file__).with_name("app")
Expected = dict[str, list[tuple[str, float]]]


# -- what the sink ships (in this process, no Spark) -----------------------------------------------------------


@pytest.fixture
def modules(tmp_path: Path) -> Iterator[Path]:
    """A directory on this process's path for modules of a test's own; they are forgotten afterwards."""
    root = tmp_path / "mods"
    root.mkdir()
    sys.path.insert(0, str(root))
    before = set(sys.modules)
    try:
        yield root
    finally:
        sys.path.remove(str(root))
        for name in set(sys.modules) - before:
            module = sys.modules.pop(name)
            if name in cloudpickle.list_registry_pickle_by_value():
                cloudpickle.unregister_pickle_by_value(module)


def write(root: Path, name: str, source: str) -> str:
    (root / f"{name}.py").write_text(source)
    return name


def test_the_mappers_own_modules_are_shipped_by_value(modules: Path) -> None:
    tag = uuid.uuid4().hex[:8]
    helpers = write(modules, f"helpers_{tag}", "import time\ndef pause():\n    time.sleep(0)\n")
    jobs = write(
        modules,
        f"jobs_{tag}",
        f"from {helpers} import pause\nfrom zcluster.testing.traffic import timeline_mapper\n"
        "class Job:\n    def __call__(self, m):\n        pause()\n        return timeline_mapper(m)\n",
    )
    job = __import__(jobs).Job()
    assert sorted(ship_by_value(job, None)) == sorted([jobs, helpers])  # helpers: reached through jobs
    assert {jobs, helpers} <= cloudpickle.list_registry_pickle_by_value()
    assert ship_by_value(job, None) == ship_by_value(job, None)  # a second sink ships them too (no-op)
    # Loaded in a process that can import neither module (as an executor): the job's code came with it.
    code = "import sys, pickle; job = pickle.loads(sys.stdin.buffer.read()); print(type(job).__name__)"
    done = subprocess.run([sys.executable, "-c", code], input=cloudpickle.dumps(job), capture_output=True, timeout=120)
    assert (done.returncode, done.stdout.strip()) == (0, b"Job"), done.stderr.decode()[-2000:]


def test_installed_and_stdlib_mappers_ship_nothing(modules: Path) -> None:
    assert ship_by_value(timeline_mapper, json.loads) == ()
    assert ship_by_value(lambda m: timeline_mapper(m), None) == ()  # a lambda travels by value anyway


def test_an_unpicklable_mapper_is_a_config_error_at_construction(modules: Path) -> None:
    import threading

    lock = threading.Lock()
    with pytest.raises(ConfigError, match="cannot pickle its mapper"):
        ship_by_value(lambda m: [lock], None)


def test_a_module_that_cannot_travel_by_value_is_left_to_the_workers(
    modules: Path, caplog: pytest.LogCaptureFixture
) -> None:
    name = write(
        modules,
        f"locked_{uuid.uuid4().hex[:8]}",
        "import threading\nLOCK = threading.Lock()\ndef mapper(m):\n    with LOCK:\n        return []\n",
    )
    with caplog.at_level(logging.WARNING, logger="zcluster.spark"):
        assert ship_by_value(__import__(name).mapper, None) == ()
    assert name not in cloudpickle.list_registry_pickle_by_value()
    assert f"cannot ship {name} by value" in caplog.text and "executors must import" in caplog.text


def test_a_worker_missing_a_module_is_explained() -> None:
    failure = RuntimeError("PythonException: ... ModuleNotFoundError: No module named 'jobs'")
    with pytest.raises(ConfigError, match=r"cannot import 'jobs'.*PYSPARK_PYTHON.*--py-files") as caught:
        explain_missing_module(failure, ("jobhelpers",))
    assert caught.value.__cause__ is failure and "shipped jobhelpers" in str(caught.value)
    explain_missing_module(RuntimeError("something else"), ())  # not about a module: left as it is


# -- the job, run as a user runs it ------------------------------------------------------------------------------


def state_of(cluster: Cluster, keys: list[str]) -> Expected:
    return {k: [(str(t.member), t.score) for t in v] for k, v in cluster.select(keys, limit=100000).items()}


def visible(cluster: Cluster, keys: list[str]) -> int:
    return sum(len(v) for v in cluster.select(keys, limit=100000).values())


class Job:
    """The app copied into ``tmp/app``, its journals with published traffic, and how to start its driver."""

    def __init__(self, tmp: Path, shards: LocalShards, messages: int, seed: int) -> None:
        self.app = tmp / "app"
        shutil.copytree(APP, self.app, ignore=shutil.ignore_patterns("__pycache__"))
        self.cwd = tmp / "elsewhere"  # the user's shell is somewhere else
        self.cwd.mkdir()
        store = FileJournals(tmp / "journals")
        names = [f"timelines/part-{i:03d}" for i in range(4)]
        create_journals(store, names)
        self.traffic = publish(store, Traffic(names), producers=3, messages=messages, seed=seed)
        self.prefix = f"dep{uuid.uuid4().hex[:8]}:"
        self.deliveries, self.report, self.log = tmp / "deliveries.txt", tmp / "report.json", tmp / "driver.log"
        self.args = [
            *("--journals", f"file://{tmp / 'journals'}", "--urls", *shards.urls, "--prefix", self.prefix),
            *("--checkpoint", str(tmp / "ckpt"), "--query-name", f"dep-{uuid.uuid4().hex[:8]}"),
            *("--deliveries", str(self.deliveries), "--report", str(self.report)),
        ]
        # The job's directory reaches the driver's sys.path only, as the script's own: not PYTHONPATH, not cwd.
        self.env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable)
        assert str(self.app) not in self.env.get("PYTHONPATH", "")

    def start(self, *extra: str) -> subprocess.Popen[bytes]:
        with open(self.log, "wb") as log:
            return subprocess.Popen(
                [sys.executable, str(self.app / "driver.py"), *self.args, *extra],
                cwd=self.cwd,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def tail(self) -> str:
        """The driver's output without Java stack frames, its end."""
        lines = self.log.read_text(errors="replace").splitlines()
        return "\n".join(line for line in lines if not line.startswith("\t"))[-6000:]

    def lines(self) -> list[str]:
        """The deliveries so far, complete lines only (``pid shipped|imported``)."""
        text = self.deliveries.read_text() if self.deliveries.exists() else ""
        return [line for line in text.split("\n")[:-1] if len(line.split()) == 2]

    def check_exact(self, shards: LocalShards) -> None:
        report = json.loads(self.report.read_text())
        assert sorted(report["shipped"]) == ["jobhelpers", "jobs"], report
        lines = self.lines()
        assert len(lines) >= self.traffic.committed
        assert {line.split()[1] for line in lines} == {"shipped"}  # no process that mapped could import jobs
        with Cluster.from_urls(shards.urls, prefix=self.prefix) as cluster:
            expected = self.traffic.expected()
            assert state_of(cluster, list(expected)) == expected


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL what is left of a driver: every process below it, then its session's process group."""
    if proc.poll() is None:
        for pid in descendants(proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(120)


def test_local_cluster_executor_jvm_killed_mid_batch_exactly_once(shards: LocalShards, tmp_path: Path) -> None:
    job = Job(tmp_path, shards, messages=60, seed=51)
    keys, total = list(job.traffic.expected()), sum(len(v) for v in job.traffic.expected().values())
    markers = tmp_path / "markers"  # a task holds at its 71st message (jobs.TimelineJob) until the kill
    markers.mkdir()
    proc = job.start(
        "--master", "local-cluster[2,1,1024]", "--flush", "8", "--hold-at", "71", "--markers", str(markers)
    )
    try:
        deadline, target = time.monotonic() + 300, None
        while target is None:  # a task has mapped 70 of its ~115 messages: its first journal is checkpointed
            assert proc.poll() is None, job.tail()
            assert time.monotonic() < deadline, "no task got far enough\n" + job.tail()
            time.sleep(0.05)
            held = {int(m.name.split("-")[1]) for m in markers.glob("held-*")}
            executors = [p for p in descendants(proc.pid) if "CoarseGrainedExecutorBackend" in cmdline(p)]
            target = next((e for e in executors if held & set(descendants(e))), None)
        kill_tree(target)  # the executor JVM dies mid-task, its Python daemon and workers with it
        at_kill = len(job.lines())
        with Cluster.from_urls(shards.urls, prefix=job.prefix) as cluster:
            landed = visible(cluster, keys)
        assert len(executors) == 2 and 0 < landed < total, "the kill must land mid-batch, some writes landed"
        (markers / "release").touch()  # the other task goes on, and the killed one runs again elsewhere
        assert proc.wait(120) == 0, job.tail()
    finally:
        stop(proc)
        report = json.loads(job.report.read_text()) if job.report.exists() else {}
        home = os.environ.get("SPARK_HOME") or _spark_home()
        work = Path(home) / "work" / report["app_id"] if report.get("app_id") and home else None
        if work is not None and work.exists():  # the executors' logs, kept with the test's files
            shutil.move(work, tmp_path / "spark-work")
    job.check_exact(shards)
    history = report["history"]
    assert [(b["batch_id"], b["skipped"]) for b in history] == [(0, False)]
    # The task of the dead executor ran again, from its journals' stored checkpoints: the dead attempt had
    # mapped messages (it died mid-task), some of them again in the new attempt, none applied twice.
    delivered = history[0]["delivered"]  # by the attempts that succeeded
    assert delivered <= job.traffic.committed <= len(job.lines()) and delivered < len(job.lines())
    print(f"executor killed after {at_kill} deliveries; {len(job.lines())} for {job.traffic.committed} committed")


def _spark_home() -> str | None:
    from zcluster.spark.session import _bytecode_spark_home

    return _bytecode_spark_home()


@pytest.mark.own_connect_server  # a server started without the mappers' module on its path
def test_connect_server_without_the_mappers_module_exactly_once(shards: LocalShards, tmp_path: Path) -> None:
    job = Job(tmp_path, shards, messages=30, seed=52)
    proc = job.start("--connect")
    try:
        assert proc.wait(240) == 0, job.tail()
    finally:
        stop(proc)
    job.check_exact(shards)
    assert len(job.lines()) == job.traffic.committed  # one run, no fault: each committed message mapped once
