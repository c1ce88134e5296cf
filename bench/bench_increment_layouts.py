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
* ``sums``: the one-key layout for sums, measured without building it, on both sides of the trade:
  its memory (sums at both shapes written by hand as one sorted set: the totals, the source's fence as one
  more member, and a marker member a 2P-set write would look for), against plain ``ZINCRBY`` and the
  library's two keys; and the read it would add to every 2P-set write: ``Cluster.insert`` with the stock
  ``lua/write.lua`` against the same script plus one ``ZSCORE K+ <marker>`` per key and call (a sums key's K+
  is a sorted set, so only a read of it can refuse the write), at hot and spread keys, unbounded and
  ``max_size`` 10,000, 200,000 fresh tuples per run, interleaved, medians of ``--repeat`` (3): tuples/s,
  client and server CPU per tuple, the scripts' own time per tuple (INFO commandstats ``usec`` of EVALSHA: the
  server's time inside the script, steadier than its process CPU on a shared machine), and the server's
  commands per tuple.

    python bench/bench_increment_layouts.py commands --label after
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

import redis
from bench_cluster import insert_library, make_tuples, med, metered
from bench_increments import by_hand, bytes_per_member, library, make, script_commands

import zcluster.cluster
from zcluster import Cluster
from zcluster._scripts import Script, write_script
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


def one_key(
    client: redis.Redis,
    incs: list[Any],
    total: Callable[[Any, Any], Any],
    fence: Callable[[Any, str, int, int], Any] | None,
) -> None:
    """From FLUSHALL, each increment's ``total(pipe, inc)``, then per key its ``fence(pipe, redis key, last
    position, count)``: a one-key layout written by hand, pipelined."""
    client.flushall()
    pipe = client.pipeline(transaction=False)
    last: dict[str, int] = {}
    count: dict[str, int] = {}
    for pos, i in enumerate(incs):
        total(pipe, i)
        last[i.key], count[i.key] = pos, count.get(i.key, 0) + 1
    if fence is not None:
        for k in last:
            fence(pipe, "{b:" + k + "}+", last[k], count[k])
    pipe.execute()


def _hash_fence(fence: tuple[bytes, Callable[[int, int], str]], pipe: Any, key: str, last: int, n: int) -> None:
    pipe.hset(key, fence[0], fence[1](last, n))


def _member_fence(extra: dict[bytes, int], pipe: Any, key: str, last: int, n: int) -> None:
    pipe.zadd(key, {FENCE + f"{last}:0:0:{n}".encode(): 0, **extra})


def formats(cluster: Cluster, client: redis.Redis) -> dict[str, Any]:
    incs = make(N, *SHAPES["spread"], seed=len("spread"), counters=True)
    distinct = len({(i[0], i[1]) for i in incs})
    client.flushall()
    by_hand(client, incs)
    plain = bytes_per_member(client, distinct)
    out: dict[str, Any] = {"plain_bytes_per_member": plain}
    for name, fence in FORMATS.items():
        one_key(
            client,
            incs,
            lambda pipe, i: pipe.hincrby("{b:" + i.key + "}+", i.field, i.delta),
            None if fence is None else functools.partial(_hash_fence, fence),
        )
        mine = bytes_per_member(client, distinct)
        out[name] = {"bytes_per_member": mine, "ratio": mine / plain}
        print(f"{name:42s} {mine:6.1f} B/member  {mine / plain:.2f}x plain HINCRBY ({plain:.1f})")
    return out


MARKER = b"\x00zc|"  # the member a one-key sums key would hold for a 2P-set write to find
FENCE = b"\x00zc|bench/journal|"  # + "c:m:j:n": the fence as a member (its score unused)


def sums_memory(cluster: Cluster, client: redis.Redis) -> dict[str, Any]:
    """Bytes per total of sums kept as one sorted set, written by hand, against ZINCRBY and the library."""
    out: dict[str, Any] = {}
    for name, (keys, members) in SHAPES.items():
        incs = make(N, keys, members, seed=len(name))
        distinct = len({(i.key, i.member) for i in incs})
        client.flushall()
        by_hand(client, incs)
        plain = bytes_per_member(client, distinct)
        row: dict[str, Any] = {"plain_bytes_per_member": plain}
        for layout in ("one key: totals + fence member + marker", "one key: totals + fence member"):
            extra = {MARKER: 0} if "marker" in layout else {}
            one_key(
                client,
                incs,
                lambda pipe, i: pipe.zincrby("{b:" + i.key + "}+", i.delta, i.member),
                functools.partial(_member_fence, extra),
            )
            mine = bytes_per_member(client, distinct)
            row[layout] = {"bytes_per_member": mine, "ratio": mine / plain}
        client.flushall()
        library(cluster, incs)
        mine = bytes_per_member(client, distinct)
        row["two keys (the library)"] = {"bytes_per_member": mine, "ratio": mine / plain}
        print(f"sums {name}: " + "; ".join(f"{k} {v['ratio']:.2f}x" for k, v in row.items() if isinstance(v, dict)))
        out[name] = row
    return out


