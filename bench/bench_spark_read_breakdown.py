"""Where the time of one ``spark.read.format("zcluster")`` goes (issue 31), beside ``bench_spark_read.py``.

The same store (two local shards, ``--members`` over ``--keys``) and ``local[2]`` session; medians of
``--repeat`` runs (one warm-up first), each materialized with Spark's ``noop`` writer:

  (a) the reader's own work outside Spark: ``TupleReader.partitions()`` and ``read(partition)`` called in this
      process, partitions one after another (one core): wall time, and this process's CPU time (which the
      machine's other load disturbs less);
  (b) the Redis servers' time in one Spark read (``INFO commandstats`` usec, both shards summed);
  (c) Spark's fixed cost: a read of a pattern that matches nothing (plan, job, a Python worker per task);
  (d) the ceiling of any Python data source here: a trivial one yielding pre-built Arrow batches of the
      same shape (same rows, same rows per batch, two partitions), so only Arrow to the JVM and Spark's own
      per-row work remain;
  (e) the zcluster read itself, as in ``bench_spark_read.py``.

Writes ``results/spark-read-breakdown[-quick].json``. Run under ``flock /tmp/zc-bench.lock``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import redis
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from zcluster import Cluster, KeyScoreMember
from zcluster.spark import local_session
from zcluster.spark.reader import TupleReader
from zcluster.spark.rows import SET_ARROW
from zcluster.testing import LocalShards

PREFIX = "bench:"


class Prebuilt(DataSource):
    """``format("prebuilt")``: ``rows`` rows of the set schema in batches of ``per_batch``, over two
    partitions, every batch the same one built once per partition (no per-row Python work)."""

    @classmethod
    def name(cls) -> str:
        return "prebuilt"

    def schema(self) -> str:
        return "key string, score double, member string"

    def reader(self, schema: Any) -> DataSourceReader:
        return PrebuiltReader(int(self.options["rows"]), int(self.options["per_batch"]))


class PrebuiltReader(DataSourceReader):
    def __init__(self, rows: int, per_batch: int) -> None:
        self.rows, self.per_batch = rows, per_batch

    def partitions(self) -> list[InputPartition]:
        return [InputPartition(0), InputPartition(1)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        n = self.per_batch
        batch = pa.RecordBatch.from_arrays(
            [
                pa.array([f"k{i // 10}" for i in range(n)]),
                pa.array([float(i % 10) for i in range(n)]),
                pa.array([f"member-{i // 10}-{i % 10}" for i in range(n)]),
            ],
            schema=SET_ARROW,
        )
        for _ in range(self.rows // 2 // n):
            yield batch


def median_time(job: Callable[[], Any], repeat: int) -> tuple[float, list[float]]:
    job()  # warm-up
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        job()
        times.append(time.perf_counter() - started)
    return statistics.median(times), times


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--members", type=int, default=1_000_000)
    ap.add_argument("--keys", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="100k members over 10k keys")
    ap.add_argument("--out", type=Path, default=Path(__file__).with_name("results"))
    args = ap.parse_args(argv)
    if args.quick:
        args.members, args.keys = 100_000, 10_000
    with LocalShards(2) as shards:
        cluster = Cluster.from_urls(shards.urls, prefix=PREFIX)
        per = args.members // args.keys
        rows = [KeyScoreMember(f"k{i}", float(j), f"member-{i}-{j}") for i in range(args.keys) for j in range(per)]
        for lo in range(0, len(rows), 50_000):
            cluster.insert(rows[lo : lo + 50_000])
        n = len(rows)
        where = {"urls": ",".join(shards.urls), "prefix": PREFIX}
        reader = TupleReader(where)

        def in_process() -> int:
            return sum(b.num_rows for p in reader.partitions() for b in reader.read(p))

        assert in_process() == n
        out: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "members": n, "keys": args.keys}
        out["a_in_process_s"], _ = median_time(in_process, args.repeat)
        cpu = time.process_time()
        in_process()
        out["a_in_process_cpu_s"] = time.process_time() - cpu  # this process's CPU: less disturbed by load

        spark = local_session("local[2]")
        spark.dataSource.register(Prebuilt)

        def noop(df: Any) -> None:
            df.write.format("noop").mode("overwrite").save()

        def ours() -> None:
            noop(spark.read.format("zcluster").options(**where).load())

        clients = [redis.Redis.from_url(u) for u in shards.urls]
        ours()
        for c in clients:
            c.config_resetstat()
        ours()
        usec = sum(v["usec"] for c in clients for k, v in c.info("commandstats").items() if "resetstat" not in k)
        out["b_redis_s"] = usec / 1e6
        empty = {**where, "pattern": "no-such-key-*"}
        out["c_empty_read_s"], _ = median_time(
            lambda: noop(spark.read.format("zcluster").options(**empty).load()), args.repeat
        )
        per_batch = 1000 * per  # the reader's default batch: 1000 keys
        out["d_prebuilt_s"], _ = median_time(
            lambda: noop(spark.read.format("prebuilt").option("rows", n).option("per_batch", per_batch).load()),
            args.repeat,
        )
        out["e_zcluster_s"], out["e_runs"] = median_time(ours, args.repeat)
        spark.stop()
        cluster.close()
    for k in ("a_in_process_s", "a_in_process_cpu_s", "d_prebuilt_s", "e_zcluster_s"):
        out[k.replace("_s", "_rows_per_s", 1)] = n / out[k]
    print(json.dumps(out, indent=2))
    args.out.mkdir(parents=True, exist_ok=True)
    stem = "spark-read-breakdown-quick" if args.quick else "spark-read-breakdown"
    (args.out / f"{stem}.json").write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
