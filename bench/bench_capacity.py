"""Capacity: Redis memory per member and writes/s per shard, against plain Redis, for docs/capacity.md.

Part 1, memory, on one local ``redis-server`` (:class:`zcluster.testing.LocalShards`): for each shape, from
FLUSHALL, the library's keys are written, then (from FLUSHALL again) a plain-Redis baseline of the same
members: ZADD into one sorted set per logical key (``timeline:<k>``: no prefix, no hash tag), HSET for
counters. Bytes are every key's ``MEMORY USAGE`` (``SAMPLES 0``: exact) summed per kind of key (K+, K-, the
floor, plain), and the ``used_memory`` delta (which also counts the keyspace's hash table, resized in powers of
two: a step function of the key count). Shapes: 2P-set inserts into small sets (listpack encoding) and large sets
(skiplist); tombstones (deletes of members never inserted); members under a ``max_size`` bound, trimmed, with
their floor key; ``Incr`` totals with their fences from 1 and 4 sources per key, and ``Count`` from 4; the
state store's journal checkpoints (4 and 64 producer states each, saved twice: the floor key) and the keys a
real :class:`zcluster.state.Consumer` left after applying published traffic.

Part 2, writes/s per shard: one client process (this one) against one ``redis-server``, the main shapes,
library and baseline interleaved from FLUSHALL, medians of ``--repeat``: inserts at spread keys (2 tuples per
key) and hot keys (100 per key) against pipelined ZADD; increments at spread keys (4 members per key) and hot
keys against pipelined ZINCRBY; and the plain exactly-once ``Consumer`` polling published traffic (20,000 users).
Each run's client CPU (this process) and server CPU (``INFO cpu`` used_cpu_user + used_cpu_sys deltas) per
write, and the server's CPU share (server CPU seconds / wall seconds), say how many client processes one shard
can absorb. Client and server share this machine's cores: compare ratios and CPU per write, not absolute rates.

Results: ``bench/results/capacity[-quick].{json,png}``.

    python bench/bench_capacity.py --quick    # 1/5 of the members, 40k writes, 2 repetitions (~1 min)
    python bench/bench_capacity.py            # 200k members per shape, 200k writes, 3 repetitions (~4 min)
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import random
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import redis
from bench_cluster import insert_library, insert_zadd, machine_info, make_tuples, med, metered, used_memory
from bench_increments import by_hand
from bench_increments import library as increment_library
from bench_increments import make as make_increments

from zcluster import Cluster, Count, Incr, KeyScoreMember
from zcluster._server_module import loadmodule
from zcluster.message.sequencer import ProducerState
from zcluster.message.uuid import new_producer_id
from zcluster.state import Consumer, StateStore
from zcluster.testing import LocalShards
from zcluster.testing.traffic import Traffic, create_journals, publish, timeline_mapper

RESULTS = Path(__file__).resolve().parent / "results"
PREFIX = "zc:"
KINDS = {b"}+": "adds", b"}-": "removes", b"}~": "floor"}
MARKER = b"}layout"  # the layout guard's marker (zcluster._markers): one key per store and shard, not counted
BASE = 1_700_000_000.0


# -- part 1: memory -----------------------------------------------------------------------------------------


def tally(client: redis.Redis) -> dict[str, Any]:
    """Every key's ``MEMORY USAGE`` (exact), entries and encoding, summed per kind of key."""
    keys = list(client.scan_iter(count=10_000))
    pipe = client.pipeline(transaction=False)
    for k in keys:
        pipe.memory_usage(k, samples=0)
        pipe.type(k)
        pipe.object("encoding", k)
    replies = pipe.execute()
    out: dict[str, Any] = {}
    for i, k in enumerate(keys):
        used, kind_type, encoding = replies[3 * i : 3 * i + 3]
        kind = "marker" if k.endswith(MARKER) else KINDS.get(k[-2:], "plain")
        kind = "state" if k.startswith(b"{zcstate:") and kind != "marker" else kind
        row = out.setdefault(kind, {"keys": 0, "bytes": 0, "encodings": {}})
        row["keys"] += 1
        row["bytes"] += int(used)
        name = f"{kind_type.decode()}/{encoding.decode()}"
        row["encodings"][name] = row["encodings"].get(name, 0) + 1
    for row in out.values():
        row["encodings"] = dict(sorted(row["encodings"].items()))
    return out


