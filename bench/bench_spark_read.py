"""``spark.read.format("zcluster")`` against a hand-written ``mapPartitions`` over redis-py, side by side.

One run: two local ``redis-server`` shards, one ``local[2]`` SparkSession, ``--members`` members spread
evenly over ``--keys`` keys. Timed, each materialized with Spark's ``noop`` writer (every row produced):

  (a) ``spark.read.format("zcluster")`` by pattern (a partition per shard);
  (b) by hand: a partition per shard, each SCANning its shard with redis-py (MATCH on the store's K+ keys,
      COUNT 1000) and reading every key with pipelined ``ZREVRANGE ... WITHSCORES`` (1000 per pipeline),
      rows as tuples through ``mapPartitions`` and ``createDataFrame`` with the same schema.

Each runs once untimed first, then ``--repeat`` times interleaved; medians reported. Goals (issue 31):
(a)/(b) >= 1.0 and (a) >= 500k rows/s at 1M members over 100k keys. ``--quick``: 100k members over 10k keys.
Writes ``results/spark-read[-quick].json`` and a bar chart ``results/spark-read[-quick].png``. Run under
``flock /tmp/zc-bench.lock``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from zcluster import Cluster, KeyScoreMember
from zcluster._keys import KeyLayout
from zcluster.spark import local_session
from zcluster.testing import LocalShards

PREFIX = "bench:"


def by_hand() -> Any:
    """The hand-written reader's partition function (one partition = one shard URL)."""
    layout = KeyLayout(PREFIX)
    pattern = layout.scan_pattern(None, include_removed=False)

    def read(urls: Any) -> Any:
        import redis

        for url in urls:
            client = redis.Redis.from_url(url)
            for chunk in _chunks(client.scan_iter(match=pattern, count=1000), 1000):
                pipe = client.pipeline(transaction=False)
                for rk in chunk:
                    pipe.zrevrange(rk, 0, -1, withscores=True)
                for rk, pairs in zip(chunk, pipe.execute(), strict=True):
                    key = layout.logical(rk)[0].decode()  # type: ignore[index]
                    for member, score in pairs:
                        yield (key, score, member.decode())
            client.close()

    return read


def _chunks(items: Any, size: int) -> Any:
    chunk: list[Any] = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--members", type=int, default=1_000_000)
    ap.add_argument("--keys", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="100k members over 10k keys")
    ap.add_argument("--out", type=Path, default=Path(__file__).with_name("results"))
    ap.add_argument("--no-plot", action="store_true")
    args = ap.parse_args(argv)
    if args.quick:
        args.members, args.keys = 100_000, 10_000
    stem = "spark-read-quick" if args.quick else "spark-read"
    with LocalShards(2) as shards:
        cluster = Cluster.from_urls(shards.urls, prefix=PREFIX)
        per = args.members // args.keys
        rows = [KeyScoreMember(f"k{i}", float(j), f"member-{i}-{j}") for i in range(args.keys) for j in range(per)]
        for lo in range(0, len(rows), 50_000):
            cluster.insert(rows[lo : lo + 50_000])
        spark = local_session("local[2]")
        where = {"urls": ",".join(shards.urls), "prefix": PREFIX}
        schema = "key string, score double, member string"

        def ours() -> None:
            spark.read.format("zcluster").options(**where).load().write.format("noop").mode("overwrite").save()

        def hand() -> None:
            rdd = spark.sparkContext.parallelize(shards.urls, len(shards.urls)).mapPartitions(by_hand())
            spark.createDataFrame(rdd, schema).write.format("noop").mode("overwrite").save()

        assert spark.read.format("zcluster").options(**where).load().count() == len(rows)
        times: dict[str, list[float]] = {"zcluster": [], "by_hand": []}
        for run in range(args.repeat + 1):
            for name, job in (("zcluster", ours), ("by_hand", hand)):
                started = time.perf_counter()
                job()
                if run:  # the first round warms up
                    times[name].append(time.perf_counter() - started)
        spark.stop()
        cluster.close()
    median = {name: statistics.median(t) for name, t in times.items()}
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "members": len(rows),
        "keys": args.keys,
        "seconds": median,
        "rows_per_s": {name: len(rows) / t for name, t in median.items()},
        "ratio_zcluster_over_by_hand": median["by_hand"] / median["zcluster"],
        "runs": times,
    }
    print(json.dumps(result, indent=2))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{stem}.json").write_text(json.dumps(result, indent=2) + "\n")
    if not args.no_plot:
        plot(args.out / f"{stem}.png", result)
    return 0


def plot(path: Path, result: dict[str, Any]) -> None:
    """Rows/s of each reader (medians), the ratio in the title."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = ["zcluster", "by_hand"]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.bar(names, [result["rows_per_s"][n] / 1000 for n in names], color=["tab:blue", "tab:gray"])
    ax.axhline(500, color="tab:red", linestyle="--", label="goal: 500k rows/s")
    ax.set_ylabel("thousand rows/s (median)")
    ax.set_title(
        f"spark.read.format('zcluster') vs mapPartitions over redis-py\n{result['members']:,} members, "
        f"{result['keys']:,} keys: ratio {result['ratio_zcluster_over_by_hand']:.2f}"
    )
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
