"""Cluster write/read throughput and memory against plain-Redis baselines, in one run on the same servers.

Measures, on local ``redis-server`` processes started by :class:`zcluster.testing.LocalShards`:

  (a) ``Cluster.insert`` (the library: batched 2P-set Lua script, pipelined, shards in parallel)
  (b) redis-py pipelined plain ZADD, one command per tuple (no CRDT logic at all)
  (c) one EVALSHA per tuple, pipelined (roshi's way: a per-tuple 2P-set script)
  (d) ``redis-benchmark -P 64`` ZADD (the C client: the practical ceiling)
  (e) ``Cluster.insert`` over 2 shards (for the 2-shard / 1-shard ratio)

plus ``Cluster.select`` (limit 10) keys/s against per-key ZREVRANGE (naive, one round trip per key, and
pipelined), and Redis memory per stored tuple (``used_memory`` delta after FLUSHALL) for ``Cluster.insert``
data against plain ZADD data, insert-only.

Then the MATRIX (skip it with ``--no-matrix``; run only it with ``--matrix-only``): on one more local server
(``LocalShards(1)``), for keys in {2000, 10000, 100000} x max_size in {None, 10000}, every point with fresh
tuples from FLUSHALL, the three insert methods (a) ``Cluster.insert`` with that max_size, (b) one EVALSHA per
tuple (bounded points: roshi's script with its bound, ZCARD check + ZADD + ZREMRANGEBYRANK), (c) pipelined
plain ZADD (bounded points: plus a ZREMRANGEBYRANK of a key after every max_size/10 ZADDs to it), interleaved,
with memory per tuple after each run; and a REDIS CLUSTER point: ``Cluster.insert`` over a 3-master Redis
Cluster (``LocalRedisCluster(3)``) against 3 standalone shards (``LocalShards(3)``), 100,000 keys. Key counts
scale with ``--tuples`` (tuples per key stay 100 / 20 / 2).

Every measurement is repeated; methods are interleaved round-robin inside each repetition so that drift on a
shared machine hits them alike. Medians and ratios are printed, and written with every raw sample to
``bench/results/cluster.json`` and ``bench/results/cluster.png`` (``--matrix-only``: ``cluster-matrix.*``;
``--quick`` adds ``-quick``). ``--module``: every local server loads zcluster's Redis module, so that
``Cluster.insert`` writes through ``ZCLUSTER.WRITE`` instead of the script (results ``-module``).

    python bench/bench_cluster.py                  # full run: 200k tuples, 5 repetitions, then the matrix
    python bench/bench_cluster.py --quick          # smoke run: 20k tuples, 2 repetitions, keys / 10
    python bench/bench_cluster.py --matrix-only    # just the matrix and the Redis Cluster point
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import gc
import io
import json
import os
import platform
import random
import resource
import shutil
import statistics
import subprocess
import sys
import textwrap
import time
from collections import Counter
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import redis

from zcluster import Cluster, KeyScoreMember
from zcluster.testing import LocalRedisCluster, LocalShards, server_version

RESULTS = Path(__file__).resolve().parent / "results"

#: roshi's insert, one tuple per call (its Lua, minus the size bound): ZSCORE on K+ and K-, compare, ZREM + ZADD.
#: The score is given to ZADD as the client's text so that it is exact (roshi lets Lua print it with 14 digits).
PER_TUPLE_LUA = """
local s = tonumber(ARGV[1])
local ins = redis.call('ZSCORE', KEYS[1], ARGV[2])
local del = redis.call('ZSCORE', KEYS[2], ARGV[2])
if ins and s < tonumber(ins) then return -1 end
if del and s <= tonumber(del) then return -1 end
redis.call('ZREM', KEYS[2], ARGV[2])
redis.call('ZADD', KEYS[1], ARGV[1], ARGV[2])
return 1
"""

#: roshi's insert WITH its size bound N = ARGV[3] (roshi's cluster/cluster.go script, one tuple per call): when K+
#: holds N entries a score below its lowest is refused; then the 2P-set check, ZREM from K-, ZADD to K+, and
#: ZREMRANGEBYRANK K+ 0 -(N+1), which removes something only when K+ is over the bound. Exact score text as above.
PER_TUPLE_BOUNDED_LUA = """
local s = tonumber(ARGV[1])
local n = tonumber(ARGV[3])
if redis.call('ZCARD', KEYS[1]) >= n then
  local low = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')[2]
  if low and s < tonumber(low) then return -1 end
end
local ins = redis.call('ZSCORE', KEYS[1], ARGV[2])
local del = redis.call('ZSCORE', KEYS[2], ARGV[2])
if ins and s < tonumber(ins) then return -1 end
if del and s <= tonumber(del) then return -1 end
redis.call('ZREM', KEYS[2], ARGV[2])
redis.call('ZADD', KEYS[1], ARGV[1], ARGV[2])
redis.call('ZREMRANGEBYRANK', KEYS[1], 0, -(n + 1))
return 1
"""

#: Commands per pipeline round trip for the redis-py baselines (b) and (c).
PIPELINE = 1000
PREFIX = "zc:"
OTHER_PREFIX = "zd:"  # a second store on the same servers, with keys as long as PREFIX's

#: The matrix (at 200k tuples; key counts scale with --tuples so that tuples per key stay 100 / 20 / 2).
MATRIX_TUPLES = 200_000
MATRIX_KEYS = (2_000, 10_000, 100_000)
MATRIX_BOUNDS: tuple[int | None, ...] = (None, 10_000)
CLUSTER_KEYS = 100_000
CLUSTER_MASTERS = 3
MATRIX_METHODS = ("library", "per_tuple_script", "zadd")
MATRIX_GOALS = {"library_vs_per_tuple_script": 2.0, "library_vs_zadd": 1.2, "memory": 1.1, "redis_cluster": 0.9}


# -- data -------------------------------------------------------------------------------------------------


SERVER_ARGS: list[str] = []
"""Options of every local server this run starts (``--module`` adds ``--loadmodule``)."""


def make_tuples(n: int, nkeys: int, seed: int) -> list[KeyScoreMember]:
    """``n`` fresh tuples over ``nkeys`` keys: unique members ``event-<n>``, unix-time scores with fractions."""
    rng = random.Random(seed)
    base = 1_700_000_000 + seed * 1_000_000
    first = seed * n
    keys = [f"timeline:{k}" for k in range(nkeys)]
    return [
        KeyScoreMember(keys[rng.randrange(nkeys)], base + rng.random() * 86_400.0, f"event-{first + i}")
        for i in range(n)
    ]


# -- the methods ------------------------------------------------------------------------------------------


def timed(fn: Callable[..., Any], *args: Any) -> float:
    gc.collect()
    t0 = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t0


def server_cpu(clients: tuple[redis.Redis, ...]) -> float:
    """CPU seconds (user + system) the servers have used so far, all threads."""
    total = 0.0
    for c in clients:
        info = c.info("cpu")
        total += float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
    return total


def own_cpu() -> tuple[float, float]:
    """CPU seconds of this process (all threads) and of its reaped children (redis-benchmark)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime


