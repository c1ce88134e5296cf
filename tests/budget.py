"""The suite's time, seen by everyone: which tests are ``slow``, and the time budget printed after a run.

Loaded by ``tests/conftest.py``. Two parts:

* **The ``slow`` marker** (registered in ``pyproject.toml``). ``./run test -m "not slow"`` is the fast
  subset a contributor runs; CI runs everything. A test is slow when it starts Spark (every ``spark``-marked
  test is marked here, automatically) or is listed in :data:`SLOW`: Redis Cluster failovers and faults,
  migration kill sweeps, server kills and restarts under a consumer, chain fault runs, the soak. An entry
  naming a file or test that no longer exists stops the run (:func:`pytest_collection_modifyitems`), so the
  list cannot rot silently.
* **The budget** (``budget_test_seconds`` and ``budget_run_minutes`` in ``pyproject.toml``'s pytest
  section, the one place the numbers live). After a run the terminal summary prints the run's wall time and
  a WARNING line for each test over ``budget_test_seconds`` (setup, call and teardown together) and for a
  run over ``budget_run_minutes``. A warning never fails a test or the run: a machine's speed varies
  twofold. ``./run test`` adds ``--durations=25`` (the 25 slowest phases). A line gives the CPU the tests
  used (their processes, and the child processes they reaped: servers and JVMs stopped within a test, not
  the session-wide ones) and the 10 costliest files: on a 2-core machine with more workers than cores, CPU,
  not a test's wall time, is what the run pays. Under pytest-xdist another gives each worker's busy time and
  when it finished (one idle long before the others: the schedule's fault). The only guard that fails a
  test on time is pytest-timeout's per-test ``timeout`` (against a hang). Under ``./run test`` the run's
  time is counted from the start of its first pass (``ZCLUSTER_TEST_STARTED``, epoch seconds), so the
  Valkey pass reports both passes together. Under pytest-xdist the summary is the controller's, over every
  worker's tests.
* **The schedule under pytest-xdist** (``./run test`` runs ``-n``, see ``run``):
  :func:`pytest_xdist_make_scheduler` hands out whole files (a module's Spark session and the per-worker
  session servers are started once a file), the files with the most ``slow`` tests first, Spark and not
  Spark in turn (:func:`_heaviest_files_first`), so the long ones do not start last. The Spark Connect tests
  (:func:`is_spark_connect`) all go to one worker, one after another, first of all: most reuse that
  worker's persistent Connect server (``tests/spark/conftest.py``), and the few that start one of their
  own (``own_connect_server``) take its fixed port, 15002, so two at once on one machine would collide.
"""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]

