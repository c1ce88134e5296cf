"""The exactly-once Spark sink against a naive foreachBatch writer, in one run on the same servers and journals.

Starts two local ``redis-server`` shards (:class:`zcluster.testing.LocalShards`), publishes synthetic timeline
traffic (:mod:`zcluster.testing.traffic`: committed messages, transactions, rolled-back transactions, duplicated
appends) into file journals once, starts one ``local[2]`` SparkSession, and measures, every repetition on
flushed servers with a fresh query name and checkpoint:

  (a) the whole query: ``zcluster-journal`` source -> ``ZClusterSink`` (exactly once) -> cluster
  (b) the same source -> a naive ``foreachBatch`` that collects the rows to the driver and writes them one
      by one with redis-py (at-least-once, no sequencing: parses each frame's JSON, one ZADD/ZREM per
      message, no pipeline; rolled-back and duplicated messages are written too)

both as journal messages (frames) per second over the query's wall time (start to termination), and the
sink's own cost, without Spark, in this process over the same rows (what an executor task does,
``_Job.run``), against ``Cluster.insert``/``Cluster.delete`` of exactly the tuples the sink wrote:

  (c) ``_Job.run`` with the real mapper: decode, sequence read-committed, map, batched writes, states
  (d) ``_Job.run`` with a mapper that writes nothing (decode + sequencing + states only)
  (e) ``Cluster.insert`` + ``Cluster.delete`` of the same tuples the sink wrote, one call each

Goals: (a)/(b) >= 5; (c)/(e) time <= 2 (the sink's own cost per message within 2x of Cluster.insert).
Medians, ratios and the raw samples go to ``bench/results/spark.json`` and ``bench/results/spark.png``.

    python bench/bench_spark.py             # full run: ~100k journal messages, 3 repetitions (~4-5 min)
    python bench/bench_spark.py --quick     # smoke run: ~10k messages, 1 repetition (~1 min)
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import logging
import shutil
import sys
import tempfile
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import redis

from zcluster import Cluster
from zcluster.journal.files import FileJournals
from zcluster.spark import Delete, Insert, ZClusterSink, local_session
from zcluster.spark.source import JournalRange, read_partition
from zcluster.testing import LocalShards
from zcluster.testing.traffic import Traffic, create_journals, publish, timeline_mapper

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_cluster import machine_info, med

RESULTS = Path(__file__).resolve().parent / "results"
PRODUCERS = 4
JOURNALS = 4
FRAMES_PER_STEP = 1.95  # journal frames per producer step published by zcluster.testing.traffic.publish (measured)


class Row(NamedTuple):
    """A row of the ``zcluster-journal`` source, as Spark hands it to ``mapPartitions``."""

    journal: str
    begin: int
    end: int
    content_type: str
    data: bytes | None
    error: str | None


# -- the naive writer ---------------------------------------------------------------------------------------


class NaiveWriter:
    """foreachBatch: collect to the driver, one redis-py command per message, no pipeline, no sequencing."""

    def __init__(self, urls: list[str]) -> None:
        self.clients = [redis.Redis.from_url(u) for u in urls]
        self.written = 0

    def __call__(self, df: Any, batch_id: int) -> None:
        clients, n = self.clients, len(self.clients)
        for row in df.collect():
            if row.data is None:
                continue
            doc = json.loads(row.data)
            if "user" not in doc:
                continue  # an ACK: no event in it
            key = f"timeline:{doc['user']}"
            client = clients[zlib.crc32(key.encode()) % n]
            if doc["op"] == "remove":
                client.zrem(key, str(doc["event"]))
            else:
                client.zadd(key, {str(doc["event"]): float(doc["ts"])})
            self.written += 1


# -- measurements -------------------------------------------------------------------------------------------


def run_query(spark: Any, url: str, ckpt: str, fn: Callable[[Any, int], None]) -> tuple[float, list[dict[str, Any]]]:
    """Wall seconds from start to termination of an availableNow query over every journal, and its progress."""
    gc.collect()
    t0 = time.perf_counter()
    stream = spark.readStream.format("zcluster-journal").option("journals", url).load()
    query = stream.writeStream.foreachBatch(fn).option("checkpointLocation", ckpt).trigger(availableNow=True).start()
    query.awaitTermination()
    wall = time.perf_counter() - t0
    progress = [
        {"batchId": p["batchId"], "numInputRows": p["numInputRows"], "durationMs": p["durationMs"]}
        for p in query.recentProgress
    ]
    return wall, progress


def check(cluster: Cluster, traffic: Traffic) -> int:
    """Keys whose visible members differ from the model (0 = exactly once held)."""
    expected = traffic.expected()
    got = cluster.select(list(expected), limit=10**9)
    return sum(1 for k, want in expected.items() if [(m.member, m.score) for m in got[k]] != want)


def nothing(message: Any) -> list[Any]:
    return []


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=100_000, help="journal messages to publish (default 100000)")
    ap.add_argument("--repeat", type=int, default=3, help="repetitions of every measurement (default 3)")
    ap.add_argument("--quick", action="store_true", help="smoke run: 10k messages, 1 repetition")
    ap.add_argument("--out", type=Path, default=RESULTS, help="results folder (default bench/results)")
    ap.add_argument("--no-plot", action="store_true", help="skip the PNG")
    ap.add_argument("--partitions", type=int, default=None, help="ZClusterSink partitions (default: the sink's)")
    args = ap.parse_args(argv)
    if args.quick:
        args.messages, args.repeat = 10_000, 1
    steps = max(1, round(args.messages / (PRODUCERS * FRAMES_PER_STEP)))
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("zcluster").setLevel(logging.ERROR)
    started = time.perf_counter()
    root = Path(tempfile.mkdtemp(prefix="zcluster-bench-spark-"))
    samples: dict[str, list[float]] = {
        k: [] for k in ("query_sink", "query_naive", "sink_batch_seconds", "job_run", "job_run_nomap", "cluster_insert")
    }
    progress: dict[str, list[Any]] = {"query_sink": [], "query_naive": []}
    mismatched: list[int] = []
    try:
        with LocalShards(2) as shards:
            clients = [s.client() for s in shards.servers]

            def flush() -> None:
                for c in clients:
                    c.flushall()

            store = FileJournals(str(root / "journals"))
            url = "file://" + str(root / "journals")
            names = [f"timelines/part-{i:03d}" for i in range(JOURNALS)]
            create_journals(store, names)
            traffic = publish(store, Traffic(names), producers=PRODUCERS, messages=steps)
            ends = {n: store.end(n) for n in names}
            rows = [
                Row(*r)
                for n in sorted(names)
                for r in read_partition(url, JournalRange(n, "application/x-ndjson", 0, ends[n]))
            ]
            frames = len(rows)
            print(
                f"zcluster Spark benchmark: {frames:,} journal messages in {JOURNALS} journals "
                f"({traffic.committed:,} committed, {traffic.rolled_back:,} rolled back, "
                f"{traffic.duplicates:,} duplicates, {traffic.transactions:,} transactions), "
                f"{args.repeat} repetitions, local[2], 2 shards",
                flush=True,
            )

            # the tuples the sink writes (recorded once, untimed)
            written: list[Any] = []

            def recording(message: Any) -> list[Any]:
                out = timeline_mapper(message)
                written.extend(out)
                return out

            flush()
            list(ZClusterSink(shards.urls, recording, "bench-record", journals=url).job.run(iter(rows)))
            inserts = [w for w in written if isinstance(w, Insert)]
            deletes = [w for w in written if isinstance(w, Delete)]
            cluster = Cluster.from_urls(shards.urls)
            cluster.load_scripts()

            spark = local_session("local[2]", app="zcluster-bench", **{"spark.ui.showConsoleProgress": "false"})
            t0 = time.perf_counter()
            # warm up the JVM, the Python workers and the code paths on a small journal set of their own
            small = FileJournals(str(root / "warm"))
            small_url = "file://" + str(root / "warm")
            create_journals(small, names)
            publish(small, Traffic(names), producers=PRODUCERS, messages=100, seed=1)
            flush()
            warm = ZClusterSink(shards.urls, timeline_mapper, "bench-warm", journals=small_url)
            run_query(spark, small_url, str(root / "ckpt-warm"), warm)
            run_query(spark, small_url, str(root / "ckpt-warm-naive"), NaiveWriter(shards.urls))
            print(f"  warm-up: {time.perf_counter() - t0:.1f}s", flush=True)

            for rep in range(args.repeat):
                # (a) the whole query through the sink
                flush()
                sink = ZClusterSink(
                    shards.urls, timeline_mapper, f"bench-sink-{rep}", journals=url, partitions=args.partitions
                )
                wall, prog = run_query(spark, url, str(root / f"ckpt-sink-{rep}"), sink)
                samples["query_sink"].append(frames / wall)
                samples["sink_batch_seconds"].append(sum(b.seconds for b in sink.history))
                progress["query_sink"].append(
                    {"wall_s": wall, "progress": prog, "batches": [b.__dict__ for b in sink.history]}
                )
                mismatched.append(check(cluster, traffic))
                # (b) the naive writer
                flush()
                naive = NaiveWriter(shards.urls)
                wall_naive, prog = run_query(spark, url, str(root / f"ckpt-naive-{rep}"), naive)
                samples["query_naive"].append(frames / wall_naive)
                progress["query_naive"].append({"wall_s": wall_naive, "progress": prog, "written": naive.written})
                # (c) the sink's executor-side work in this process, (d) without writes, (e) Cluster.insert
                for name, mapper in (("job_run", timeline_mapper), ("job_run_nomap", nothing)):
                    flush()
                    job = ZClusterSink(shards.urls, mapper, f"bench-job-{name}-{rep}", journals=url).job
                    gc.collect()
                    t1 = time.perf_counter()
                    list(job.run(iter(rows)))
                    samples[name].append(frames / (time.perf_counter() - t1))
                flush()
                gc.collect()
                t1 = time.perf_counter()
                cluster.insert(inserts)
                cluster.delete(deletes)
                samples["cluster_insert"].append(frames / (time.perf_counter() - t1))
                print(
                    f"  rep {rep + 1}/{args.repeat}: sink query {wall:.1f}s, naive query {wall_naive:.1f}s, "
                    + "  ".join(f"{k}={v[-1]:,.0f}" for k, v in samples.items() if k != "sink_batch_seconds")
                    + f"  mismatched keys={mismatched[-1]}",
                    flush=True,
                )
            spark.stop()
            flush()
            cluster.close()
            machine = machine_info(shards.binary)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    import pyspark

    machine["pyspark"] = pyspark.__version__
    machine["java"] = _java_version()
    elapsed = time.perf_counter() - started

    m = {k: med(v) for k, v in samples.items()}
    delivered = len(inserts) + len(deletes)
    ratios = {
        "sink_vs_naive": m["query_sink"] / m["query_naive"],
        "sink_cost_vs_cluster_insert": m["cluster_insert"] / m["job_run"],  # time ratio (<= 2 is the goal)
        "sink_nomap_cost_vs_cluster_insert": m["cluster_insert"] / m["job_run_nomap"],
    }
    paired = {
        "sink_vs_naive": [a / b for a, b in zip(samples["query_sink"], samples["query_naive"], strict=True)],
        "sink_cost_vs_cluster_insert": [
            a / b for a, b in zip(samples["cluster_insert"], samples["job_run"], strict=True)
        ],
    }
    us = {k: 1e6 / v for k, v in m.items() if k != "sink_batch_seconds"}  # microseconds per journal message
    spark_fixed = [p["wall_s"] - s for p, s in zip(progress["query_sink"], samples["sink_batch_seconds"], strict=True)]

    def rng(name: str) -> str:
        xs = samples[name]
        return f"{min(xs):>10,.0f} .. {max(xs):<10,.0f}"

    print()
    print(
        f"{frames:,} journal messages ({delivered:,} committed writes: {len(inserts):,} inserts, "
        f"{len(deletes):,} deletes); rates are journal messages/s"
    )
    print(f"{'measurement':<58} {'median':>10} {'us/msg':>8}   {'min .. max':<24}")
    table = [
        ("(a) whole query, ZClusterSink (exactly once)", "query_sink"),
        ("(b) whole query, naive collect + redis-py one by one", "query_naive"),
        ("(c) sink's own work (_Job.run in-process)", "job_run"),
        ("(d) sink's own work, mapper writes nothing", "job_run_nomap"),
        ("(e) Cluster.insert + delete of the same tuples", "cluster_insert"),
    ]
    for label, key in table:
        print(f"{label:<58} {m[key]:>10,.0f} {us[key]:>8.1f}   {rng(key)}")
    print(f"{'sink batch time inside the query (foreachBatch call), s':<58} {m['sink_batch_seconds']:>10.2f}")
    print(f"{'query time outside the sink call (start, offsets, commit), s':<58} {med(spark_fixed):>10.2f}")
    print()
    print("ratios (of medians)                                    value   goal")
    ok1, ok2 = ratios["sink_vs_naive"] >= 5, ratios["sink_cost_vs_cluster_insert"] <= 2
    print(
        f"  (a)/(b) sink query / naive query, msgs/s          {ratios['sink_vs_naive']:>7.2f}   >= 5    "
        f"{'met' if ok1 else 'MISSED'}"
    )
    print(
        f"  (c) vs (e) sink's own time / Cluster.insert time  {ratios['sink_cost_vs_cluster_insert']:>7.2f}   "
        f"<= 2    {'met' if ok2 else 'MISSED'}"
    )
    print(f"  (d) vs (e) decode+sequencing time / insert time   {ratios['sink_nomap_cost_vs_cluster_insert']:>7.2f}")
    for name, xs in paired.items():
        print(f"  paired per-rep {name}: " + ", ".join(f"{x:.2f}" for x in xs))
    print(f"  exactly-once check after every sink query: mismatched keys {mismatched}")
    print(
        f"\nmachine: {machine['nproc']} CPUs, {machine['cpu_model']}, {machine['redis_server']}, "
        f"Python {machine['python']}, PySpark {machine['pyspark']}, load {machine['loadavg'][0]:.2f}; "
        f"run took {elapsed:.0f}s"
    )

    report = {
        "benchmark": "bench/bench_spark.py",
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": machine,
        "config": {
            "messages": frames,
            "requested_messages": args.messages,
            "producers": PRODUCERS,
            "journals": JOURNALS,
            "steps": steps,
            "repeat": args.repeat,
            "partitions": args.partitions,
            "master": "local[2]",
            "shards": 2,
            "committed": traffic.committed,
            "rolled_back": traffic.rolled_back,
            "duplicates": traffic.duplicates,
            "transactions": traffic.transactions,
            "inserts": len(inserts),
            "deletes": len(deletes),
        },
        "units": {
            "query_*": "journal messages/s (query wall time)",
            "job_run*": "journal messages/s",
            "cluster_insert": "journal messages/s (time to write the tuples of that many messages)",
            "sink_batch_seconds": "seconds",
        },
        "samples": samples,
        "medians": m,
        "us_per_message": us,
        "ratios": ratios,
        "paired_ratios": paired,
        "goals": {"sink_vs_naive": ">= 5", "sink_cost_vs_cluster_insert": "<= 2 (time ratio)"},
        "spark_outside_sink_seconds": spark_fixed,
        "queries": progress,
        "mismatched_keys": mismatched,
        "elapsed_s": elapsed,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    stem = "spark-quick" if args.quick else "spark"
    json_path = args.out / f"{stem}.json"
    json_path.write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(f"wrote {json_path}")
    if not args.no_plot:
        png = args.out / f"{stem}.png"
        plot(png, report)
        print(f"wrote {png}")
    return 0


def plot(path: Path, report: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    m, r, cfg = report["medians"], report["ratios"], report["config"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5.2), gridspec_kw={"width_ratios": [2, 3]})
    bars = ax1.bar(
        ["(a) ZClusterSink\nquery", "(b) naive\nforeachBatch"],
        [m["query_sink"] / 1000, m["query_naive"] / 1000],
        color=["#1f77b4", "#d62728"],
    )
    ax1.bar_label(bars, fmt="%.1f")
    ax1.set_ylabel("thousand journal messages/s (median)")
    ax1.set_title("whole query, local[2]")
    names = ["job_run", "job_run_nomap", "cluster_insert"]
    labels = [
        "(c) sink's own work\n(_Job.run)",
        "(d) decode + sequencing\n(no writes)",
        "(e) Cluster.insert\nsame tuples",
    ]
    us = [1e6 / m[k] for k in names]
    bars = ax2.bar(labels, us, color=["#1f77b4", "#6baed6", "#7f7f7f"])
    ax2.bar_label(bars, fmt="%.1f")
    ax2.set_ylabel("microseconds per journal message (median)")
    ax2.set_title("the sink's own cost, without Spark")
    fig.suptitle(
        f"zcluster Spark sink, {cfg['messages']:,} journal messages, median of {cfg['repeat']}, "
        f"{report['machine']['nproc']} CPUs\n(a)/(b) = {r['sink_vs_naive']:.2f} (goal >= 5)   "
        f"(c)/(e) time = {r['sink_cost_vs_cluster_insert']:.2f} (goal <= 2)",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _java_version() -> str:
    import subprocess

    try:
        out = subprocess.run(["java", "-version"], capture_output=True, text=True, check=True)
        return (out.stderr or out.stdout).splitlines()[0]
    except (OSError, subprocess.CalledProcessError, IndexError):
        return ""


if __name__ == "__main__":
    sys.exit(main())
