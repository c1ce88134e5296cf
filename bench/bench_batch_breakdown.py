"""Where the fixed time of one micro-batch of the exactly-once sink goes (issue 30, item 1).

Two cases, one ``local[2]`` session, two local shards, as ``bench_latency.py`` and ``bench_spark.py`` run them:

* **continuous**: a producer process publishes ``--rate`` (2,000) committed messages/s into 4 file journals
  while a ``processingTime`` ``--trigger`` (250 ms) query (``rows=ranges``, ``numPartitions`` = cores) feeds
  ``ZClusterSink`` (plain ``foreachBatch``, as ``bench_latency.py``); medians over the batches after
  ``--warmup`` s. Beside it, Spark's own cost: the ``text`` source over a directory that gets one new
  file of the same messages per trigger, into a ``foreachBatch`` that runs one job (``df.count()``);
* **availableNow**: ``--messages`` (100k) committed messages of ``bench_spark.py``'s many-users traffic, the
  sink as :func:`zcluster.spark.run_available_now` runs it (observed metrics); the first query of the session,
  then ``--repeat`` more (each from FLUSHALL, a fresh query name and checkpoint), medians of those.

Sources of the figures (nothing in the library is changed for them):

* Spark's ``StreamingQueryProgress.durationMs`` per trigger (``latestOffset``, ``walCommit``, ``addBatch``...);
* the driver: timestamps around each step of ``ZClusterSink.__call__`` (a subclass here; the steps patched in
  this process only), so ``addBatch`` minus the sink's call is Spark's ``foreachBatch`` and Py4J call-back;
* the source's process (the Python data source's stream reader): the same reader, subclassed here, timing
  ``latestOffset``, ``partitions`` and ``commit`` into a trace directory;
* the executor tasks: the sink's task function, subclassed here, timing each step (open the journal store,
  load the checkpoint, the journal's identity, the apply loop, flushing writes, saving the checkpoint, the
  lag's ``end()``) and whether its Python worker is new, into the trace directory;
* Spark's UI REST API (``/api/v1/applications/<id>/jobs``, stages, tasks): the job's wall time, task launch
  (scheduler delay, deserialization) and the tasks' run time.

``--ab N``: only the continuous case, N pairs of queries alternating the Python workers' heap thawed
(``gc.unfreeze()`` at each task of the source and the sink: as before :mod:`zcluster.spark.workers`) and frozen,
in one session; writes ``results/batch-breakdown-ab[-TAG].json``. ``--py-spy``: profile the Python processes
Spark starts during the plain continuous case (raw stacks, paths in the JSON).

Run under ``flock /tmp/zc-bench.lock``. Writes ``results/batch-breakdown[-quick][-TAG].{json,png}``.

    python bench/bench_batch_breakdown.py --quick
    python bench/bench_batch_breakdown.py --tag before
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench_cluster import machine_info
from bench_latency import producer

from zcluster.spark.batch_source import JournalDataSource
from zcluster.spark.sink import ZClusterSink, _Job
from zcluster.spark.source import JournalStreamReader

RESULTS = Path(__file__).resolve().parent / "results"
JOURNALS = 4
PHASES = ("triggerExecution", "latestOffset", "queryPlanning", "getBatch", "walCommit", "addBatch", "commitOffsets")
TASK_STEPS = ("wait_rows", "open_store", "applier", "load_checkpoint", "verify", "apply_loop", "flush_writes")
TASK_STEPS += ("save_checkpoint", "lag_end", "close_store")


def _write_trace(directory: str, kind: str, record: dict[str, Any]) -> None:
    with open(os.path.join(directory, f"{kind}-{os.getpid()}.jsonl"), "a") as f:
        f.write(json.dumps(record) + "\n")


# -- executor side: the sink's task function, timed ---------------------------------------------------------


def _time_calls(owner: Any, attr: str, step: str, steps: Callable[[], dict[str, float] | None]) -> None:
    """Replace ``owner.attr`` with a wrapper adding each call's seconds to ``steps()[step]`` (none: not timed)."""
    inner = getattr(owner, attr)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            into = steps()
            if into is not None:
                into[step] = into.get(step, 0.0) + time.perf_counter() - t

    setattr(owner, attr, wrapper)


