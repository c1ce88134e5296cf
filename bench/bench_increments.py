"""Exactly-once increments against what a user writes by hand, side by side in one run.

On one local ``redis-server`` (:class:`zcluster.testing.LocalShards`), the same increments (``--n``, each a
member of a key gaining a delta) at two shapes, hot keys (``--hot`` keys: a leaderboard per few keys) and
spread keys (``--spread`` keys), every method from FLUSHALL, methods interleaved, medians of ``--repeat``:

  (a) ``Cluster.increment`` with positions (fenced: exactly once), calls of 10,000 increments (a poll's
      flush), one source;
  (b) redis-py pipelined ``ZINCRBY`` (pipelines of 1,000): at-least-once, what a hand-written writer does;
  (c) ``Farm.increment`` on a farm of 3 replicas (one more server each, on the same cores): every replica
      must confirm each increment.

Goal: (a)/(b) >= 0.7 at both shapes. Memory: the keys' ``MEMORY USAGE`` (every key, ``SAMPLES 0``: exact)
summed, per distinct member, after (a) against after (b) (the fences are one small hash per key per source),
goal <= 1.3. (``used_memory`` deltas also counted the clients' query buffers, which (a)'s overlapped sends
leave larger for a while.) Results go to
``bench/results/increments[-quick].json`` and ``.png``.

    python bench/bench_increments.py            # 500k increments, 2k hot and 100k spread keys, 5 repetitions
    python bench/bench_increments.py --quick    # 100k increments, 3 repetitions
    python bench/bench_increments.py --quick --kind counters   # Count against pipelined HINCRBY

``--kind counters`` runs the same shapes with :class:`zcluster.Count` against redis-py pipelined ``HINCRBY``
(results ``increments-counters[-quick].*``); memory is per distinct (key, field) either way.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import random
import time
from pathlib import Path
from typing import Any

import redis
from bench_cluster import machine_info, med, timed

from zcluster import Cluster, Count, Incr, KeyMember
from zcluster._server_module import loadmodule
from zcluster.farm import Farm
from zcluster.testing import LocalShards

RESULTS = Path(__file__).resolve().parent / "results"
CALL = 10_000
PIPELINE = 1_000


def make(n: int, keys: int, members: int, seed: int, counters: bool = False) -> list[Any]:
    rng = random.Random(seed)
    if counters:
        return [Count(f"lb:{rng.randrange(keys)}", f"u{rng.randrange(members)}", rng.randint(1, 5)) for _ in range(n)]
    return [Incr(f"lb:{rng.randrange(keys)}", f"u{rng.randrange(members)}", float(rng.randint(1, 5))) for _ in range(n)]


def library(cluster: Cluster | Farm, incs: list[Any]) -> None:
    for lo in range(0, len(incs), CALL):
        cluster.increment("bench/journal", [(lo + i, inc) for i, inc in enumerate(incs[lo : lo + CALL])])


def by_hand(client: redis.Redis, incs: list[Any]) -> None:
    for lo in range(0, len(incs), PIPELINE):
        pipe = client.pipeline(transaction=False)
        for inc in incs[lo : lo + PIPELINE]:
            if type(inc) is Count:
                pipe.hincrby(inc.key, inc.field, inc.delta)
            else:
                pipe.zincrby(inc.key, inc.delta, inc.member)
        pipe.execute()


def bytes_per_member(client: redis.Redis, members: int) -> float:
    """Every key's ``MEMORY USAGE`` summed, per distinct (key, member) of the increments (``members``): what
    the totals and their fences cost per total kept."""
    keys = list(client.scan_iter(count=10_000))
    pipe = client.pipeline(transaction=False)
    for k in keys:
        pipe.memory_usage(k, samples=0)
    used = sum(int(r) for r in pipe.execute(raise_on_error=False))
    return used / max(1, members)


def script_commands(client: redis.Redis) -> dict[str, int]:
    """The commands the server ran since CONFIG RESETSTAT (INFO commandstats counts a script's own calls),
    but the script calls themselves and the bench's own."""
    stats = client.info("commandstats")
    skip = ("cmdstat_evalsha", "cmdstat_eval", "cmdstat_info", "cmdstat_config|resetstat", "cmdstat_script|load")
    return {k[8:]: int(v["calls"]) for k, v in stats.items() if k not in skip}


def totals_of(cluster: Cluster, sample: list[tuple[str, str]], counters: bool) -> dict[tuple[str, str], float]:
    """The totals of ``sample`` ((key, member) pairs) as ``cluster`` reads them."""
    if counters:
        held = cluster.counters(sorted({k for k, _ in sample}))
        return {(k, m): float(held[k].get(m, 0)) for k, m in sample}
    ranked = cluster.ranks(sample)
    return {(k, m): 0.0 if (r := ranked[KeyMember(k, m)]) is None else r[1] for k, m in sample}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--n", type=int, default=None)
    ap.add_argument("--hot", type=int, default=2_000)
    ap.add_argument("--spread", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=None)
    ap.add_argument("--no-plot", action="store_true")
    ap.add_argument("--module", action="store_true", help="servers load zcluster's Redis module (results -module)")
    ap.add_argument("--kind", choices=("sums", "counters"), default="sums", help="Incr vs ZINCRBY, or Count vs HINCRBY")
    args = ap.parse_args(argv)
    servers = loadmodule() if args.module else []
    counters = args.kind == "counters"
    plain = "HINCRBY" if counters else "ZINCRBY"
    n = args.n or (100_000 if args.quick else 500_000)
    repeat = args.repeat or (3 if args.quick else 5)
    shapes = {"hot": (args.hot, 50), "spread": (args.spread, 4)}
    report: dict[str, Any] = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "n": n,
        "kind": args.kind,
        "shapes": {},
    }
    with (
        LocalShards(1, extra=servers) as shards,
        LocalShards(3, extra=servers) as trio,
        Cluster.from_urls(shards.urls, prefix="b:") as cluster,
        Farm([Cluster.from_urls([u], prefix="b:") for u in trio.urls]) as farm,
    ):
        client = redis.Redis.from_url(shards.urls[0])
        replicas = [redis.Redis.from_url(u) for u in trio.urls]
        for name, (keys, members) in shapes.items():
            incs = make(n, keys, members, seed=len(name), counters=counters)
            distinct = len({(inc[0], inc[1]) for inc in incs})
            runs: dict[str, list[float]] = {"a": [], "b": [], "c": []}
            memory: dict[str, list[float]] = {"a": [], "b": []}
            for r in range(repeat):
                order = ["a", "b"] if r % 2 == 0 else ["b", "a"]
                for replica in replicas:
                    replica.flushall()
                runs["c"].append(n / timed(library, farm, incs))
                for method in order:
                    client.flushall()
                    seconds = timed(library, cluster, incs) if method == "a" else timed(by_hand, client, incs)
                    memory[method].append(bytes_per_member(client, distinct))
                    runs[method].append(n / seconds)
            # a correctness check of the last run of (a): totals equal a hand count; the server's commands
            # per increment (what the script runs, from INFO commandstats) counted on the way
            client.flushall()
            client.config_resetstat()
            library(cluster, incs)
            commands = script_commands(client)
            library(cluster, incs)  # a replay: fenced
            want: dict[tuple[str, str], float] = {}
            for inc in incs:
                want[(inc[0], str(inc[1]))] = want.get((inc[0], str(inc[1])), 0.0) + inc.delta
            sample = random.Random(1).sample(sorted(want), 200)
            got = totals_of(cluster, sample, counters)
            assert got == {k: want[k] for k in sample}, "totals differ from the hand count"
            for replica in replicas:
                replica.flushall()
            library(farm, incs)
            library(farm, incs)
            for member in farm.clusters:
                held = totals_of(member, sample, counters)
                assert held == {k: want[k] for k in sample}, "a replica's totals differ from the hand count"
            shape = {
                "keys": keys,
                "members_per_key": members,
                "a_per_s": runs["a"],
                "b_per_s": runs["b"],
                "a_over_b": med(runs["a"]) / med(runs["b"]),
                "c_per_s": runs["c"],
                "farm_over_cluster": med(runs["c"]) / med(runs["a"]),
                "paired": [x / y for x, y in zip(runs["a"], runs["b"], strict=True)],
                "bytes_per_member_a": med(memory["a"]),
                "bytes_per_member_b": med(memory["b"]),
                "memory_a_over_b": med(memory["a"]) / med(memory["b"]),
                "server_commands_per_increment_a": sum(commands.values()) / n,
                "server_commands_a": commands,
            }
            report["shapes"][name] = shape
            print(
                f"{name:>6} ({keys:,} keys): increment {med(runs['a']):>10,.0f}/s  {plain} {med(runs['b']):>10,.0f}/s"
                f"  ratio {shape['a_over_b']:.2f} (goal >= 0.7 {'met' if shape['a_over_b'] >= 0.7 else 'MISSED'};"
                f" paired {min(shape['paired']):.2f}..{max(shape['paired']):.2f})"
                f"  memory/member {shape['bytes_per_member_a']:.1f} vs {shape['bytes_per_member_b']:.1f} B"
                f" = {shape['memory_a_over_b']:.2f}"
                f" (goal <= 1.3 {'met' if shape['memory_a_over_b'] <= 1.3 else 'MISSED'})"
                f"  farm of 3: {med(runs['c']):,.0f}/s = {shape['farm_over_cluster']:.2f} of one cluster"
                f"  server commands per increment {shape['server_commands_per_increment_a']:.2f} (plain: 1)"
                f" {commands}"
            )
        report["machine"] = machine_info(shards.binary)
    stem = ("increments-counters" if counters else "increments") + ("-quick" if args.quick else "")
    stem += "-module" if args.module else ""
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{stem}.json").write_text(json.dumps(report, indent=2) + "\n")
    if not args.no_plot:
        plot(RESULTS / f"{stem}.png", report)
    return 0


