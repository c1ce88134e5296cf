"""The exactly-once Spark sink against what a user would write by hand, side by side in one run.

One run: two local ``redis-server`` shards (:class:`zcluster.testing.LocalShards`), one ``local[2]``
SparkSession (:func:`zcluster.spark.local_session`), and synthetic timeline traffic
(:func:`zcluster.testing.traffic.publish`: several producers, committed messages, transactions, rolled-back
transactions, duplicated appends) published once into 4 ndjson file journals per workload shape:

* ``many-users``: 20,000 users (``--users``), so the writes spread over that many keys;
* ``hot-key``: the traffic module's default 50 users (``--hot-users``): few, very hot keys.

The journals' bytes are also copied, once, into 4 plain ndjson files (one per journal, byte for byte: the
same lines, ACKs, duplicates and rolled-back messages included) for Spark's own ``text`` source.

Measured for each shape, every query an ``availableNow`` streaming query timed from start to termination,
every write measurement on flushed servers with a fresh query name and checkpoint:

  (a) ``zcluster-journal`` source -> ``ZClusterSink`` (exactly once) -> cluster, through
      ``run_available_now`` (the source's ``rows=ranges``: tasks read the journal ranges themselves; and its
      ``numPartitions`` = the session's cores, as for every query on the source below: 2 tasks for 4 journals);
      afterwards the cluster is compared with the traffic's model (``Traffic.expected()``), mismatched keys
      reported; (a') the same with ``rows=frames`` (every frame through the JVM), for comparison;
  (b) ``zcluster-journal`` source -> a hand-written at-least-once ``foreachBatch`` + ``foreachPartition``:
      per partition, ``json.loads`` each frame, skip ACKs (no "user"), pipelined ZADD/ZREM with redis-py
      (pipelines of 1000), routed to the 2 shards by crc32, no sequencing (duplicates and rolled-back
      messages are written too);
  (c) Spark's ``text`` source over the ndjson copies -> the same hand-written writer (on ``value``);
  (d) ``Cluster.apply`` (or ``insert`` + ``delete``) in this process, no Spark, of exactly the writes the
      sink makes (recorded once with the plain exactly-once consumer, ``zcluster.state.Consumer``, whose
      single run is also reported, for information);
  (e) count only: a ``foreachBatch`` that only calls ``df.count()``, on the ``zcluster-journal`` source
      and on the ``text`` source over the same bytes.

Every kind of query runs once untimed on a small journal set before its first timed run, except (a): the
first query of the session is (a) on the ``many-users`` shape, reported on its own as the start-up cost,
followed at once by the second query of the session, (a) again, which starts the timed repetitions.
Repetitions (``--repeat``) are interleaved (shape after shape, (a) .. (e) in each); medians are reported.
Rates are committed messages/s (every query reads all the journal frames; the frame counts are printed).

Ratios and goals: (a)/(c) >= 1.0, (a)/(d) >= 0.5, (e) source/text >= 1.0 (messages/s), and the first
query of the session over the second, (a), <= 1.5 (time). Results go to ``bench/results/spark.json`` and
``spark.png`` (``--quick``: ``spark-quick.*``, ignored by git).

    python bench/bench_spark.py --quick     # smoke run: 10k committed messages per shape, 1 repetition
    python bench/bench_spark.py             # full run: 100k committed messages per shape, 3 repetitions (~6-10 min)
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import gc
import json
import logging
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench_cluster import machine_info, med

RESULTS = Path(__file__).resolve().parent / "results"
PRODUCERS = 4
JOURNALS = 4
COMMITTED_PER_STEP = 1.29  # committed messages per producer step of traffic.publish's defaults (measured)
PREFIX = "zc:"  # the sink's and the checking Cluster's namespace
PIPELINE = 1000  # commands per redis-py pipeline in the hand-written writer
SMALL_STEPS = 100  # producer steps of the small journal set each query kind is warmed up on
MEASUREMENTS = ("a_sink", "a_frames", "b_source_hand", "c_text_hand", "d_cluster", "e_source_count", "e_text_count")
LABELS = {
    "a_sink": "(a) zcluster-journal -> ZClusterSink (exactly once)",
    "a_frames": "(a') the same with the source's rows=frames",
    "b_source_hand": "(b) zcluster-journal -> hand-written foreachPartition",
    "c_text_hand": "(c) text source -> hand-written foreachPartition",
    "d_cluster": "(d) Cluster.apply of the sink's writes, no Spark",
    "e_source_count": "(e) zcluster-journal, count only",
    "e_text_count": "(e) text source, count only",
}
SHORT = {
    "a_sink": "a",
    "a_frames": "a'",
    "b_source_hand": "b",
    "c_text_hand": "c",
    "d_cluster": "d",
    "e_source_count": "e/source",
    "e_text_count": "e/text",
}
GOALS = {
    "a_over_c": (">=", 1.0),
    "a_over_d": (">=", 0.5),
    "e_source_over_text": (">=", 1.0),
    "a_first_over_second": ("<=", 1.5),
}


# -- the hand-written at-least-once writer (b, c) ------------------------------------------------------------


def hand_written_partition(
    urls: list[str],
    column: str,
    size: int = PIPELINE,
    incr: Callable[[dict[str, Any]], tuple[str, str, int]] | None = None,
) -> Callable[[Any], None]:
    """What a competent user writes for ``foreachPartition``: JSON per row, pipelined ZADD/ZREM, no sequencing.
    With ``incr`` (an event -> its increment's key, member, delta) a ZINCRBY per event instead."""

    def write(rows: Any) -> None:
        import json
        import zlib

        import redis

        clients = [redis.Redis.from_url(u) for u in urls]
        pipes = [c.pipeline(transaction=False) for c in clients]
        pending = [0] * len(pipes)
        n = len(pipes)
        try:
            for row in rows:
                data = row[column]
                if data is None:
                    continue
                doc = json.loads(data)
                user = doc.get("user")
                if user is None:
                    continue  # an ACK: no event in it
                if incr is not None:
                    key, member, delta = incr(doc)
                else:
                    key = f"timeline:{user}"
                i = zlib.crc32(key.encode()) % n
                pipe = pipes[i]
                if incr is not None:
                    pipe.zincrby(key, delta, member)
                elif doc.get("op") == "remove":
                    pipe.zrem(key, str(doc["event"]))
                else:
                    pipe.zadd(key, {str(doc["event"]): float(doc["ts"])})
                pending[i] += 1
                if pending[i] >= size:
                    pipe.execute()
                    pending[i] = 0
            for i, pipe in enumerate(pipes):
                if pending[i]:
                    pipe.execute()
        finally:
            for c in clients:
                c.close()

    return write


def hand_written_batch(
    urls: list[str], column: str, incr: Callable[[dict[str, Any]], tuple[str, str, int]] | None = None
) -> Callable[[Any, int], None]:
    partition = hand_written_partition(urls, column, incr=incr)

    def batch(df: Any, batch_id: int) -> None:
        df.foreachPartition(partition)

    return batch


class Counter:
    """foreachBatch that only counts the batch's rows (on the driver: ``df.count()``)."""

    def __init__(self) -> None:
        self.rows = 0

    def __call__(self, df: Any, batch_id: int) -> None:
        self.rows += df.count()


# -- queries ---------------------------------------------------------------------------------------------------


def _progress(query: Any) -> list[dict[str, Any]]:
    out = []
    for p in getattr(query, "recentProgress", None) or []:
        try:
            d = p if isinstance(p, dict) else json.loads(p.json)
        except Exception:
            try:
                d = {k: p[k] for k in ("batchId", "numInputRows", "durationMs")}
            except Exception:
                continue
        out.append({k: d.get(k) for k in ("batchId", "numInputRows", "durationMs")})
    return out


def stream_query(spark: Any, fmt: str, options: dict[str, str], path: str | None, fn: Any, ckpt: Path) -> Any:
    """One availableNow query of ``fmt`` into foreachBatch ``fn``; returns the terminated query."""
    reader = spark.readStream.format(fmt)
    for k, v in options.items():
        reader = reader.option(k, v)
    df = reader.load(path) if path is not None else reader.load()
    query = df.writeStream.foreachBatch(fn).option("checkpointLocation", str(ckpt)).trigger(availableNow=True).start()
    query.awaitTermination()
    return query


def run_sink_query(spark: Any, zspark: Any, sink: Any, url: str, ckpt: Path, rows: str) -> Any:
    """(a) through the package's own runner, with the source's ``rows`` option."""
    return zspark.run_available_now(spark, sink, url, str(ckpt), rows=rows)


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    gc.collect()
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


# -- workloads -------------------------------------------------------------------------------------------------


@dataclass
class Shape:
    name: str
    users: int
    root: Path
    url: str = ""
    text_dir: str = ""
    traffic: Any = None
    frames: int = 0
    bytes: int = 0
    writes: list[Any] = field(default_factory=list)  # what the sink writes (d)
    consumer_s: float | None = None
    expected: dict[str, Any] = field(default_factory=dict)


def build_shape(name: str, users: int, root: Path, steps: int, seed: int, traffic: Any = None) -> Shape:
    """Publish the traffic into 4 file journals and copy their bytes into 4 ndjson files. ``traffic``: the
    model's class (a :class:`zcluster.testing.traffic.Traffic`, which sees every committed event)."""
    from zcluster.journal import FileJournals
    from zcluster.testing.traffic import Traffic, create_journals, publish

    shape = Shape(name, users, root)
    jdir, tdir = root / "journals", root / "text"
    tdir.mkdir(parents=True)
    store = FileJournals(str(jdir))
    names = [f"timelines/part-{i:03d}" for i in range(JOURNALS)]
    create_journals(store, names)
    model = (traffic or Traffic)(names)
    shape.traffic = publish(store, model, producers=PRODUCERS, messages=steps, users=users, seed=seed)
    for i, n in enumerate(names):
        end = store.end(n)
        data = b"".join(chunk for _, chunk in store.read(n, 0))[:end]
        (tdir / f"part-{i:03d}.ndjson").write_bytes(data)
        shape.frames += data.count(b"\n")
        shape.bytes += len(data)
    close = getattr(store, "close", None)
    if close is not None:
        close()
    shape.url, shape.text_dir = "file://" + str(jdir), str(tdir)
    shape.expected = shape.traffic.expected()
    return shape


def record_writes(shape: Shape, urls: list[str], flush: Callable[[], None]) -> None:
    """The writes the sink makes, recorded once through the same applier in this process (untimed for (d))."""
    try:
        from zcluster import Cluster
        from zcluster.state import Consumer
        from zcluster.testing.traffic import timeline_mapper

        writes: list[Any] = []

        def recording(message: Any) -> Any:
            out = list(timeline_mapper(message))
            writes.extend(out)
            return out

        flush()
        cluster = Cluster.from_urls(urls, prefix=PREFIX)
        try:
            consumer = Consumer(cluster, shape.url, recording, f"bench-record-{shape.name}")
            seconds, _ = timed(consumer.poll)
            getattr(consumer, "close", lambda: None)()
        finally:
            cluster.close()
        shape.writes, shape.consumer_s = writes, seconds
    except Exception:
        print(f"  ! could not record the sink's writes for {shape.name}; (d) skipped:", flush=True)
        traceback.print_exc()
    flush()


def mismatched_keys(cluster: Any, expected: dict[str, list[tuple[str, float]]]) -> int:
    """Keys whose visible members differ from the model, plus visible keys the model does not have."""
    got = cluster.select(list(expected), limit=10**9)
    bad = sum(1 for k, want in expected.items() if [(m.member, m.score) for m in got[k]] != want)
    try:
        for keys in cluster.keys(match="timeline:*"):
            bad += sum(1 for k in keys if k not in expected)
    except Exception as exc:  # the check above still stands; say why this one could not run
        print(f"  ! could not scan the cluster's keys for extra ones: {type(exc).__name__}: {exc}", flush=True)
    return bad


# -- the run ---------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=None, help="committed messages per shape (default 100000)")
    ap.add_argument("--repeat", type=int, default=None, help="repetitions of every measurement (default 3)")
    ap.add_argument("--quick", action="store_true", help="smoke run: 10k messages, 1 repetition (*-quick.* files)")
    ap.add_argument("--users", type=int, default=20_000, help="users of the spread shape (default 20000)")
    ap.add_argument("--hot-users", type=int, default=50, help="users of the hot-key shape (default 50)")
    ap.add_argument("--out", type=Path, default=RESULTS, help="results folder (default bench/results)")
    ap.add_argument("--no-plot", action="store_true", help="skip the PNG")
    ap.add_argument("--module", action="store_true", help="the shards load zcluster's Redis module (results -module)")
    args = ap.parse_args(argv)
    args.messages = args.messages or (10_000 if args.quick else 100_000)
    args.repeat = args.repeat or (1 if args.quick else 3)
    steps = max(1, round(args.messages / (PRODUCERS * COMMITTED_PER_STEP)))
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("zcluster").setLevel(logging.ERROR)
    logging.getLogger("py4j").setLevel(logging.ERROR)

    import zcluster.spark as zspark
    from zcluster import Cluster
    from zcluster.testing import LocalShards
    from zcluster.testing.traffic import timeline_mapper

    sink_class = zspark.ZClusterSink  # the public name only
    started = time.perf_counter()
    root = Path(tempfile.mkdtemp(prefix="zcluster-bench-spark-"))
    seconds: dict[str, dict[str, list[float]]] = {}
    extra: dict[str, dict[str, list[Any]]] = {}
    first: dict[str, Any] = {}
    warm_up_s: dict[str, float] = {}  # each query kind's untimed first run, on the small journal set
    spark = None
    try:
        from zcluster._server_module import loadmodule

        with LocalShards(2, extra=loadmodule() if args.module else []) as shards:
            clients = [s.client() for s in shards.servers]

            def flush() -> None:
                for c in clients:
                    c.flushall()

            def dbsize() -> int:
                return sum(int(c.dbsize()) for c in clients)

            t0 = time.perf_counter()
            shapes = [
                build_shape("many-users", args.users, root / "many-users", steps, seed=0),
                build_shape("hot-key", args.hot_users, root / "hot-key", steps, seed=0),
            ]
            small = build_shape("small", 100, root / "small", SMALL_STEPS, seed=1)
            publish_s = time.perf_counter() - t0
            for s in [*shapes, small]:
                record_writes(s, shards.urls, flush)
            for s in shapes:
                tr = s.traffic
                print(
                    f"{s.name}: {tr.committed:,} committed messages in {s.frames:,} journal frames "
                    f"({s.bytes / 1e6:.1f} MB; {tr.rolled_back:,} rolled back, {tr.duplicates:,} duplicates, "
                    f"{tr.transactions:,} transactions) over {len(s.expected):,} keys ({s.users:,} users); "
                    f"the sink writes {len(s.writes):,} tuples",
                    flush=True,
                )
            print(f"published in {publish_s:.1f}s; {args.repeat} repetitions, local[2], 2 shards", flush=True)
            for s in shapes:
                seconds[s.name] = {m: [] for m in MEASUREMENTS}
                extra[s.name] = {
                    "mismatched_a": [],
                    "mismatched_d": [],
                    "queries_a": [],
                    "dbsize_b": [],
                    "dbsize_c": [],
                    "rows_e_source": [],
                    "rows_e_text": [],
                }
            cluster = Cluster.from_urls(shards.urls, prefix=PREFIX)
            getattr(cluster, "load_scripts", lambda: None)()
            apply_writes = _apply_function(cluster)

            session_s, spark = timed(lambda: _session(zspark))
            print(f"SparkSession started in {session_s:.1f}s", flush=True)
            cores = str(spark.sparkContext.defaultParallelism)  # the source's numPartitions, as its docs advise
            ckpts = root / "checkpoints"
            counter = [0]

            def fresh(tag: str) -> tuple[str, Path]:
                counter[0] += 1
                return f"bench-{tag}-{counter[0]}", ckpts / f"{tag}-{counter[0]}"

            def query_a(s: Shape, rows: str = "ranges") -> tuple[float, dict[str, Any]]:
                flush()
                name, ckpt = fresh(f"a-{rows}-{s.name}")
                sink = sink_class(shards.urls, timeline_mapper, name, journals=s.url, prefix=PREFIX)
                wall, query = timed(lambda: run_sink_query(spark, zspark, sink, s.url, ckpt, rows))
                batch_s = [getattr(b, "seconds", None) for b in getattr(sink, "history", [])]
                info = {"wall_s": wall, "batch_seconds": batch_s, "progress": _progress(query)}
                info["mismatched"] = mismatched_keys(cluster, s.expected)
                return wall, info

            def query_hand(s: Shape, text: bool) -> float:
                flush()
                tag = ("c-" if text else "b-") + s.name
                _, ckpt = fresh(tag)
                if text:
                    fn = hand_written_batch(shards.urls, "value")
                    wall, _ = timed(lambda: stream_query(spark, "text", {}, s.text_dir, fn, ckpt))
                else:
                    fn = hand_written_batch(shards.urls, "data")
                    wall, _ = timed(
                        lambda: stream_query(
                            spark, "zcluster-journal", {"journals": s.url, "numPartitions": cores}, None, fn, ckpt
                        )
                    )
                return wall

            def query_count(s: Shape, text: bool) -> tuple[float, int]:
                _, ckpt = fresh(("e-text-" if text else "e-source-") + s.name)
                fn = Counter()
                if text:
                    wall, _ = timed(lambda: stream_query(spark, "text", {}, s.text_dir, fn, ckpt))
                else:
                    wall, _ = timed(
                        lambda: stream_query(
                            spark, "zcluster-journal", {"journals": s.url, "numPartitions": cores}, None, fn, ckpt
                        )
                    )
                return wall, fn.rows

            def cluster_d(s: Shape) -> tuple[float, int]:
                flush()
                wall, _ = timed(lambda: apply_writes(s.writes))
                return wall, mismatched_keys(cluster, s.expected)

            # The first query of the session: (a) on the first shape, the start-up cost.
            wall, info = query_a(shapes[0])
            first = {"shape": shapes[0].name, "seconds": wall, **info}
            print(
                f"  first query of the session, (a) {shapes[0].name}: {wall:.1f}s, "
                f"mismatched keys {info['mismatched']}",
                flush=True,
            )
            warmed = {"a_sink"}

            def warm(kind: str) -> None:
                """Run ``kind`` once on the small journal set (its wall time kept: that kind's first-run cost)."""
                if kind in warmed:
                    return
                warmed.add(kind)
                t = time.perf_counter()
                if kind == "a_frames":
                    query_a(small, "frames")
                elif kind == "b_source_hand":
                    query_hand(small, text=False)
                elif kind == "c_text_hand":
                    query_hand(small, text=True)
                elif kind == "e_source_count":
                    query_count(small, text=False)
                elif kind == "e_text_count":
                    query_count(small, text=True)
                elif kind == "d_cluster" and small.writes:
                    cluster_d(small)
                warm_up_s[kind] = time.perf_counter() - t

            for rep in range(args.repeat):
                for s in shapes:
                    sec, ext = seconds[s.name], extra[s.name]
                    wall, info = query_a(s)  # rep 0, first shape: the second query of the session
                    sec["a_sink"].append(wall)
                    ext["mismatched_a"].append(info["mismatched"])
                    ext["queries_a"].append(info)
                    warm("a_frames")
                    wall, info = query_a(s, "frames")
                    sec["a_frames"].append(wall)
                    ext["mismatched_a"].append(info["mismatched"])
                    warm("b_source_hand")
                    sec["b_source_hand"].append(query_hand(s, text=False))
                    ext["dbsize_b"].append(dbsize())
                    warm("c_text_hand")
                    sec["c_text_hand"].append(query_hand(s, text=True))
                    ext["dbsize_c"].append(dbsize())
                    if s.writes:
                        warm("d_cluster")
                        wall, bad = cluster_d(s)
                        sec["d_cluster"].append(wall)
                        ext["mismatched_d"].append(bad)
                    warm("e_source_count")
                    wall, rows = query_count(s, text=False)
                    sec["e_source_count"].append(wall)
                    ext["rows_e_source"].append(rows)
                    warm("e_text_count")
                    wall, rows = query_count(s, text=True)
                    sec["e_text_count"].append(wall)
                    ext["rows_e_text"].append(rows)
                    print(
                        f"  rep {rep + 1}/{args.repeat} {s.name:<10} "
                        + "  ".join(f"{SHORT[m]}={sec[m][-1]:.2f}s" for m in MEASUREMENTS if sec[m])
                        + f"  mismatched keys (a)={ext['mismatched_a'][-1]}"
                        + (f" (d)={ext['mismatched_d'][-1]}" if ext["mismatched_d"] else ""),
                        flush=True,
                    )
            spark.stop()
            spark = None
            flush()
            cluster.close()
            machine = machine_info(shards.binary)
    finally:
        if spark is not None:
            with contextlib.suppress(Exception):
                spark.stop()
        shutil.rmtree(root, ignore_errors=True)
    import pyspark

    machine["pyspark"] = pyspark.__version__
    machine["java"] = _java_version()
    elapsed = time.perf_counter() - started
    report = summarize(args, shapes, seconds, extra, first, session_s, publish_s, machine, elapsed, steps)
    report["warm_up"] = {"frames": small.frames, "committed": small.traffic.committed, "seconds": warm_up_s}
    print_report(report)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = ("spark-quick" if args.quick else "spark") + ("-module" if args.module else "")
    json_path = args.out / f"{stem}.json"
    json_path.write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(f"wrote {json_path}")
    if not args.no_plot:
        png = args.out / f"{stem}.png"
        plot(png, report)
        print(f"wrote {png}")
    return 0


def _session(zspark: Any) -> Any:
    conf = {"spark.ui.showConsoleProgress": "false"}
    try:
        return zspark.local_session("local[2]", app="zcluster-bench", **conf)
    except TypeError:
        return zspark.local_session("local[2]")


def _apply_function(cluster: Any) -> Callable[[list[Any]], None]:
    """``Cluster.apply`` when there is one, else ``insert`` + ``delete`` of the same writes."""
    if hasattr(cluster, "apply"):
        return lambda writes: cluster.apply(writes)
    from zcluster import Delete

    def split(writes: list[Any]) -> None:
        cluster.insert([w for w in writes if not isinstance(w, Delete)])
        cluster.delete([w for w in writes if isinstance(w, Delete)])

    return split


# -- the report ------------------------------------------------------------------------------------------------


def _ratio(x: float | None, y: float | None) -> float | None:
    if not x or not y or x != x or y != y:
        return None
    return x / y


def _paired(num: list[float], den: list[float]) -> list[float]:
    return [d / n for n, d in zip(num, den, strict=False) if n and d]  # seconds in: a rate ratio out


def _breakdown(queries: list[dict[str, Any]]) -> dict[str, float | None]:
    """Medians over the (a) queries: wall, Spark's trigger time, addBatch (the foreachBatch call), the sink's
    own batch time, and the rest (query start and stop, outside any trigger)."""
    parts: dict[str, list[float]] = {"wall": [], "trigger": [], "add_batch": [], "sink_call": [], "outside": []}
    for q in queries:
        durations = [p.get("durationMs") or {} for p in q.get("progress", [])]
        trigger = sum(d.get("triggerExecution", 0) for d in durations) / 1000
        parts["wall"].append(q["wall_s"])
        parts["trigger"].append(trigger)
        parts["add_batch"].append(sum(d.get("addBatch", 0) for d in durations) / 1000)
        calls = [b for b in q.get("batch_seconds", []) if b is not None]
        if calls:
            parts["sink_call"].append(sum(calls))
        parts["outside"].append(q["wall_s"] - trigger)
    return {k: (med(v) if v else None) for k, v in parts.items()}


def summarize(
    args: Any,
    shapes: list[Shape],
    seconds: dict[str, dict[str, list[float]]],
    extra: dict[str, dict[str, list[Any]]],
    first: dict[str, Any],
    session_s: float,
    publish_s: float,
    machine: dict[str, Any],
    elapsed: float,
    steps: int,
) -> dict[str, Any]:
    per_shape: dict[str, Any] = {}
    for s in shapes:
        sec = seconds[s.name]
        med_s = {m: (med(v) if v else None) for m, v in sec.items()}
        rate = {m: (s.traffic.committed / v if v else None) for m, v in med_s.items()}
        frames_rate = {m: (s.frames / v if v else None) for m, v in med_s.items()}
        ratios = {
            "a_over_c": _ratio(rate["a_sink"], rate["c_text_hand"]),
            "a_over_d": _ratio(rate["a_sink"], rate["d_cluster"]),
            "e_source_over_text": _ratio(rate["e_source_count"], rate["e_text_count"]),
            "a_over_b": _ratio(rate["a_sink"], rate["b_source_hand"]),
            "a_over_a_frames": _ratio(rate["a_sink"], rate["a_frames"]),
            "b_over_c": _ratio(rate["b_source_hand"], rate["c_text_hand"]),
        }
        paired = {
            "a_over_c": _paired(sec["a_sink"], sec["c_text_hand"]),
            "a_over_d": _paired(sec["a_sink"], sec["d_cluster"]),
            "e_source_over_text": _paired(sec["e_source_count"], sec["e_text_count"]),
        }
        per_shape[s.name] = {
            "users": s.users,
            "keys": len(s.expected),
            "committed": s.traffic.committed,
            "frames": s.frames,
            "bytes": s.bytes,
            "rolled_back": s.traffic.rolled_back,
            "duplicates": s.traffic.duplicates,
            "transactions": s.traffic.transactions,
            "sink_writes": len(s.writes),
            "seconds": sec,
            "median_seconds": med_s,
            "messages_per_s": rate,
            "frames_per_s": frames_rate,
            "ratios": ratios,
            "paired_ratios": paired,
            "a_breakdown_s": _breakdown(extra[s.name]["queries_a"]),
            "consumer_seconds": s.consumer_s,
            "consumer_messages_per_s": s.traffic.committed / s.consumer_s if s.consumer_s else None,
            **extra[s.name],
        }
    a0 = seconds[first["shape"]]["a_sink"] if first else []
    second = a0[0] if a0 else None
    startup = {
        "session_start_s": session_s,
        "first_query_s": first.get("seconds"),
        "second_query_s": second,
        "median_a_s": med(a0) if a0 else None,
        "a_first_over_second": _ratio(first.get("seconds"), second),
        "a_first_over_median": _ratio(first.get("seconds"), med(a0) if a0 else None),
        "first_query": first,
    }
    return {
        "benchmark": "bench/bench_spark.py",
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": machine,
        "config": {
            "messages": args.messages,
            "repeat": args.repeat,
            "quick": args.quick,
            "producers": PRODUCERS,
            "journals": JOURNALS,
            "steps": steps,
            "master": "local[2]",
            "shards": 2,
            "pipeline": PIPELINE,
            "prefix": PREFIX,
            "publish_s": publish_s,
        },
        "units": {
            "seconds": "query wall time, start to termination (d: the apply call)",
            "messages_per_s": "committed messages / median seconds",
            "frames_per_s": "journal frames (ndjson lines) / median seconds",
            "ratios": "of messages/s medians (a_first_over_second: of seconds)",
        },
        "labels": LABELS,
        "goals": {k: f"{op} {v}" for k, (op, v) in GOALS.items()},
        "shapes": per_shape,
        "startup": startup,
        "elapsed_s": elapsed,
    }


def _verdict(name: str, value: float | None) -> str:
    if value is None:
        return "n/a"
    op, goal = GOALS[name]
    ok = value >= goal if op == ">=" else value <= goal
    return "met" if ok else "MISSED"


def print_report(report: dict[str, Any]) -> None:
    shapes = report["shapes"]
    names = list(shapes)
    print()
    print(
        "median query wall time (s) and committed messages/s; "
        + "; ".join(f"{n}: {shapes[n]['committed']:,} messages, {shapes[n]['frames']:,} frames" for n in names)
    )
    head = "".join(f" {n + ' s':>13} {n + ' msg/s':>16}" for n in names)
    print(f"{'measurement':<54}{head}")
    for m in MEASUREMENTS:
        cells = ""
        for n in names:
            s, r = shapes[n]["median_seconds"][m], shapes[n]["messages_per_s"][m]
            cells += f" {s:>13.2f} {r:>16,.0f}" if s else f" {'-':>13} {'-':>16}"
        print(f"{LABELS[m]:<54}{cells}")
    cells = ""
    for n in names:
        c = shapes[n]["consumer_seconds"]
        cells += f" {c:>13.2f} {shapes[n]['committed'] / c:>16,.0f}" if c else f" {'-':>13} {'-':>16}"
    print(f"{'(info) zcluster.state.Consumer, no Spark, 1 run':<54}{cells}")
    st = report["startup"]
    print()
    nan = float("nan")
    print(
        f"start-up: SparkSession {st['session_start_s']:.1f}s; first query of the session, (a) "
        f"{st['first_query']['shape'] if st['first_query'] else '?'}: {st['first_query_s'] or nan:.2f}s; "
        f"second query (a): {st['second_query_s'] or nan:.2f}s; median (a): {st['median_a_s'] or nan:.2f}s"
    )
    print()
    print(f"{'ratios (of medians, messages/s)':<44}" + "".join(f"{n:>12}" for n in names) + "    goal")
    rows = [
        ("a_over_c", "(a)/(c) sink / text + hand-written"),
        ("a_over_d", "(a)/(d) sink / Cluster.apply"),
        ("e_source_over_text", "(e) source count / text count"),
        ("a_over_b", "(a)/(b) sink / source + hand-written"),
        ("a_over_a_frames", "(a)/(a') rows=ranges / rows=frames"),
        ("b_over_c", "(b)/(c) source / text, hand-written"),
    ]
    for key, label in rows:
        vals = [shapes[n]["ratios"][key] for n in names]
        cells = "".join(f"{v:>12.2f}" if v is not None else f"{'n/a':>12}" for v in vals)
        goal = ""
        if key in GOALS:
            op, g = GOALS[key]
            goal = f"    {op} {g}  " + " ".join(_verdict(key, v) for v in vals)
        print(f"  {label:<42}{cells}{goal}")
    v = st["a_first_over_second"]
    print(
        f"  {'(a) first / second query of the session (time)':<54}{v if v is not None else float('nan'):>12.2f}"
        f"    <= 1.5  {_verdict('a_first_over_second', v)}   (first / median (a): "
        f"{st['a_first_over_median'] or float('nan'):.2f})"
    )
    for n in names:
        p = shapes[n]["paired_ratios"]
        print(
            f"  paired per repetition, {n}: "
            + "; ".join(f"{k} " + ", ".join(f"{x:.2f}" for x in xs) for k, xs in p.items())
        )
    print()
    for n in names:
        b = shapes[n]["a_breakdown_s"]
        print(
            f"(a) {n}, median s: wall {b['wall'] or nan:.2f} = Spark triggers {b['trigger'] or nan:.2f} "
            f"(addBatch {b['add_batch'] or nan:.2f}, of which the sink's call {b['sink_call'] or nan:.2f}) "
            f"+ query start/stop outside triggers {b['outside'] or nan:.2f}"
        )
    for n in names:
        sh = shapes[n]
        print(
            f"exactly once ({n}): mismatched keys after every (a) {sh['mismatched_a']}, after every (d) "
            f"{sh['mismatched_d']}; rows counted (e) source {sh['rows_e_source']} text {sh['rows_e_text']} "
            f"(frames {sh['frames']}); Redis keys after (b) {sh['dbsize_b']} (c) {sh['dbsize_c']}"
        )
    w = report.get("warm_up")
    if w:
        print(
            f"untimed warm-up runs, {w['frames']:,} frames each (each kind's first run in the session): "
            + "  ".join(f"{SHORT[k]}={v:.2f}s" for k, v in w["seconds"].items())
        )
    print("\n" + machine_line(report))


def machine_line(report: dict[str, Any]) -> str:
    """The machine a report was measured on, and how long the run took, in one line."""
    mach = report["machine"]
    return (
        f"machine: {mach['nproc']} CPUs, {mach['cpu_model']}, {mach['redis_server']}, Python {mach['python']}, "
        f"PySpark {mach['pyspark']}, {mach['java']}, load {mach['loadavg'][0]:.2f}; run took {report['elapsed_s']:.0f}s"
    )


def plot(path: Path, report: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shapes = report["shapes"]
    names = list(shapes)
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(17, 5.6), gridspec_kw={"width_ratios": [5, 3, 2]})
    short = [
        "(a) sink",
        "(a') sink,\nframes",
        "(b) source\n+ hand",
        "(c) text\n+ hand",
        "(d) Cluster\n.apply",
        "(e) source\ncount",
        "(e) text\ncount",
    ]
    width = 0.8 / len(names)
    colors = ["#1f77b4", "#ff7f0e"]
    for i, n in enumerate(names):
        vals = [(shapes[n]["messages_per_s"][m] or 0) / 1000 for m in MEASUREMENTS]
        xs = [j + (i - (len(names) - 1) / 2) * width for j in range(len(MEASUREMENTS))]
        bars = ax1.bar(xs, vals, width, label=f"{n} ({shapes[n]['keys']:,} keys)", color=colors[i % 2])
        ax1.bar_label(bars, fmt="%.3g", fontsize=7)
    ax1.set_xticks(range(len(MEASUREMENTS)), short, fontsize=8)
    ax1.set_yscale("log")
    ax1.set_ylabel("thousand committed messages/s (median, log)")
    ax1.set_title("availableNow query, start to termination; (d) in-process")
    ax1.legend(fontsize=8)

    keys = ["a_over_c", "a_over_d", "e_source_over_text"]
    for i, n in enumerate(names):
        vals = [shapes[n]["ratios"][k] or 0 for k in keys]
        xs = [j + (i - (len(names) - 1) / 2) * width for j in range(len(keys))]
        bars = ax2.bar(xs, vals, width, color=colors[i % 2], label=n)
        ax2.bar_label(bars, fmt="%.2f", fontsize=8)
    for j, k in enumerate(keys):
        goal = GOALS[k][1]
        ax2.hlines(goal, j - 0.45, j + 0.45, colors="k", linestyles="--", linewidth=1)
    ax2.set_xticks(
        range(len(keys)), ["(a)/(c)\ngoal >= 1", "(a)/(d)\ngoal >= 0.5", "(e) source/text\ngoal >= 1"], fontsize=8
    )
    ax2.set_title("ratios of messages/s (dashed: goal)")
    top = max([1.0] + [shapes[n]["ratios"][k] or 0 for n in names for k in keys])
    ax2.set_ylim(0, top * 1.3)
    ax2.legend(fontsize=8, loc="upper center", ncols=len(names))

    st = report["startup"]
    vals = [st["session_start_s"] or 0, st["first_query_s"] or 0, st["second_query_s"] or 0]
    bars = ax3.bar(
        ["session\nstart", "1st query\n(a)", "2nd query\n(a)"], vals, color=["#7f7f7f", "#d62728", "#1f77b4"]
    )
    ax3.bar_label(bars, fmt="%.1f")
    ax3.set_ylabel("seconds")
    r = st["a_first_over_second"]
    ax3.set_title(f"start-up: first/second = {r if r is not None else float('nan'):.2f} (goal <= 1.5)", fontsize=9)

    cfg = report["config"]
    save_figure(
        fig,
        path,
        f"zcluster Spark sink vs hand-written writers, local[2], 2 shards, {cfg['messages']:,} committed messages "
        f"per shape, median of {cfg['repeat']}, {report['machine']['nproc']} CPUs",
    )


def save_figure(fig: Any, path: Path, title: str) -> None:
    """Title, lay out, write and close a figure, as every Spark benchmark's plot does."""
    import matplotlib.pyplot as plt

    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _java_version() -> str:
    try:
        out = subprocess.run(["java", "-version"], capture_output=True, text=True, check=True)
        return (out.stderr or out.stdout).splitlines()[0]
    except (OSError, subprocess.CalledProcessError, IndexError):
        return ""


if __name__ == "__main__":
    sys.exit(main())