def _install_task_timers() -> None:
    """Wrap the steps of a task in this (worker) process with timers adding into ``sink._zc_steps``."""
    import zcluster.spark.sink as sink_mod
    from zcluster.state.applier import Applier
    from zcluster.state.batch import WriteBuffer
    from zcluster.state.store import StateStore

    if getattr(sink_mod, "_zc_steps", None) is not None:
        return
    steps: dict[str, float] = {}
    sink_mod._zc_steps = steps  # type: ignore[attr-defined]

    def timed(owner: Any, attr: str, step: str) -> None:
        _time_calls(owner, attr, step, lambda: steps)

    timed(sink_mod, "open_store", "open_store")
    timed(sink_mod, "close_store", "close_store")
    timed(sink_mod._Job, "_applier", "applier")
    timed(StateStore, "load_journal", "load_checkpoint")
    timed(Applier, "_verify", "verify")
    timed(WriteBuffer, "flush", "flush_writes")
    timed(StateStore, "save_journal", "save_checkpoint")
    timed(Applier, "_measure", "lag_end")


def _heap(mode: str) -> None:
    """The A/B of ``--ab``: "thawed" undoes the worker's ``gc.freeze()`` (the code before it), "frozen" redoes it."""
    import gc

    if mode == "thawed":
        gc.unfreeze()
    elif mode == "frozen" and gc.get_freeze_count() == 0:
        gc.freeze()


@dataclass(frozen=True)
class TimedJob(_Job):
    trace: str = ""
    heap: str = ""

    def run(self, batches: Iterator[Any]) -> Iterator[Any]:
        import zcluster.spark.sink as sink_mod

        _heap(self.heap)
        _install_task_timers()
        steps: dict[str, float] = sink_mod._zc_steps  # type: ignore[attr-defined]
        steps.clear()
        tasks = getattr(sys, "_zc_tasks", 0)
        sys._zc_tasks = tasks + 1  # type: ignore[attr-defined]
        started, t0 = time.time(), time.perf_counter()
        first = next(batches, None)
        steps["wait_rows"] = time.perf_counter() - t0

        def rest() -> Iterator[Any]:
            if first is not None:
                yield first
            yield from batches

        out = list(super().run(rest()))
        total = time.perf_counter() - t0
        steps["apply_loop"] = total - sum(steps.values())
        _write_trace(
            self.trace,
            "task",
            {
                "start": started,
                "end": time.time(),
                "total": total,
                "worker_age": started - os.stat(f"/proc/{os.getpid()}").st_ctime,
                "first_sink_task": tasks == 0,
                "steps": dict(steps),
            },
        )
        yield from out