def measured(client: redis.Redis, load: Callable[[], None]) -> dict[str, Any]:
    """From FLUSHALL: ``load()``, then the ``used_memory`` delta and the per-kind tally."""
    client.flushall()
    time.sleep(0.05)
    before = used_memory(client)
    load()
    time.sleep(0.05)  # the clients' query buffers are freed after the last reply
    kinds = tally(client)
    return {
        "used_memory_delta": used_memory(client) - before,
        "memory_usage": sum(r["bytes"] for k, r in kinds.items() if k != "marker"),
        "kinds": kinds,
    }


def members(nkeys: int, per_key: int, seed: int) -> list[KeyScoreMember]:
    """``per_key`` unique members in each of ``nkeys`` keys, unix-time scores with fractions."""
    rng = random.Random(seed)
    return [
        KeyScoreMember(f"timeline:{k}", BASE + rng.random() * 86_400.0, f"event-{k * per_key + i}")
        for k in range(nkeys)
        for i in range(per_key)
    ]


def kept(tuples: list[KeyScoreMember], bound: int) -> list[KeyScoreMember]:
    """The members a bound of ``bound`` keeps: each key's highest scores."""
    by_key: dict[str, list[KeyScoreMember]] = {}
    for t in tuples:
        by_key.setdefault(str(t.key), []).append(t)
    return [t for ts in by_key.values() for t in sorted(ts, key=lambda t: t.score)[-bound:]]


def in_calls(write: Callable[[list[Any]], Any], items: list[Any], call: int = 10_000) -> None:
    for lo in range(0, len(items), call):
        write(items[lo : lo + call])


def checkpoints(store: StateStore, journals: int, producers: int) -> None:
    """Every journal's checkpoint saved twice (the second save forgets the first and sets the floor)."""
    states = [
        (new_producer_id(), 1_000_000 + p * 7_919, -1 if p % 3 else 4_096 + p, 1_000_000 + p * 7_919 + 11)
        for p in range(producers)
    ]
    for save in (1, 2):
        for j in range(journals):
            name = f"events/part-{j:05d}"
            at = save * 10_000_000 + j
            store.save_journal(
                name,
                at,
                [ProducerState(name, pid, ack + at, begin, clock + at) for pid, ack, begin, clock in states],
                journal_id=f"uid{j:05d}",
            )


