"""Journal throughput: append and read, messages/s and MB/s, per backend against raw baselines.

* file: FileJournals.append_many (batches) and .append (one call per message) against raw buffered file
  writes (``open(..., "wb").write`` per frame); reads against raw buffered reads of one file.
* streams: RedisJournals.append_many (one script call per batch) and .append against raw XADD pipelined
  with redis-py (one pipeline per batch); reads against raw XRANGE paging.

Each figure is the median of ``--runs`` runs, on a local redis-server started for the run. Results are
printed, and written to bench/results/journal.json and journal.png.

    python bench/bench_journal.py [--messages 100000] [--batch 1000] [--runs 5]
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import redis

from zcluster.journal import FileJournals, RedisJournals
from zcluster.message import CONTENT_TYPE_NDJSON, JournalSpec
from zcluster.testing import LocalShards

RESULTS = Path(__file__).with_name("results")
SPEC = {"content-type": CONTENT_TYPE_NDJSON}


def frames(n: int) -> list[bytes]:
    return [
        json.dumps({"UUID": f"{i:08x}-0000-1000-8000-000000000001", "i": i, "v": "x" * 40}).encode() + b"\n"
        for i in range(n)
    ]


def timed(fn: Callable[[], object]) -> float:
    gc.collect()
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def consume(it: Iterable[object]) -> None:
    """Run `it` to the end, dropping each result (as a publisher that checks and forgets them does)."""
    for _ in it:
        pass


def batches(data: list[bytes], size: int) -> list[list[bytes]]:
    return [data[i : i + size] for i in range(0, len(data), size)]


def bench_file(data: list[bytes], batch: int, single: int, tmp: Path, run: int) -> dict[str, float]:
    out: dict[str, float] = {}
    raw = tmp / f"raw-{run}.bin"

    def raw_write() -> None:
        with open(raw, "wb") as f:
            for d in data:
                f.write(d)

    def raw_read() -> None:
        with open(raw, "rb") as f:
            while f.read(1 << 20):
                pass

    out["raw_write"] = timed(raw_write)
    out["raw_read"] = timed(raw_read)
    with FileJournals(tmp / f"journals-{run}") as fj:
        fj.create(JournalSpec("batched", SPEC))
        fj.create(JournalSpec("single", SPEC))
        parts = batches(data, batch)
        out["append_many"] = timed(lambda: consume(fj.append_many("batched", p) for p in parts))
        out["append"] = timed(lambda: consume(fj.append("single", d) for d in data[:single]))
        out["read"] = timed(lambda: consume(fj.read("batched", 0)))
        assert fj.end("batched") == sum(map(len, data))
    return out


def bench_streams(data: list[bytes], batch: int, single: int, url: str, run: int) -> dict[str, float]:
    out: dict[str, float] = {}
    client = redis.Redis.from_url(url)
    raw_key = f"raw:{run}"
    parts = batches(data, batch)

    def raw_xadd() -> None:
        for p in parts:
            pipe = client.pipeline(transaction=False)
            for d in p:
                pipe.xadd(raw_key, {"d": d})
            pipe.execute()

    def raw_xrange() -> None:
        last = "-"
        while True:
            got = client.xrange(raw_key, min=last, count=batch)
            if not got:
                return
            last = "(" + got[-1][0].decode()

    out["raw_write"] = timed(raw_xadd)
    out["raw_read"] = timed(raw_xrange)
    rj = RedisJournals(client, prefix=f"bench{run}:", read_batch=batch)
    rj.create(JournalSpec("batched", SPEC))
    rj.create(JournalSpec("single", SPEC))
    out["append_many"] = timed(lambda: consume(rj.append_many("batched", p) for p in parts))
    out["append"] = timed(lambda: consume(rj.append("single", d) for d in data[:single]))
    out["read"] = timed(lambda: consume(rj.read("batched", 0)))
    assert rj.end("batched") == sum(map(len, data))
    client.flushall()
    client.close()
    return out


def summarise(runs: list[dict[str, float]], n: int, single: int, nbytes: int, single_bytes: int) -> dict[str, object]:
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    count = {"append": single}
    size = {"append": single_bytes}
    rates = {
        k: {"seconds": med[k], "msgs_per_s": count.get(k, n) / med[k], "mb_per_s": size.get(k, nbytes) / med[k] / 1e6}
        for k in med
    }
    ratios = {
        "append_many_vs_raw_write": rates["append_many"]["msgs_per_s"] / rates["raw_write"]["msgs_per_s"],
        "append_vs_raw_write": rates["append"]["msgs_per_s"] / rates["raw_write"]["msgs_per_s"],
        "read_vs_raw_read": rates["read"]["mb_per_s"] / rates["raw_read"]["mb_per_s"],
    }
    return {"rates": rates, "ratios": ratios}


def plot(results: dict[str, dict[str, object]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, backend in zip(axes, ("file", "streams"), strict=True):
        rates = results[backend]["rates"]
        assert isinstance(rates, dict)
        names = ["raw_write", "append_many", "append", "raw_read", "read"]
        ax.bar(names, [rates[k]["msgs_per_s"] for k in names], color=["grey", "C0", "C1", "grey", "C2"])
        ax.set_yscale("log")
        ax.set_title(f"{backend}: messages/s (median)")
        ax.tick_params(axis="x", rotation=30)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=100_000)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--single", type=int, default=10_000, help="messages for the one-append-per-message runs")
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    data = frames(args.messages)
    nbytes = sum(map(len, data))
    single_bytes = sum(map(len, data[: args.single]))
    file_runs, stream_runs = [], []
    with tempfile.TemporaryDirectory() as tmp, LocalShards(1) as shards:
        for run in range(args.runs):
            file_runs.append(bench_file(data, args.batch, args.single, Path(tmp), run))
            stream_runs.append(bench_streams(data, args.batch, args.single, shards.urls[0], run))
    results = {
        "params": {
            "messages": args.messages,
            "bytes": nbytes,
            "batch": args.batch,
            "single": args.single,
            "runs": args.runs,
        },
        "file": summarise(file_runs, args.messages, args.single, nbytes, single_bytes),
        "streams": summarise(stream_runs, args.messages, args.single, nbytes, single_bytes),
    }
    for backend in ("file", "streams"):
        res = results[backend]
        assert isinstance(res, dict)
        print(f"== {backend}")
        for k, r in res["rates"].items():
            print(f"  {k:12s} {r['msgs_per_s']:>12,.0f} msg/s {r['mb_per_s']:>9.1f} MB/s")
        for k, v in res["ratios"].items():
            print(f"  ratio {k:26s} {v:6.2f}x")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "journal.json").write_text(json.dumps(results, indent=2))
    plot(results, RESULTS / "journal.png")  # type: ignore[arg-type]
    print(f"wrote {RESULTS / 'journal.json'} and {RESULTS / 'journal.png'}")


if __name__ == "__main__":
    main()