class TimedSink(ZClusterSink):
    """The sink with each step of ``__call__`` timed on the driver (see :func:`_install_driver_timers`)."""

    def __init__(self, *args: Any, trace: str, heap: str = "", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.trace, self.heap = trace, heap
        self.calls: list[dict[str, Any]] = []

    def _tasks_job(self) -> _Job:
        job = super()._tasks_job()
        return TimedJob(**{f: getattr(job, f) for f in job.__dataclass_fields__}, trace=self.trace, heap=self.heap)

    def __call__(self, df: Any, batch_id: int) -> None:
        record: dict[str, Any] = {"batch": batch_id, "start": time.time(), "steps": {}}
        _DRIVER.current = record["steps"]
        t = time.perf_counter()
        try:
            super().__call__(df, batch_id)
        finally:
            record["total"] = time.perf_counter() - t
            record["end"] = time.time()
            _DRIVER.current = None
            self.calls.append(record)


class _Driver:
    current: dict[str, float] | None = None


_DRIVER = _Driver()


def _install_driver_timers() -> None:
    """Time the sink's steps in this process: the query id (Py4J), the batch progress read and write (Redis),
    building the tasks' plan (``mapInArrow``) and ``collect`` (the Spark job)."""
    import pyspark.sql.classic.dataframe as classic

    import zcluster.spark.sink as sink_mod
    from zcluster.state.store import StateStore

    def timed(owner: Any, attr: str, step: str) -> None:
        _time_calls(owner, attr, step, lambda: _DRIVER.current)

    timed(sink_mod, "_query_id", "query_id")
    timed(StateStore, "committed_batch", "committed_batch")
    timed(StateStore, "commit_batch", "commit_batch")
    timed(classic.DataFrame, "mapInArrow", "map_in_arrow")
    timed(classic.DataFrame, "collect", "collect")


# -- the source's process: the stream reader, timed ----------------------------------------------------------


class TimedReader(JournalStreamReader):
    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        lowered = {k.lower(): v for k, v in options.items()}
        self.trace, self.heap = lowered["zc_trace"], lowered.get("zc_heap", "")

    def read(self, partition: Any) -> Any:
        _heap(self.heap)
        return super().read(partition)

    def _timed(self, step: str, fn: Callable[[], Any]) -> Any:
        start, t = time.time(), time.perf_counter()
        try:
            return fn()
        finally:
            _write_trace(self.trace, "source", {"step": step, "start": start, "seconds": time.perf_counter() - t})

    def latestOffset(self, start: Any = None, limit: Any = None) -> Any:
        return self._timed("latestOffset", lambda: super(TimedReader, self).latestOffset(start, limit))

    def partitions(self, start: Any, end: Any) -> Any:
        return self._timed("partitions", lambda: super(TimedReader, self).partitions(start, end))

    def commit(self, end: Any) -> None:
        self._timed("commit", lambda: super(TimedReader, self).commit(end))


class TimedSource(JournalDataSource):
    @classmethod
    def name(cls) -> str:
        return "zcluster-journal-timed"

    def streamReader(self, schema: Any) -> Any:
        return TimedReader(dict(self.options))


def _traces(directory: str, kind: str) -> list[dict[str, Any]]:
    out = []
    for p in Path(directory).glob(f"{kind}-*.jsonl"):
        out.extend(json.loads(line) for line in p.read_text().splitlines() if line)
    return sorted(out, key=lambda r: r["start"])


# -- Spark's UI REST API -------------------------------------------------------------------------------------


def _rest(spark: Any, path: str) -> Any:
    base = spark.sparkContext.uiWebUrl
    app = spark.sparkContext.applicationId
    with urllib.request.urlopen(f"{base}/api/v1/applications/{app}/{path}", timeout=30) as r:
        return json.loads(r.read())


def _ts(text: str) -> float:
    return dt.datetime.strptime(text.replace("GMT", "+0000"), "%Y-%m-%dT%H:%M:%S.%f%z").timestamp()


def _iso(text: str) -> float:
    return dt.datetime.fromisoformat(text).timestamp()


def _jobs(spark: Any, since: float) -> list[dict[str, Any]]:
    """Every finished job submitted after ``since``: wall time, and its tasks' launch delay and run time."""
    out = []
    for job in _rest(spark, "jobs?status=succeeded"):
        submitted = _ts(job["submissionTime"])
        if submitted < since or "completionTime" not in job:
            continue
        tasks = []
        for sid in job["stageIds"]:
            for stage in _rest(spark, f"stages/{sid}"):
                if stage.get("status") != "COMPLETE":
                    continue
                for t in _rest(spark, f"stages/{sid}/{stage['attemptId']}/taskList?length=1000"):
                    m = t.get("taskMetrics", {})
                    tasks.append(
                        {
                            "launch_delay": _ts(t["launchTime"]) - submitted,
                            "duration": t.get("duration", 0) / 1000,
                            "scheduler_delay": t.get("schedulerDelay", 0) / 1000,
                            "deserialize": m.get("executorDeserializeTime", 0) / 1000,
                            "run": m.get("executorRunTime", 0) / 1000,
                        }
                    )
        out.append(
            {
                "submitted": submitted,
                "completed": _ts(job["completionTime"]),
                "wall": _ts(job["completionTime"]) - submitted,
                "tasks": tasks,
            }
        )
    return sorted(out, key=lambda j: j["submitted"])


# -- the cases -----------------------------------------------------------------------------------------------


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _batch_rows(
    spark: Any, sink: TimedSink, trace: str, progress: list[dict[str, Any]], since: float, skip_before: float
) -> list[dict[str, Any]]:
    """One dict of seconds per sink batch: Spark's phases, the driver's steps, the job, the tasks' steps."""
    jobs = _jobs(spark, since)
    tasks = _traces(trace, "task")
    sources = _traces(trace, "source")
    by_batch = {p["batchId"]: p for p in progress}
    rows = []
    for call in sink.calls:
        if call["start"] < skip_before or call["batch"] not in by_batch:
            continue
        p = by_batch[call["batch"]]
        row: dict[str, Any] = {f"spark.{k}": v / 1000 for k, v in p["durationMs"].items()}
        row["rows_in"] = p.get("numInputRows")
        row["driver.sink_call"] = call["total"]
        for k, v in call["steps"].items():
            row[f"driver.{k}"] = v
        row["driver.foreachBatch_outside_sink"] = row.get("spark.addBatch", 0) - call["total"]
        mine = [j for j in jobs if call["start"] <= j["submitted"] <= call["end"] and j["tasks"]]
        if mine:
            job = mine[-1]
            row["job.wall"] = job["wall"]
            row["job.collect_outside_job"] = call["steps"].get("collect", 0) - sum(j["wall"] for j in mine)
            row["job.first_task_launch"] = min(t["launch_delay"] for t in job["tasks"])
            row["job.task_duration_max"] = max(t["duration"] for t in job["tasks"])
            row["job.task_deserialize_max"] = max(t["deserialize"] for t in job["tasks"])
            row["job.tasks"] = len(job["tasks"])
        mine_t = [t for t in tasks if call["start"] <= t["start"] <= call["end"]]
        if mine_t:
            row["task.total_max"] = max(t["total"] for t in mine_t)
            row["task.new_workers"] = sum(t["worker_age"] < t["total"] + 1.0 for t in mine_t)
            row["task.first_sink_task"] = sum(t["first_sink_task"] for t in mine_t)
            for step in TASK_STEPS:
                row[f"task.{step}"] = max(t["steps"].get(step, 0.0) for t in mine_t)
        # The source's calls of this trigger: between the trigger's start and the sink's end.
        trigger_start = _iso(p["timestamp"])
        for step in ("latestOffset", "partitions", "commit"):
            hits = [
                s["seconds"]
                for s in sources
                if s["step"] == step and trigger_start - 0.01 <= s["start"] <= call["end"] + 0.5
            ]
            if hits:
                row[f"source.{step}"] = hits[0] if step != "commit" else hits[-1]
        rows.append(row)
    return rows


def _progress_dicts(query: Any) -> list[dict[str, Any]]:
    return [json.loads(p.json) for p in query.recentProgress]


def continuous(
    spark: Any,
    shards: Any,
    rate: float,
    seconds: float,
    warmup: float,
    trigger: str,
    observe: bool,
    spy: bool,
    heap: str = "",
) -> dict[str, Any]:
    from zcluster.journal import FileJournals
    from zcluster.message.journals import JournalSpec
    from zcluster.testing.traffic import timeline_mapper

    tmp = Path(tempfile.mkdtemp(prefix="zc-breakdown-"))
    root, trace = tmp / "journals", tmp / "trace"
    trace.mkdir()
    names = [f"lat/part-{i:03d}" for i in range(JOURNALS)]
    store = FileJournals(root)
    for n in names:
        store.create(JournalSpec(n, {"content-type": "application/x-ndjson"}))
    store.close()
    url = f"file://{root}"
    app = f"bd{int(time.time() * 1000)}"
    sink = TimedSink(shards.urls, timeline_mapper, app, journals=url, trace=str(trace), heap=heap)
    since = time.time()
    stream = (
        spark.readStream.format("zcluster-journal-timed")
        .option("journals", url)
        .option("rows", "ranges")
        .option("numPartitions", str(spark.sparkContext.defaultParallelism))
        .option("zc_trace", str(trace))
        .option("zc_heap", heap)
        .load()
    )
    query = (
        (sink.observe(stream) if observe else stream)
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(tmp / "ckpt"))
        .trigger(processingTime=trigger)
        .start()
    )
    receive, send = multiprocessing.Pipe(duplex=False)
    proc = multiprocessing.get_context("spawn").Process(
        target=producer, args=(str(root), names, rate, seconds, send), daemon=True
    )
    proc.start()
    spied: list[str] = []
    spies = []
    if spy:
        time.sleep(warmup)
        for pid in _spark_pythons(os.getpid()):
            out = tmp / f"py-spy-{pid}.txt"
            cmd = [
                str(Path(sys.executable).parent / "py-spy"),
                "record",
                "-s",
                "--nonblocking",
                "-r",
                "50",
                "-f",
                "raw",
            ]
            cmd += ["-d", str(max(1, int(seconds - warmup - 1))), "-o", str(out), "-p", str(pid)]
            spies.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            spied.append(str(out))
    receive.recv()
    proc.join(60)
    for p in spies:
        p.wait(120)
    time.sleep(1.0)
    progress = _progress_dicts(query)
    query.stop()
    rows = _batch_rows(spark, sink, str(trace), progress, since, since + warmup)
    rows = [r for r in rows if (r.get("rows_in") or 0) > 0]
    return {"batches": len(rows), "rows": rows, "py_spy": spied}


