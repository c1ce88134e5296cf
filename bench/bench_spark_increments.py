"""Exactly-once increments through the Spark sink against a hand-written at-least-once ZINCRBY writer.

The issue's goal: "Through the sink at 500k messages (4 journals, local[2]): exactly-once increments >= 1.0x a
hand-written at-least-once foreachBatch doing pipelined ZINCRBY on Spark's text source over the same messages."

One run, as :mod:`bench_spark` (whose helpers it uses): two local ``redis-server`` shards, one ``local[2]``
SparkSession, the traffic module's timeline events (4 producers, committed messages, transactions, rolled-back
transactions, duplicated appends) published once into 4 ndjson file journals per shape, and copied byte for byte
into 4 plain ndjson files for Spark's ``text`` source. Every message is one increment (:func:`board_incr`): key
``board:<user>``, member ``item<ts mod 50>``, delta 1..9 taken from the event's timestamp (-1 for a removal):

* ``hot``: the traffic's 50 users (``--hot-users``): 50 leaderboards, every increment on one of them;
* ``spread``: 20,000 users (``--users``): the increments spread over 20,000 keys.

Measured per shape, every query an ``availableNow`` streaming query timed from start to termination, from
FLUSHALL with a fresh query name and checkpoint, the two kinds alternating (order swapped every repetition):

  (a) ``zcluster-journal`` source -> ``ZClusterSink`` with an ``Incr`` mapper (exactly once), through
      ``run_available_now`` (``rows=ranges``, ``numPartitions`` = the session's 2 cores). After every (a) the
      totals are compared with the model, which the publisher builds from exactly the events it committed (no
      journal read, no Sequencer): any difference, or any extra key, stops the benchmark (exit status 1);
  (c) Spark's ``text`` source over the ndjson copies -> ``foreachBatch`` + ``foreachPartition``: per partition
      ``json.loads`` each line, skip ACKs, pipelined ZINCRBY with redis-py (pipelines of 1000), routed to the 2
      shards by crc32, no sequencing (:func:`bench_spark.hand_written_partition`): duplicates and rolled-back
      messages count too, so its totals are wrong; how many is reported.

The positioned sink (:class:`zcluster.spark.PositionedSink`, for rows with a partition and an offset) on the
``zcluster-journal`` source's frame rows (``rows=frames``, ``numPartitions`` 2; ``journal`` as the partition,
``begin`` as the offset), one ``Incr`` per frame holding an event (every row is a message there: duplicates and
rolled-back messages count, as in (c); its totals are compared with that model after every run):

  (p) the sink: it brings each partition's rows of a batch into one task (a repartition by the partition column),
      so it is exact however Spark cuts a batch;
  (q) the sink as it was before that (its task function through ``mapInArrow`` on the batch as Spark cut it):
      exact here only because this source never splits a journal over tasks; the cost without the shuffle;
  (r) (q) after the user's own ``df.repartition("partition")``: what a user had to write to be exact on a
      source that splits a partition (the JSON file source, Kafka's ``minPartitions``);
  (s) (p) with ``publish=`` (a file journal store) and the same mapper, which publishes nothing: each partition's
      rows of a batch are a consumer transaction (a claim, a fenced checkpoint per partition; rows below it
      skipped), the machinery a publishing application pays per batch beside its messages. (s)/(p) is its cost.

``--frames-per-trigger N`` bounds each micro-batch (the source's ``maxFramesPerTrigger``) for (p), (q), (r), (s),
so a per-batch cost shows beside the per-row one (about frames / N batches per query). ``--kinds`` picks the
kinds run (default: all). Each kind runs once untimed on a small journal set first.
Rates are committed messages/s (every query reads every frame). Goal: (a)/(c) >= 1.0 at both shapes (of median
messages/s). Results go to ``bench/results/spark-increments.json`` and ``.png`` (``--quick``:
``spark-increments-quick.*``, ignored by git unless a text quotes it; a subset of ``--kinds`` without (a) and
(c): ``spark-increments-<kinds' letters>[-fpt<N>][-quick].json``, no plot).

    python bench/bench_spark_increments.py --quick   # 100k committed messages per shape, 3 repetitions (~1-2 min)
    python bench/bench_spark_increments.py           # 500k per shape, 3 repetitions (~4 min)
    python bench/bench_spark_increments.py --quick --kinds p_sink,q_unshuffled,r_user_repartition
    python bench/bench_spark_increments.py --quick --kinds p_sink,s_publishing --frames-per-trigger 5000
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import logging
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import bench_spark as bs
from bench_cluster import machine_info, med

from zcluster import Incr
from zcluster.testing.traffic import Traffic

RESULTS = Path(__file__).resolve().parent / "results"
MEMBERS = 50  # members per leaderboard: item<ts mod 50>
KINDS = ("a_sink", "c_text_hand", "p_sink", "q_unshuffled", "r_user_repartition", "s_publishing")
LABELS = {
    "a_sink": "(a) zcluster-journal -> ZClusterSink, Incr (exactly once)",
    "c_text_hand": "(c) text source -> hand-written pipelined ZINCRBY",
    "p_sink": "(p) frames -> PositionedSink (shuffles by partition)",
    "q_unshuffled": "(q) frames -> PositionedSink's tasks, no shuffle",
    "r_user_repartition": "(r) frames -> repartition(partition) -> (q)",
    "s_publishing": "(s) (p) with publish=: a transaction per partition",
}
POSITIONED = ("p_sink", "q_unshuffled", "r_user_repartition", "s_publishing")
GOAL = 1.0  # (a)/(c), of messages/s


def board_incr(doc: dict[str, Any]) -> tuple[str, str, int]:
    """An event's increment (key, member, delta): the one rule of the sink's mapper, the hand-written writer and
    the model. Integer deltas, so totals are exact whatever order they are added in."""
    ts = doc["ts"]
    delta = -1 if doc["op"] == "remove" else 1 + int(ts * 1000) % 9
    return f"board:{doc['user']}", f"item{int(ts) % MEMBERS}", delta


def row_mapper(row: dict[str, Any]) -> list[Any]:
    """The positioned sink's mapper: a frame row's event as one :class:`zcluster.Incr` (an ACK: none)."""
    doc = json.loads(row["data"])
    return [Incr(*board_incr(doc))] if doc.get("user") is not None else []


def every_frame(text_dir: str) -> dict[str, dict[str, int]]:
    """The positioned sink's model: every frame's event counted (duplicates and rolled-back ones too)."""
    totals: dict[str, dict[str, int]] = {}
    for path in sorted(Path(text_dir).iterdir()):
        for line in path.read_text().splitlines():
            doc = json.loads(line)
            if doc.get("user") is not None:
                key, member, delta = board_incr(doc)
                board = totals.setdefault(key, {})
                board[member] = board.get(member, 0) + delta
    return totals


def board_mapper(message: Any) -> list[Any]:
    """The sink's mapper: one :class:`zcluster.Incr` per committed event."""
    return [Incr(*board_incr(message.doc))]


