"""The main job, end to end on an embedded default: journals -> Spark -> exactly-once sink -> cluster.

``python -m zcluster.demo`` (or ``./run demo``) starts two local Redis servers and file journals in a
temporary directory, publishes timeline events from several producers (committed messages,
transactions, rolled-back transactions, one transaction left open across micro-batches, duplicated
appends), runs a PySpark Structured Streaming query with :class:`zcluster.spark.ZClusterSink` twice from
one checkpoint, and compares what the cluster holds with what exactly-once delivery must produce.
``--url`` (repeatable) or ``--cluster-url`` point it at real Redis servers or a Redis Cluster instead
(parsed by :class:`zcluster.ClusterConfig`, as everywhere). ``--replicas N`` runs it on a farm of N local
replicas of two shards each instead, kills one replica's shard (no persistence) after the first
micro-batch, restarts it empty after the second, and shows the walker rebuilding it. Exits non-zero if the
state differs from the model (or a rebuilt replica from the others). Needs the ``spark`` and ``cli`` extras.
"""

from __future__ import annotations

import logging
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from zcluster.cluster import Cluster
from zcluster.config import ClusterConfig, StoreConfig
from zcluster.errors import ConfigError
from zcluster.farm.config import FarmConfig
from zcluster.farm.farm import Farm
from zcluster.farm.walker import Walker
from zcluster.journal.files import FileJournals
from zcluster.journal.publishing import AsyncPublisher
from zcluster.message.framing import CONTENT_TYPE_NDJSON
from zcluster.message.journals import JournalSpec
from zcluster.message.mapping import modulo_mapping
from zcluster.message.records import JsonMessage
from zcluster.testing import LocalShards, find_server_binary, server_version
from zcluster.testing.traffic import Traffic, create_journals, leaderboard_mapper, publish, timeline_mapper
from zcluster.types import KeyMember, Store


