"""What every ``zcluster`` subcommand gets: the connection settings, the Cluster they open, error lines.

The settings are turned into a :class:`zcluster.ClusterConfig` (the library parses every URL); a URL or
option it refuses is a usage error (exit 2). The Cluster is opened on first use and closed at exit; a
:class:`zcluster.ConfigError` raised before any server was contacted is a usage error too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, NoReturn, TypeVar

import click
import redis

from zcluster._urls import redact
from zcluster.cli.output import one_line
from zcluster.cluster import Cluster
from zcluster.config import ClusterConfig
from zcluster.errors import ConfigError, ZClusterError

__all__ = ["EXPECTED", "Settings", "fail_if", "json_option", "pass_settings"]

F = TypeVar("F", bound=Callable[..., Any])

#: Errors reported as one line; anything else is a bug and keeps its traceback.
EXPECTED = (ZClusterError, redis.RedisError, OSError)


@dataclass
class Settings:
    """Connection options of one invocation; opens the :class:`Cluster` on first use, closes it at exit."""

    urls: tuple[str, ...]
    cluster_url: str | None
    prefix: str
    routing: str | None
    max_size: int | None
    json: bool = False
    _cluster: Cluster | None = field(default=None, repr=False)

    def redact(self, text: str) -> str:
        """``text`` on one line, with every password of the configured URLs replaced by ``***``."""
        return one_line(redact(text, [*self.urls, self.cluster_url or ""]))

    def config(self) -> ClusterConfig:
        """The library's config for these settings; anything it refuses is a usage error (exit 2)."""
        if self.urls and self.cluster_url:
            raise click.UsageError("use either --url (standalone shards) or --cluster-url, not both")
        if not self.urls and not self.cluster_url:
            raise click.UsageError(
                "no servers: pass --url (standalone shards) or --cluster-url (Redis Cluster), "
                "or set ZCLUSTER_URLS / ZCLUSTER_CLUSTER_URL"
            )
        if self.cluster_url and self.routing is not None:
            raise click.UsageError("--routing applies to standalone shards (--url) only")
        options: dict[str, Any] = {"prefix": self.prefix, "max_size": self.max_size}
        try:
            if self.cluster_url:
                return ClusterConfig.of(self.cluster_url, cluster=True, **options)
            return ClusterConfig.of(list(self.urls), routing=self.routing or "jump", **options)
        except ConfigError as exc:
            self.usage_failure(str(exc))

    def cluster(self) -> Cluster:
        """The Cluster, opened on first use. A :class:`ConfigError` (a bad URL, query option or prefix) is a
        usage error (exit 2); a server that fails raises a ShardError or a redis error (exit 1)."""
        if self._cluster is None:
            config = self.config()
            try:
                self._cluster = config.open()
            except ConfigError as exc:  # servers that fail raise ShardError or redis errors (exit 1)
                self.usage_failure(str(exc))
        return self._cluster

    def failing_shards(self, message: str) -> str:
        """`` (failing shard(s): host:port, ...)`` when ``message`` names no shard: found by PING."""
        if self._cluster is None:
            return ""
        try:
            if any(name in message for name in self._cluster.shards):
                return ""
            failed = [name for name, error in self._cluster.ping().items() if error is not None]
        except EXPECTED:
            return ""
        return f" (failing shard(s): {', '.join(failed)})" if failed else ""

    def usage_failure(self, message: str) -> NoReturn:
        """Report a usage error as one redacted ``Error:`` line (no usage text) and exit with status 2."""
        self.error(message)
        raise click.exceptions.Exit(2)

    def close(self) -> None:
        if self._cluster is not None:
            self._cluster.close()
            self._cluster = None

    def error(self, message: str) -> None:
        """Print one redacted ``Error:`` line on stderr."""
        click.echo(f"Error: {self.redact(message)}", err=True)


def fail_if(settings: Settings, failures: Iterable[str]) -> None:
    """Report each failure on stderr; exit 1 if there was any."""
    lines = list(failures)
    for line in lines:
        settings.error(line)
    if lines:
        raise click.exceptions.Exit(1)


def _set_json(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    settings = ctx.find_object(Settings)
    if value and settings is not None:
        settings.json = True


def json_option(f: F) -> F:
    """``--json`` on a subcommand (same as on the group)."""
    return click.option(
        "--json",
        "json_",
        is_flag=True,
        expose_value=False,
        callback=_set_json,
        help="One JSON document on stdout instead of a table.",
    )(f)


pass_settings = click.make_pass_decorator(Settings)