def _spark_pythons(root: int) -> list[int]:
    """The Python processes the JVM (a child of ``root``) started: daemons and the data source's runners."""
    children: dict[int, list[int]] = {}
    names: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            stat = (entry / "stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry.name))
            names[int(entry.name)] = (entry / "cmdline").read_bytes().decode(errors="replace")
    jvms = [c for c in children.get(root, []) if "java" in names.get(c, "")]
    return [c for j in jvms for c in children.get(j, []) if "python" in names.get(c, "")]


def text_continuous(spark: Any, rate: float, seconds: float, warmup: float, trigger: str) -> dict[str, Any]:
    """Spark's own cost per trigger: the ``text`` source, a new file of rate x trigger lines per trigger, into a
    ``foreachBatch`` that runs one job."""
    tmp = Path(tempfile.mkdtemp(prefix="zc-breakdown-text-"))
    data, staging = tmp / "data", tmp / "staging"
    data.mkdir()
    staging.mkdir()
    period = 0.25
    per_file = int(rate * period)
    stop = threading.Event()

    def writer() -> None:
        n = 0
        while not stop.is_set():
            lines = "".join(
                json.dumps({"user": f"u{i % 500}", "event": f"e{i}", "ts": float(i), "op": "add"}) + "\n"
                for i in range(n, n + per_file)
            )
            (staging / f"f{n}.json").write_text(lines)
            os.rename(staging / f"f{n}.json", data / f"f{n}.json")
            n += per_file
            time.sleep(period)

    calls: list[dict[str, Any]] = []

    def batch(df: Any, batch_id: int) -> None:
        t = time.perf_counter()
        df.count()
        calls.append({"batch": batch_id, "total": time.perf_counter() - t})

    query = (
        spark.readStream.format("text")
        .load(str(data))
        .writeStream.foreachBatch(batch)
        .option("checkpointLocation", str(tmp / "ckpt"))
        .trigger(processingTime=trigger)
        .start()
    )
    thread = threading.Thread(target=writer, daemon=True)
    started = time.time()
    thread.start()
    time.sleep(seconds)
    stop.set()
    thread.join()
    time.sleep(1.0)
    progress = _progress_dicts(query)
    query.stop()
    job = {c["batch"]: c["total"] for c in calls}
    rows = []
    for p in progress:
        if (p.get("numInputRows") or 0) == 0 or p["batchId"] not in job:
            continue
        if _iso(p["timestamp"]) < started + warmup:
            continue
        row = {f"spark.{k}": v / 1000 for k, v in p["durationMs"].items()}
        row["rows_in"] = p["numInputRows"]
        row["driver.count_job"] = job[p["batchId"]]
        rows.append(row)
    return {"batches": len(rows), "rows": rows}


def available_now(spark: Any, shards: Any, shape: Any, repeat: int) -> dict[str, Any]:
    import redis

    from zcluster.testing.traffic import timeline_mapper

    queries = []
    for i in range(1 + repeat):
        for u in shards.urls:
            redis.Redis.from_url(u).flushall()
        tmp = Path(tempfile.mkdtemp(prefix="zc-breakdown-an-"))
        trace = tmp / "trace"
        trace.mkdir()
        sink = TimedSink(
            shards.urls, timeline_mapper, f"an{int(time.time() * 1000)}", journals=shape.url, trace=str(trace)
        )
        since = time.time()
        t = time.perf_counter()
        stream = (
            spark.readStream.format("zcluster-journal-timed")
            .option("journals", shape.url)
            .option("rows", "ranges")
            .option("numPartitions", str(spark.sparkContext.defaultParallelism))
            .option("zc_trace", str(trace))
            .load()
        )
        query = (
            sink.observe(stream)
            .writeStream.foreachBatch(sink)
            .option("checkpointLocation", str(tmp / "ckpt"))
            .trigger(availableNow=True)
            .start()
        )
        started = time.perf_counter() - t
        query.awaitTermination()
        wall = time.perf_counter() - t
        progress = _progress_dicts(query)
        rows = _batch_rows(spark, sink, str(trace), progress, since, 0.0)
        delivered = sum(s.delivered for s in sink.history)
        first_trigger = _iso(progress[0]["timestamp"]) - since if progress else None
        triggers = sum(p["durationMs"].get("triggerExecution", 0) for p in progress) / 1000
        queries.append(
            {
                "query": i,
                "wall": wall,
                "start_call": started,
                "to_first_trigger": first_trigger,
                "triggers": triggers,
                "outside_triggers": wall - triggers,
                "delivered": delivered,
                "msgs_per_s": delivered / wall,
                "batches": rows,
            }
        )
        print(
            f"  availableNow query {i}: {wall:.2f} s, {delivered / wall:,.0f} msgs/s, first trigger after "
            f"{first_trigger:.2f} s, outside triggers {wall - triggers:.2f} s"
        )
    return {"queries": queries}


# -- the report ----------------------------------------------------------------------------------------------


def _table(rows: list[dict[str, Any]]) -> dict[str, float]:
    keys: list[str] = []
    for r in rows:
        keys.extend(k for k in r if k not in keys)
    return {k: m for k in keys if (m := _median([r[k] for r in rows if isinstance(r.get(k), int | float)])) is not None}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=2000.0)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--warmup", type=float, default=8.0)
    parser.add_argument("--trigger", default="250 milliseconds")
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--users", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--tag", default="")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--no-plot", action="store_true")
    parser.add_argument("--ab", type=int, default=0, help="only N pairs of continuous queries, heap thawed/frozen")
    parser.add_argument("--py-spy", action="store_true", help="profile the plain continuous case's processes")
    args = parser.parse_args(argv)
    if args.quick:
        args.seconds, args.warmup, args.messages, args.repeat = 12.0, 4.0, 20_000, 1
    from bench_spark import build_shape

    from zcluster.spark import local_session
    from zcluster.testing import LocalShards

    if not args.ab:
        tmp = Path(tempfile.mkdtemp(prefix="zc-breakdown-shape-"))
        shape = build_shape("many-users", args.users, tmp, args.messages, seed=7)
        print(f"traffic: {args.messages} committed messages, {shape.frames} frames")
    _install_driver_timers()
    report: dict[str, Any] = {"date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), "args": vars(args)}
    report["args"] = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    with LocalShards(2) as shards:
        t = time.perf_counter()
        spark = local_session("local[2]", "zcluster-breakdown", **{"spark.ui.enabled": "true"})
        report["session_start"] = time.perf_counter() - t
        spark.dataSource.register(TimedSource)
        report["spark_python_worker_reuse"] = spark.sparkContext.getConf().get("spark.python.worker.reuse", "unset")
        try:
            if args.ab:
                report["ab"] = ab(spark, shards, args)
                return finish(report, args)
            print("availableNow:")
            report["available_now"] = available_now(spark, shards, shape, args.repeat)
            print("continuous (sink)...")
            c = (spark, shards, args.rate, args.seconds, args.warmup, args.trigger)
            report["continuous"] = continuous(*c, observe=False, spy=args.py_spy)
            print("continuous (sink, observed metrics)...")
            report["continuous_observed"] = continuous(*c, observe=True, spy=False)
            print("continuous (text + count)...")
            report["text"] = text_continuous(spark, args.rate, args.seconds, args.warmup, args.trigger)
        finally:
            spark.stop()
        report["machine"] = machine_info(shards.binary)
    return finish(report, args)


def finish(report: dict[str, Any], args: Any) -> int:
    if "ab" in report:
        suffix = ("-quick" if args.quick else "") + (f"-{args.tag}" if args.tag else "")
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"batch-breakdown-ab{suffix}.json").write_text(json.dumps(report, indent=2))
        return 0
    cont = _table(report["continuous"]["rows"])
    observed = _table(report["continuous_observed"]["rows"])
    text = _table(report["text"]["rows"])
    queries = report["available_now"]["queries"]
    later = queries[1:] or queries
    an = _table([b for q in later for b in q["batches"]])
    an_q = _table([{k: v for k, v in q.items() if isinstance(v, int | float)} for q in later])
    report["summary"] = {
        "continuous": cont,
        "continuous_observed": observed,
        "text": text,
        "available_now_batch": an,
        "available_now_query": an_q,
    }
    report["summary"]["first_over_second"] = queries[0]["wall"] / queries[1]["wall"] if len(queries) > 1 else None
    print_table(report)
    suffix = ("-quick" if args.quick else "") + (f"-{args.tag}" if args.tag else "")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"batch-breakdown{suffix}.json").write_text(json.dumps(report, indent=2))
    if not args.no_plot:
        plot(args.out / f"batch-breakdown{suffix}.png", report)
    return 0


