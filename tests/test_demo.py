"""The README's first command: the demo runs end to end and finds the cluster equal to the model."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.spark
@pytest.mark.timeout(600)
def test_demo_end_to_end(tmp_path: object) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "zcluster.demo", "--messages", "60", "--workdir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "exactly once: the cluster matches the model" in out.stdout
    assert "Traceback" not in out.stderr
