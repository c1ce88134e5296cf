"""The layouts of an aggregate key measured where wall-clock rates cannot be trusted (a shared, loaded machine):
what the server runs and holds per increment, and the CPU it costs, for the zcluster on ``PYTHONPATH`` (run it
once against the code before a change and once after, ``--label before`` / ``--label after``).

* ``commands``: per shape (hot: 2,000 keys x 50 members; spread: 100,000 keys x 4 members; 100,000
  increments, one source, calls of 10,000 as ``bench_increments.py``) and kind (counters, sums): the server's
  commands per increment (INFO commandstats: a script's own calls), Redis keys, and bytes per distinct
  (key, member) (every key's ``MEMORY USAGE``) against redis-py pipelined ``HINCRBY`` / ``ZINCRBY``.
  Deterministic.
* ``cpu``: counters at both shapes, three runs interleaved with pipelined ``HINCRBY``: the server's process
  CPU (INFO cpu ``used_cpu_user + used_cpu_sys``) and the client's (``process_time``) per increment; the
  ratio by CPU (plain's CPU over zcluster's, client + server) beside the wall-clock one.
* ``formats``: the memory of a one-key counters key at spread keys with other fence fields written by hand
  (prefix, position text, an interned source): what each byte of the fence costs. Deterministic.

    python bench/bench_increment_layouts.py commands --label after
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
from bench_cluster import med
from bench_increments import by_hand, bytes_per_member, library, make, script_commands

from zcluster import Cluster
from zcluster.testing import LocalShards

RESULTS = Path(__file__).resolve().parent / "results"
SHAPES = {"hot": (2_000, 50), "spread": (100_000, 4)}
N = 100_000


def commands(cluster: Cluster, client: redis.Redis) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kind in ("counters", "sums"):
        for name, (keys, members) in SHAPES.items():
            incs = make(N, keys, members, seed=len(name), counters=kind == "counters")
            distinct = len({(i[0], i[1]) for i in incs})
            client.flushall()
            client.config_resetstat()
            library(cluster, incs)
            ran = script_commands(client)
            mine, held = bytes_per_member(client, distinct), client.dbsize()
            client.flushall()
            by_hand(client, incs)
            plain = bytes_per_member(client, distinct)
            out[f"{kind}/{name}"] = row = {
                "commands_per_increment": sum(ran.values()) / N,
                "commands": ran,
                "bytes_per_member": mine,
                "plain_bytes_per_member": plain,
                "memory_ratio": mine / plain,
                "redis_keys": held,
                "plain_keys": client.dbsize(),
            }
            print(kind, name, json.dumps(row))
    return out


def cpu(cluster: Cluster, client: redis.Redis) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, (keys, members) in SHAPES.items():
        incs = make(N, keys, members, seed=len(name), counters=True)
        runs: dict[str, list[dict[str, float]]] = {"a": [], "b": []}
        for r in range(3):
            for method in ("a", "b") if r % 2 == 0 else ("b", "a"):
                client.flushall()
                before = client.info("cpu")
                c0, w0 = time.process_time(), time.perf_counter()
                library(cluster, incs) if method == "a" else by_hand(client, incs)
                c1, w1 = time.process_time(), time.perf_counter()
                after = client.info("cpu")
                server = sum(after[f] - before[f] for f in ("used_cpu_user", "used_cpu_sys"))
                runs[method].append(
                    {"server_us": server * 1e6 / N, "client_us": (c1 - c0) * 1e6 / N, "per_s": N / (w1 - w0)}
                )
        row: dict[str, Any] = {
            m: {f: med([x[f] for x in runs[m]]) for f in ("server_us", "client_us", "per_s")} for m in ("a", "b")
        }
        row["ratio_by_cpu"] = (row["b"]["server_us"] + row["b"]["client_us"]) / (
            row["a"]["server_us"] + row["a"]["client_us"]
        )
        row["ratio_wall"] = row["a"]["per_s"] / row["b"]["per_s"]
        print("counters", name, json.dumps(row))
        out[name] = {**row, "runs": runs}
    return out


FORMATS: dict[str, tuple[bytes, Callable[[int, int], str]] | None] = {
    "no fence (the key name {b:K}+ only)": None,
    "\\0zc|bench/journal = c:m:j:n (built)": (b"\x00zc|bench/journal", lambda p, n: f"{p}:0:0:{n}"),
    "\\0|bench/journal = c:m:j:n": (b"\x00|bench/journal", lambda p, n: f"{p}:0:0:{n}"),
    "\\0zc|bench/journal = c:n": (b"\x00zc|bench/journal", lambda p, n: f"{p}:{n}"),
    "\\0|7 = c:n (an interned source)": (b"\x00|7", lambda p, n: f"{p}:{n}"),
}


def formats(cluster: Cluster, client: redis.Redis) -> dict[str, Any]:
    incs = make(N, *SHAPES["spread"], seed=len("spread"), counters=True)
    distinct = len({(i[0], i[1]) for i in incs})
    client.flushall()
    by_hand(client, incs)
    plain = bytes_per_member(client, distinct)
    out: dict[str, Any] = {"plain_bytes_per_member": plain}
    for name, fence in FORMATS.items():
        client.flushall()
        pipe = client.pipeline(transaction=False)
        last: dict[str, int] = {}
        count: dict[str, int] = {}
        for pos, i in enumerate(incs):
            pipe.hincrby("{b:" + i.key + "}+", i.field, i.delta)
            last[i.key], count[i.key] = pos, count.get(i.key, 0) + 1
        if fence is not None:
            for k in last:
                pipe.hset("{b:" + k + "}+", fence[0], fence[1](last[k], count[k]))
        pipe.execute()
        mine = bytes_per_member(client, distinct)
        out[name] = {"bytes_per_member": mine, "ratio": mine / plain}
        print(f"{name:42s} {mine:6.1f} B/member  {mine / plain:.2f}x plain HINCRBY ({plain:.1f})")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=("commands", "cpu", "formats"))
    ap.add_argument("--label", default="after")
    args = ap.parse_args()
    with LocalShards(1) as shards, Cluster.from_urls(shards.urls, prefix="b:") as cluster:
        client = redis.Redis.from_url(shards.urls[0])
        report = {"commands": commands, "cpu": cpu, "formats": formats}[args.what](cluster, client)
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"increment-layouts-{args.what}-{args.label}.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