SLOW: dict[str, str] = {
    # Redis Cluster failover and fault tests: each starts its own cluster and waits on elections.
    "tests/cluster/test_failover.py::test_a_killed_master_is_followed_and_writes_confirmed_by_a_replica_survive": (
        "two elections"
    ),
    "tests/cluster/test_failover.py::test_a_hung_master_times_out_and_is_followed": "an election",
    "tests/cluster/test_failover.py::test_a_call_waits_out_clusterdown_until_a_replica_takes_over": "a failover",
    "tests/cluster/test_failover.py::test_a_killed_replica_does_not_disturb_the_client": "a node marked failed",
    "tests/cluster/test_failover.py::test_a_manual_cluster_failover_is_followed_through_moved_and_readonly": (
        "two failovers"
    ),
    "tests/cluster/test_failover.py::test_a_dead_master_causes_no_refresh_storm": "an election",
    "tests/cluster/test_failover.py::test_a_master_without_replicas_is_reported_at_once": "a cluster of its own",
    "tests/cluster/test_failover.py::test_a_map_read_just_before_a_promotion_is_not_taken_for_a_master_without_replicas": (  # noqa: E501
        "an election"
    ),
    "tests/cluster/test_failover.py::test_the_exactly_once_consumer_runs_through_a_failover_mid_poll": "an election",
    "tests/cluster/test_failover.py::test_a_durable_write_rides_out_a_failover_until_the_killed_master_rejoins_as_a_replica": (  # noqa: E501
        "an election, then 15 s before the rejoin"
    ),
    "tests/cluster/test_failover.py::test_a_durable_write_whose_shard_never_gets_a_replica_back_fails_after_the_deadline_saying_what_to_do": (  # noqa: E501
        "an election"
    ),
    "tests/testing/test_replicas.py::test_a_redis_cluster_replica_takes_over_a_killed_master": "an election",
    "tests/state/test_increments_faults.py::test_a_consumer_counts_increments_once_through_a_master_kill_and_failover": (  # noqa: E501
        "an election"
    ),
    "tests/cluster/test_cluster_growth.py": "a reshard of 4096 slots under load",
    "tests/cluster/test_faults.py::test_slot_migration_under_concurrent_writes_loses_nothing": "a resharding",
    "tests/cluster/test_increments.py::test_increments_during_a_slot_migration_count_once": "a resharding",
    # Server kills and AOF restarts under a consumer or a writer.
    "tests/state/test_increments_faults.py::test_a_consumer_through_shards_sigkilled_and_restarted_from_their_aof_counts_each_increment_once": (  # noqa: E501
        "repeated SIGKILLs and AOF restarts"
    ),
    "tests/state/test_increments_faults.py::test_increment_calls_with_resends_through_sigkills_and_aof_restarts_count_each_position_once": (  # noqa: E501
        "repeated SIGKILLs and AOF restarts"
    ),
    # Migration kill sweeps (also in SWEEPS): the mover killed at every kill point, then resumed.
    "tests/cluster/test_migration.py::test_the_mover_killed_at_random_points_and_in_its_cut_over_resumes_and_loses_nothing": (  # noqa: E501
        "a kill sweep"
    ),
    "tests/cluster/test_migration_fence.py": "movers paused and taken over",
    # Chain fault runs: the shard holding the state SIGKILLed between and inside transactions.
    "tests/state/test_chains.py::test_the_shard_holding_the_state_sigkilled_between_and_inside_transactions": (
        "SIGKILLs of the state's shard"
    ),
    # Measured among the slowest of the rest (property tests over real servers, migrations held open).
    "tests/state/test_poll_boundaries.py::test_any_micro_batch_boundaries_deliver_what_one_batch_delivers_through_the_sink": (  # noqa: E501
        "a property test: whole sink runs per example"
    ),
    "tests/state/test_poll_boundaries.py::test_any_poll_boundaries_deliver_what_one_uninterrupted_read_delivers": (
        "a property test over real servers"
    ),
    "tests/cluster/test_node_calls.py::test_a_call_whose_keys_a_migration_split_waits_for_the_migration_not_for_a_count_of_tries": (  # noqa: E501
        "a slot migration held open for 40 tries"
    ),
    "tests/cluster/test_node_calls.py::test_tuples_whose_resend_cannot_be_routed_fail_and_the_others_stand": (
        "a slot migration held open"
    ),
    # Whole-system runs.
    "tests/test_soak.py": "the soak: a week of traffic in a minute",
    "tests/test_wheel.py": "builds (compiling the hot path with mypyc) and installs the wheel in a fresh environment",
}
"""Slow tests besides the ``spark``-marked ones and :data:`SWEEPS`: a file, or ``file::test`` (every
parametrization), with why."""

SWEEPS: dict[str, str] = {
    "tests/cluster/test_migration.py::test_the_mover_killed_among_its_cut_overs_last_writes_finishes_them_when_run_again": (  # noqa: E501
        "the mover killed at each of its cut-over's last writes"
    ),
    "tests/cluster/test_migration_resume.py::test_the_mover_killed_after_each_marker_write_or_in_its_clean_up_resumes_and_loses_nothing": (  # noqa: E501
        "the mover killed after each marker write, for four kinds of target"
    ),
    "tests/cluster/test_migration_interleavings.py": "movers paused, killed and taken over in many interleavings",
}
"""Kill and interleaving sweeps, marked ``sweep`` (and ``slow``): one protocol of zcluster's own run again at
each of its kill points or interleavings. ``./run test``'s Valkey pass leaves them out (``-m "not sweep and not
spark"``): what could differ on another server is the commands a sweep sends, and the tier's other tests send
those (a migration killed and resumed: ``test_migration.py``'s random kill points; movers fenced:
``test_migration_fence.py``), while the sweep's repetitions test the client's protocol, which is the same on
both."""


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini("budget_test_seconds", "a WARNING names each test that took longer (never a failure)")
    parser.addini("budget_run_minutes", "a WARNING says when the run took longer (never a failure)")


