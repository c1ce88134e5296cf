"""The main job on an embedded default: start local shards, write, read, scan, print.

``python -m zcluster.demo`` (or ``./run demo``) starts two local Redis servers, writes timelines of
events with inserts, deletes, stale replays and duplicates, then reads them back with select, score,
cursor paging and a key scan, and checks the result against what the CRDT rules say it must be.
``--url`` (repeatable) or ``--cluster-url`` point it at real servers instead.
"""

from __future__ import annotations

import random
import sys
import time

import click
from rich.console import Console
from rich.table import Table

from zcluster import Cluster, Cursor, KeyMember, KeyScoreMember
from zcluster.local import LocalShards, find_server_binary, server_version


def run(cluster: Cluster, users: int, events: int, console: Console) -> bool:
    rng = random.Random(42)
    now = 1_700_000_000.0
    inserts = [
        KeyScoreMember(f"timeline:{rng.randrange(users)}", now + i + rng.random(), f"event-{i}") for i in range(events)
    ]
    started = time.perf_counter()
    first = cluster.insert(inserts)
    took = time.perf_counter() - started
    console.print(f"inserted {first.applied_count:,} events into {users} timelines in {took:.2f}s "
                  f"({events / took:,.0f} tuples/s)")  # fmt: skip
    # at-least-once delivery: the same events again, and stale copies, change nothing
    replay = cluster.insert(rng.sample(inserts, events // 10))
    stale = cluster.insert([t._replace(score=t.score - 1) for t in rng.sample(inserts, events // 10)])
    deletes = rng.sample(inserts, events // 20)
    removed = cluster.delete(deletes)
    late = cluster.insert(deletes)  # a replay of an insert after its delete: the delete wins
    console.print(f"replayed {len(replay.applied)} (applied {replay.applied_count}), stale {len(stale.applied)} "
                  f"(applied {stale.applied_count}), deleted {removed.applied_count}, "
                  f"late replays of deleted events applied {late.applied_count}")  # fmt: skip

    gone = {(t.key, t.member) for t in deletes}
    expected: dict[str, list[tuple[float, str]]] = {}
    for t in inserts:
        if (t.key, t.member) not in gone:
            expected.setdefault(str(t.key), []).append((t.score, str(t.member)))
    keys = sorted(expected)
    got = cluster.select(keys, limit=events)
    ok = all([(m.score, m.member) for m in got[k]] == sorted(expected[k], reverse=True) for k in keys)

    table = Table(title="three timelines, newest first (select limit 3)")
    for col in ("key", "score", "member"):
        table.add_column(col)
    for key in keys[:3]:
        for t in got[key][:3]:
            table.add_row(str(key), f"{t.score:.3f}", str(t.member))
    console.print(table)
    page = cluster.select_range([keys[0]], limit=2)[keys[0]]
    cursor = Cursor(page[-1].score, page[-1].member)
    console.print(f"cursor after 2 of {keys[0]}: {cursor}")
    sample = deletes[0]
    console.print(f"score of a deleted event: {cluster.score([KeyMember(sample.key, sample.member)])}")
    scanned = sum(len(b) for b in cluster.keys(batch_size=500))
    console.print(f"scan found {scanned} keys (expected {len(keys)})")
    ok = ok and scanned == len(keys) and replay.applied_count == 0 and stale.applied_count == 0
    ok = ok and late.applied_count == 0
    console.print("[bold green]state matches the model[/]" if ok else "[bold red]state differs from the model[/]")
    return ok


@click.command()
@click.option("--url", "urls", multiple=True, help="Standalone shard URL (repeatable); default: start local ones.")
@click.option("--cluster-url", help="Seed node of a Redis Cluster instead of standalone shards.")
@click.option("--shards", default=2, show_default=True, help="Local shards to start when no URL is given.")
@click.option("--users", default=200, show_default=True)
@click.option("--events", default=50_000, show_default=True)
def main(urls: tuple[str, ...], cluster_url: str | None, shards: int, users: int, events: int) -> None:
    """Run the zcluster demo end to end and exit non-zero if the state is not what the model says."""
    console = Console()
    prefix = f"demo{int(time.time())}:"
    if cluster_url or urls:
        cluster = Cluster.from_cluster_url(cluster_url, prefix=prefix) if cluster_url else Cluster.from_urls(
            list(urls), prefix=prefix)  # fmt: skip
        with cluster:
            ok = run(cluster, users, events, console)
    else:
        binary = find_server_binary()
        console.print(f"starting {shards} local shards with {server_version(binary)}")
        with LocalShards(shards, binary=binary) as local, Cluster.from_urls(local.urls, prefix=prefix) as cluster:
            ok = run(cluster, users, events, console)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