def checked_write_script() -> Script:
    """``lua/write.lua`` plus the read a one-key sums layout would need: ZSCORE of the marker in each K+."""
    stock = write_script()
    anchor = b"    local adds, rems = from[at + 1], from[at + 2]\n"
    if stock.source.count(anchor) != 1:
        raise SystemExit("lua/write.lua changed: the bench's anchor for the extra read is gone")
    check = b'    if redis.call("ZSCORE", adds, "\\0zc|") then error({err = "WRONGTYPE a sums key"}) end\n'
    source = stock.source.replace(anchor, anchor + check)
    return Script("write-checked", source, hashlib.sha1(source).hexdigest())


def sums_read(client: redis.Redis, url: str, repeat: int) -> dict[str, Any]:
    """Cluster.insert with the stock write script against the one with the extra read, interleaved."""
    points = [(2_000, None), (2_000, 10_000), (100_000, None), (100_000, 10_000)]
    clusters: dict[tuple[str, int | None], Cluster] = {}
    for bound in (None, 10_000):
        prefix = "b:" if bound is None else "c:"  # a store's layout marker names its max_size
        clusters["stock", bound] = Cluster.from_urls([url], prefix=prefix, max_size=bound)
        with mock.patch.object(zcluster.cluster, "write_script", checked_write_script):
            clusters["checked", bound] = Cluster.from_urls([url], prefix=prefix, max_size=bound)
    for c in clusters.values():
        c.load_scripts()
    for bound in (None, 10_000):  # the extra read does its job: a key holding the marker refuses the write
        client.flushall()
        key = "sums:1"
        prefix = "b:" if bound is None else "c:"
        client.zadd("{" + prefix + key + "}+", {MARKER: 0})
        refused = clusters["checked", bound].insert([(key, 1.0, "m")], raise_on_error=False).refused
        if refused is None or clusters["stock", bound].insert([(key, 1.0, "m")]).applied_count != 1:
            raise SystemExit("the checked write script did not refuse a key holding the marker")
    out: dict[str, Any] = {}
    for keys, bound in points:
        runs: dict[str, list[dict[str, float]]] = {"stock": [], "checked": []}
        for r in range(repeat):
            tuples = make_tuples(200_000, keys, seed=3_000 + r)
            for variant in ("stock", "checked") if r % 2 == 0 else ("checked", "stock"):
                client.flushall()
                client.config_resetstat()
                _, wall, client_s, server_s = metered((client,), insert_library, clusters[variant, bound], tuples)
                ran = sum(script_commands(client).values())
                script_usec = int(client.info("commandstats")["cmdstat_evalsha"]["usec"])
                n = len(tuples)
                runs[variant].append(
                    {
                        "per_s": n / wall,
                        "client_us": client_s * 1e6 / n,
                        "server_us": server_s * 1e6 / n,
                        "script_us": script_usec / n,
                        "commands_per_tuple": ran / n,
                    }
                )
        row: dict[str, Any] = {v: {f: med([x[f] for x in runs[v]]) for f in runs[v][0]} for v in ("stock", "checked")}
        s, c = row["stock"], row["checked"]
        row["wall_ratio"] = c["per_s"] / s["per_s"]
        row["server_cpu_ratio"] = c["server_us"] / s["server_us"]
        row["cpu_ratio"] = (s["client_us"] + s["server_us"]) / (c["client_us"] + c["server_us"])
        row["script_time_ratio"] = c["script_us"] / s["script_us"]
        pairs = zip(runs["stock"], runs["checked"], strict=True)
        row["paired_wall_ratios"] = [b["per_s"] / a["per_s"] for a, b in pairs]
        label = f"{keys:,} keys, max_size {bound}"
        print(
            f"{label}: checked/stock tuples/s {row['wall_ratio']:.2f}, by CPU {row['cpu_ratio']:.2f}, script time "
            f"{c['script_us']:.2f} / {s['script_us']:.2f} us ({row['script_time_ratio']:.2f}x), server CPU "
            f"{c['server_us']:.2f} / {s['server_us']:.2f} us, commands per tuple {c['commands_per_tuple']:.2f} / "
            f"{s['commands_per_tuple']:.2f}"
        )
        out[label] = {**row, "runs": runs}
    for c in clusters.values():
        c.close()
    return out


def sums(cluster: Cluster, client: redis.Redis, url: str, repeat: int) -> dict[str, Any]:
    return {"memory": sums_memory(cluster, client), "write_path": sums_read(client, url, repeat)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=("commands", "cpu", "formats", "sums"))
    ap.add_argument("--label", default="after")
    ap.add_argument("--repeat", type=int, default=3, help="repetitions of the write-path runs (sums)")
    args = ap.parse_args()
    with LocalShards(1) as shards, Cluster.from_urls(shards.urls, prefix="b:") as cluster:
        client = redis.Redis.from_url(shards.urls[0])
        if args.what == "sums":
            report = sums(cluster, client, shards.urls[0], args.repeat)
        else:
            report = {"commands": commands, "cpu": cpu, "formats": formats}[args.what](cluster, client)
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"increment-layouts-{args.what}-{args.label}.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
