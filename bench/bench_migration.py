"""Online migration (issue 28): a standalone store grown from 2 to 3 shards, against what an operator writes
by hand, and what a writer sees while it runs. One run, three local servers (:class:`LocalShards`), every
measurement from FLUSHALL and a freshly loaded store, methods interleaved, medians of ``--repeat``.

1. **Rate.** A store of ``--keys`` keys (``--members`` members each: 100,000 x 10 = 1M members) written with
   ``Cluster.insert`` (shape ``timelines``), and the same keys and members as fenced increments
   (``Cluster.increment``, shape ``counts``: a totals key and a fences key per key). Moved 2 -> 3 shards by
   (a) ``zcluster.migration.Migration`` (run in a child process, as ``zcluster migrate`` would be), against
   (b) a hand-written move: SCAN each source shard (COUNT = the mover's batch), keep the keys the new layout
   routes to the new shard, ``MIGRATE host port "" 0 5000 COPY REPLACE KEYS ...`` per SCAN batch (what
   ``redis-cli --cluster reshard`` does, with no online guarantee), then UNLINK them on the source. Rates:
   keys scanned per second of the copy pass (goal >= 50k/s), keys moved per second; (a)/(b) for the copy
   pass and for the whole move (copy + clean-up; (a) also marks, catches up and cuts over).
2. **A writer during a migration.** A long-lived ``Cluster`` (one thread) inserts batches of 1,000 tuples at
   spread keys (the store's keys, at random) without pause. Its tuples/s inside the migration's window
   (start to end of ``Migration.run`` in the child) against a window as long with no migration, the two
   interleaved (alternating which goes first), each on a freshly loaded store. Goal (for the Spark sink, in
   the issue): >= 0.7. This is a ``Cluster.insert`` thread, not the Spark sink.
3. **The cut-over.** ``MigrationReport.pause`` with the writer running (from 2) and without one (from 1),
   and the longest single ``insert`` call of the writer that overlapped the cut-over (between the mover's
   last catch-up round and the start of its clean-up), beside its longest call with no migration.

Results: ``bench/results/migration[-quick].{json,png}``.

    python bench/bench_migration.py --quick   # 100k members over 10k keys, 2 repetitions (~3 min)
    python bench/bench_migration.py           # 1M members over 100k keys, 3 repetitions (~45 min: a migration
                                              # under the writer took 6-9 min here, and so does its pair)
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import random
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import redis
from bench_cluster import machine_info, med
from redis.crc import key_slot

from zcluster import Cluster, Incr, PartialWriteError
from zcluster._keys import KeyLayout
from zcluster._markers import marker_key
from zcluster._topology import jump_hash
from zcluster.migration._fence import fence_key
from zcluster.testing import LocalShards

RESULTS = Path(__file__).resolve().parent / "results"
PREFIX = "mb:"
BATCH = 2000  # the mover's default batch; the hand-written move's SCAN COUNT and MIGRATE batch too
CALL = 10_000  # tuples per Cluster call when loading
WRITER_CALL = 1_000
SHAPES = ("timelines", "counts")


# -- the store --------------------------------------------------------------------------------------------


def load(shards: LocalShards, shape: str, keys: int, members: int) -> float:
    """FLUSHALL on every server, then the store written on the first two; returns the load's seconds."""
    for url in shards.urls:
        with redis.Redis.from_url(url) as r:
            r.flushall()
    t0 = time.perf_counter()
    n = keys * members
    with Cluster.from_urls(shards.urls[:2], prefix=PREFIX) as cluster:
        for lo in range(0, n, CALL):
            idx = range(lo, min(lo + CALL, n))
            if shape == "timelines":
                cluster.insert([(f"k:{i // members}", 1_700_000_000.0 + i, f"m{i % members}") for i in idx])
            else:
                cluster.increment("bench/load", [(i, Incr(f"n:{i // members}", f"m{i % members}", 1.0)) for i in idx])
    return time.perf_counter() - t0


def data_keys(urls: list[str]) -> list[int]:
    """Keys per server, markers and the mover's lease left out."""
    marker, lease = marker_key(KeyLayout(PREFIX)), fence_key(PREFIX.encode())
    out = []
    for url in urls:
        with redis.Redis.from_url(url) as r:
            out.append(int(r.dbsize()) - int(r.exists(marker)) - int(r.exists(lease)))
    return out


