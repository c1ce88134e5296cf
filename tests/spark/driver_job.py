"""A Spark driver process for the fault tests: one availableNow run of the sink over file journals.

    python tests/spark/driver_job.py --journals file:///abs/journals --urls redis://127.0.0.1:1 redis://... \
        --checkpoint /abs/ckpt --query-name q1 [--prefix zc:] [--sleep 0.005] [--flush 16] [--stats out.json] \
        [--max-frames 40 --progress batches.json]

``--hold-at N --markers DIR`` is the fault tests' kill point (:class:`Held`): a task stops at its N-th message
until ``DIR/release`` exists, having written ``DIR/held-<pid>``, so a kill lands mid-batch whatever the
machine's speed.
``--leaderboard`` has the mapper also add one point per event to its user on ``leaderboard`` (exactly-once
increments). ``--chain`` runs stage A of tests/state/chain_helpers.py instead (it publishes to the output
journals, ``publish=`` the journal store; tests/state must be on the workers' PYTHONPATH on classic Spark).
``--sleep`` makes the mapper (either one) sleep per message (so a batch is
slow enough to be killed mid-way); with ``--chain``, ``--deliveries`` records the pid of the Python worker that
mapped each message and ``--queued`` sets how many messages a transaction queues before appending them.
``--master local-cluster[2,1,1024]`` runs each executor in a JVM of its own (the driver prints the application
id). ``--flush``
bounds the sink's write batches (so writes land while the batch still runs). ``--stats`` writes the sink's
history (one BatchStats per batch) as JSON when the run ends. ``--max-frames`` sets the source's
``maxFramesPerTrigger``; ``--progress`` writes each batch's input row count, from the query's progress
(also under Spark Connect), and ``--observed`` each batch's observed sink figures (``observedMetrics``). The
exit status is 0 when the query finished.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from zcluster.spark import ZClusterSink, local_session, run_available_now
from zcluster.spark.observe import figures
from zcluster.state import txn
from zcluster.testing.traffic import leaderboard_mapper, timeline_mapper


class SlowMapper:
    """The demo's timeline mapper, sleeping ``seconds`` per message; with ``deliveries``, it appends one line
    per message to that file (the executors' count of delivered messages, also under Spark Connect, where
    the sink's history stays in the server's foreachBatch process)."""

    def __init__(self, seconds: float, deliveries: str | None = None, leaderboard: bool = False) -> None:
        self.seconds = seconds
        self.deliveries = deliveries
        self.leaderboard = leaderboard

    def __call__(self, message: Any) -> list[Any]:
        if self.seconds:
            time.sleep(self.seconds)
        if self.deliveries:
            with open(self.deliveries, "a") as f:
                f.write("1\n")
        return leaderboard_mapper(message) if self.leaderboard else timeline_mapper(message)


class Held:
    """``mapper``, with a kill point: the task's ``at``-th message (its earlier flushes have landed) writes
    ``held-<pid>`` (this Python worker's) in ``markers`` and waits until ``markers/release`` exists, so a test
    kills the driver or an executor while the task stands mid-batch. Once released, no task holds again (a
    retried task runs through)."""

    def __init__(self, mapper: Any, at: int, markers: str) -> None:
        self.mapper, self.at, self.markers, self.seen = mapper, at, Path(markers), 0

    def __call__(self, message: Any) -> Any:
        self.seen += 1
        release = self.markers / "release"
        if self.seen == self.at and not release.exists():
            (self.markers / f"held-{os.getpid()}").touch()
            while not release.exists():
                time.sleep(0.02)
        return self.mapper(message)


def chain_mapper(stage_a: Any, seconds: float, deliveries: str | None, queued: int | None) -> Any:
    """Stage A's mapper, sleeping ``seconds`` per message; with ``deliveries``, it appends one line per message
    naming the Python worker that mapped it (its pid); with ``queued``, the transactions append their messages
    every ``queued`` messages (``txn.QUEUED`` is a global of the process running the transaction: the Python
    worker, where this mapper runs, so it is set here)."""

    def mapper(message: Any) -> list[Any]:
        if queued:
            txn.QUEUED = queued
        if seconds:
            time.sleep(seconds)
        if deliveries:
            with open(deliveries, "a") as f:
                f.write(f"{os.getpid()}\n")
        return stage_a(message)  # type: ignore[no-any-return]

    return mapper


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--journals", required=True)
    p.add_argument("--urls", nargs="+", required=True)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--query-name", required=True)
    p.add_argument("--sleep", type=float, default=0.0)
    p.add_argument("--flush", type=int, default=4096)
    p.add_argument("--master", default="local[2]")
    p.add_argument("--prefix", default="zc:")
    p.add_argument("--stats")
    p.add_argument("--deliveries")
    p.add_argument("--max-frames", type=int)
    p.add_argument("--progress")
    p.add_argument("--observed")
    p.add_argument("--connect", action="store_true", help="a local Spark Connect session (no --stats there)")
    p.add_argument("--leaderboard", action="store_true", help="the mapper also counts events per user (Incr)")
    p.add_argument("--chain", action="store_true", help="stage A of tests/state/chain_helpers.py, publishing")
    p.add_argument("--queued", type=int, help="with --chain: the workers' transactions append every N messages")
    p.add_argument("--hold-at", type=int, help="a task holds at its N-th message until MARKERS/release exists")
    p.add_argument("--markers", help="with --hold-at: where held-<pid> is written and release is looked for")
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING)

    cluster_mode = args.master.startswith("local-cluster")  # executors in JVMs of their own: bind them to loopback
    spark = local_session(
        args.master, connect=args.connect, **({"spark.driver.host": "127.0.0.1"} if cluster_mode else {})
    )
    if cluster_mode:  # the executors' logs are in $SPARK_HOME/work/<application id>
        print("application", spark.sparkContext.applicationId, flush=True)
    selector, mapper, publish = "", SlowMapper(args.sleep, args.deliveries, args.leaderboard), None
    if args.chain:
        sys.path.insert(0, str(Path(__file__).parents[1] / "state"))
        from chain_helpers import A_SELECTOR, stage_a

        selector, mapper, publish = A_SELECTOR, stage_a, args.journals
        if args.sleep or args.deliveries or args.queued:
            mapper = chain_mapper(stage_a, args.sleep, args.deliveries, args.queued)
    if args.hold_at:
        mapper = Held(mapper, args.hold_at, args.markers)
    sink = ZClusterSink(
        args.urls,
        mapper,
        args.query_name,
        journals=args.journals,
        flush=args.flush,
        prefix=args.prefix,
        publish=publish,
    )
    bound = {"maxFramesPerTrigger": args.max_frames} if args.max_frames else {}
    query = run_available_now(spark, sink, args.journals, args.checkpoint, selector, **bound)
    if args.progress:
        with open(args.progress, "w") as f:
            json.dump([p.numInputRows for p in query.recentProgress], f)
    if args.observed:
        with open(args.observed, "w") as f:
            json.dump([figures(p) for p in query.recentProgress], f)
    if args.stats:
        with open(args.stats, "w") as f:
            json.dump([dataclasses.asdict(s) for s in sink.history], f)
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