def metered(clients: tuple[redis.Redis, ...], fn: Callable[..., Any], *args: Any) -> tuple[Any, float, float, float]:
    """``fn(*args)``'s result, wall seconds, client CPU seconds (this process + children), server CPU seconds.

    On a busy machine wall-clock throughput swings with other load; CPU per tuple barely does.
    """
    gc.collect()
    s0, (m0, k0) = server_cpu(clients), own_cpu()
    t0 = time.perf_counter()
    out = fn(*args)
    wall = time.perf_counter() - t0
    (m1, k1), s1 = own_cpu(), server_cpu(clients)
    return out, wall, (m1 - m0) + (k1 - k0), s1 - s0


def insert_library(cluster: Cluster, tuples: list[KeyScoreMember]) -> None:
    result = cluster.insert(tuples)
    if result.applied_count != len(tuples):
        raise SystemExit(f"Cluster.insert applied {result.applied_count} of {len(tuples)} fresh tuples")


def insert_zadd(client: redis.Redis, tuples: list[KeyScoreMember]) -> None:
    pipe = client.pipeline(transaction=False)
    for lo in range(0, len(tuples), PIPELINE):
        for key, score, member in tuples[lo : lo + PIPELINE]:
            pipe.execute_command("ZADD", key, score, member)
        pipe.execute()


def insert_per_tuple_script(client: redis.Redis, sha: str, tuples: list[KeyScoreMember]) -> None:
    pipe = client.pipeline(transaction=False)
    head = "{" + PREFIX
    for lo in range(0, len(tuples), PIPELINE):
        for key, score, member in tuples[lo : lo + PIPELINE]:
            base = head + key
            pipe.execute_command("EVALSHA", sha, 2, base + "}+", base + "}-", score, member)
        replies = pipe.execute()
        if replies and replies[0] != 1:
            raise SystemExit(f"per-tuple script answered {replies[0]!r} for a fresh tuple")


def insert_per_tuple_script_bounded(client: redis.Redis, sha: str, bound: int, tuples: list[KeyScoreMember]) -> None:
    """(b) at a bounded point: :data:`PER_TUPLE_BOUNDED_LUA`, one EVALSHA per tuple, pipelined."""
    pipe = client.pipeline(transaction=False)
    head = "{" + PREFIX
    for lo in range(0, len(tuples), PIPELINE):
        for key, score, member in tuples[lo : lo + PIPELINE]:
            base = head + key
            pipe.execute_command("EVALSHA", sha, 2, base + "}+", base + "}-", score, member, bound)
        replies = pipe.execute()
        if replies and replies[0] != 1:
            raise SystemExit(f"bounded per-tuple script answered {replies[0]!r} for a fresh tuple")


def insert_zadd_trimmed(client: redis.Redis, bound: int, tuples: list[KeyScoreMember]) -> int:
    """(c) at a bounded point: plain ZADD, and ``ZREMRANGEBYRANK key 0 -(bound+1)`` queued after every
    ``bound // 10`` ZADDs to that key (counted client-side from an empty server), so a set never holds more
    than 1.1 x bound entries. Returns how many trims were sent."""
    every = max(1, bound // 10)
    since: dict[Any, int] = {}
    trims = 0
    pipe = client.pipeline(transaction=False)
    for lo in range(0, len(tuples), PIPELINE):
        for key, score, member in tuples[lo : lo + PIPELINE]:
            pipe.execute_command("ZADD", key, score, member)
            c = since.get(key, 0) + 1
            if c >= every:
                pipe.execute_command("ZREMRANGEBYRANK", key, 0, -(bound + 1))
                trims += 1
                c = 0
            since[key] = c
        pipe.execute()
    return trims


def redis_benchmark(binary: str, port: int, n: int, nkeys: int) -> tuple[float, str]:
    """redis-benchmark's own tuples/s for ``n`` ZADDs with random keys and members, pipelined 64 deep.

    Each ``__rand_int__`` is drawn independently in [0, nkeys): about ``n`` distinct (key, member) pairs over
    ``nkeys`` keys, so nearly every ZADD inserts (``insert_fraction`` in the JSON says how many did).
    """
    args = [
        binary,
        "-h",
        "127.0.0.1",
        "-p",
        str(port),
        "-P",
        "64",
        "-n",
        str(n),
        "-r",
        str(nkeys),
        "-q",
        "--csv",
        "ZADD",
        "timeline:__rand_int__",
        "__rand_int__",
        "event-__rand_int__",
    ]
    out = subprocess.run(args, capture_output=True, text=True, check=True, timeout=300).stdout
    rows = [r for r in csv.reader(io.StringIO(out)) if len(r) >= 2]
    rps = [float(r[1]) for r in rows if r[0] != "test"]
    if not rps:
        raise SystemExit(f"could not parse redis-benchmark output: {out!r}")
    return rps[-1], " ".join(args[1:])


def select_library(cluster: Cluster, keys: list[str]) -> None:
    cluster.select(keys, limit=10)


def select_naive(client: redis.Redis, redis_keys: list[bytes]) -> None:
    for k in redis_keys:
        client.zrevrange(k, 0, 9, withscores=True)


def select_pipelined(client: redis.Redis, redis_keys: list[bytes]) -> None:
    pipe = client.pipeline(transaction=False)
    for lo in range(0, len(redis_keys), PIPELINE):
        for k in redis_keys[lo : lo + PIPELINE]:
            pipe.zrevrange(k, 0, 9, withscores=True)
        pipe.execute()


def used_memory(client: redis.Redis) -> int:
    return int(client.info("memory")["used_memory"])


def memory_per_tuple(client: redis.Redis, load: Callable[[], None], n: int) -> float:
    client.flushall()
    time.sleep(0.05)
    before = used_memory(client)
    load()
    time.sleep(0.05)  # let the server settle; client query buffers are freed after the last reply
    return (used_memory(client) - before) / n


# -- reporting --------------------------------------------------------------------------------------------


def machine_info(binary: str) -> dict[str, Any]:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "nproc": os.cpu_count(),
        "cpu_model": model,
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "redis_py": redis.__version__,
        "hiredis": _hiredis_version(),
        "redis_server": server_version(binary),
        "redis_benchmark": _run_text([_benchmark_binary(binary) or "redis-benchmark", "--version"]),
        "loadavg": os.getloadavg(),
    }