# -- (a) the mover, in a child process ----------------------------------------------------------------------


def mover_child(spec: str) -> None:
    """``--mover JSON``: run one migration, print its report and phase times (monotonic, system-wide)."""
    from zcluster.migration import Migration, Progress

    args = json.loads(spec)
    phases: list[tuple[str, float, int, int]] = []
    last_rate = [0.0]

    def progress(p: Progress) -> None:
        now = time.monotonic()
        if p.phase == "copying":
            last_rate[0] = p.rate
        if p.phase != "copying" or not phases or phases[-1][0] != p.phase:  # every catch-up round
            phases.append((p.phase, now, p.scanned, p.copied))

    started = time.monotonic()
    with Migration(
        args["source"], args["target"], prefix=PREFIX, namespaces=[PREFIX], batch=args["batch"], progress=progress
    ) as migration:
        report = migration.run()
    ended = time.monotonic()
    mine = {
        "started": started,
        "ended": ended,
        "cpu": time.process_time(),
        "phases": phases,
        "mover_rate": last_rate[0],
    }
    print(json.dumps(mine | vars(report)))


def run_mover(source: list[str], target: list[str]) -> dict[str, Any]:
    spec = json.dumps({"source": source, "target": target, "batch": BATCH})
    out = subprocess.run([sys.executable, __file__, "--mover", spec], capture_output=True, text=True, check=False)
    if out.returncode:
        raise SystemExit(f"the mover failed:\n{out.stderr}")
    res: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    first = {phase: t for phase, t, _, _ in reversed(res["phases"])}
    last = {phase: t for phase, t, _, _ in res["phases"]}
    # The copy pass: from the run's start (marking included) to the first catch-up round's report; the
    # cut-over: from the last catch-up round's report to the clean-up's start.
    res["copy_seconds"] = first["catching up"] - res["started"]
    res["catch_up_seconds"] = last["catching up"] - first["catching up"]
    res["cut_window"] = [last["catching up"], first["cleaning"]]
    res["cleanup_seconds"] = first["done"] - first["cleaning"]
    return res


# -- (b) by hand ----------------------------------------------------------------------------------------------


def by_hand(source: list[str], new: str) -> dict[str, Any]:
    """SCAN the sources, MIGRATE ... COPY REPLACE KEYS the keys routed to the new (third) shard, then UNLINK."""
    marker = marker_key(KeyLayout(PREFIX))
    host, port = urlsplit(new).hostname, urlsplit(new).port
    pattern = b"{" + PREFIX.encode() + b"*"
    scanned = 0
    moved: list[tuple[redis.Redis, list[bytes]]] = []
    clients = [redis.Redis.from_url(u) for u in source]
    t0 = time.perf_counter()
    for client in clients:
        cursor = 0
        while True:
            cursor, keys = client.scan(cursor, match=pattern, count=BATCH)
            scanned += len(keys)
            going = [k for k in keys if k != marker and jump_hash(key_slot(k), 3) == 2]
            if going:
                reply = client.execute_command("MIGRATE", host, port, "", 0, 5000, "COPY", "REPLACE", "KEYS", *going)
                if reply not in (b"OK", "OK", True):
                    raise SystemExit(f"MIGRATE answered {reply!r}")
                moved.append((client, going))
            if cursor == 0:
                break
    copy = time.perf_counter() - t0
    for client, going in moved:
        client.unlink(*going)
    total = time.perf_counter() - t0
    for client in clients:
        client.close()
    return {"scanned": scanned, "copied": sum(len(g) for _, g in moved), "copy_seconds": copy, "seconds": total}


# -- part 1 ----------------------------------------------------------------------------------------------------


