"""The ``zcluster`` click group: connection options, the subcommands, one-line error reports, :func:`main`.

See :mod:`zcluster.cli` for the options and exit statuses.
"""

from __future__ import annotations

import os
from typing import Any

import click

from zcluster.cli.aggregates import counters, fences, top
from zcluster.cli.consumers import consumers
from zcluster.cli.context import EXPECTED, Settings, counts
from zcluster.cli.info import info
from zcluster.cli.markers import markers
from zcluster.cli.migrate import migrate
from zcluster.cli.module import server_module
from zcluster.cli.reads import keys, score, select
from zcluster.cli.replicas import diff, walk
from zcluster.cli.writes import delete, insert
from zcluster.errors import ConfigError, InvalidTupleError, ZClusterError
from zcluster.message.errors import SelectorError

__all__ = ["cli", "main"]


class _Group(click.Group):
    """Turns expected errors into one redacted line instead of a traceback: exit 2 for bad input, 1 otherwise."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            raise  # click's standalone mode exits quietly
        except (InvalidTupleError, ConfigError, SelectorError) as exc:  # bad input, found before anything was sent
            settings = ctx.obj if isinstance(ctx.obj, Settings) else None
            text = settings.redact(str(exc)) if settings is not None else str(exc)
            click.echo(f"Error: {' '.join(text.split())}", err=True)
            raise click.exceptions.Exit(2) from None
        except EXPECTED as exc:
            settings = ctx.obj if isinstance(ctx.obj, Settings) else None
            text = str(exc) if isinstance(exc, ZClusterError) else f"{type(exc).__name__}: {exc}"
            if settings is None:
                raise click.ClickException(" ".join(text.split())) from None
            text += settings.failing_shards(text)
            raise click.ClickException(settings.redact(text)) from None


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--url",
    "urls",
    multiple=True,
    metavar="URL",
    help="A standalone shard (repeatable, in shard order). Env: ZCLUSTER_URLS (comma-separated).",
)
@click.option("--cluster-url", metavar="URL", help="A seed node of a Redis Cluster. Env: ZCLUSTER_CLUSTER_URL.")
@click.option(
    "--replica",
    "replicas",
    multiple=True,
    metavar="WHERE",
    help="A replica of a farm (repeatable, one per replica; not with --url/--cluster-url): a shard URL, "
    "comma-separated shard URLs, or a redis+cluster:// seed. Env: ZCLUSTER_REPLICAS (replicas separated by ';').",
)
@click.option(
    "--prefix",
    envvar="ZCLUSTER_PREFIX",
    default="zc:",
    show_default=True,
    help="Namespace prefix of the keys. Env: ZCLUSTER_PREFIX.",
)
@click.option(
    "--routing",
    envvar="ZCLUSTER_ROUTING",
    type=click.Choice(["jump", "roshi"]),
    default=None,
    help="Shard routing for --url shards (default jump). Env: ZCLUSTER_ROUTING.",
)
@click.option(
    "--max-size",
    envvar="ZCLUSTER_MAX_SIZE",
    type=counts(1),
    default=None,
    help="Size bound of every set (must match the other writers'). Env: ZCLUSTER_MAX_SIZE.",
)
@click.option("--json", "json_", is_flag=True, help="One JSON document on stdout instead of a table.")
@click.version_option(package_name="zcluster")
@click.pass_context
def cli(
    ctx: click.Context,
    urls: tuple[str, ...],
    cluster_url: str | None,
    replicas: tuple[str, ...],
    prefix: str,
    routing: str | None,
    max_size: int | None,
    json_: bool,
) -> None:
    """Inspect and edit zcluster CRDT sorted sets on Redis shards, a Redis Cluster, or a farm of replicas.

    One cluster is named by --url (repeatable) or --cluster-url; a farm (independent clusters holding the
    same sets) by --replica, once per replica. Every command works on both; walk and diff compare and
    repair the replicas of a farm. Flags win over the environment.

    Non-UTF-8 keys and members appear as {"b64": "<base64>"} in --json output and are accepted in that
    form in JSON-lines input (insert/delete --file).
    """
    if not urls and not cluster_url and not replicas:
        urls = tuple(u.strip() for u in os.environ.get("ZCLUSTER_URLS", "").split(",") if u.strip())
        cluster_url = os.environ.get("ZCLUSTER_CLUSTER_URL") or None
        replicas = tuple(r.strip() for r in os.environ.get("ZCLUSTER_REPLICAS", "").split(";") if r.strip())
    settings = Settings(urls, cluster_url, prefix, routing, max_size, json_, replicas=replicas)
    ctx.obj = settings
    ctx.call_on_close(settings.close)


for _command in (
    *(keys, select, score, top, counters, fences, insert, delete, info),
    *(walk, diff, consumers, migrate, markers, server_module),
):
    cli.add_command(_command)


def main() -> None:
    """Run the ``zcluster`` command (click and rich are installed: see :func:`zcluster.cli.main`)."""
    cli(prog_name="zcluster")