def _check_slow_list() -> None:
    stale = []
    for entry in [*SLOW, *SWEEPS]:
        path, _, name = entry.partition("::")
        file = REPO / path
        if not file.is_file() or (name and f"def {name}(" not in file.read_text()):
            stale.append(entry)
    if stale:
        raise pytest.UsageError(f"tests/budget.py: SLOW names tests that do not exist: {stale}")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _check_slow_list()
    for item in items:
        file = Path(item.path).resolve()
        path = file.relative_to(REPO).as_posix() if file.is_relative_to(REPO) else ""
        function = item.nodeid.partition("::")[2].partition("[")[0]
        if (
            item.get_closest_marker("spark") is not None
            or "spark" in getattr(item, "fixturenames", ())
            or path in SLOW
            or f"{path}::{function}" in SLOW
            or path in SWEEPS
            or f"{path}::{function}" in SWEEPS
        ):
            item.add_marker(pytest.mark.slow)
        if path in SWEEPS or f"{path}::{function}" in SWEEPS:
            item.add_marker(pytest.mark.sweep)
    if hasattr(config, "workerinput"):  # an xdist worker: the controller hands out work in this order
        items[:] = _heaviest_files_first(items)


SPARK_CONNECT = "spark-connect"
"""The scope (:func:`pytest_xdist_make_scheduler`) of the tests that start a Spark Connect server."""


def is_spark_connect(nodeid: str) -> bool:
    """Whether the test uses Spark Connect: a test under ``tests/spark/`` whose name says ``connect`` (every
    such test is named so; one that is not would neither reuse its worker's Connect server nor be kept apart
    from another on port 15002)."""
    path, _, name = nodeid.partition("::")
    return path.startswith("tests/spark/") and "connect" in name.lower()


def _scope(nodeid: str) -> str:
    return SPARK_CONNECT if is_spark_connect(nodeid) else nodeid.partition("::")[0]


