"""A local SparkSession shared by the Spark tests of one module, and a Spark Connect server shared by a test
process's Spark Connect tests.

Every Spark Connect test runs its Spark code in a process of its own (a driver, a script), which would start
a local Connect server of its own: a JVM, about 15 s of CPU, for each run. Instead those processes reuse one
persistent local server per test process (pyspark's opt-in ``SPARK_LOCAL_CONNECT_REUSE``): as a long-lived
Connect server is used in production, each run a client session of its own on it. :func:`connect_server`
starts it once, with every path the tests' mappers are imported from, so what a run finds on the server never
depends on which test started it. The tests marked ``own_connect_server`` start one of their own, as before:
a driver killed with its server, a server started without the mappers' module.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from budget import is_spark_connect

from zcluster.testing import free_port

TESTS = Path(__file__).resolve().parents[1]

_START = """
import sys
from zcluster.spark import local_session

spark = local_session("local[2]", connect=True, **{"spark.local.connect.server.port": sys.argv[1]})
spark.range(1).count()  # the server's first job (its slowest) here, once
spark.stop()  # the client session only: the server stays
"""


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    from zcluster.spark import local_session

    session = local_session("local[2,4]")  # 4: task retries allowed, as on a real cluster
    yield session
    session.stop()


@pytest.fixture(scope="session")
def connect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The environment under which a process reuses this test process's Spark Connect server (started here).

    Its discovery file (address, token, pid) is in this session's temporary directory, so no other test
    process, and no other pytest run on the machine, ever finds it. It listens on a free port, never 15002,
    which the servers of ``own_connect_server`` tests take. Stopped when the session ends."""
    where = tmp_path_factory.mktemp("connect") / "connect-local.json"
    paths = [str(TESTS / "spark"), str(TESTS / "state"), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {"SPARK_LOCAL_CONNECT_REUSE": "1", "SPARK_LOCAL_CONNECT_DISCOVERY": str(where)}
    started = subprocess.run(
        [sys.executable, "-c", _START, str(free_port())],
        env={**os.environ, **env, "PYTHONPATH": os.pathsep.join(paths)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert started.returncode == 0, started.stdout[-3000:] + started.stderr[-3000:]
    try:
        yield env
    finally:
        stop = [sys.executable, "-m", "pyspark.sql.connect.local_server", "--stop"]
        subprocess.run(stop, env={**os.environ, **env}, capture_output=True, timeout=120, check=True)


@pytest.fixture(autouse=True)
def _reused_connect_server(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Spark Connect test's processes reuse :func:`connect_server` (unless marked ``own_connect_server``)."""
    if is_spark_connect(request.node.nodeid) and request.node.get_closest_marker("own_connect_server") is None:
        for name, value in request.getfixturevalue("connect_server").items():
            monkeypatch.setenv(name, value)
