"""Shared fixtures: the zcluster.testing pytest plugin (real Redis servers, isolated per test by namespace);
the suite's `slow` marker, time budget and schedule under pytest-xdist (tests/budget.py).

Under pytest-xdist each worker process gets a temporary directory of its own (``TMPDIR``, removed when the
worker ends), so what the suite's processes put under the temporary directory by a fixed name is theirs
alone: the Spark home :func:`zcluster.spark.local_session` links there, and with it the ``work`` directory
where ``local-cluster`` executors run and log (by application id, which two standalone masters started in
the same second give alike).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

pytest_plugins = ["zcluster.testing.plugin", "budget"]


def pytest_configure(config: pytest.Config) -> None:
    worker = getattr(config, "workerinput", {}).get("workerid")
    if worker is None:
        return
    own = Path(tempfile.mkdtemp(prefix=f"zcluster-{worker}-"))
    os.environ["TMPDIR"] = str(own)  # for every process the worker starts
    tempfile.tempdir = None  # and for this one: tempfile reads TMPDIR again
    config.add_cleanup(lambda: shutil.rmtree(own, ignore_errors=True))
