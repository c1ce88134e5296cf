"""A user's Spark job as the deployment tests run it: ``python /elsewhere/app/driver.py ...`` from another directory.

The mapper lives in ``jobs.py`` next to this script. Python puts the script's directory on this process's
``sys.path`` only: executors (also in other JVMs) and a Spark Connect server never see it, so the job works
only because the sink ships ``jobs`` (and ``jobhelpers``, which it imports) by value. ``--report`` writes
the modules the sink shipped, and on classic Spark its history and the application id, as JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging

import jobs

from zcluster.spark import ZClusterSink, local_session, run_available_now


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--master", default="local[2]")
    p.add_argument("--connect", action="store_true")
    p.add_argument("--journals", required=True)
    p.add_argument("--urls", nargs="+", required=True)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--query-name", required=True)
    p.add_argument("--prefix", default="zc:")
    p.add_argument("--sleep", type=float, default=0.0)
    p.add_argument("--flush", type=int, default=4096)
    p.add_argument("--deliveries")
    p.add_argument("--report", required=True)
    p.add_argument("--hold-at", type=int, default=0, help="the tests' kill point: a task holds at its N-th message")
    p.add_argument("--markers", help="with --hold-at: where held-<pid> is written and release is looked for")
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("zcluster.spark").setLevel(logging.INFO)

    spark = local_session(args.master, connect=args.connect, **{"spark.driver.host": "127.0.0.1"})
    mapper = jobs.TimelineJob(args.sleep, args.deliveries, args.hold_at, args.markers)
    sink = ZClusterSink(
        args.urls, mapper, args.query_name, journals=args.journals, prefix=args.prefix, flush=args.flush
    )
    report = {"shipped": list(sink.shipped), "app_id": None if args.connect else spark.sparkContext.applicationId}
    with open(args.report, "w") as f:
        json.dump(report, f)
    run_available_now(spark, sink, args.journals, args.checkpoint)
    report["history"] = [dataclasses.asdict(s) for s in sink.history]
    with open(args.report, "w") as f:
        json.dump(report, f)
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