def rate_shape(shards: LocalShards, shape: str, keys: int, members: int, repeat: int) -> dict[str, Any]:
    source, target = shards.urls[:2], shards.urls[:3]
    runs: dict[str, list[dict[str, Any]]] = {"mover": [], "by_hand": []}
    loads = []
    for r in range(repeat):
        for method in ("mover", "by_hand") if r % 2 == 0 else ("by_hand", "mover"):
            loads.append(load(shards, shape, keys, members))
            before = data_keys(shards.urls)
            res = run_mover(source, target) if method == "mover" else by_hand(source, shards.urls[2])
            after = data_keys(shards.urls)
            if sum(after) != sum(before) or after[2] != res["copied"]:
                raise SystemExit(f"{method}: keys per server {before} -> {after}, {res['copied']} copied")
            res["scan_rate"] = res["scanned"] / res["copy_seconds"]
            res["move_rate"] = res["copied"] / res["copy_seconds"]
            res["keys_per_s"] = res["scanned"] / res["seconds"]
            runs[method].append(res)
            print(
                f"  {shape} rep {r + 1} {method:>7}: scanned {res['scanned']:,} (copied {res['copied']:,}) "
                f"copy pass {res['copy_seconds']:.2f} s = {res['scan_rate']:,.0f} scanned/s, "
                f"{res['move_rate']:,.0f} moved/s; whole move {res['seconds']:.2f} s"
                + (f", pause {res['pause'] * 1000:.0f} ms" if method == "mover" else "")
            )
    m, h = runs["mover"], runs["by_hand"]

    def ratio(field: str) -> float:
        return med([x[field] for x in m]) / med([x[field] for x in h])

    out = {
        "keys": keys,
        "members_per_key": members,
        "redis_keys": m[0]["scanned"],
        "load_seconds": loads,
        "runs": runs,
        "mover_scan_rate": med([x["scan_rate"] for x in m]),
        "mover_move_rate": med([x["move_rate"] for x in m]),
        "by_hand_scan_rate": med([x["scan_rate"] for x in h]),
        "by_hand_move_rate": med([x["move_rate"] for x in h]),
        "copy_pass_ratio": ratio("scan_rate"),
        "whole_move_ratio": ratio("keys_per_s"),
        "paired_copy_pass": [a["scan_rate"] / b["scan_rate"] for a, b in zip(m, h, strict=True)],
        "pause_no_writer": [x["pause"] for x in m],
    }
    print(
        f"{shape} ({keys:,} keys x {members} members = {m[0]['scanned']:,} Redis keys): mover copy pass "
        f"{out['mover_scan_rate']:,.0f} scanned/s ({out['mover_move_rate']:,.0f} moved/s; goal >= 50k scanned/s "
        f"{'met' if out['mover_scan_rate'] >= 50_000 else 'MISSED'}); by hand {out['by_hand_scan_rate']:,.0f} "
        f"scanned/s ({out['by_hand_move_rate']:,.0f} moved/s); mover/by hand {out['copy_pass_ratio']:.2f} (paired "
        f"{min(out['paired_copy_pass']):.2f}..{max(out['paired_copy_pass']):.2f}), whole move "
        f"{out['whole_move_ratio']:.2f}; pause without a writer {med(out['pause_no_writer']) * 1000:.0f} ms"
    )
    return out


# -- parts 2 and 3: a writer -------------------------------------------------------------------------------------


class Writer:
    """One long-lived Cluster inserting ``WRITER_CALL`` tuples at random keys of the store per call, without
    pause; every call's (start, end) kept. A PartialWriteError is counted and the call sent again."""

    def __init__(self, urls: list[str], keys: int, seed: int) -> None:
        self.cluster = Cluster.from_urls(urls, prefix=PREFIX)
        self.rng = random.Random(seed)
        self.keys = keys
        self.calls: list[tuple[float, float]] = []
        self.retries = 0
        self.error: BaseException | None = None
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        seq = 2_000_000_000.0
        try:
            while not self.stop.is_set():
                tuples = []
                for j in range(WRITER_CALL):
                    seq += 1
                    tuples.append((f"k:{self.rng.randrange(self.keys)}", seq, f"w{j % 50}"))
                t0 = time.monotonic()
                while True:
                    try:
                        self.cluster.insert(tuples)
                        break
                    except PartialWriteError:
                        self.retries += 1
                self.calls.append((t0, time.monotonic()))
        except BaseException as exc:  # reported by the caller
            self.error = exc

    def __enter__(self) -> Writer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(60)
        self.cluster.close()
        if self.error is not None:
            raise SystemExit(f"the writer failed: {self.error!r}")

    def rate(self, lo: float, hi: float) -> float:
        """Tuples/s of the calls that ended inside [lo, hi]."""
        return sum(WRITER_CALL for _, end in self.calls if lo <= end <= hi) / (hi - lo)

    def longest(self, lo: float, hi: float) -> float:
        """The longest call overlapping [lo, hi] (seconds)."""
        return max((end - start for start, end in self.calls if end >= lo and start <= hi), default=0.0)