def demo(
    console: Console,
    config: StoreConfig,
    cluster: Store,
    workdir: Path,
    messages: int,
    fault: Callable[[], None] | None = None,
) -> bool:
    from zcluster.spark import ZClusterSink, local_session, run_available_now  # PySpark: only when it runs

    journals_url = f"file://{workdir / 'journals'}"
    store = FileJournals(workdir / "journals")
    names = [f"timelines/part-{i:03d}" for i in range(4)]
    create_journals(store, names)
    traffic = Traffic(names)
    specs = [JournalSpec(n, {"content-type": CONTENT_TYPE_NDJSON}) for n in names]
    mapping = modulo_mapping(lambda m: m.doc["user"], lambda: specs)
    # Increments on a farm need every replica to confirm them (Farm.increment), and the farm's demo kills a
    # replica and carries on: it keeps the timelines only, which a quorum of replicas confirms.
    mapper = leaderboard_mapper if isinstance(cluster, Cluster) else timeline_mapper
    sink = ZClusterSink(config, mapper, f"demo-{int(time.time())}", journals=journals_url)
    long_txn = AsyncPublisher(store)
    with console.status("starting Spark (local[2])"):
        spark = local_session("local[2]")
    try:
        with console.status("publishing round 1: 3 producers, committed messages, transactions, duplicates"):
            publish(store, traffic, producers=3, messages=messages, seed=1)
            # A transaction that stays open across micro-batches: its ACK lands after the first batch.
            long_docs = [
                {"user": f"u{i}", "event": f"long-txn-{i}", "ts": 1_800_000_000.0 + i, "op": "add"} for i in range(5)
            ]
            for doc in long_docs:
                long_txn.publish_uncommitted(mapping, JsonMessage(dict(doc)))
            long_txn.barrier()
        round1 = (traffic.committed, traffic.rolled_back, traffic.duplicates)
        console.print(
            f"round 1: published {round1[0]:,} committed, {round1[1]:,} rolled back, "
            f"{round1[2]:,} duplicated appends; {len(long_docs)} more in an open transaction"
        )
        with console.status("micro-batch 0: sequencing and writing"):
            run_available_now(spark, sink, journals_url, workdir / "checkpoint")
        if fault is not None:
            fault()
        with console.status("publishing round 2, committing the long transaction"):
            publish(store, traffic, producers=3, messages=messages // 2, seed=2)
            long_txn.commit()
            long_txn.close()
            for doc in long_docs:
                traffic.apply(doc)
            traffic.committed += len(long_docs)
        # The table below counts both rounds: say so, so that its figures match what was published.
        console.print(
            f"round 2: published {traffic.committed - round1[0] - len(long_docs):,} committed, "
            f"{traffic.rolled_back - round1[1]:,} rolled back, {traffic.duplicates - round1[2]:,} duplicated "
            f"appends, and committed the open transaction's {len(long_docs)}: "
            f"{traffic.committed:,} committed in all"
        )
        with console.status("micro-batch 1: sequencing and writing (the long transaction is replayed)"):
            run_available_now(spark, sink, journals_url, workdir / "checkpoint")
    finally:
        spark.stop()
    return report(console, cluster, traffic, sink)


def report(console: Console, cluster: Store, traffic: Traffic, sink: Any) -> bool:
    expected = traffic.expected()
    got = cluster.select(list(expected), limit=1_000_000)
    matching = sum([(t.member, t.score) for t in got[k]] == v for k, v in expected.items())
    delivered = sum(b.delivered for b in sink.history)
    table = Table(title="committed vs what should have been")
    table.add_column("")
    table.add_column("should", justify="right")
    table.add_column("got", justify="right")
    table.add_row("committed messages applied once", f"{traffic.committed:,}", f"{delivered:,}")
    table.add_row(
        "duplicated appends dropped", f"{traffic.duplicates:,}", f"{sum(b.duplicates for b in sink.history):,}"
    )
    table.add_row("rolled-back messages delivered", "0", f"{delivered - traffic.committed:,}")
    table.add_row("timelines equal to the model", f"{len(expected):,}", f"{matching:,}")
    console.print(table)
    for b in sink.history:
        console.print(
            f"batch {b.batch_id}: {b.frames:,} frames, {b.delivered:,} delivered, {b.duplicates} dup, "
            f"{b.rollbacks} rollbacks, {b.replays} replays, {b.applied:,} writes applied, "
            f"{b.seconds:.1f}s"
        )
    key = sorted(expected, key=lambda k: -len(expected[k]))[0]
    lookups = Table(title=f"select {key} limit 3")
    for col in ("score", "member"):
        lookups.add_column(col)
    for t in cluster.select([key], limit=3)[key]:
        lookups.add_row(f"{t.score:.3f}", str(t.member))
    console.print(lookups)
    removed = next((KeyMember(k, m) for (k, m), (_, gone) in traffic.best.items() if gone), None)
    if removed is not None:
        console.print(f"score of a removed event {tuple(removed)}: {cluster.score([removed])[removed]}")
    probe = KeyMember("timeline:u0", "long-txn-0")
    console.print(f"score of an event from the long transaction: {cluster.score([probe])[probe]}")
    ok = bool(matching == len(expected) and delivered == traffic.committed)
    if isinstance(cluster, Cluster):
        board = [(str(e.member), e.score) for e in cluster.top(["leaderboard"], limit=1_000_000)["leaderboard"]]
        top = Table(title="leaderboard (events per user, exactly once): top 5")
        for col in ("rank", "user", "events", "model"):
            top.add_column(col)
        model = traffic.leaderboard()
        for rank, ((user, events), (model_user, model_events)) in enumerate(zip(board[:5], model[:5], strict=False), 1):
            top.add_row(str(rank), user, f"{events:.0f}", f"{model_user} {model_events:.0f}")
        console.print(top)
        ok = ok and board == model
    console.print(
        "[bold green]exactly once: the cluster matches the model[/]"
        if ok
        else "[bold red]the cluster differs from the model[/]"
    )
    return ok


def heal(console: Console, farm: Farm, local: LocalShards, killed: int) -> bool:
    """Restart the killed shard empty, walk the farm, and check every replica holds the same records."""
    local.start(killed)
    state = farm.view("zcstate:", floors=True)  # the sink's checkpoints: rebuilt like the data
    with console.status("walking the farm: the restarted replica is rebuilt from the others"):
        checkpoints = Walker(state).run()
        first, second = (Walker(farm).run() for _ in range(2))
    console.print(f"walk of the checkpoints: {checkpoints.keys} keys, {checkpoints.repaired} records repaired")
    console.print(
        f"walk: {first.keys:,} keys compared, {first.diverged:,} diverged, {first.repaired:,} records repaired "
        f"in {first.seconds:.1f}s; a second walk finds {second.diverged} diverged"
    )
    keys = sorted(k for batch in farm.keys(include_removed=True) for k in batch)
    held = farm.records(keys)
    same = all(h == held[0] and not h.errors for h in held[1:])
    console.print(
        f"[bold green]all {len(held)} replicas hold the same records for {len(keys):,} keys[/]"
        if same and second.diverged == 0
        else "[bold red]the replicas differ after the walk[/]"
    )
    return same and second.diverged == 0


def _config(urls: tuple[str, ...], cluster_url: str | None, prefix: str) -> ClusterConfig:
    """The config of a ``--cluster-url`` seed (``redis://`` or ``redis+cluster://``; it wins) or ``--url``
    shards; a URL the library refuses is a usage error (its message names the URL without password)."""
    try:
        if not cluster_url:
            return ClusterConfig.of(list(urls), prefix=prefix)
        return ClusterConfig.of(cluster_url, cluster=True, prefix=prefix)
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from None


@click.command()
@click.option("--url", "urls", multiple=True, help="Standalone shard URL (repeatable); default: start local ones.")
@click.option("--cluster-url", help="Seed node of a Redis Cluster instead of standalone shards.")
@click.option("--messages", default=400, show_default=True, help="Publish steps per producer in round 1.")
@click.option("--workdir", type=click.Path(path_type=Path), help="Where journals and the checkpoint go.")
@click.option(
    "--replicas",
    type=click.IntRange(min=0),
    default=0,
    help="Run on a farm of this many local replicas (2 shards each), kill one mid-run and heal it.",
)
def main(urls: tuple[str, ...], cluster_url: str | None, messages: int, workdir: Path | None, replicas: int) -> None:
    """Run the zcluster demo end to end; exit non-zero if the cluster does not match the model."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    console = Console()
    started = time.perf_counter()
    prefix = f"demo{int(time.time())}:"
    work = workdir or Path(tempfile.mkdtemp(prefix="zcluster-demo-"))
    if replicas and (cluster_url or urls):
        raise click.UsageError("--replicas starts local servers: it does not take --url or --cluster-url")
    if replicas == 1:
        raise click.UsageError("a farm needs at least 2 replicas")
    if replicas:
        binary = find_server_binary()
        console.print(f"starting {replicas} local replicas of 2 shards: {server_version(binary).split(' sha=')[0]}")
        with LocalShards(2 * replicas, binary=binary) as local:
            farm_config = FarmConfig.of([local.urls[2 * i : 2 * i + 2] for i in range(replicas)], prefix=prefix)
            with farm_config.open() as farm:

                def fault() -> None:
                    local.kill(2)  # replica1's first shard: its data is gone
                    console.print("[yellow]killed replica1's first shard (no persistence): the farm carries on[/]")

                ok = demo(console, farm_config, farm, work, messages, fault)
                ok = heal(console, farm, local, 2) and ok
    elif cluster_url or urls:
        config = _config(urls, cluster_url, prefix)
        with config.open() as cluster:
            ok = demo(console, config, cluster, work, messages)
    else:
        binary = find_server_binary()
        console.print(f"starting 2 local shards: {server_version(binary).split(' sha=')[0]}")
        with LocalShards(2, binary=binary) as local:
            config = ClusterConfig.of(local.urls, prefix=prefix)
            with config.open() as cluster:
                ok = demo(console, config, cluster, work, messages)
    console.print(f"done in {time.perf_counter() - started:.0f}s (journals and checkpoint in {work})")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
