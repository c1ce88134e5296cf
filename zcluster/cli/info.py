"""The ``info`` subcommand: per shard figures from :meth:`zcluster.Cluster.stats` (of every replica of a farm,
its shards named ``replica/host:port``), and a warning per Redis Cluster master holding slots open for a
migration (exit 0: a reshard under way holds them too). On standalone shards, first the migration their
layout markers describe, if any (:func:`zcluster.cli.markers.migration_of`): its state, id, target, since
when, its mover's lease and the command that resumes it."""

from __future__ import annotations

import dataclasses

import click

from zcluster.cli.context import Settings, fail_if, json_option, pass_settings
from zcluster.cli.markers import migration_lines, migration_of, read_markers
from zcluster.cli.output import emit_json, human, print_table

__all__ = ["info"]


@click.command()
@click.option("--no-scan", is_flag=True, help="Skip counting logical keys (a SCAN of every shard).")
@json_option
@pass_settings
def info(settings: Settings, no_scan: bool) -> None:
    """Per shard: Redis keys (DBSIZE), logical keys of the prefix, memory, write script loaded, version, the
    protocol of zcluster's Redis module where the server has it loaded ("-" without);
    on a Redis Cluster, the slots each master holds open for a migration (a warning names them).

    On a farm, the shards of every replica, named replica/host:port.

    On standalone shards (--url), first the migration their layout markers describe, if any: its state
    (copying, cutting, done, or incoming on a target's shards), id, target, since when, the mover's lease
    (holder, since, seconds since its last heartbeat) and the command that resumes it (`markers` shows
    every marker). A store a finished migration moved away is then refused (exit 1), naming its new home.
    """
    standalone = bool(settings.urls) and not settings.cluster_url and not settings.replicas
    migration = migration_of(settings, read_markers(settings)) if standalone else None
    if migration is not None and not settings.json:
        print_table("migration", ("", "value"), migration_lines(migration))
    store = settings.store()
    found = store.stats(scan=not no_scan)  # a farm names its shards replica/host:port
    stats = [s if s.error is None else dataclasses.replace(s, error=settings.redact(s.error)) for s in found]
    if settings.json:
        emit_json(
            {
                "prefix": store.prefix.decode("utf-8", "backslashreplace"),
                "shards": [dataclasses.asdict(s) for s in stats],
                "migration": migration,
            }
        )
    else:
        columns = ("shard", "dbsize", "keys", "removed-only", "memory", "script", "version", "module", "open-slots")
        rows = [
            (s.shard, "-", "-", "-", "-", "-", "-", "-", "-")
            if s.error is not None
            else (
                s.shard,
                s.dbsize,
                "-" if s.keys is None else s.keys,
                "-" if s.removed_only is None else s.removed_only,
                s.used_memory_human,
                "loaded" if s.script_loaded else "not loaded",
                s.version,
                "-" if s.module_version is None else f"v{s.module_version}",
                "-" if s.open_slots is None else len(s.open_slots),
            )
            for s in stats
        ]
        print_table(f"prefix {human(store.prefix)}", columns, rows)
    for s in stats:
        if s.open_slots:
            click.echo(
                f"Warning: {s.shard} holds slot(s) open for a migration: {', '.join(s.open_slots)}. Calls on their "
                "keys may wait up to failover_timeout, then fail; if no reshard is running (redis-cli died), "
                "`redis-cli --cluster fix <host:port>` closes them",
                err=True,
            )
    fail_if(settings, (f"shard {s.shard}: {s.error}" for s in stats if s.error is not None))
