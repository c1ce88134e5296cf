"""The ``migrate`` subcommand: move the standalone store named by ``--url`` online to ``--to`` shards (more or
fewer) or to a Redis Cluster (``--to-cluster``); run it again to resume one that stopped
(:mod:`zcluster.migration`)."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import click

from zcluster.cli.context import Settings, counts, json_option, pass_settings
from zcluster.cli.output import emit_json, human_duration, print_table
from zcluster.config import ClusterConfig
from zcluster.migration import Migration, Progress

__all__ = ["migrate"]


@click.command()
@click.option("--to", "to", multiple=True, metavar="URL", help="A shard of the target layout (repeatable, in order).")
@click.option("--to-cluster", metavar="URL", help="A seed node of a Redis Cluster to move the store into.")
@click.option(
    "--namespace",
    "namespaces",
    multiple=True,
    metavar="PREFIX",
    help="A key prefix to move (repeatable; besides --prefix; default: zcstate: and zcdedup:).",
)
@click.option("--rate", type=counts(1), default=None, help="At most this many keys scanned per second.")
@click.option("--batch", type=counts(1), default=2000, show_default=True, help="Keys per SCAN step and copy.")
@click.option(
    "--cutover-keys",
    type=int,
    default=2000,
    show_default=True,
    help="Cut over once a catch-up round finds at most this many changed keys.",
)
@click.option(
    "--retry-for",
    type=float,
    default=60.0,
    show_default=True,
    help="Seconds to retry a server that cannot be reached before giving up (run again to resume).",
)
@click.option("--keep-others", is_flag=True, help="Leave keys of other namespaces ({...) in place instead of refusing.")
@click.option(
    "--take-over",
    is_flag=True,
    help="Take the migration's lease from the mover holding it (it must be dead or paused: once taken over it "
    "writes nothing more). Without it a second run is refused while the lease is live.",
)
@click.option(
    "--lease",
    type=click.FloatRange(min=0.5),
    default=30.0,
    show_default=True,
    help="Seconds without a heartbeat after which this mover's lease may be taken by another run.",
)
@click.option(
    "--own-namespaces",
    is_flag=True,
    help="The namespaces besides --prefix hold this store's keys only (other stores share the servers).",
)
@click.option("--quiet", is_flag=True, help="No progress lines on stderr.")
@json_option
@pass_settings
def migrate(
    settings: Settings,
    to: tuple[str, ...],
    to_cluster: str | None,
    namespaces: tuple[str, ...],
    rate: int | None,
    batch: int,
    cutover_keys: int,
    retry_for: float,
    keep_others: bool,
    take_over: bool,
    lease: float,
    own_namespaces: bool,
    quiet: bool,
) -> None:
    """Move the store to another layout while applications keep using it.

    The source is the store of --url (standalone shards); the target is --to (repeatable: shards of the
    new list, in order; a shard of both lists keeps its place) or --to-cluster (a Redis Cluster seed).
    Every key of the namespaces is copied, then changes are caught up, then a short cut-over pauses
    clients while the last changes are copied; long-lived clients then follow the store by themselves,
    and a client opened on the old list is refused with the new one named. Run the same command again to
    resume a migration that stopped (killed, a server down): its state is in the stores' layout markers.
    One mover at a time holds a migration (a lease with a heartbeat): a second run while the first is alive
    is refused and names it; a mover of this host that was killed is taken over at once.
    """
    if not settings.urls or settings.cluster_url or settings.replicas:
        raise click.UsageError("migrate moves a standalone store: name its shards with --url")
    if bool(to) == bool(to_cluster):
        raise click.UsageError("give the target as --to URL (repeatable) or --to-cluster URL, one of them")
    settings.secrets += [*to, to_cluster or ""]
    layout: dict[str, Any] = {"prefix": settings.prefix, "max_size": settings.max_size}
    source = ClusterConfig.of(list(settings.urls), **layout)
    target = ClusterConfig.of(to_cluster or list(to), cluster=bool(to_cluster), **layout)
    last = [0.0]

    def progress(p: Progress) -> None:
        now = time.monotonic()
        if quiet or (now - last[0] < 1.0 and p.phase == "copying"):
            return
        last[0] = now
        eta = "" if p.eta is None else f", about {human_duration(p.eta)} left in the pass"
        line = f"{p.phase}: {p.scanned} key(s) scanned, {p.copied} copied, {p.deleted} deleted"
        click.echo(settings.redact(line + (f", {p.rate:.0f} keys/s{eta}" if p.rate else "")), err=True)

    with Migration(
        source,
        target,
        namespaces=list(namespaces) or None,
        rate=rate,
        batch=batch,
        cutover_keys=cutover_keys,
        retry_for=retry_for,
        progress=progress,
        keep_others=keep_others,
        lease=lease,
        take_over=take_over,
        own_namespaces=own_namespaces,
    ) as migration:
        report = migration.run()
    if settings.json:
        emit_json(dataclasses.asdict(report))
        return
    rows = [(field.name, _shown(field.name, getattr(report, field.name))) for field in dataclasses.fields(report)]
    print_table(f"migration {report.migration}", ("", "value"), rows)


def _shown(name: str, value: Any) -> str:
    """A report field for people (``--json`` keeps the full numbers)."""
    if name in ("pause", "seconds"):
        return human_duration(value)
    if isinstance(value, list):
        return ", ".join(map(str, value)) or "-"
    return "-" if value is None else str(value)
