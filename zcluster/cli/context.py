"""What every ``zcluster`` subcommand gets: the connection settings, the store they open, error lines.

The settings name either one cluster (``--url``/``--cluster-url``), turned into a
:class:`zcluster.ClusterConfig`, or a farm of replicas (``--replica``, repeatable), turned into a
:class:`zcluster.farm.FarmConfig`; the library parses every URL, and a URL or option it refuses is a usage
error (exit 2), as is naming both a cluster and a farm. The store (a :class:`zcluster.Cluster` or a
:class:`zcluster.farm.Farm`) is opened on first use and closed at exit; a :class:`zcluster.ConfigError`
raised before any server was contacted is a usage error too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, NoReturn, TypeVar

import click
import redis

from zcluster._urls import redact, redact_url
from zcluster.cli.output import one_line
from zcluster.cluster import Cluster
from zcluster.config import ClusterConfig
from zcluster.errors import ConfigError, ZClusterError
from zcluster.farm.config import FarmConfig
from zcluster.farm.farm import Farm
from zcluster.instrumentation import OpEvent

__all__ = ["EXPECTED", "MAX_COUNT", "Settings", "counts", "fail_if", "json_option", "pass_settings", "replica_where"]

F = TypeVar("F", bound=Callable[..., Any])

#: Errors reported as one line; anything else is a bug and keeps its traceback.
EXPECTED = (ZClusterError, redis.RedisError, OSError)

#: The largest count, size, limit or offset an option takes (2^53 - 1): beyond it a server refuses the number
#: (offset + limit must fit its signed 64-bit integers), which would be reported as a shard's failure.
MAX_COUNT = (1 << 53) - 1


def counts(minimum: int) -> click.IntRange:
    """The type of an option counting things (a limit, an offset, a size): ``minimum`` to :data:`MAX_COUNT`;
    anything else is a usage error (exit 2), found before a server is asked."""
    return click.IntRange(min=minimum, max=MAX_COUNT)


def replica_where(text: str) -> str | list[str]:
    """One ``--replica`` value as the library takes it: a URL (a shard, or a ``redis+cluster://`` seed), or
    the list of its comma-separated shard URLs (a comma inside a password must be written ``%2C``)."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts:
        raise click.UsageError("an empty --replica: give a shard URL, comma-separated shard URLs or a seed URL")
    return parts[0] if len(parts) == 1 else parts


@dataclass
class Settings:
    """Connection options of one invocation; opens the :class:`Cluster` (or, with ``replicas``, the
    :class:`Farm`) on first use, closes it at exit."""

    urls: tuple[str, ...]
    cluster_url: str | None
    prefix: str
    routing: str | None
    max_size: int | None
    json: bool = False
    replicas: tuple[str, ...] = ()
    _cluster: Cluster | None = field(default=None, repr=False)
    _farm: Farm | None = field(default=None, repr=False)
    #: Replica shards (``replica/host:port``) where a repair could not be written (from the farm's events).
    repair_failed: set[str] = field(default_factory=set, repr=False)
    #: Other URLs a command was given (a journal store's), whose passwords are redacted as well.
    secrets: list[str] = field(default_factory=list, repr=False)

    def redact(self, text: str) -> str:
        """``text`` on one line, with every password of the configured URLs replaced by ``***``."""
        pieces = [p for r in self.replicas for p in r.split(",")]
        return one_line(redact(text, [*self.urls, self.cluster_url or "", *self.replicas, *pieces, *self.secrets]))

    def _check_one_kind(self) -> None:
        if self.replicas and (self.urls or self.cluster_url):
            raise click.UsageError(
                "use either --replica (a farm of replicas; env ZCLUSTER_REPLICAS) or --url/--cluster-url "
                "(one cluster; env ZCLUSTER_URLS/ZCLUSTER_CLUSTER_URL), not both"
            )

    def config(self) -> ClusterConfig:
        """The library's config for these settings; anything it refuses is a usage error (exit 2)."""
        self._check_one_kind()
        if self.replicas:
            raise click.UsageError(f"{_command()} works on one cluster (--url/--cluster-url), not on --replica")
        if self.urls and self.cluster_url:
            raise click.UsageError("use either --url (standalone shards) or --cluster-url, not both")
        if not self.urls and not self.cluster_url:
            raise click.UsageError(
                "no servers: pass --url (standalone shards), --cluster-url (Redis Cluster) or --replica (a farm), "
                "or set ZCLUSTER_URLS / ZCLUSTER_CLUSTER_URL / ZCLUSTER_REPLICAS"
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

    def farm_config(self) -> FarmConfig:
        """The library's config of the farm named by ``--replica``; anything it refuses is a usage error."""
        self._check_one_kind()
        if not self.replicas:
            raise click.UsageError(
                f"{_command()} needs a farm: pass --replica WHERE once per replica (or set ZCLUSTER_REPLICAS, "
                "replicas separated by ';')"
            )
        options: dict[str, Any] = {"prefix": self.prefix, "max_size": self.max_size}
        if self.routing is not None:
            options["routing"] = self.routing
        wheres = [replica_where(r) for r in self.replicas]
        for i, where in enumerate(wheres):  # the library's own checks, naming the replica that fails them
            try:
                ClusterConfig.of(where, **options)
            except ConfigError as exc:
                self.usage_failure(f"replica{i}: {exc}")
        try:
            return FarmConfig.of(wheres, **options)
        except ConfigError as exc:
            self.usage_failure(str(exc))

    def farm(self, minimum: int = 1) -> Farm:
        """The Farm, opened on first use (one Cluster per replica); fewer than ``minimum`` replicas is a usage
        error. A replica whose servers fail while opening (a Redis Cluster seed) is named (exit 1)."""
        if self._farm is None:
            config = self.farm_config()
            count = len(config.replicas)
            if count < minimum:
                raise click.UsageError(
                    f"{_command()} compares replicas: pass --replica at least {minimum} times (got {count})"
                )
            names = [f"replica{i}" for i in range(len(config.replicas))]
            clusters: list[Cluster] = []
            try:
                for name, replica in zip(names, config.replicas, strict=True):
                    try:
                        clusters.append(replica.open())
                    except ConfigError as exc:
                        self.usage_failure(f"{name}: {exc}")
                    except EXPECTED as exc:
                        text = str(exc) if isinstance(exc, ZClusterError) else f"{type(exc).__name__}: {exc}"
                        raise click.ClickException(self.redact(f"{name}: {text}")) from None
                self._farm = Farm(
                    clusters,
                    write_quorum=config.write_quorum,
                    read=config.read,
                    repair=config.repair,
                    names=names,
                    instrumentation=self._on_event,
                )
            except BaseException:
                for c in clusters:
                    c.close()
                raise
        if len(self._farm.clusters) < minimum:
            raise click.UsageError(f"{_command()} compares replicas: pass --replica at least {minimum} times")
        return self._farm

    def store(self) -> Cluster | Farm:
        """The Farm with ``--replica``, else the Cluster: both have the same reads and writes."""
        return self.farm() if self.replicas else self.cluster()

    def replica_names(self) -> list[tuple[str, str]]:
        """(name, redacted WHERE) of every replica, in farm order."""
        shown = [",".join(redact_url(u.strip()) for u in r.split(",")) for r in self.replicas]
        return [(f"replica{i}", where) for i, where in enumerate(shown)]

    def _on_event(self, event: OpEvent) -> None:
        if event.op == "farm.repair" and event.failed_shards:
            self.repair_failed.update(event.failed_shards)

    def _shard_names(self) -> list[str]:
        store: Cluster | Farm | None = self._farm if self._farm is not None else self._cluster
        return store.shards if store is not None else []

    def failing_shards(self, message: str) -> str:
        """`` (failing shard(s): host:port, ...)`` when ``message`` names no shard: found by PING."""
        store: Cluster | Farm | None = self._farm if self._farm is not None else self._cluster
        if store is None:
            return ""
        try:
            if any(name.rpartition("/")[2] in message for name in self._shard_names()):
                return ""
            failed = [name for name, error in store.ping().items() if error is not None]
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
        if self._farm is not None:
            self._farm.close()
            self._farm = None

    def error(self, message: str) -> None:
        """Print one redacted ``Error:`` line on stderr."""
        click.echo(f"Error: {self.redact(message)}", err=True)


def _command() -> str:
    """The running subcommand's name, for messages."""
    ctx = click.get_current_context(silent=True)
    return ctx.info_name if ctx is not None and ctx.info_name else "this command"


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
