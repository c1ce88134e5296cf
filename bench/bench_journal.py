"""Journal throughput: append and read, messages/s and MB/s, per backend against raw baselines.

* file: FileJournals.append_many (batches) and .append (one call per message) against raw buffered file
  writes (``open(..., "wb").write`` per frame); reads against raw buffered reads of one file.
* streams: RedisJournals.append_many (one script call per batch) and .append against raw XADD pipelined
  with redis-py (one pipeline per batch); reads against raw XRANGE paging.

Each figure is the median of ``--runs`` runs, on a local redis-server started for the run. Results are
printed, and written to bench/results/journal.json and journal.png.

    python bench/bench_journal.py [--messages 100000] [--batch 1000] [--runs 5]

``--read-path``: the file journals' read path alone, as the Spark source uses it (no Redis). ``--frames``
ndjson frames (default 150,000), one append each (as publishers append them), round-robin over
``--journals`` journals (default 4), read end to end, both while they sit in the open fragments (one
checksummed record per append) and once rolled into fragment files. Per layout, each step on a fresh
store, as a new process (a Spark task) would see it: ``open+recover`` (``FileJournals(root)``, which
checks every journal), ``end`` (every journal's end, on a store opened without recovery), ``read``
(``FileJournals.read`` of every journal from 0, on a store opened without recovery) and ``source``
(``zcluster.spark.source.read_batches`` over each journal's whole range: the rows a Spark task hands over,
store opening included); ``raw`` counts the newlines of the same bytes in plain files. Frames/s and
µs/frame are medians of ``--runs`` runs (interleaved); written to bench/results/journal-read.json.

    python bench/bench_journal.py --read-path [--frames 150000] [--journals 4] [--runs 7]

``--tail-reads``: a streaming batch's read of a file journal, as a Spark sink's task makes it: a store opened
for the read (``recover=False``), the last 250 frames of one journal read, its ``end()`` asked, the store
closed, while the open fragment (one record per frame, as publishers append) grows to 1, 8, 24 and 48 MiB.
``first``: the first such read in a process (nothing remembered: the whole open fragment is checked);
``later``: the median of ``--runs`` reads after it (what every later task of a reused worker pays). Baseline:
``raw``, ``os.pread`` of the same bytes. Its figure of merit: ``later`` stays flat as the fragment grows.
Written to bench/results/journal-tail.json.

    python bench/bench_journal.py --tail-reads [--runs 7]
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import redis

from zcluster.journal import FileJournals, RedisJournals, _marks
from zcluster.journal._filefmt import OPEN_NAME, RECORD
from zcluster.journal.frames import read_range_frames
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


# -- the file read path (--read-path) -------------------------------------------------------------------


def build_read_store(root: Path, data: list[bytes], journals: int) -> list[str]:
    """Append `data` one frame per append, round-robin over `journals` ndjson journals; return their names."""
    names = [f"j{i}" for i in range(journals)]
    with FileJournals(root) as fj:
        for n in names:
            fj.create(JournalSpec(n, SPEC))
        for i, d in enumerate(data):
            fj.append(names[i % journals], d)
    return names


def bench_read_path(root: Path, raw: list[Path], names: list[str]) -> dict[str, float]:
    """One run of each read-path step over the store at `root` (see the module docstring); seconds."""
    out: dict[str, float] = {}
    url = f"file://{root}"

    def open_recover() -> None:
        FileJournals(root).close()

    def ends() -> None:
        with FileJournals(root, recover=False) as fj:
            for n in names:
                fj.end(n)

    def read() -> None:
        with FileJournals(root, recover=False) as fj:
            for n in names:
                consume(fj.read(n, 0))

    def raw_read() -> None:
        for p in raw:
            with open(p, "rb") as f:
                while chunk := f.read(1 << 20):
                    chunk.count(b"\n")

    def fresh(fn: Callable[[], object]) -> float:
        _marks._marks.clear()  # as a new process: nothing remembered of the open fragments
        return timed(fn)

    out["raw"] = timed(raw_read)
    out["open+recover"] = fresh(open_recover)
    out["end"] = fresh(ends)
    out["read"] = fresh(read)
    try:
        from zcluster.spark.source import JournalRange, read_batches
    except ImportError:  # no spark extra
        return out
    with FileJournals(root, recover=False) as fj:
        parts = [JournalRange(n, CONTENT_TYPE_NDJSON, 0, fj.end(n)) for n in names]
    rows: list[int] = []
    out["source"] = fresh(lambda: rows.extend(b.num_rows for p in parts for b in read_batches(url, p)))
    return out


def read_path_main(args: argparse.Namespace) -> None:
    data = frames(args.frames)
    nbytes = sum(map(len, data))
    results: dict[str, object] = {
        "params": {"frames": args.frames, "bytes": nbytes, "journals": args.journals, "runs": args.runs}
    }
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "journals"
        names = build_read_store(root, data, args.journals)
        raw = []
        with FileJournals(root, recover=False) as fj:
            for n in names:
                raw.append(Path(tmp) / f"{n}.ndjson")
                raw[-1].write_bytes(b"".join(c for _, c in fj.read(n, 0)))
        assert sum(p.stat().st_size for p in raw) == nbytes
        layouts: dict[str, list[dict[str, float]]] = {"open fragment": [], "fragment files": []}
        rolled = Path(tmp) / "rolled"
        shutil.copytree(root, rolled)
        with FileJournals(rolled) as fj:
            for n in names:
                fj.roll(n)
        for _ in range(args.runs):
            layouts["open fragment"].append(bench_read_path(root, raw, names))
            layouts["fragment files"].append(bench_read_path(rolled, raw, names))
    for layout, runs in layouts.items():
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        size = f"{args.frames:,} frames ({nbytes / 1e6:.1f} MB) in {args.journals} journals"
        print(f"== {layout}: {size}, median of {args.runs}")
        for k, sec in med.items():
            rate, per = args.frames / sec, sec / args.frames * 1e6
            print(f"  {k:13s} {rate:>12,.0f} frames/s {per:>7.2f} us/frame {sec * 1e3:>8.1f} ms")
        results[layout] = {
            k: {"seconds": sec, "frames_per_s": args.frames / sec, "us_per_frame": sec / args.frames * 1e6}
            for k, sec in med.items()
        }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "journal-read.json").write_text(json.dumps(results, indent=2))
    print(f"wrote {args.out / 'journal-read.json'}")


def _tail_read(root: Path, begin: int, end: int, frames: int) -> None:
    with FileJournals(root, recover=False) as fj:
        n = sum(1 for _ in read_range_frames(fj, "j", CONTENT_TYPE_NDJSON, begin, end))
        assert n == frames and fj.end("j") == end


def _raw_tail(path: Path, nbytes: int) -> None:
    with open(path, "rb") as f:
        f.seek(-nbytes, 2)
        f.read()


def tail_reads_main(args: argparse.Namespace) -> None:
    line = frames(1)[0]
    tail = 250
    results: dict[str, object] = {"params": {"frame_bytes": len(line), "tail_frames": tail, "runs": args.runs}}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "journals"
        with FileJournals(root, fragment_bytes=1 << 30) as writer:
            writer.create(JournalSpec("j", {"content-type": CONTENT_TYPE_NDJSON}))
            size = 0
            for mib in (1, 8, 24, 48):
                while size < mib << 20:
                    writer.append("j", line)
                    size += len(line)
                end = writer.end("j")
                begin = end - tail * len(line)

                read_once = functools.partial(_tail_read, root, begin, end, tail)
                raw_once = functools.partial(_raw_tail, root / "j" / OPEN_NAME, tail * (len(line) + RECORD.size))
                _marks._marks.clear()  # as a new process: the writer's own scans are not a reader's
                first = timed(read_once)
                later = statistics.median(timed(read_once) for _ in range(args.runs))
                raw = statistics.median(timed(raw_once) for _ in range(args.runs))
                print(
                    f"open fragment {mib:>2} MiB: first read {first * 1e3:7.2f} ms, later reads {later * 1e3:6.2f} ms, "
                    f"raw pread {raw * 1e3:5.2f} ms (later / raw {later / raw:.0f}x)"
                )
                results[f"{mib} MiB"] = {"first_ms": first * 1e3, "later_ms": later * 1e3, "raw_ms": raw * 1e3}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "journal-tail.json").write_text(json.dumps(results, indent=2))
    print(f"wrote {args.out / 'journal-tail.json'}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=100_000)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--single", type=int, default=10_000, help="messages for the one-append-per-message runs")
    ap.add_argument("--runs", type=int, default=None, help="runs per figure (default 5; --read-path: 7)")
    ap.add_argument("--read-path", action="store_true", help="only the file journals' read path (see above)")
    ap.add_argument("--tail-reads", action="store_true", help="only a streaming batch's short reads (see above)")
    ap.add_argument("--frames", type=int, default=150_000, help="--read-path: frames, one append each")
    ap.add_argument("--journals", type=int, default=4, help="--read-path: journals the frames go round")
    ap.add_argument("--out", type=Path, default=RESULTS, help="--read-path: results folder (default bench/results)")
    args = ap.parse_args()
    if args.read_path or args.tail_reads:
        args.runs = args.runs or 7
        (read_path_main if args.read_path else tail_reads_main)(args)
        return
    args.runs = args.runs or 5
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