@dataclass
class Boards(Traffic):
    """The traffic's model plus the totals of every committed event's increment (the publisher calls
    :meth:`apply` once per committed event, in commit order; never for a duplicate or a rolled-back one)."""

    totals: dict[str, dict[str, int]] = field(default_factory=dict)

    def apply(self, doc: dict[str, Any]) -> None:
        super().apply(doc)
        key, member, delta = board_incr(doc)
        board = self.totals.setdefault(key, {})
        board[member] = board.get(member, 0) + delta


def differences(got: dict[str, dict[str, float]], want: dict[str, dict[str, int]]) -> list[str]:
    """Every total where ``got`` (key -> member -> total) differs from the model ``want``, as a line each."""
    bad = [
        f"{key} {member}: {got.get(key, {}).get(member)} != {total}"
        for key, board in want.items()
        for member, total in board.items()
        if got.get(key, {}).get(member) != total
    ]
    bad += [
        f"{key} {member}: extra" for key, board in got.items() for member in board if member not in want.get(key, {})
    ]
    return bad


def sink_totals(cluster: Any, keys: list[str]) -> dict[str, dict[str, float]]:
    """The totals the sink wrote, read with the library (every member of every board), and every other key."""
    got = {k: {str(e.member): e.score for e in entries} for k, entries in cluster.select(keys, limit=10**6).items()}
    for batch in cluster.keys(match="board:*"):
        for k in batch:
            got.setdefault(str(k), {"<unexpected key>": 0.0})
    return {k: v for k, v in got.items() if v}


