"""Replicas: a farm of 3 clusters against one cluster, read strategies, and the walker, in one run.

On local ``redis-server`` processes (:class:`zcluster.testing.LocalShards`), all on this machine's cores:

  insert   ``Farm.insert`` over 3 replicas (one shard each) against ``Cluster.insert`` into one shard, the
           same fresh tuples from FLUSHALL, interleaved; spread keys (1 tuple per key per call on
           average) and hot keys (100 per key). Goal: farm >= 0.6x single.
  select   ``Farm.select`` (limit 10, 1,000 keys per call) with send-all-read-all against
           send-one-read-one, replicas in agreement: the price of merging every read.
  walk     ``Walker.run()`` keys/s over the whole keyspace when nothing diverges (goal >= 50k keys/s), and
           when one replica was flushed (the rebuild rate: every key read whole and repaired).

Medians over ``--repeat`` repetitions, methods interleaved; the farm's three servers, the single server
and this client share the same cores (``nproc`` is in the JSON), so the farm's 3x server work competes
with the client: the ratio is what a user on this machine gets, not a best case. Results go to
``bench/results/farm[-quick].json`` and ``.png``.

    python bench/bench_farm.py            # 200k tuples, 100k keys for the walk, 3 repetitions
    python bench/bench_farm.py --quick    # 20k tuples, 10k keys, 2 repetitions
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from pathlib import Path
from typing import Any

from bench_cluster import machine_info, make_tuples, med, metered, timed

from zcluster import Cluster
from zcluster.farm import Farm, SendAllReadAll, SendOneReadOne, Walker
from zcluster.testing import LocalShards

RESULTS = Path(__file__).resolve().parent / "results"


def insert_all(store: Cluster | Farm, tuples: list[Any], call: int) -> None:
    for lo in range(0, len(tuples), call):
        store.insert(tuples[lo : lo + call])


def select_all(store: Farm, keys: list[str]) -> None:
    for lo in range(0, len(keys), 1000):
        store.select(keys[lo : lo + 1000], limit=10)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--repeat", type=int, default=None)
    ap.add_argument("--tuples", type=int, default=None)
    ap.add_argument("--no-plot", action="store_true")
    args = ap.parse_args(argv)
    n = args.tuples or (20_000 if args.quick else 200_000)
    repeat = args.repeat or (2 if args.quick else 3)
    walk_keys = n // 2
    call = 10_000
    report: dict[str, Any] = {"date": dt.date.today().isoformat(), "tuples": n, "repeat": repeat, "call": call}
    with LocalShards(3) as replicas, LocalShards(1) as single_server:
        report["machine"] = machine_info(replicas.binary)
        clusters = [Cluster.from_urls([u]) for u in replicas.urls]
        farm = Farm(clusters, write_quorum="51%")
        single = Cluster.from_urls(single_server.urls)
        flush = [s.client() for s in [*replicas.servers, *single_server.servers]]

        def flush_all() -> None:
            for c in flush:
                c.flushall()

        # -- insert: farm vs single, spread and hot keys
        shapes = {"spread": n, "hot": max(1, n // 100)}
        inserts: dict[str, dict[str, list[float]]] = {s: {"farm": [], "single": []} for s in shapes}
        cpu: dict[str, dict[str, list[tuple[float, float]]]] = {s: {"farm": [], "single": []} for s in shapes}
        servers = {"farm": tuple(flush[:3]), "single": (flush[3],)}
        for r in range(repeat):
            for shape, nkeys in shapes.items():
                tuples = make_tuples(n, nkeys, seed=r * 10 + len(shape))
                order = [("farm", farm), ("single", single)] if r % 2 == 0 else [("single", single), ("farm", farm)]
                for name, store in order:
                    flush_all()
                    _, wall, client_cpu, server_cpu = metered(servers[name], insert_all, store, tuples, call)
                    inserts[shape][name].append(n / wall)
                    cpu[shape][name].append((client_cpu / n * 1e6, server_cpu / n * 1e6))
        report["insert"] = {
            shape: {
                "farm_tuples_per_s": med(v["farm"]),
                "single_tuples_per_s": med(v["single"]),
                "ratio": med(v["farm"]) / med(v["single"]),
                "client_us_per_tuple": {k: med([c for c, _ in cpu[shape][k]]) for k in v},
                "server_us_per_tuple": {k: med([s for _, s in cpu[shape][k]]) for k in v},
                "samples": v,
            }
            for shape, v in inserts.items()
        }

        # -- select and walk on one agreed keyspace
        flush_all()
        tuples = make_tuples(n, walk_keys, seed=99)
        insert_all(farm, tuples, call)
        keys = sorted({t.key for t in tuples})
        strategies = {"all": SendAllReadAll(), "one": SendOneReadOne()}
        selects: dict[str, list[float]] = {k: [] for k in strategies}
        walks: list[float] = []
        for r in range(repeat):
            for name, strategy in list(strategies.items()) if r % 2 == 0 else list(strategies.items())[::-1]:
                reader = Farm(clusters, read=strategy)
                selects[name].append(len(keys) / timed(select_all, reader, keys))
            t0 = time.perf_counter()
            result = Walker(farm).run()
            walks.append(result.keys / (time.perf_counter() - t0))
            assert result.diverged == 0 and result.position is None, result
        report["select"] = {
            "all_keys_per_s": med(selects["all"]),
            "one_keys_per_s": med(selects["one"]),
            "ratio_all_over_one": med(selects["all"]) / med(selects["one"]),
            "samples": selects,
        }
        # rebuild: one replica flushed, the walker copies everything back
        rebuilds: list[float] = []
        for _ in range(repeat):
            flush[2].flushall()
            t0 = time.perf_counter()
            result = Walker(farm).run()
            rebuilds.append(result.keys / (time.perf_counter() - t0))
            assert result.diverged == len(keys), (result.diverged, len(keys))
        report["walk"] = {
            "keys": len(keys),
            "agreed_keys_per_s": med(walks),
            "rebuild_keys_per_s": med(rebuilds),
            "samples": {"agreed": walks, "rebuild": rebuilds},
        }
        farm.close()
        single.close()

    print(
        f"zcluster farm bench, {report['date']}, {n} tuples, {repeat} repetitions, nproc {report['machine']['nproc']}"
    )
    for shape, row in report["insert"].items():
        goal = "met" if row["ratio"] >= 0.6 else "MISSED"
        print(
            f"  insert {shape:<6} farm {row['farm_tuples_per_s']:>9,.0f}/s"
            f"  single {row['single_tuples_per_s']:>9,.0f}/s  ratio {row['ratio']:.2f} (goal >= 0.6: {goal})"
        )
        c, sv = row["client_us_per_tuple"], row["server_us_per_tuple"]
        print(
            f"      CPU µs/tuple: client farm {c['farm']:.2f} single {c['single']:.2f};"
            f" servers farm {sv['farm']:.2f} (3 servers) single {sv['single']:.2f}"
        )
    s = report["select"]
    print(
        f"  select all {s['all_keys_per_s']:>9,.0f} keys/s  one {s['one_keys_per_s']:>9,.0f} keys/s"
        f"  all/one {s['ratio_all_over_one']:.2f}"
    )
    w = report["walk"]
    goal = "met" if w["agreed_keys_per_s"] >= 50_000 else "MISSED"
    print(
        f"  walk {w['keys']:,} keys: agreed {w['agreed_keys_per_s']:>9,.0f} keys/s (goal >= 50k: {goal});"
        f"  rebuild {w['rebuild_keys_per_s']:>9,.0f} keys/s"
    )
    RESULTS.mkdir(exist_ok=True)
    stem = "farm-quick" if args.quick else "farm"
    (RESULTS / f"{stem}.json").write_text(json.dumps(report, indent=2) + "\n")
    if not args.no_plot:
        plot(RESULTS / f"{stem}.png", report)
    return 0


def plot(path: Path, report: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    shapes = list(report["insert"])
    x = range(len(shapes))
    axes[0].bar([i - 0.2 for i in x], [report["insert"][s]["single_tuples_per_s"] for s in shapes], 0.4, label="single")
    axes[0].bar(
        [i + 0.2 for i in x], [report["insert"][s]["farm_tuples_per_s"] for s in shapes], 0.4, label="farm of 3"
    )
    axes[0].set_xticks(list(x), shapes)
    axes[0].set_title("insert tuples/s")
    axes[0].legend()
    s = report["select"]
    axes[1].bar(["send-one", "send-all"], [s["one_keys_per_s"], s["all_keys_per_s"]])
    axes[1].set_title("select keys/s (limit 10)")
    w = report["walk"]
    axes[2].bar(["agreed", "rebuild"], [w["agreed_keys_per_s"], w["rebuild_keys_per_s"]])
    axes[2].axhline(50_000, color="red", linestyle="--", label="goal")
    axes[2].set_title("walker keys/s")
    axes[2].legend()
    fig.suptitle(f"zcluster farm, {report['date']}, nproc {report['machine']['nproc']}")
    fig.tight_layout()
    fig.savefig(path)


if __name__ == "__main__":
    sys.exit(main())
