"""The time budget (tests/budget.py) warns and never fails, and the closing summary line stays last."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from budget import SPARK_CONNECT, SWEEPS, _heaviest_files_first, _minutes, _scope, budget_warnings


def _pytest(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_inner.py").write_text("def test_passes():\n    assert sum(range(1000)) == 499500\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), *sys.path])}
    env.pop("ZCLUSTER_TEST_STARTED", None)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "budget", "-p", "no:cacheprovider", *args, "test_inner.py"]
    return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["one-process", "xdist"])
def test_a_run_over_both_budgets_warns_passes_and_ends_with_pytests_summary_line(
    tmp_path: Path, workers: list[str]
) -> None:
    """In one process and under xdist (there the controller prints the budget and the slowest phases)."""
    workers_given = bool(workers)
    done = _pytest(tmp_path, *workers, "-o", "budget_test_seconds=0", "-o", "budget_run_minutes=0", "--durations=5")
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    assert re.fullmatch(r"1 passed in [0-9.]+s", lines[-1]), lines[-3:]
    assert any(line.startswith("WARNING: test_inner.py::test_passes took") for line in lines)
    assert any(line.startswith("WARNING: the run took") for line in lines)
    assert any(line.startswith("budget: this pytest run took") for line in lines)
    assert any("slowest 5 durations" in line for line in lines)
    cpu = [line for line in lines if line.startswith("budget: CPU ")]
    assert len(cpu) == 1 and re.search(r"the 10 costliest files: test_inner\.py \d+ s$", cpu[0]), cpu
    workers = [line for line in lines if line.startswith("budget: workers: ")]
    assert len(workers) == (1 if workers_given else 0), lines
    if workers_given:  # the one test ran on one of the two
        assert re.fullmatch(r"budget: workers: gw[01] busy 0 min \d+ s, done at \d+ min \d+ s", workers[0])


def test_a_run_within_its_budgets_warns_of_nothing(tmp_path: Path) -> None:
    done = _pytest(tmp_path)  # no budget configured in tmp_path: nothing to be over
    assert done.returncode == 0 and "WARNING" not in done.stdout, done.stdout
    assert budget_warnings({"a": 59.0, "b": 61.0}, 1199.0, "60", "20") == [
        "WARNING: b took 61.0 s, over the budget of 60 s a test"
    ]
    assert budget_warnings({"a": 1.0}, 1201.0, "60", "20") == [
        "WARNING: the run took 20 min 1 s, over the budget of 20 min"
    ]


def test_spark_tests_and_the_listed_ones_are_slow_and_the_rest_is_not() -> None:
    repo = Path(__file__).resolve().parents[1]
    picks = ["tests/spark/test_reader.py", "tests/test_soak.py", "tests/cluster/test_failover.py"]
    cmd = [sys.executable, "-m", "pytest", "-q", "--collect-only", "-p", "no:cacheprovider", *picks]
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}

    def ids(marks: str) -> list[str]:
        done = subprocess.run([*cmd, "-m", marks], cwd=repo, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode in (0, 5), done.stdout + done.stderr  # 5: none selected
        return [line for line in done.stdout.splitlines() if "::" in line]

    fast, slow = ids("not slow"), ids("slow")
    assert fast and slow and all("test_failover.py::test_a_bad_" in i or "test_failover_timeout_" in i for i in fast)
    assert any("tests/spark/test_reader.py::" in i for i in slow) and any("test_soak.py::" in i for i in slow)


def test_the_valkey_pass_leaves_out_the_sweeps_only() -> None:
    """``-m "not sweep"`` (the Valkey pass's selection) drops each SWEEPS entry's tests, all of them slow, and
    keeps the rest of those files: the migration tests that kill and resume a mover once stay."""
    repo = Path(__file__).resolve().parents[1]
    picks = ["tests/cluster/test_migration.py", "tests/cluster/test_migration_resume.py"]
    cmd = [sys.executable, "-m", "pytest", "-q", "--collect-only", "-p", "no:cacheprovider", *picks]
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}

    def ids(marks: str) -> set[str]:
        done = subprocess.run([*cmd, "-m", marks], cwd=repo, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode in (0, 5), done.stdout + done.stderr  # 5: none selected
        return {line for line in done.stdout.splitlines() if "::" in line}

    sweeps, kept, slow = ids("sweep"), ids("not sweep"), ids("slow")
    assert sweeps and sweeps <= slow and not sweeps & kept
    mine = [entry for entry in SWEEPS if entry.split("::")[0] in picks]
    assert len(mine) == 2 and all(any(i.startswith(entry) for i in sweeps) for entry in mine)
    assert all(any(i.startswith(entry) for entry in mine) for i in sweeps)
    assert any("test_the_mover_killed_at_random_points" in i for i in kept)


class _Item:  # what the schedule reads of a pytest.Item
    def __init__(self, nodeid: str, *marks: str) -> None:
        self.nodeid, self.marks = nodeid, marks

    def get_closest_marker(self, name: str) -> object:
        return getattr(pytest.mark, name) if name in self.marks else None


def test_whole_files_go_out_heaviest_first_and_the_spark_connect_tests_together_before_all() -> None:
    assert _scope("tests/spark/test_sink.py::test_a[x]") == "tests/spark/test_sink.py"
    assert _scope("tests/spark/test_connect.py::test_exactly_once_on_spark_connect") == SPARK_CONNECT
    assert _scope("tests/spark/test_spark_faults.py::test_driver_killed[connect]") == SPARK_CONNECT
    assert _scope("tests/cluster/test_api.py::test_connect_refused") == "tests/cluster/test_api.py"  # no Spark
    spark = ("spark", "slow")
    items = [
        _Item("tests/a.py::test_1"),
        _Item("tests/b.py::test_1", "slow"),
        _Item("tests/spark/c.py::test_1", *spark),
        _Item("tests/spark/c.py::test_on_connect", *spark),
        _Item("tests/spark/c.py::test_2", *spark),
        _Item("tests/spark/d.py::test_1", *spark),
        _Item("tests/spark/e.py::test_1", *spark),
        _Item("tests/spark/e.py::test_2", *spark),
        _Item("tests/a.py::test_2"),
    ]
    order = [i.nodeid for i in _heaviest_files_first(items)]  # type: ignore[arg-type]
    assert order == [  # Spark Connect's, then the most slow tests first, Spark and not Spark in turn
        "tests/spark/c.py::test_on_connect",
        "tests/spark/c.py::test_1",
        "tests/spark/c.py::test_2",
        "tests/b.py::test_1",
        "tests/spark/e.py::test_1",
        "tests/spark/e.py::test_2",
        "tests/a.py::test_1",
        "tests/a.py::test_2",
        "tests/spark/d.py::test_1",
    ]


def test_a_duration_is_rounded_once_so_no_minute_shows_60_seconds() -> None:
    assert [_minutes(s) for s in (0.4, 59.4, 59.6, 659.6, 660.4, 3599.7)] == [
        "0 min 0 s",
        "0 min 59 s",
        "1 min 0 s",
        "11 min 0 s",
        "11 min 0 s",
        "60 min 0 s",
    ]