def run_memory(shards: LocalShards, scale: float) -> dict[str, Any]:
    client = shards.servers[0].client()
    small_keys, large_keys, journals = round(20_000 * scale), max(2, round(100 * scale)), round(1_000 * scale)
    small, large = members(small_keys, 10, 1), members(large_keys, 2_000, 2)
    over_small, over_large = members(small_keys, 20, 3), members(large_keys, 1_500, 4)
    shapes: dict[str, Any] = {}

    def zadd(tuples: list[KeyScoreMember]) -> Callable[[], None]:
        return lambda: insert_zadd(client, tuples)

    def incr_shape(name: str, sources: int, counters: bool) -> None:
        """Every (key, member) of ``small`` gains 1..9 from each of ``sources`` sources."""
        rng = random.Random(5)
        deltas = [[rng.randint(1, 9) for _ in small] for _ in range(sources)]
        totals = [sum(d[i] for d in deltas) for i in range(len(small))]
        with Cluster.from_urls(shards.urls, prefix=PREFIX) as c:

            def load() -> None:
                for s, ds in enumerate(deltas):
                    items = [
                        (i, Count(t.key, t.member, d) if counters else Incr(t.key, t.member, float(d)))
                        for i, (t, d) in enumerate(zip(small, ds, strict=True))
                    ]
                    in_calls(lambda part, s=s: c.increment(f"events/part-{s:03d}", part), items)

            def baseline() -> None:
                pipe = client.pipeline(transaction=False)
                for i, (t, total) in enumerate(zip(small, totals, strict=True)):
                    if counters:
                        pipe.hset(str(t.key), str(t.member), total)
                    else:
                        pipe.zadd(str(t.key), {str(t.member): total})
                    if i % 1_000 == 999:
                        pipe.execute()
                pipe.execute()

            shapes[name] = shape(client, name, len(small), small_keys, load, baseline, sources=sources)

    with Cluster.from_urls(shards.urls, prefix=PREFIX) as c:
        shapes["set_small"] = shape(
            client, "set_small", len(small), small_keys, lambda: in_calls(c.insert, small), zadd(small)
        )
        shapes["set_large"] = shape(
            client, "set_large", len(large), large_keys, lambda: in_calls(c.insert, large), zadd(large)
        )
        shapes["tombstones_small"] = shape(
            client, "tombstones_small", len(small), small_keys, lambda: in_calls(c.delete, small), zadd(small)
        )
    for name, tuples, bound in (("bounded_small", over_small, 10), ("bounded_large", over_large, 1_000)):
        held = kept(tuples, bound)
        with Cluster.from_urls(shards.urls, prefix=PREFIX, max_size=bound) as c:
            shapes[name] = shape(
                client, name, len(held), len({t.key for t in held}), partial(in_calls, c.insert, tuples), zadd(held)
            )
            shapes[name].update(max_size=bound, inserted=len(tuples))
    incr_shape("incr_1_source", 1, counters=False)
    incr_shape("incr_4_sources", 4, counters=False)
    incr_shape("count_4_sources", 4, counters=True)
    with Cluster.from_urls(shards.urls, prefix=PREFIX) as c:
        for producers in (4, 64):
            store = StateStore(c, "capacity")
            name = f"checkpoints_{producers}_producers"
            shapes[name] = shape(
                client,
                name,
                journals,
                journals,
                partial(checkpoints, store, journals, producers),
                lambda: None,
                producers=producers,
            )
    client.close()
    return shapes


def shape(
    client: redis.Redis,
    name: str,
    n: int,
    nkeys: int,
    load: Callable[[], None],
    baseline: Callable[[], None],
    **extra: Any,
) -> dict[str, Any]:
    lib, base = measured(client, load), measured(client, baseline)
    row: dict[str, Any] = {"members": n, "keys": nkeys, "library": lib, "baseline": base, **extra}
    row["per_member"] = lib["memory_usage"] / n
    row["per_member_used_memory"] = lib["used_memory_delta"] / n
    if base["memory_usage"]:
        row["baseline_per_member"] = base["memory_usage"] / n
        row["baseline_per_member_used_memory"] = base["used_memory_delta"] / n
        row["ratio"] = lib["memory_usage"] / base["memory_usage"]
        row["ratio_used_memory"] = lib["used_memory_delta"] / base["used_memory_delta"]
    kinds = ", ".join(
        f"{k} {v['bytes'] / n:.1f} ({','.join(v['encodings'])})" for k, v in lib["kinds"].items() if k != "marker"
    )
    vs = f"  plain {row['baseline_per_member']:6.1f}  ratio {row['ratio']:.2f}" if "ratio" in row else ""
    print(
        f"  {name:<26} {n:>7,} in {nkeys:>6,} keys: {row['per_member']:7.1f} B/member (used_memory"
        f" {row['per_member_used_memory']:6.1f}){vs}  [{kinds}]",
        flush=True,
    )
    return row


# -- part 2: writes/s per shard -----------------------------------------------------------------------------