def _heaviest_files_first(items: list[pytest.Item]) -> list[pytest.Item]:
    """``items`` by scope (:func:`_scope`): the Spark Connect tests first (they run one after another), then
    the scopes with the most ``slow`` tests, a Spark one and one without Spark in turn, so that the workers
    do not all start JVMs at once (a Spark test's own waits, as on a Python worker connecting back, give
    out when four run on two cores among other load) while the tests that mostly wait on servers run
    beside them. Ties, and each scope's own tests, in collection order."""
    scopes: dict[str, list[pytest.Item]] = {}
    for item in items:
        scopes.setdefault(_scope(item.nodeid), []).append(item)

    def slow(scope: str) -> int:
        return sum(item.get_closest_marker("slow") is not None for item in scopes[scope])

    def spark(scope: str) -> bool:
        return any(item.get_closest_marker("spark") is not None for item in scopes[scope])

    ranked = sorted((s for s in scopes if s != SPARK_CONNECT), key=lambda s: -slow(s))
    with_spark, without = [s for s in ranked if spark(s)], [s for s in ranked if not spark(s)]
    order = [SPARK_CONNECT] if SPARK_CONNECT in scopes else []
    for i in range(max(len(with_spark), len(without))):
        order += with_spark[i : i + 1] + without[i : i + 1]
    return [item for scope in order for item in scopes[scope]]


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist's, called on the controller when it distributes
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Whole scopes (:func:`_scope`: a file, or every Spark Connect test) to a worker at a time, in the
    workers' collection order (:func:`_heaviest_files_first`), whatever ``--dist`` says but ``each``."""
    if config.getoption("dist") == "each":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ByFile(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return _scope(nodeid)

    config.option.loadscopereorder = False  # keep the order above, not xdist's most-tests-first
    return ByFile(config, log)


_started = time.time()
_spent: dict[str, float] = {}
_workers: dict[str, list[float]] = {}  # xdist worker -> [seconds busy, when its last test phase ended]
_cpu_by_file: dict[str, float] = {}
_CPU_AT = pytest.StashKey[float]()
CPU = "cpu_seconds"
"""A report's user property: the CPU its phase used in the test process and the child processes it reaped."""


def _cpu() -> float:
    own, reaped = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + reaped.ru_utime + reaped.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    item.stash[_CPU_AT] = _cpu()
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    now = _cpu()
    outcome.get_result().user_properties.append((CPU, now - item.stash.get(_CPU_AT, now)))
    item.stash[_CPU_AT] = now


def pytest_sessionstart(session: pytest.Session) -> None:
    global _started
    _started = time.time()
    _spent.clear()
    _workers.clear()
    _cpu_by_file.clear()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _spent[report.nodeid] = _spent.get(report.nodeid, 0.0) + report.duration
    file = report.nodeid.partition("::")[0]
    for name, value in report.user_properties:
        if name == CPU:
            _cpu_by_file[file] = _cpu_by_file.get(file, 0.0) + float(value)
    node = getattr(report, "node", None)  # set by pytest-xdist on the controller
    if node is not None:
        busy = _workers.setdefault(node.gateway.id, [0.0, 0.0])
        busy[0] += report.duration
        busy[1] = max(busy[1], report.stop)


def _minutes(seconds: float) -> str:
    whole = round(seconds)  # rounded once: 659.6 s is "11 min 0 s", never "10 min 60 s"
    return f"{whole // 60} min {whole % 60} s"


@pytest.hookimpl(trylast=True)  # after --durations, before the short summary and the closing line
def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    now = time.time()
    this_pass = now - _started
    first = os.environ.get("ZCLUSTER_TEST_STARTED", "")
    run = now - float(first) if first.replace(".", "", 1).isdigit() else this_pass
    line = f"budget: this pytest run took {_minutes(this_pass)}"
    if run != this_pass:
        line += f"; ./run test's passes so far {_minutes(run)}"
    terminalreporter.write_line(line)
    if _workers:  # an idle worker at the end means the schedule, not the machine, set the pass's length
        shares = [
            f"{w} busy {_minutes(busy)}, done at {_minutes(last - _started)}"
            for w, (busy, last) in sorted(_workers.items())
        ]
        terminalreporter.write_line(f"budget: workers: {'; '.join(shares)}")
    if _cpu_by_file:  # what a 2-core machine pays for, when the workers outnumber the cores
        top = sorted(_cpu_by_file.items(), key=lambda kv: -kv[1])[:10]
        terminalreporter.write_line(
            f"budget: CPU {_minutes(sum(_cpu_by_file.values()))} in all (test processes and the children they "
            f"reaped); the 10 costliest files: {', '.join(f'{f} {c:.0f} s' for f, c in top)}"
        )
    test_budget, run_budget = config.getini("budget_test_seconds"), config.getini("budget_run_minutes")
    for warning in budget_warnings(_spent, run, test_budget, run_budget):
        terminalreporter.write_line(warning, yellow=True, bold=True)


def budget_warnings(spent: dict[str, float], run_seconds: float, test_budget: str, run_budget: str) -> list[str]:
    """The WARNING lines for ``spent`` (node id -> seconds) and a run of ``run_seconds``, against the
    budgets as written in the ini file (empty: no budget)."""
    out = []
    if test_budget:
        limit = float(test_budget)
        for nodeid, seconds in sorted(spent.items(), key=lambda kv: -kv[1]):
            if seconds > limit:
                out.append(f"WARNING: {nodeid} took {seconds:.1f} s, over the budget of {limit:g} s a test")
    if run_budget and run_seconds > float(run_budget) * 60:
        out.append(f"WARNING: the run took {_minutes(run_seconds)}, over the budget of {float(run_budget):g} min")
    return out