def _hiredis_version() -> str | None:
    try:
        import hiredis  # type: ignore[import-not-found]

        return str(hiredis.__version__)
    except ImportError:
        return None


def _run_text(args: list[str]) -> str:
    try:
        return subprocess.run(args, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def _benchmark_binary(server_binary: str) -> str | None:
    beside = Path(server_binary).with_name("redis-benchmark")
    if beside.is_file():
        return str(beside)
    return shutil.which("redis-benchmark") or shutil.which("valkey-benchmark")


def med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def goal_line(name: str, value: float, goal: str, ok: bool, note: str = "") -> str:
    mark = "met" if ok else "MISSED"
    return f"  {name:<34} {value:>7.2f}   goal {goal:<8} {mark:<6} {note}"


def plot(path: Path, report: dict[str, Any], core: bool = True) -> None:
    """The PNG: the original three panels (``core``), and below them the matrix and the Redis Cluster point."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [p for p, on in ((_plot_core, core), (_plot_matrix, "matrix" in report)) if on]
    fig = plt.figure(figsize=(15, 5.4 * len(panels)), layout="constrained")
    subs: list[Any] = list(fig.subfigures(len(panels), 1)) if len(panels) > 1 else [fig]
    for draw, sub in zip(panels, subs, strict=True):
        draw(sub, report)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_core(fig: Any, report: dict[str, Any]) -> None:
    m, r = report["medians"], report["ratios"]
    ax1, ax2, ax3 = fig.subplots(1, 3, gridspec_kw={"width_ratios": [5, 3, 2]})
    labels = [
        "(a) Cluster.insert\n1 shard",
        "(e) Cluster.insert\n2 shards",
        "(b) pipelined\nZADD",
        "(c) EVALSHA\nper tuple",
        "(d) redis-benchmark\nZADD -P 64",
    ]
    names = [
        "insert_library",
        "insert_library_2shards",
        "insert_zadd",
        "insert_per_tuple_script",
        "insert_redis_benchmark",
    ]
    values = [m[k] / 1000 for k in names]
    colors = ["#1f77b4", "#6baed6", "#7f7f7f", "#d62728", "#2ca02c"]
    bars = ax1.bar(labels, values, color=colors)
    ax1.bar_label(bars, fmt="%.0f")
    ax1.set_ylabel("thousand tuples/s (median)")
    ax1.set_title("insert throughput")
    ax1.tick_params(axis="x", labelsize=8)
    sel = ["select_library", "select_pipelined", "select_naive"]
    bars = ax2.bar(
        ["Cluster.select", "pipelined\nZREVRANGE", "per-key\nZREVRANGE"],
        [m[k] / 1000 for k in sel],
        color=["#1f77b4", "#7f7f7f", "#d62728"],
    )
    ax2.bar_label(bars, fmt="%.0f")
    ax2.set_ylabel("thousand keys/s (median)")
    ax2.set_title("select, limit 10")
    ax2.tick_params(axis="x", labelsize=8)
    bars = ax3.bar(["Cluster", "plain\nZADD"], [m["memory_library"], m["memory_zadd"]], color=["#1f77b4", "#7f7f7f"])
    ax3.bar_label(bars, fmt="%.1f")
    ax3.set_ylabel("bytes per tuple (used_memory delta)")
    ax3.set_title("memory, insert-only")
    cfg = report["config"]
    fig.suptitle(
        f"zcluster, {cfg['tuples']:,} tuples over {cfg['keys']:,} keys, median of {cfg['repeat']}, "
        f"{report['machine']['nproc']} CPUs\n"
        f"(a)/(c) = {r['library_vs_per_tuple_script']:.2f} (goal >= 2.5)   "
        f"(a)/(b) = {r['library_vs_zadd']:.2f} (goal >= 1.3)   "
        f"(a)/(d) = {r['library_vs_redis_benchmark']:.2f} (goal >= 0.5)   "
        f"memory = {r['memory']:.2f} (goal <= 1.1)   "
        f"2 shards / 1 = {r['two_shards_vs_one']:.2f} (goal >= 1.0)",
        fontsize=10,
    )


def _plot_matrix(fig: Any, report: dict[str, Any]) -> None:
    rows, rc, g = report["matrix"], report["redis_cluster"], MATRIX_GOALS
    ax1, ax2 = fig.subplots(1, 2, gridspec_kw={"width_ratios": [6, 2]})
    width = 0.26
    colors = {"library": "#1f77b4", "per_tuple_script": "#d62728", "zadd": "#7f7f7f"}
    names = {"library": "(a) Cluster.insert", "per_tuple_script": "(b) EVALSHA per tuple", "zadd": "(c) pipelined ZADD"}
    top = max(r["medians"][k] for r in rows for k in MATRIX_METHODS) / 1000
    for j, method in enumerate(MATRIX_METHODS):
        xs = [i + (j - 1) * width for i in range(len(rows))]
        ax1.bar(xs, [r["medians"][method] / 1000 for r in rows], width, label=names[method], color=colors[method])
    for i, r in enumerate(rows):
        rt = r["ratios"]
        ax1.text(
            i,
            max(r["medians"][k] for k in MATRIX_METHODS) / 1000 + top * 0.02,
            f"a/b {rt['library_vs_per_tuple_script']:.2f}\na/c {rt['library_vs_zadd']:.2f}",
            ha="center",
            va="bottom",
            fontsize=8,
        )
    ax1.set_xticks(
        range(len(rows)), [f"{r['keys']:,} keys\nmax_size {_bound_label(r['max_size'])}" for r in rows], fontsize=8
    )
    ax1.set_ylim(0, top * 1.25)
    ax1.set_ylabel("thousand tuples/s (median)")
    ax1.set_title(f"matrix: 1 shard, {rows[0]['tuples']:,} tuples per run")
    ax1.legend(fontsize=8, loc="upper right")
    bars = ax2.bar(
        [f"Redis Cluster\n{rc['masters']} masters", f"{rc['masters']} standalone\nshards"],
        [rc["medians"]["redis_cluster"] / 1000, rc["medians"]["standalone"] / 1000],
        color=["#9467bd", "#1f77b4"],
    )
    ax2.bar_label(bars, fmt="%.0f")
    ax2.set_ylabel("thousand tuples/s (median)")
    ax2.set_title(f"Cluster.insert, {rc['keys']:,} keys", fontsize=10)
    ax2.tick_params(axis="x", labelsize=8)
    unbounded = [r for r in rows if r["max_size"] is None]
    mem = max(unbounded, key=lambda r: r["keys"]) if unbounded else None
    mem_text = (
        f"memory (a)/(c) at {mem['keys']:,} keys unbounded = {mem['ratios']['memory']:.2f} (goal <= {g['memory']})   "
        if mem
        else ""
    )
    fig.suptitle(
        f"matrix, median of {len(rows[0]['samples']['library'])}: goals (a)/(b) >= {g['library_vs_per_tuple_script']}, "
        f"(a)/(c) >= {g['library_vs_zadd']} at every point\n"
        + mem_text
        + f"Redis Cluster / standalone = {rc['ratio']:.2f} (goal >= {g['redis_cluster']})",
        fontsize=10,
    )


# -- the original measurements ------------------------------------------------------------------------


def run_core(args: argparse.Namespace, options: dict[str, Any]) -> dict[str, Any]:
    """The original measurements (a)-(e), select, memory on ``LocalShards(2)``; prints, returns the report part."""
    n, nkeys, repeat = args.tuples, args.keys, args.repeat

    samples: dict[str, list[float]] = {
        k: []
        for k in (
            "insert_library",
            "insert_library_2shards",
            "insert_zadd",
            "insert_per_tuple_script",
            "insert_redis_benchmark",
            "select_library",
            "select_naive",
            "select_pipelined",
            "memory_library",
            "memory_zadd",
        )
    }
    extra: dict[str, Any] = {"redis_benchmark_insert_fraction": []}
    started = time.perf_counter()
    with LocalShards(2, extra=SERVER_ARGS) as shards:
        binary = shards.binary
        bench_bin = _benchmark_binary(binary)
        c0, c1 = (s.client() for s in shards.servers)
        one = Cluster.from_urls(shards.urls[:1], **options)
        # Another prefix of the same length: a store's layout marker names its shard list (zcluster._guard).
        two = Cluster.from_urls(shards.urls, **{**options, "prefix": OTHER_PREFIX})
        for c in (one, two):
            c.load_scripts()
        sha = c0.script_load(PER_TUPLE_LUA)
        clients = (c0, c1)

        def flush() -> None:
            for c in clients:
                c.flushall()

        c0s = (c0,)
        cpu: dict[str, list[dict[str, float]]] = {k: [] for k in samples if k.startswith("insert_")}

        def measure(name: str, servers: tuple[redis.Redis, ...], fn: Callable[..., Any], *fn_args: Any) -> None:
            """Insert on empty servers; record tuples/s and client/server CPU microseconds per tuple."""
            flush()
            _, wall, client_s, server_s = metered(servers, fn, *fn_args)
            samples[name].append(n / wall)
            cpu[name].append({"client_us": client_s / n * 1e6, "server_us": server_s / n * 1e6})

        # warm up connections, script caches and code paths
        warm = make_tuples(min(n, 5_000), nkeys, seed=10_000)
        for warm_up in (
            lambda: insert_library(one, warm),
            lambda: insert_library(two, warm),
            lambda: insert_zadd(c0, warm),
            lambda: insert_per_tuple_script(c0, sha, warm),
        ):
            flush()
            warm_up()
        flush()
        config = {
            "tuples": n,
            "keys": nkeys,
            "repeat": repeat,
            "pipeline": PIPELINE,
            "prefix": PREFIX,
            "batch_size": one.batch_size,
            "pipeline_calls": one._transport.pipeline_calls,
            "ports": [s.port for s in shards.servers],
        }
        print(
            f"zcluster benchmark: {n:,} tuples over {nkeys:,} keys, {repeat} repetitions, "
            f"batch_size={one.batch_size} pipeline_calls={one._transport.pipeline_calls}",
            flush=True,
        )

        bench_cmd = ""
        for rep in range(repeat):
            tuples = make_tuples(n, nkeys, seed=rep + 1)
            # -- inserts, each on empty servers, the same fresh tuples for every method
            measure("insert_zadd", c0s, insert_zadd, c0, tuples)
            measure("insert_per_tuple_script", c0s, insert_per_tuple_script, c0, sha, tuples)
            measure("insert_library_2shards", clients, insert_library, two, tuples)
            if bench_bin:
                flush()
                (rps, bench_cmd), _, client_s, server_s = metered(
                    c0s, redis_benchmark, bench_bin, shards.servers[0].port, n, nkeys
                )
                samples["insert_redis_benchmark"].append(rps)
                cpu["insert_redis_benchmark"].append({"client_us": client_s / n * 1e6, "server_us": server_s / n * 1e6})
                stored = sum(c0.zcard(k) for k in c0.scan_iter(count=1000))
                extra["redis_benchmark_insert_fraction"].append(stored / n)
            measure("insert_library", c0s, insert_library, one, tuples)
            # -- selects on the data just inserted by Cluster.insert (1 shard)
            keys = sorted({t.key for t in tuples})
            redis_keys = [f"{{{PREFIX}{k}}}+".encode() for k in keys]  # K+ of each key
            nk = len(keys)
            samples["select_library"].append(nk / timed(select_library, one, keys))
            samples["select_naive"].append(nk / timed(select_naive, c0, redis_keys))
            samples["select_pipelined"].append(nk / timed(select_pipelined, c0, redis_keys))
            # -- memory per tuple, insert-only, same tuples
            samples["memory_library"].append(memory_per_tuple(c0, partial(insert_library, one, tuples), n))
            samples["memory_zadd"].append(memory_per_tuple(c0, partial(insert_zadd, c0, tuples), n))
            line = "  ".join(f"{k.removeprefix('insert_')}={v[-1]:,.0f}" for k, v in samples.items() if v)
            print(f"  rep {rep + 1}/{repeat}: {line}", flush=True)
        flush()
        for c in (one, two):
            c.close()
        machine = machine_info(binary)

    m = {k: med(v) for k, v in samples.items()}
    cpu_m = {k: {part: med([x[part] for x in v]) for part in ("client_us", "server_us")} for k, v in cpu.items() if v}
    for v in cpu_m.values():
        v["total_us"] = v["client_us"] + v["server_us"]
    a = m["insert_library"]
    ratios = {
        "library_vs_per_tuple_script": a / m["insert_per_tuple_script"],
        "library_vs_zadd": a / m["insert_zadd"],
        "library_vs_redis_benchmark": a / m["insert_redis_benchmark"] if samples["insert_redis_benchmark"] else None,
        "memory": m["memory_library"] / m["memory_zadd"],
        "two_shards_vs_one": m["insert_library_2shards"] / a,
        "select_vs_naive": m["select_library"] / m["select_naive"],
        "select_vs_pipelined": m["select_library"] / m["select_pipelined"],
    }
    # per-repetition ratios (paired samples): their spread shows how far the medians can be trusted
    paired = {
        "library_vs_per_tuple_script": [
            x / y for x, y in zip(samples["insert_library"], samples["insert_per_tuple_script"], strict=True)
        ],
        "library_vs_zadd": [x / y for x, y in zip(samples["insert_library"], samples["insert_zadd"], strict=True)],
        "two_shards_vs_one": [
            y / x for x, y in zip(samples["insert_library"], samples["insert_library_2shards"], strict=True)
        ],
    }
    elapsed = time.perf_counter() - started

    def rng(name: str) -> str:
        xs = samples[name]
        return f"{min(xs):>12,.0f} .. {max(xs):<12,.0f}" if xs else ""

    print()
    print(f"{'measurement':<46} {'median':>12}   {'min .. max':<28}")
    rows = [
        ("(a) Cluster.insert, 1 shard        tuples/s", "insert_library"),
        ("(b) pipelined plain ZADD           tuples/s", "insert_zadd"),
        ("(c) EVALSHA per tuple, pipelined   tuples/s", "insert_per_tuple_script"),
        ("(d) redis-benchmark ZADD -P 64     tuples/s", "insert_redis_benchmark"),
        ("(e) Cluster.insert, 2 shards       tuples/s", "insert_library_2shards"),
        ("Cluster.select, limit 10           keys/s", "select_library"),
        ("per-key ZREVRANGE (no pipeline)    keys/s", "select_naive"),
        ("pipelined ZREVRANGE                keys/s", "select_pipelined"),
        ("memory, Cluster.insert data     bytes/tuple", "memory_library"),
        ("memory, plain ZADD data         bytes/tuple", "memory_zadd"),
    ]
    for label, key in rows:
        fmt = f"{m[key]:>12,.1f}" if key.startswith("memory") else f"{m[key]:>12,.0f}"
        print(f"{label:<46} {fmt}   {rng(key)}")
    print()
    print(f"{'CPU microseconds per tuple (median)':<46} {'client':>8} {'server':>8} {'total':>8}")
    for label, key in rows[:6]:
        if key in cpu_m:
            c = cpu_m[key]
            name = label.removesuffix("tuples/s").rstrip()
            print(f"{name:<46} {c['client_us']:>8.2f} {c['server_us']:>8.2f} {c['total_us']:>8.2f}")
    print()
    print("ratios (of medians)                      value   goal")
    print(
        goal_line(
            "(a)/(c) library / per-tuple script",
            ratios["library_vs_per_tuple_script"],
            ">= 2.5",
            ratios["library_vs_per_tuple_script"] >= 2.5,
        )
    )
    print(
        goal_line(
            "(a)/(b) library / plain ZADD",
            ratios["library_vs_zadd"],
            ">= 1.3",
            ratios["library_vs_zadd"] >= 1.3,
            "((b) does strictly less work: no CRDT check)",
        )
    )
    if ratios["library_vs_redis_benchmark"] is not None:
        print(
            goal_line(
                "(a)/(d) library / redis-benchmark",
                ratios["library_vs_redis_benchmark"],
                ">= 0.5",
                ratios["library_vs_redis_benchmark"] >= 0.5,
            )
        )
    print(goal_line("memory library / plain ZADD", ratios["memory"], "<= 1.1", ratios["memory"] <= 1.1))
    print(
        goal_line(
            "(e)/(a) 2 shards / 1 shard",
            ratios["two_shards_vs_one"],
            ">= 1.0",
            ratios["two_shards_vs_one"] >= 1.0,
            f"({machine['nproc']} CPUs in all)",
        )
    )
    print(f"  {'select: library / per-key ZREVRANGE':<34} {ratios['select_vs_naive']:>7.2f}")
    print(f"  {'select: library / pipelined ZREVRANGE':<34} {ratios['select_vs_pipelined']:>7.2f}")
    tot = {k: v["total_us"] for k, v in cpu_m.items()}
    cpu_ratios = {
        "library_vs_per_tuple_script": tot["insert_per_tuple_script"] / tot["insert_library"],
        "library_vs_zadd": tot["insert_zadd"] / tot["insert_library"],
        "library_vs_redis_benchmark": (
            tot["insert_redis_benchmark"] / tot["insert_library"] if "insert_redis_benchmark" in tot else None
        ),
    }
    print("  by CPU (inverse CPU-us per tuple, client + server; robust to other load on the machine):")
    print(
        f"    (a)/(c) {cpu_ratios['library_vs_per_tuple_script']:.2f}   (a)/(b) {cpu_ratios['library_vs_zadd']:.2f}"
        + (
            f"   (a)/(d) {cpu_ratios['library_vs_redis_benchmark']:.2f}"
            if cpu_ratios["library_vs_redis_benchmark"] is not None
            else ""
        )
    )
    for name, xs in paired.items():
        print(f"  paired per-rep {name}: " + ", ".join(f"{x:.2f}" for x in xs))
    print(f"\nredis-benchmark: {bench_cmd or 'not found'}")
    return {
        "config": config,
        "redis_benchmark_command": bench_cmd,
        "units": {"insert_*": "tuples/s", "select_*": "keys/s", "memory_*": "bytes per tuple"},
        "samples": samples,
        "medians": m,
        "ratios": ratios,
        "paired_ratios": paired,
        "cpu_samples": cpu,
        "cpu_medians": cpu_m,
        "cpu_ratios": cpu_ratios,
        "goals": {
            "library_vs_per_tuple_script": ">= 2.5",
            "library_vs_zadd": ">= 1.3",
            "library_vs_redis_benchmark": ">= 0.5",
            "memory": "<= 1.1",
            "two_shards_vs_one": ">= 1.0",
        },
        "extra": extra,
        "core_elapsed_s": elapsed,
        "machine": machine,
    }


# -- the matrix and the Redis Cluster point -------------------------------------------------------------


def _flush_all(clients: list[redis.Redis]) -> None:
    for c in clients:
        c.flushall()


def _bound_label(bound: int | None) -> str:
    return "none" if bound is None else f"{bound:,}"


def run_matrix(
    n: int, key_counts: list[int], bounds: tuple[int | None, ...], repeat: int, options: dict[str, Any]
) -> tuple[list[dict[str, Any]], str]:
    """Every (keys, max_size) point on one fresh server; returns the matrix rows and the server binary.

    Inside each repetition the points run in order and, at each point, the three methods run on the same
    fresh tuples, each from FLUSHALL, in an order rotated by repetition and point. Memory per tuple is the
    ``used_memory`` delta of each timed run (taken after it, outside the timing).
    """
    with LocalShards(1, extra=SERVER_ARGS) as shards:
        client = shards.servers[0].client()
        servers = (client,)
        # One prefix per bound (the same length): a store's layout marker names its max_size (zcluster._guard).
        clusters = {
            b: Cluster.from_urls(
                shards.urls, max_size=b, **{**options, "prefix": options["prefix"] if b is None else OTHER_PREFIX}
            )
            for b in bounds
        }
        for c in clusters.values():
            c.load_scripts()
        sha = client.script_load(PER_TUPLE_LUA)
        sha_bounded = client.script_load(PER_TUPLE_BOUNDED_LUA)

        def methods(bound: int | None) -> dict[str, Callable[[list[KeyScoreMember]], Any]]:
            if bound is None:
                return {
                    "library": partial(insert_library, clusters[None]),
                    "per_tuple_script": partial(insert_per_tuple_script, client, sha),
                    "zadd": partial(insert_zadd, client),
                }
            return {
                "library": partial(insert_library, clusters[bound]),
                "per_tuple_script": partial(insert_per_tuple_script_bounded, client, sha_bounded, bound),
                "zadd": partial(insert_zadd_trimmed, client, bound),
            }

        warm = make_tuples(min(n, 5_000), min(key_counts), seed=20_000)
        for b in bounds:
            for fn in methods(b).values():
                client.flushall()
                fn(warm)
        rows: list[dict[str, Any]] = [
            {
                "keys": k,
                "max_size": b,
                "tuples": n,
                "tuples_per_key": n / k,
                "per_tuple_script": "roshi's script, one EVALSHA per tuple"
                + ("" if b is None else f", with its bound {b}: ZCARD check, ZADD, ZREMRANGEBYRANK 0 -({b}+1)"),
                "zadd_mode": "plain ZADD"
                if b is None
                else f"ZADD + ZREMRANGEBYRANK key 0 -({b}+1) after every {max(1, b // 10)} ZADDs to a key",
                "samples": {name: [] for name in MATRIX_METHODS},
                "memory_samples": {name: [] for name in MATRIX_METHODS},
                "cpu_samples": {name: [] for name in MATRIX_METHODS},
                "zadd_trims_sent": [],
                "max_tuples_per_key": [],
            }
            for k in key_counts
            for b in bounds
        ]
        print(
            f"matrix: 1 shard, {n:,} fresh tuples per run, keys {'/'.join(f'{k:,}' for k in key_counts)} x "
            f"max_size {'/'.join(_bound_label(b) for b in bounds)}, {repeat} repetitions",
            flush=True,
        )
        for rep in range(repeat):
            for p, row in enumerate(rows):
                tuples = make_tuples(n, row["keys"], seed=1_000 + rep * len(rows) + p)
                row["max_tuples_per_key"].append(max(Counter(t.key for t in tuples).values()))
                fns = methods(row["max_size"])
                turn = (rep + p) % len(MATRIX_METHODS)
                for name in MATRIX_METHODS[turn:] + MATRIX_METHODS[:turn]:
                    client.flushall()
                    time.sleep(0.05)
                    before = used_memory(client)
                    out, wall, client_s, server_s = metered(servers, fns[name], tuples)
                    time.sleep(0.05)  # let the server settle before reading its memory
                    row["memory_samples"][name].append((used_memory(client) - before) / n)
                    row["samples"][name].append(n / wall)
                    row["cpu_samples"][name].append({"client_us": client_s / n * 1e6, "server_us": server_s / n * 1e6})
                    if name == "zadd" and row["max_size"] is not None:
                        row["zadd_trims_sent"].append(out)
            line = "  ".join(
                f"{r['keys']}/{_bound_label(r['max_size'])}: "
                + "/".join(f"{r['samples'][m][-1] / 1000:.0f}k" for m in MATRIX_METHODS)
                for r in rows
            )
            print(f"  rep {rep + 1}/{repeat} (a/b/c tuples/s): {line}", flush=True)
        client.flushall()
        for c in clusters.values():
            c.close()
        client.close()
        binary = shards.binary
    for row in rows:
        _summarize_matrix_row(row)
    return rows, binary


def _summarize_matrix_row(row: dict[str, Any]) -> None:
    s, mem, cpu = row["samples"], row["memory_samples"], row["cpu_samples"]
    row["medians"] = {k: med(v) for k, v in s.items()}
    row["memory_medians"] = {k: med(v) for k, v in mem.items()}
    row["cpu_medians"] = {
        k: {part: med([x[part] for x in v]) for part in ("client_us", "server_us")} for k, v in cpu.items()
    }
    for v in row["cpu_medians"].values():
        v["total_us"] = v["client_us"] + v["server_us"]
    m, mm, tot = row["medians"], row["memory_medians"], {k: v["total_us"] for k, v in row["cpu_medians"].items()}
    row["ratios"] = {
        "library_vs_per_tuple_script": m["library"] / m["per_tuple_script"],
        "library_vs_zadd": m["library"] / m["zadd"],
        "memory": mm["library"] / mm["zadd"],
    }
    row["cpu_ratios"] = {
        "library_vs_per_tuple_script": tot["per_tuple_script"] / tot["library"],
        "library_vs_zadd": tot["zadd"] / tot["library"],
    }
    row["paired_ratios"] = {
        "library_vs_per_tuple_script": [x / y for x, y in zip(s["library"], s["per_tuple_script"], strict=True)],
        "library_vs_zadd": [x / y for x, y in zip(s["library"], s["zadd"], strict=True)],
    }
    bound = row["max_size"]
    row["bound_reached"] = bound is not None and max(row["max_tuples_per_key"]) > bound


def run_redis_cluster(n: int, nkeys: int, repeat: int, options: dict[str, Any]) -> dict[str, Any]:
    """``Cluster.insert`` on a Redis Cluster of CLUSTER_MASTERS masters vs as many standalone shards, same tuples."""
    with LocalRedisCluster(CLUSTER_MASTERS) as rc, LocalShards(CLUSTER_MASTERS) as shards:
        groups = {
            "redis_cluster": (
                Cluster.from_cluster_url(rc.url, **options),
                [s.client() for s in rc.servers],
            ),
            "standalone": (Cluster.from_urls(shards.urls, **options), [s.client() for s in shards.servers]),
        }
        for cluster, clients in groups.values():
            cluster.load_scripts()
            _flush_all(clients)
            insert_library(cluster, make_tuples(min(n, 5_000), nkeys, seed=30_000))
            _flush_all(clients)
        samples: dict[str, list[float]] = {name: [] for name in groups}
        cpu: dict[str, list[dict[str, float]]] = {name: [] for name in groups}
        print(
            f"Redis Cluster point: {n:,} tuples over {nkeys:,} keys, {CLUSTER_MASTERS}-master Redis Cluster vs "
            f"{CLUSTER_MASTERS} standalone shards, {repeat} repetitions",
            flush=True,
        )
        names = list(groups)
        for rep in range(repeat):
            tuples = make_tuples(n, nkeys, seed=3_000 + rep)
            for name in names[rep % 2 :] + names[: rep % 2]:
                cluster, clients = groups[name]
                _flush_all(clients)
                _, wall, client_s, server_s = metered(tuple(clients), insert_library, cluster, tuples)
                samples[name].append(n / wall)
                cpu[name].append({"client_us": client_s / n * 1e6, "server_us": server_s / n * 1e6})
            print(
                f"  rep {rep + 1}/{repeat}: " + "  ".join(f"{k}={v[-1]:,.0f}" for k, v in samples.items()),
                flush=True,
            )
        for cluster, clients in groups.values():
            _flush_all(clients)
            cluster.close()
            for c in clients:
                c.close()
    m = {k: med(v) for k, v in samples.items()}
    cpu_m = {k: {part: med([x[part] for x in v]) for part in ("client_us", "server_us")} for k, v in cpu.items()}
    for v in cpu_m.values():
        v["total_us"] = v["client_us"] + v["server_us"]
    return {
        "tuples": n,
        "keys": nkeys,
        "masters": CLUSTER_MASTERS,
        "repeat": repeat,
        "samples": samples,
        "medians": m,
        "ratio": m["redis_cluster"] / m["standalone"],
        "paired_ratios": [x / y for x, y in zip(samples["redis_cluster"], samples["standalone"], strict=True)],
        "cpu_samples": cpu,
        "cpu_medians": cpu_m,
        "cpu_ratio": cpu_m["standalone"]["total_us"] / cpu_m["redis_cluster"]["total_us"],
        "goal": f">= {MATRIX_GOALS['redis_cluster']}",
    }


def print_matrix(rows: list[dict[str, Any]], rc: dict[str, Any]) -> dict[str, Any]:
    """Print the matrix and the Redis Cluster point; returns the goal verdicts."""
    g = MATRIX_GOALS

    def mark(ok: bool) -> str:
        return "met" if ok else "MISS"

    def note(text: str) -> None:
        print(textwrap.fill(text, width=116, initial_indent="  ", subsequent_indent="      "))

    print()
    print(
        f"matrix: 1 shard, {rows[0]['tuples']:,} fresh tuples per run, medians of {len(rows[0]['samples']['library'])}"
    )
    print(
        f"{'':>24} {'thousand tuples/s':^26}   {'(a)/(b)':<12} {'(a)/(c)':<12} {'by CPU':^15} {'bytes per tuple':^23}"
    )
    print(
        f"{'keys':>8} {'max_size':>8} {'t/key':>6} {'(a)':>8} {'(b)':>8} {'(c)':>8}   "
        f"{'>= ' + str(g['library_vs_per_tuple_script']):<12} {'>= ' + str(g['library_vs_zadd']):<12} "
        f"{'(a)/(b)':>7} {'(a)/(c)':>7} {'(a)':>7} {'(c)':>7} {'(a)/(c)':>7}"
    )
    for r in rows:
        m, rt, cr, mm = r["medians"], r["ratios"], r["cpu_ratios"], r["memory_medians"]
        ab, ac = rt["library_vs_per_tuple_script"], rt["library_vs_zadd"]
        print(
            f"{r['keys']:>8,} {_bound_label(r['max_size']):>8} {r['tuples_per_key']:>6.0f} "
            f"{m['library'] / 1000:>8.0f} {m['per_tuple_script'] / 1000:>8.0f} {m['zadd'] / 1000:>8.0f}   "
            f"{ab:>5.2f} {mark(ab >= g['library_vs_per_tuple_script']):<6} "
            f"{ac:>5.2f} {mark(ac >= g['library_vs_zadd']):<6} "
            f"{cr['library_vs_per_tuple_script']:>7.2f} {cr['library_vs_zadd']:>7.2f} "
            f"{mm['library']:>7.1f} {mm['zadd']:>7.1f} {rt['memory']:>7.2f}"
        )
    note(
        "(a) Cluster.insert, a Cluster with that max_size; (b) one EVALSHA per tuple, pipelined; (c) redis-py "
        "pipelined ZADD. Unbounded points: (b) roshi's script without its bound, (c) plain ZADD."
    )
    bounded = [r for r in rows if r["max_size"] is not None]
    if bounded:
        note(f"Bounded points: (b) {bounded[0]['per_tuple_script']};")
        note(
            f"(c) {bounded[0]['zadd_mode']}; trims sent over all repetitions: "
            + ", ".join(f"{sum(r['zadd_trims_sent']):,} at {r['keys']:,} keys" for r in bounded)
            + "."
        )
        most = max(max(r["max_tuples_per_key"]) for r in bounded)
        if not any(r["bound_reached"] for r in bounded):
            note(
                f"No key got more than {most:,} tuples in a run, below the bound: nothing is trimmed, so the "
                "bounded points measure the cost of the bounded code paths (the library's one-tuple-at-a-time "
                "bounded script path with floors; roshi's ZCARD + ZREMRANGEBYRANK per tuple), not of trimming."
            )
        else:
            note(f"The largest key got {most:,} tuples in a run: trimming happened at some bounded points.")
    note(
        "by CPU: inverse CPU-us per tuple, client + server (robust to other load on the machine). Memory: "
        "used_memory delta of each timed run over the tuples written."
    )
    unbounded = [r for r in rows if r["max_size"] is None]
    mem_row = max(unbounded, key=lambda r: r["keys"]) if unbounded else None
    verdicts: dict[str, Any] = {
        "library_vs_per_tuple_script_all": all(
            r["ratios"]["library_vs_per_tuple_script"] >= g["library_vs_per_tuple_script"] for r in rows
        ),
        "library_vs_zadd_all": all(r["ratios"]["library_vs_zadd"] >= g["library_vs_zadd"] for r in rows),
    }
    print()
    if mem_row is not None:
        v = mem_row["ratios"]["memory"]
        verdicts["memory"] = v <= g["memory"]
        print(
            goal_line(
                f"memory (a)/(c), {mem_row['keys']:,} keys unbounded",
                v,
                f"<= {g['memory']}",
                v <= g["memory"],
                f"({mem_row['memory_medians']['library']:.1f} vs {mem_row['memory_medians']['zadd']:.1f} B/tuple; "
                "(c) keys carry no prefix or hash tag)",
            )
        )
    v = rc["ratio"]
    verdicts["redis_cluster"] = v >= g["redis_cluster"]
    print(
        goal_line(
            f"Redis Cluster / {rc['masters']} standalone shards",
            v,
            f">= {g['redis_cluster']}",
            v >= g["redis_cluster"],
            f"({rc['medians']['redis_cluster']:,.0f} vs {rc['medians']['standalone']:,.0f} tuples/s, "
            f"{rc['tuples']:,} tuples over {rc['keys']:,} keys; by CPU {rc['cpu_ratio']:.2f})",
        )
    )
    print("  paired per-rep Redis Cluster / standalone: " + ", ".join(f"{x:.2f}" for x in rc["paired_ratios"]))
    print(
        f"  matrix goals at every point: (a)/(b) {mark(verdicts['library_vs_per_tuple_script_all'])}, "
        f"(a)/(c) {mark(verdicts['library_vs_zadd_all'])}"
    )
    return verdicts


# -- main -------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tuples", type=int, default=200_000, help="tuples per insert run (default 200000)")
    ap.add_argument("--keys", type=int, default=2_000, help="distinct logical keys (default 2000)")
    ap.add_argument("--repeat", type=int, default=5, help="repetitions of every measurement (default 5)")
    ap.add_argument(
        "--quick", action="store_true", help="smoke run: 20k tuples, 500 keys, 2 repetitions (matrix keys / 10)"
    )
    ap.add_argument("--batch-size", type=int, default=None, help="Cluster batch_size (default: library's)")
    ap.add_argument("--pipeline-calls", type=int, default=None, help="Cluster pipeline_calls (default: library's)")
    ap.add_argument("--out", type=Path, default=RESULTS, help="results folder (default bench/results)")
    ap.add_argument("--no-plot", action="store_true", help="skip the PNG")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument(
        "--matrix-only",
        action="store_true",
        help="only the matrix and the Redis Cluster point (writes cluster-matrix[-quick].{json,png})",
    )
    mode.add_argument("--no-matrix", action="store_true", help="skip the matrix and the Redis Cluster point")
    ap.add_argument("--module", action="store_true", help="servers load zcluster's Redis module (results -module)")
    args = ap.parse_args(argv)
    if args.module:
        from zcluster._server_module import loadmodule

        SERVER_ARGS.extend(loadmodule())
    if args.quick:
        args.tuples, args.keys, args.repeat = 20_000, 500, 2
    options: dict[str, Any] = {"prefix": PREFIX}
    if args.batch_size:
        options["batch_size"] = args.batch_size
    if args.pipeline_calls:
        options["pipeline_calls"] = args.pipeline_calls

    started = time.perf_counter()
    date = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    core: dict[str, Any] = {}
    if not args.matrix_only:
        core = run_core(args, options)
    extra: dict[str, Any] = {}
    binary: str | None = None
    if not args.no_matrix:
        scale = args.tuples / MATRIX_TUPLES
        key_counts = [max(1, round(k * scale)) for k in MATRIX_KEYS]
        cluster_keys = max(1, round(CLUSTER_KEYS * scale))
        if core:
            print()
        matrix, matrix_binary = run_matrix(args.tuples, key_counts, MATRIX_BOUNDS, args.repeat, options)
        print()
        rc = run_redis_cluster(args.tuples, cluster_keys, args.repeat, options)
        verdicts = print_matrix(matrix, rc)
        extra = {
            "matrix": matrix,
            "redis_cluster": rc,
            "matrix_goals": {
                "library_vs_per_tuple_script": f">= {MATRIX_GOALS['library_vs_per_tuple_script']} at every point",
                "library_vs_zadd": f">= {MATRIX_GOALS['library_vs_zadd']} at every point",
                "memory": f"<= {MATRIX_GOALS['memory']} at the most keys, unbounded",
                "redis_cluster": f">= {MATRIX_GOALS['redis_cluster']}",
            },
            "matrix_verdicts": verdicts,
        }
        binary = matrix_binary
    elapsed = time.perf_counter() - started
    machine = core.pop("machine", None) or machine_info(binary or "redis-server")
    print(
        f"machine: {machine['nproc']} CPUs, {machine['cpu_model']}, {machine['redis_server']}, "
        f"Python {machine['python']}, load {machine['loadavg'][0]:.2f}; run took {elapsed:.0f}s"
    )

    report = {
        "benchmark": "bench/bench_cluster.py",
        "date": date,
        "machine": machine,
        **core,
        **extra,
        "elapsed_s": elapsed,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    stem = "cluster-matrix" if args.matrix_only else "cluster"
    if args.quick:
        stem += "-quick"
    if args.module:
        stem += "-module"
    json_path = args.out / f"{stem}.json"
    json_path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {json_path}")
    has_core = bool(core) and core["ratios"]["library_vs_redis_benchmark"] is not None
    if not args.no_plot and (has_core or "matrix" in report):
        png = args.out / f"{stem}.png"
        plot(png, report, core=has_core)
        print(f"wrote {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
