"""The README's first command: the demo runs end to end and finds the cluster equal to the model."""

from __future__ import annotations

import re
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
    text = " ".join(out.stdout.split())  # rich wraps long lines
    assert "leaderboard (events per user" in text  # checked against the model too
    assert "Traceback" not in out.stderr
    # The published counts the demo prints agree with its table (the first line used to count round 1 only).
    number = r"(\d[\d,]*)"
    round1 = re.search(rf"round 1: published {number} committed, {number} rolled back, {number} duplicated", text)
    round2 = re.search(
        rf"round 2: published {number} committed, {number} rolled back, {number} duplicated appends, "
        rf"and committed the open transaction's {number}: {number} committed in all",
        text,
    )
    applied = re.search(rf"committed messages applied once\W+{number}\W+{number}", text)
    dropped = re.search(rf"duplicated appends dropped\W+{number}\W+{number}", text)
    assert round1 and round2 and applied and dropped, text[-3000:]
    r1, r2, (should, got), (dup_should, dup_got) = (
        [int(g.replace(",", "")) for g in m.groups()] for m in (round1, round2, applied, dropped)
    )
    assert r1[0] + r2[0] + r2[3] == r2[4] == should == got
    assert r1[2] + r2[2] == dup_should == dup_got
    assert r1[0] > 0 and r2[0] > 0 and r2[3] == 5


@pytest.mark.spark
@pytest.mark.timeout(600)
def test_demo_on_a_farm_loses_a_replica_shard_and_heals_it(tmp_path: object) -> None:
    args = ["--replicas", "3", "--messages", "40", "--workdir", str(tmp_path)]
    out = subprocess.run([sys.executable, "-m", "zcluster.demo", *args], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    text = " ".join(out.stdout.split())  # rich wraps long lines
    assert "killed replica1's first shard" in text
    assert "exactly once: the cluster matches the model" in text
    assert "all 3 replicas hold the same records" in text and "a second walk finds 0 diverged" in text
    assert "Traceback" not in out.stderr


def test_demo_urls_go_through_cluster_config() -> None:
    from zcluster.demo.__main__ import _config

    for seed in ("redis://:pw@127.0.0.1:7000", "redis+cluster://:pw@127.0.0.1:7000"):
        config = _config((), seed, "d:")
        assert config.cluster_url == "redis://:pw@127.0.0.1:7000" and config.urls == () and config.prefix == "d:"
    config = _config(("redis://127.0.0.1:1", "redis://127.0.0.1:2"), None, "d:")
    assert config.urls == ("redis://127.0.0.1:1", "redis://127.0.0.1:2") and config.cluster_url is None


def test_demo_bad_url_is_one_error_line() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "zcluster.demo", "--url", "redis://:pw5ecr@127.0.0.1:99999"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2, out
    assert "Error:" in out.stderr and "127.0.0.1:99999" in out.stderr
    assert "pw5ecr" not in out.stdout + out.stderr and "Traceback" not in out.stderr