def plain_totals(clients: list[Any], keys: list[str]) -> dict[str, dict[str, float]]:
    """The totals the hand-written writer left (plain sorted sets, routed by crc32 as it routes them)."""
    import zlib

    out = {}
    for k in keys:
        entries = clients[zlib.crc32(k.encode()) % len(clients)].zrange(k, 0, -1, withscores=True)
        out[k] = {m.decode(): s for m, s in entries}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=None, help="committed messages per shape (default 500000)")
    ap.add_argument("--repeat", type=int, default=3, help="repetitions of every measurement (default 3)")
    ap.add_argument("--quick", action="store_true", help="100k messages per shape (*-quick.* files)")
    ap.add_argument("--users", type=int, default=20_000, help="keys of the spread shape (default 20000)")
    ap.add_argument("--hot-users", type=int, default=50, help="keys of the hot shape (default 50)")
    ap.add_argument("--out", type=Path, default=RESULTS, help="results folder (default bench/results)")
    ap.add_argument("--no-plot", action="store_true", help="skip the PNG (drawn when (a) and (c) both run)")
    ap.add_argument("--kinds", default=",".join(KINDS), help="the kinds to run, comma-separated (default: all)")
    ap.add_argument("--frames-per-trigger", type=int, default=None, help="maxFramesPerTrigger of (p), (q), (r), (s)")
    args = ap.parse_args(argv)
    kinds = tuple(k for k in KINDS if k in args.kinds.split(","))
    if not kinds or set(args.kinds.split(",")) - set(KINDS):
        ap.error(f"--kinds: a comma-separated subset of {','.join(KINDS)}")
    args.messages = args.messages or (100_000 if args.quick else 500_000)
    steps = max(1, round(args.messages / (bs.PRODUCERS * bs.COMMITTED_PER_STEP)))
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("zcluster").setLevel(logging.ERROR)
    logging.getLogger("py4j").setLevel(logging.ERROR)

    from pyspark import cloudpickle

    import zcluster.spark as zspark
    from zcluster import Cluster
    from zcluster.spark.observe import TASK_SCHEMA, add_rows
    from zcluster.state.batch import BatchStats
    from zcluster.testing import LocalShards

    # The hand-written writer is bench_spark's: executors cannot import that module, so it travels by value.
    cloudpickle.register_pickle_by_value(bs)
    started = time.perf_counter()
    root = Path(tempfile.mkdtemp(prefix="zcluster-bench-spark-incr-"))
    seconds: dict[str, dict[str, list[float]]] = {}
    wrong_c: dict[str, list[int]] = {}
    warm_up_s: dict[str, float] = {}
    spark = None
    try:
        with LocalShards(2) as shards:
            clients = [s.client() for s in shards.servers]

            def flush() -> None:
                for c in clients:
                    c.flushall()

            t0 = time.perf_counter()
            shapes = [
                bs.build_shape("hot", args.hot_users, root / "hot", steps, seed=0, traffic=Boards),
                bs.build_shape("spread", args.users, root / "spread", steps, seed=0, traffic=Boards),
            ]
            small = bs.build_shape("small", 100, root / "small", bs.SMALL_STEPS, seed=1, traffic=Boards)
            publish_s = time.perf_counter() - t0
            for s in shapes:
                tr = s.traffic
                members = sum(len(b) for b in tr.totals.values())
                print(
                    f"{s.name}: {tr.committed:,} committed messages in {s.frames:,} journal frames "
                    f"({s.bytes / 1e6:.1f} MB; {tr.rolled_back:,} rolled back, {tr.duplicates:,} duplicates, "
                    f"{tr.transactions:,} transactions): {len(tr.totals):,} keys, {members:,} totals",
                    flush=True,
                )
                seconds[s.name] = {k: [] for k in kinds}
                wrong_c[s.name] = []
            print(f"published in {publish_s:.1f}s; {args.repeat} repetitions, local[2], 2 shards", flush=True)
            cluster = Cluster.from_urls(shards.urls, prefix=bs.PREFIX)
            session_s, spark = bs.timed(lambda: bs._session(zspark))
            ckpts, counter = root / "checkpoints", [0]

            def fresh(tag: str) -> tuple[str, Path]:
                counter[0] += 1
                return f"bench-incr-{tag}-{counter[0]}", ckpts / f"{tag}-{counter[0]}"

            def query_a(s: bs.Shape) -> float:
                flush()
                name, ckpt = fresh(f"a-{s.name}")
                sink = zspark.ZClusterSink(shards.urls, board_mapper, name, journals=s.url, prefix=bs.PREFIX)
                wall, _ = bs.timed(lambda: bs.run_sink_query(spark, zspark, sink, s.url, ckpt, "ranges"))
                bad = differences(sink_totals(cluster, list(s.traffic.totals)), s.traffic.totals)
                if bad:
                    raise SystemExit(
                        f"(a) {s.name}: {len(bad)} totals differ from the model (exactly once broken?), e.g. "
                        + "; ".join(bad[:5])
                    )
                return wall

            def query_c(s: bs.Shape) -> float:
                flush()
                _, ckpt = fresh(f"c-{s.name}")
                fn = bs.hand_written_batch(shards.urls, "value", incr=board_incr)
                wall, _ = bs.timed(lambda: bs.stream_query(spark, "text", {}, s.text_dir, fn, ckpt))
                keys = list(s.traffic.totals)
                wrong_c.setdefault(s.name, []).append(len(differences(plain_totals(clients, keys), s.traffic.totals)))
                return wall

            models = {s.name: every_frame(s.text_dir) for s in [*shapes, small]}
            bounded = {"maxFramesPerTrigger": str(args.frames_per_trigger)} if args.frames_per_trigger else {}

            def query_p(s: bs.Shape, kind: str) -> float:
                flush()
                name, ckpt = fresh(f"{kind}-{s.name}")
                publish = f"file://{root / 'published' / name}" if kind == "s_publishing" else None
                sink = zspark.PositionedSink(shards.urls, row_mapper, name, prefix=bs.PREFIX, publish=publish)

                def today(df: Any, batch_id: int) -> None:  # the sink's __call__ before the shuffle
                    if kind == "r_user_repartition":
                        df = df.repartition("partition")
                    add_rows(BatchStats(), df.mapInArrow(sink.job.run, TASK_SCHEMA).collect())

                stream = (
                    spark.readStream.format("zcluster-journal")
                    .option("journals", s.url)
                    .option("rows", "frames")
                    .option("numPartitions", "2")
                    .options(**bounded)
                    .load()
                    .withColumnRenamed("journal", "partition")
                    .withColumnRenamed("begin", "offset")
                )

                def go() -> None:
                    q = (
                        stream.writeStream.foreachBatch(sink if kind in ("p_sink", "s_publishing") else today)
                        .option("checkpointLocation", str(ckpt))
                        .trigger(availableNow=True)
                        .start()
                    )
                    q.awaitTermination()
                    if q.exception() is not None:
                        raise SystemExit(f"({kind[0]}) {s.name}: the query failed: {q.exception()}")

                wall, _ = bs.timed(go)
                bad = differences(sink_totals(cluster, list(models[s.name])), models[s.name])
                if bad:
                    raise SystemExit(f"({kind[0]}) {s.name}: {len(bad)} totals differ from the model, e.g. {bad[:5]}")
                return wall

            run = {
                "a_sink": query_a,
                "c_text_hand": query_c,
                **{k: (lambda s, k=k: query_p(s, k)) for k in POSITIONED},
            }
            for kind in kinds:  # each kind's first run in the session, untimed in the figures
                warm_up_s[kind], _ = bs.timed(lambda kind=kind: run[kind](small))
            print(
                f"SparkSession started in {session_s:.1f}s; warm-up on {small.frames:,} frames: "
                + "  ".join(f"{k}={v:.2f}s" for k, v in warm_up_s.items()),
                flush=True,
            )
            for rep in range(args.repeat):
                for s in shapes:
                    for kind in kinds if rep % 2 == 0 else reversed(kinds):
                        seconds[s.name][kind].append(run[kind](s))
                    print(
                        f"  rep {rep + 1}/{args.repeat} {s.name:<7} "
                        + "  ".join(f"{k[0]}={seconds[s.name][k][-1]:.2f}s" for k in kinds)
                        + "  totals exact"
                        + (f"; (c) wrong totals {wrong_c[s.name][-1]:,}" if wrong_c[s.name] else ""),
                        flush=True,
                    )
            spark.stop()
            spark = None
            cluster.close()
            machine = machine_info(shards.binary)
    finally:
        if spark is not None:
            with contextlib.suppress(Exception):
                spark.stop()
        shutil.rmtree(root, ignore_errors=True)
    import pyspark

    machine.update(pyspark=pyspark.__version__, java=bs._java_version())
    report = summarize(args, shapes, seconds, wrong_c, machine, steps, session_s, publish_s, warm_up_s)
    report["elapsed_s"] = time.perf_counter() - started
    print_report(report)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = "spark-increments" + ("" if {"a_sink", "c_text_hand"} <= set(kinds) else "-" + "".join(k[0] for k in kinds))
    stem += f"-fpt{args.frames_per_trigger}" if args.frames_per_trigger else ""
    stem += "-quick" if args.quick else ""
    (args.out / f"{stem}.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(f"wrote {args.out / f'{stem}.json'}")
    if not args.no_plot and "a_over_c" in next(iter(report["shapes"].values())):
        plot(args.out / f"{stem}.png", report)
        print(f"wrote {args.out / f'{stem}.png'}")
    return 0


def summarize(
    args: Any,
    shapes: list[bs.Shape],
    seconds: dict[str, dict[str, list[float]]],
    wrong_c: dict[str, list[int]],
    machine: dict[str, Any],
    steps: int,
    session_s: float,
    publish_s: float,
    warm_up_s: dict[str, float],
) -> dict[str, Any]:
    per_shape = {}
    for s in shapes:
        sec, tr = seconds[s.name], s.traffic
        med_s = {k: med(v) for k, v in sec.items()}
        rate = {k: tr.committed / v for k, v in med_s.items()}
        per_shape[s.name] = {
            "users": s.users,
            "keys": len(tr.totals),
            "totals": sum(len(b) for b in tr.totals.values()),
            "committed": tr.committed,
            "frames": s.frames,
            "bytes": s.bytes,
            "rolled_back": tr.rolled_back,
            "duplicates": tr.duplicates,
            "transactions": tr.transactions,
            "seconds": sec,
            "median_seconds": med_s,
            "messages_per_s": rate,
            "totals_exact": True,  # checked after every (a), (p), (q), (r), (s): the run stops otherwise
        }
        pairs = (("a_sink", "c_text_hand"), ("p_sink", "q_unshuffled"), ("p_sink", "r_user_repartition"))
        for num, den in (*pairs, ("s_publishing", "p_sink")):
            if num in sec and den in sec:
                per_shape[s.name][f"{num[0]}_over_{den[0]}"] = rate[num] / rate[den]
                per_shape[s.name][f"paired_{num[0]}_over_{den[0]}"] = bs._paired(sec[num], sec[den])
        if wrong_c[s.name]:
            per_shape[s.name]["c_wrong_totals"] = wrong_c[s.name]
    return {
        "benchmark": "bench/bench_spark_increments.py",
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": machine,
        "config": {
            "messages": args.messages,
            "repeat": args.repeat,
            "quick": args.quick,
            "kinds": [k for k in KINDS if k in next(iter(seconds.values()))],
            "frames_per_trigger": args.frames_per_trigger,
            "producers": bs.PRODUCERS,
            "journals": bs.JOURNALS,
            "steps": steps,
            "members_per_key": MEMBERS,
            "master": "local[2]",
            "shards": 2,
            "pipeline": bs.PIPELINE,
            "prefix": bs.PREFIX,
            "publish_s": publish_s,
            "session_start_s": session_s,
            "warm_up_s": warm_up_s,
        },
        "units": {
            "seconds": "query wall time, start to termination",
            "messages_per_s": "committed messages / median seconds",
            "a_over_c": "of messages/s medians (p_over_q, p_over_r, s_over_p likewise)",
        },
        "labels": LABELS,
        "goal": f"a_over_c >= {GOAL}",
        "shapes": per_shape,
    }


def print_report(report: dict[str, Any]) -> None:
    shapes = report["shapes"]
    print()
    print(f"{'median query wall time (s), committed messages/s':<62}" + "".join(f"{n:>26}" for n in shapes))
    for kind in report["config"]["kinds"]:
        cells = "".join(
            f"{sh['median_seconds'][kind]:>10.2f} s {sh['messages_per_s'][kind]:>10,.0f}/s" for sh in shapes.values()
        )
        print(f"{LABELS[kind]:<62}{cells}")
    for name, sh in shapes.items():
        line = f"{name}: {sh['committed']:,} messages over {sh['keys']:,} keys ({sh['totals']:,} totals):"
        for ratio in ("a_over_c", "p_over_q", "p_over_r", "s_over_p"):
            if ratio in sh:
                num, den = ratio.split("_over_")
                paired = ", ".join(f"{x:.2f}" for x in sh[f"paired_{ratio}"])
                goal = f"goal >= {GOAL}: {'met' if sh[ratio] >= GOAL else 'MISSED'}; " if ratio == "a_over_c" else ""
                line += f" ({num})/({den}) {sh[ratio]:.2f} ({goal}paired {paired});"
        line += " totals exact after every run" + (
            f"; (c) wrong totals {sh['c_wrong_totals']}" if "c_wrong_totals" in sh else ""
        )
        print(line)
    print(bs.machine_line(report))


def plot(path: Path, report: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shapes = report["shapes"]
    names, xs = list(shapes), range(len(shapes))
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.6), gridspec_kw={"width_ratios": [3, 2]})
    for i, (kind, color) in enumerate(zip(("a_sink", "c_text_hand"), ["#1f77b4", "#7f7f7f"], strict=True)):
        vals = [shapes[n]["messages_per_s"][kind] / 1000 for n in names]
        bars = ax1.bar([x + (i - 0.5) * 0.4 for x in xs], vals, 0.4, label=LABELS[kind], color=color)
        ax1.bar_label(bars, fmt="%.1f", fontsize=8)
    ax1.set_xticks(list(xs), [f"{n} ({shapes[n]['keys']:,} keys)" for n in names])
    ax1.set_ylabel("thousand committed messages/s (median)")
    ax1.set_title("availableNow query, start to termination")
    top = max(shapes[n]["messages_per_s"][k] for n in names for k in ("a_sink", "c_text_hand")) / 1000
    ax1.set_ylim(0, top * 1.35)
    ax1.legend(fontsize=8, loc="upper left")
    bars = ax2.bar(list(xs), [shapes[n]["a_over_c"] for n in names], 0.5, color="#1f77b4")
    ax2.bar_label(bars, fmt="%.2f")
    ax2.axhline(GOAL, color="k", linestyle="--", linewidth=1)
    ax2.set_xticks(list(xs), names)
    ax2.set_ylim(0, max([GOAL, *(shapes[n]["a_over_c"] for n in names)]) * 1.3)
    ax2.set_title("(a)/(c), messages/s (dashed: goal)")
    cfg = report["config"]
    bs.save_figure(
        fig,
        path,
        f"Exactly-once increments through the sink vs hand-written ZINCRBY: {cfg['messages']:,} committed "
        f"messages per shape, local[2], 2 shards, median of {cfg['repeat']}, {report['date'][:10]}",
    )


if __name__ == "__main__":
    sys.exit(main())