AB_ITEMS = (
    "spark.triggerExecution",
    "spark.addBatch",
    "spark.walCommit",
    "spark.commitOffsets",
    "driver.collect",
    "job.wall",
    "job.task_duration_max",
    "task.total_max",
    "task.wait_rows",
    "task.apply_loop",
    "rows_in",
)


def ab(spark: Any, shards: Any, args: Any) -> dict[str, Any]:
    """Continuous queries alternating the worker heap thawed (as before the freeze) and frozen, in one session."""
    runs: dict[str, list[dict[str, Any]]] = {"thawed": [], "frozen": []}
    for i in range(args.ab):
        for heap in ("thawed", "frozen") if i % 2 == 0 else ("frozen", "thawed"):
            r = continuous(spark, shards, args.rate, args.seconds, args.warmup, args.trigger, False, False, heap)
            runs[heap].extend(r["rows"])
            t = _table(r["rows"])
            print(f"  {heap}: " + ", ".join(f"{k} {t[k] * 1000:.0f}" for k in AB_ITEMS[:4] if k in t))
    tables = {h: _table(rows) for h, rows in runs.items()}
    print(f"{'median ms per batch':<30}{'thawed':>10}{'frozen':>10}{'ratio':>8}")
    for k in AB_ITEMS:
        th, fr = tables["thawed"].get(k), tables["frozen"].get(k)
        if th is None or fr is None:
            continue
        scale = 1 if k == "rows_in" else 1000
        print(f"{k:<30}{th * scale:>10.1f}{fr * scale:>10.1f}{fr / th if th else float('nan'):>8.2f}")
    return {"tables": tables, "batches": {h: len(r) for h, r in runs.items()}}