def writer_runs(shards: LocalShards, keys: int, members: int, repeat: int, warmup: float) -> dict[str, Any]:
    source, target = shards.urls[:2], shards.urls[:3]
    during: list[float] = []
    without: list[float] = []
    pauses: list[float] = []
    cut_longest: list[float] = []
    mig_longest: list[float] = []
    calm_longest: list[float] = []
    windows: list[dict[str, Any]] = []
    migrations: list[dict[str, Any]] = []
    length = None
    for r in range(repeat):
        order = ("with", "without") if r % 2 == 0 or length is None else ("without", "with")
        for kind in order:
            load(shards, "timelines", keys, members)
            with Writer(source, keys, seed=r) as writer:
                time.sleep(warmup)
                if kind == "with":
                    res = run_mover(source, target)
                    lo, hi = res["started"], res["ended"]
                    length = hi - lo
                    during.append(writer.rate(lo, hi))
                    pauses.append(res["pause"])
                    cut_longest.append(writer.longest(*res["cut_window"]))
                    mig_longest.append(writer.longest(lo, hi))
                    migrations.append({k: v for k, v in res.items() if k != "urls"} | {"retries": writer.retries})
                else:
                    assert length is not None
                    lo = time.monotonic()
                    time.sleep(length)
                    hi = time.monotonic()
                    without.append(writer.rate(lo, hi))
                    calm_longest.append(writer.longest(lo, hi))
                windows.append({"kind": kind, "seconds": hi - lo, "rate": writer.rate(lo, hi)})
            print(
                f"  writer rep {r + 1} {kind:>7} a migration: {writer.rate(lo, hi):,.0f} tuples/s over {hi - lo:.1f} s"
                + (
                    f", pause {pauses[-1] * 1000:.0f} ms, longest call at the cut-over {cut_longest[-1] * 1000:.0f} ms"
                    f" (catch-up rounds {res['rounds']} in {res['catch_up_seconds']:.1f} s,"
                    f" keys copied {res['copied']:,}"
                    f", at the cut-over {res['final_keys']:,}; mover CPU {res['cpu']:.1f} s)"
                    if kind == "with"
                    else f", longest call {calm_longest[-1] * 1000:.0f} ms"
                )
            )
    out = {
        "writer_call": WRITER_CALL,
        "windows": windows,
        "migrations": migrations,
        "during_per_s": during,
        "without_per_s": without,
        "ratio": med(during) / med(without),
        "paired": [a / b for a, b in zip(during, without, strict=True)],
        "pause_with_writer": pauses,
        "longest_call_at_cutover": cut_longest,
        "longest_call_in_migration": mig_longest,
        "longest_call_without": calm_longest,
    }
    print(
        f"writer ({WRITER_CALL} tuples/call, spread over {keys:,} keys): {med(during):,.0f} tuples/s during a "
        f"migration vs {med(without):,.0f} without = {out['ratio']:.2f} (goal >= 0.7 "
        f"{'met' if out['ratio'] >= 0.7 else 'MISSED'}; paired {min(out['paired']):.2f}..{max(out['paired']):.2f})"
    )
    print(
        f"cut-over: pause {med(pauses) * 1000:.0f} ms with the writer (max {max(pauses) * 1000:.0f}); longest writer "
        f"call at the cut-over {med(cut_longest) * 1000:.0f} ms (max {max(cut_longest) * 1000:.0f}), in the whole "
        f"migration {med(mig_longest) * 1000:.0f} ms, without a migration {med(calm_longest) * 1000:.0f} ms"
    )
    return out