def run_rates(shards: LocalShards, n: int, repeat: int, messages: int) -> dict[str, Any]:
    client = shards.servers[0].client()
    servers = (client,)
    cluster = Cluster.from_urls(shards.urls, prefix=PREFIX)
    cluster.load_scripts()
    shapes: dict[str, Any] = {
        "insert_spread": (make_tuples(n, n // 2, seed=11), insert_library, insert_zadd),
        "insert_hot": (make_tuples(n, max(1, n // 100), seed=12), insert_library, insert_zadd),
        "incr_spread": (make_increments(n, n // 2, 4, seed=13), increment_library, by_hand),
        "incr_hot": (make_increments(n, max(1, n // 100), 50, seed=14), increment_library, by_hand),
    }
    out: dict[str, Any] = {}
    for name, (items, lib, hand) in shapes.items():
        runs: dict[str, list[dict[str, float]]] = {"library": [], "baseline": []}
        for r in range(repeat):
            for method in ("library", "baseline")[:: 1 if r % 2 == 0 else -1]:
                client.flushall()
                fn, target = (lib, cluster) if method == "library" else (hand, client)
                _, wall, client_s, server_s = metered(servers, fn, target, items)
                runs[method].append(
                    {
                        "per_s": n / wall,
                        "client_us": client_s / n * 1e6,
                        "server_us": server_s / n * 1e6,
                        "server_share": server_s / wall,
                    }
                )
        out[name] = summarize(name, runs)
    with tempfile.TemporaryDirectory() as tmp:
        out["consumer"] = run_consumer(shards, cluster, client, Path(tmp), messages, repeat)
    cluster.close()
    client.close()
    return out


def run_consumer(
    shards: LocalShards, cluster: Cluster, client: redis.Redis, root: Path, messages: int, repeat: int
) -> dict[str, Any]:
    """The plain exactly-once Consumer on published traffic (4 journals, 4 producers, 20,000 users): per
    committed message, its client and server CPU; and the state keys it left (tallied after its last run)."""
    from zcluster.journal import FileJournals

    store = FileJournals(str(root / "journals"))
    names = [f"timelines/part-{i:03d}" for i in range(4)]
    create_journals(store, names)
    traffic = publish(store, Traffic(names), producers=4, messages=messages // 4, users=20_000, seed=7)
    runs: list[dict[str, float]] = []
    stats: Any = None
    for r in range(repeat):
        client.flushall()
        consumer = Consumer(cluster, store, timeline_mapper, f"capacity{r}")
        stats, wall, client_s, server_s = metered((client,), consumer.poll)
        consumer.close()
        if stats.delivered != traffic.committed:
            raise SystemExit(f"the consumer delivered {stats.delivered} of {traffic.committed} committed messages")
        done = traffic.committed
        runs.append(
            {
                "per_s": done / wall,
                "client_us": client_s / done * 1e6,
                "server_us": server_s / done * 1e6,
                "server_share": server_s / wall,
            }
        )
    state = tally(client)
    store.close()
    row = summarize("consumer", {"library": runs})
    row.update(
        committed=traffic.committed,
        frames=stats.frames,
        writes=stats.inserts + stats.deletes,
        journals=len(names),
        state_keys={k: v for k, v in state.items() if k in ("state", "floor")},
    )
    return row


def summarize(name: str, runs: dict[str, list[dict[str, float]]]) -> dict[str, Any]:
    row: dict[str, Any] = {"samples": runs}
    for method, xs in runs.items():
        row[method] = {part: med([x[part] for x in xs]) for part in xs[0]}
    lib = row["library"]
    text = (
        f"  {name:<14} {lib['per_s']:>9,.0f}/s  client {lib['client_us']:5.2f} us  server {lib['server_us']:5.2f} us"
        f"  server share {lib['server_share']:.2f}"
    )
    if "baseline" in runs:
        base = row["baseline"]
        row["ratio"] = lib["per_s"] / base["per_s"]
        row["paired"] = [x["per_s"] / y["per_s"] for x, y in zip(runs["library"], runs["baseline"], strict=True)]
        text += (
            f"  | plain {base['per_s']:>9,.0f}/s  client {base['client_us']:5.2f}  server {base['server_us']:5.2f}"
            f"  ratio {row['ratio']:.2f}"
        )
    print(text, flush=True)
    return row


# -- output -------------------------------------------------------------------------------------------------


def plot(path: Path, report: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(15, 5), gridspec_kw={"width_ratios": [3, 2]})
    mem = report["memory"]
    names = list(mem)
    xs = range(len(names))
    ax1.bar([x - 0.2 for x in xs], [mem[s]["per_member"] for s in names], 0.4, label="zcluster (MEMORY USAGE)")
    ax1.bar(
        [x + 0.2 for x in xs],
        [mem[s].get("baseline_per_member", 0.0) for s in names],
        0.4,
        label="plain ZADD / HSET",
        color="#7f7f7f",
    )
    ax1.set_xticks(list(xs), [s.replace("_", "\n", 1) for s in names], fontsize=7)
    ax1.set_ylabel("bytes per member (checkpoints: per journal)")
    ax1.set_yscale("log")
    ax1.legend(fontsize=8)
    ax1.set_title("Redis memory")
    rates = report["rates"]
    rnames = list(rates)
    ys = range(len(rnames))
    ax2.bar(ys, [rates[s]["library"]["per_s"] / 1000 for s in rnames], 0.6, label="zcluster")
    ax2.scatter(
        [y for y, s in zip(ys, rnames, strict=True) if "baseline" in rates[s]],
        [rates[s]["baseline"]["per_s"] / 1000 for s in rnames if "baseline" in rates[s]],
        color="#7f7f7f",
        zorder=3,
        label="plain pipelined ZADD / ZINCRBY",
    )
    for y, s in zip(ys, rnames, strict=True):
        lib = rates[s]["library"]
        ax2.annotate(
            f"srv {lib['server_us']:.1f} us\ncli {lib['client_us']:.1f} us",
            (y, lib["per_s"] / 1000),
            ha="center",
            va="bottom",
            fontsize=7,
        )
    ax2.set_xticks(list(ys), [s.replace("_", "\n") for s in rnames], fontsize=8)
    ax2.set_ylabel("thousand writes/s (consumer: messages/s), median")
    ax2.legend(fontsize=8)
    ax2.set_title("one client process, one shard (CPU per write)")
    m = report["machine"]
    fig.suptitle(f"capacity, {report['date'][:10]}, {m['nproc']} vCPUs, {m['redis_server']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="1/5 of the members, 40k writes, 2 repetitions")
    ap.add_argument("--writes", type=int, default=None, help="writes per rate run (default 200000)")
    ap.add_argument("--repeat", type=int, default=None, help="repetitions of each rate run (default 3)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--no-plot", action="store_true")
    ap.add_argument("--module", action="store_true", help="the server loads zcluster's Redis module (results -module)")
    args = ap.parse_args(argv)
    scale = 0.2 if args.quick else 1.0
    n = args.writes or (40_000 if args.quick else 200_000)
    repeat = args.repeat or (2 if args.quick else 3)
    started = time.perf_counter()
    report: dict[str, Any] = {
        "benchmark": "bench/bench_capacity.py",
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "scale": scale,
        "writes": n,
        "repeat": repeat,
    }
    with LocalShards(1, extra=loadmodule() if args.module else []) as shards:
        report["machine"] = machine_info(shards.binary)
        print("memory (MEMORY USAGE summed, per member; checkpoints: per journal):", flush=True)
        report["memory"] = run_memory(shards, scale)
        print(f"writes/s, one client process, one shard, medians of {repeat} (CPU per write):", flush=True)
        report["rates"] = run_rates(shards, n, repeat, n // 2)
    report["elapsed_s"] = time.perf_counter() - started
    m = report["machine"]
    print(f"machine: {m['nproc']} CPUs, {m['redis_server']}, load {m['loadavg'][0]:.2f}; {report['elapsed_s']:.0f} s")
    stem = ("capacity-quick" if args.quick else "capacity") + ("-module" if args.module else "")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{stem}.json").write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out / f'{stem}.json'}")
    if not args.no_plot:
        plot(args.out / f"{stem}.png", report)
        print(f"wrote {args.out / f'{stem}.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