def print_table(report: dict[str, Any]) -> None:
    s = report["summary"]
    columns = {
        "continuous": s["continuous"],
        "observed": s["continuous_observed"],
        "text+count": s["text"],
        "availableNow": s["available_now_batch"],
    }
    keys: list[str] = []
    for d in columns.values():
        keys.extend(k for k in d if k not in keys)
    counts = ", ".join(f"{n}: {report[n]['batches']}" for n in ("continuous", "continuous_observed", "text"))
    print(f"\nmedian ms per batch (batches measured: {counts})")
    print(f"{'item':<38}" + "".join(f"{name:>14}" for name in columns))
    for k in keys:
        cells = []
        for d in columns.values():
            v = d.get(k)
            if v is None:
                cells.append("-")
            elif k == "rows_in" or k.endswith(("tasks", "new_workers", "first_sink_task")):
                cells.append(f"{v:.0f}")
            else:
                cells.append(f"{v * 1000:.1f}")
        print(f"{k:<38}" + "".join(f"{c:>14}" for c in cells))
    q = s["available_now_query"]
    print(
        f"availableNow per query (median of the later ones): wall {q['wall']:.2f} s, {q['msgs_per_s']:,.0f} msgs/s, "
        f"start() {q['start_call']:.2f} s, first trigger after {q['to_first_trigger']:.2f} s, "
        f"outside triggers {q['outside_triggers']:.2f} s; first query / second: {s['first_over_second']:.2f}x"
    )


def plot(path: Path, report: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = report["summary"]
    fig, axes = plt.subplots(1, 2, figsize=(12, 5))
    for ax, (title, d) in zip(  # noqa: B905
        axes,
        (("continuous trigger (ms, median)", s["continuous"]), ("availableNow batch (ms)", s["available_now_batch"])),
    ):
        items = [
            (k, v * 1000)
            for k, v in d.items()
            if not k.endswith(("rows_in", "tasks", "new_workers", "first_sink_task"))
        ]
        ax.barh([k for k, _ in items], [v for _, v in items])
        ax.invert_yaxis()
        ax.set_title(title)
        ax.tick_params(axis="y", labelsize=7)
    fig.tight_layout()
    fig.savefig(path)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        raise SystemExit(main())