def plot(path: Path, report: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    counters = report.get("kind") == "counters"
    plain = "HINCRBY" if counters else "ZINCRBY"
    names = list(report["shapes"])
    rates = [[med(report["shapes"][s][f"{m}_per_s"]) for s in names] for m in ("a", "b")]
    xs = range(len(names))
    axes[0].bar([x - 0.2 for x in xs], rates[0], 0.4, label="Cluster.increment (exactly once)")
    axes[0].bar([x + 0.2 for x in xs], rates[1], 0.4, label=f"pipelined {plain} (at least once)")
    axes[0].set_xticks(list(xs), [f"{s} ({report['shapes'][s]['keys']:,} keys)" for s in names])
    axes[0].set_ylabel("increments/s (median)")
    axes[0].legend(fontsize=8)
    mem = [[report["shapes"][s][f"bytes_per_member_{m}"] for s in names] for m in ("a", "b")]
    axes[1].bar([x - 0.2 for x in xs], mem[0], 0.4, label="with fences")
    axes[1].bar([x + 0.2 for x in xs], mem[1], 0.4, label="plain hashes" if counters else "plain sorted sets")
    axes[1].set_xticks(list(xs), names)
    axes[1].set_ylabel("bytes per member")
    axes[1].legend(fontsize=8)
    fig.suptitle(f"{report['n']:,} increments ({report['kind']}), 1 shard, {report['date'][:10]}")
    fig.tight_layout()
    fig.savefig(path)


if __name__ == "__main__":
    start = time.perf_counter()
    code = main()
    print(f"done in {time.perf_counter() - start:.0f} s")
    raise SystemExit(code)