# -- main -------------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="10k keys, 2 repetitions")
    ap.add_argument("--keys", type=int, default=None, help="keys of the store (default 100000; --quick 10000)")
    ap.add_argument("--members", type=int, default=10, help="members per key (default 10)")
    ap.add_argument("--repeat", type=int, default=None, help="repetitions (default 3; --quick 2)")
    ap.add_argument("--writer-repeat", type=int, default=None, help="writer pairs (default 3; --quick 2)")
    ap.add_argument("--shapes", default=",".join(SHAPES), help="shapes of part 1 (default timelines,counts)")
    ap.add_argument("--no-writer", action="store_true", help="part 1 only")
    ap.add_argument("--no-plot", action="store_true")
    ap.add_argument("--mover", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.mover:
        mover_child(args.mover)
        return 0
    keys = args.keys or (10_000 if args.quick else 100_000)
    repeat = args.repeat or (2 if args.quick else 3)
    writer_repeat = args.writer_repeat or (2 if args.quick else 3)
    report: dict[str, Any] = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "keys": keys,
        "members": args.members,
        "batch": BATCH,
        "shapes": {},
    }
    with LocalShards(3) as shards:
        for shape in args.shapes.split(","):
            report["shapes"][shape] = rate_shape(shards, shape, keys, args.members, repeat)
        if not args.no_writer:
            report["writer"] = writer_runs(shards, keys, args.members, writer_repeat, warmup=1.0)
        report["machine"] = machine_info(shards.binary)
    stem = "migration-quick" if args.quick else "migration"
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{stem}.json").write_text(json.dumps(report, indent=2) + "\n")
    if not args.no_plot:
        plot(RESULTS / f"{stem}.png", report)
    return 0


def plot(path: Path, report: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    writer = report.get("writer")
    fig, axes = plt.subplots(1, 3 if writer else 1, figsize=(14 if writer else 6, 4), squeeze=False)
    ax = axes[0][0]
    names = list(report["shapes"])
    xs = range(len(names))
    for off, field, label in (
        (-0.3, "mover_scan_rate", "mover: scanned/s"),
        (-0.1, "by_hand_scan_rate", "by hand: scanned/s"),
        (0.1, "mover_move_rate", "mover: moved/s"),
        (0.3, "by_hand_move_rate", "by hand: moved/s"),
    ):
        ax.bar([x + off for x in xs], [report["shapes"][s][field] for s in names], 0.2, label=label)
    ax.axhline(50_000, color="grey", ls="--", lw=1, label="goal 50k scanned/s")
    ax.set_xticks(list(xs), [f"{s}\n({report['shapes'][s]['redis_keys']:,} Redis keys)" for s in names])
    ax.set_ylabel("keys/s of the copy pass (median)")
    ax.set_title("2 -> 3 shards")
    ax.set_ylim(0, 1.4 * max(report["shapes"][s][f] for s in names for f in ("mover_scan_rate", "by_hand_scan_rate")))
    ax.legend(fontsize=7, ncol=2, loc="upper left")
    if writer:
        ax = axes[0][1]
        n = len(writer["during_per_s"])
        ax.bar([i - 0.2 for i in range(n)], writer["during_per_s"], 0.4, label="during a migration")
        ax.bar([i + 0.2 for i in range(n)], writer["without_per_s"], 0.4, label="same window, no migration")
        ax.set_xticks(range(n), [f"rep {i + 1}" for i in range(n)])
        ax.set_ylabel("writer tuples/s")
        ax.set_title(f"Cluster.insert writer: ratio {writer['ratio']:.2f} (goal >= 0.7)")
        ax.legend(fontsize=7)
        ax = axes[0][2]
        groups = {
            "pause, no writer": [p for s in names for p in report["shapes"][s]["pause_no_writer"]],
            "pause, writer": writer["pause_with_writer"],
            "longest call\nat cut-over": writer["longest_call_at_cutover"],
            "longest call\nno migration": writer["longest_call_without"],
        }
        for i, vals in enumerate(groups.values()):
            ax.scatter([i] * len(vals), [v * 1000 for v in vals], s=18)
            ax.hlines(med(vals) * 1000, i - 0.3, i + 0.3, color="black")
        ax.set_xticks(range(len(groups)), list(groups), fontsize=7)
        ax.set_ylabel("ms (line: median)")
        ax.set_title("the cut-over")
    fig.suptitle(
        f"online migration, {report['keys']:,} keys x {report['members']} members, 3 local servers, "
        f"{report['date'][:10]}"
    )
    fig.tight_layout()
    fig.savefig(path)


if __name__ == "__main__":
    start = time.perf_counter()
    code = main()
    if "--mover" not in sys.argv:
        print(f"done in {time.perf_counter() - start:.0f} s")
    raise SystemExit(code)
