"""``zcluster``: the operator command (keys, select, score, insert, delete, info).

Connection, from flags or the environment (flags win):

* ``--url URL`` (repeatable; env ``ZCLUSTER_URLS``, comma-separated): standalone shards, routed client-side
  (``--routing jump|roshi``, env ``ZCLUSTER_ROUTING``; the order of the URLs matters, as for the library);
* ``--cluster-url URL`` (env ``ZCLUSTER_CLUSTER_URL``): a seed node of a native Redis Cluster;
* ``--prefix`` (env ``ZCLUSTER_PREFIX``, default ``zc:``) and ``--max-size`` (env ``ZCLUSTER_MAX_SIZE``;
  writes must use the size bound of every other writer).

URLs may carry credentials (``redis://user:password@host:port``); prefer the environment over flags for
them (process lists show flags). Credentials never appear in output or error messages.

Output is a human table by default and one JSON document with ``--json`` (before or after the subcommand);
keys and members that are not UTF-8 are ``{"b64": ...}`` objects there (see :mod:`zcluster.cli_output`).
Expected errors (bad input, unreachable or failing shards) print one ``Error:`` line on stderr and exit
non-zero: 2 for usage errors, 1 otherwise, also when only some shards failed (their part is reported).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import IO, Any, TypeVar, cast
from urllib.parse import unquote, urlsplit

import click
import redis
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from zcluster import scripts
from zcluster.cli_output import (
    console,
    human,
    human_score,
    json_blob,
    json_score,
    parse_json_blob,
    parse_score,
    print_table,
    redact,
)
from zcluster.cluster import Cluster, ReadResult
from zcluster.keys import ADD
from zcluster.topology import Routing, Shard
from zcluster.types import Blob, Cursor, KeyMember, KeyScoreMember, ShardFailure, WriteResult, ZClusterError

F = TypeVar("F", bound=Callable[..., Any])

#: Errors reported as one line; anything else is a bug and keeps its traceback.
_EXPECTED = (ZClusterError, redis.RedisError, OSError)


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

    def secrets(self) -> list[str]:
        """Passwords of the configured URLs (raw and percent-decoded), to scrub from messages."""
        out: list[str] = []
        for url in (*self.urls, self.cluster_url or ""):
            try:
                password = urlsplit(url).password
            except ValueError:
                continue
            if password:
                out += [password, unquote(password)]
        return out

    def cluster(self) -> Cluster:
        if self._cluster is None:
            options: dict[str, Any] = {"prefix": self.prefix, "max_size": self.max_size}
            if self.urls and self.cluster_url:
                raise click.UsageError("use either --url (standalone shards) or --cluster-url, not both")
            if self.cluster_url:
                if self.routing is not None:
                    raise click.UsageError("--routing applies to standalone shards (--url) only")
                self._cluster = Cluster.from_cluster_url(self.cluster_url, **options)
            elif self.urls:
                self._cluster = Cluster.from_urls(
                    list(self.urls), routing=cast(Routing, self.routing or "jump"), **options
                )
            else:
                raise click.UsageError(
                    "no servers: pass --url (standalone shards) or --cluster-url (Redis Cluster), "
                    "or set ZCLUSTER_URLS / ZCLUSTER_CLUSTER_URL"
                )
        return self._cluster

    def failing_shards(self, message: str) -> str:
        """`` (failing shard(s): host:port, ...)`` when ``message`` names no shard: found by PING."""
        if self._cluster is None:
            return ""
        masters = self._cluster.topology.masters()
        if any(shard.name in message for shard in masters):
            return ""
        failed = []
        for shard in masters:
            try:
                shard.client.ping()
            except _EXPECTED:
                failed.append(shard.name)
        return f" (failing shard(s): {', '.join(failed)})" if failed else ""

    def close(self) -> None:
        if self._cluster is not None:
            self._cluster.close()
            self._cluster = None

    def error(self, message: str) -> None:
        """Print one redacted ``Error:`` line on stderr."""
        click.echo(f"Error: {redact(message, self.secrets())}", err=True)


class _Group(click.Group):
    """Turns expected errors into one redacted line (exit 1) instead of a traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            raise  # click's standalone mode exits quietly
        except _EXPECTED as exc:
            settings = ctx.obj if isinstance(ctx.obj, Settings) else None
            text = str(exc) if isinstance(exc, ZClusterError) else f"{type(exc).__name__}: {exc}"
            if settings is not None:
                text += settings.failing_shards(text)
            raise click.ClickException(redact(text, settings.secrets() if settings else ())) from None


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


def _cursor(ctx: click.Context, param: click.Parameter, value: str | None) -> Cursor | None:
    """Parse roshi's cursor string (``<uint64 score bits>A<urlsafe base64 member>``)."""
    if value is None:
        return None
    try:
        return Cursor.parse(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx, param) from None


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
    type=click.IntRange(min=1),
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
    prefix: str,
    routing: str | None,
    max_size: int | None,
    json_: bool,
) -> None:
    """Inspect and edit zcluster CRDT sorted sets on Redis shards or a Redis Cluster.

    Non-UTF-8 keys and members appear as {"b64": "<base64>"} in --json output and are accepted in that
    form in JSON-lines input (insert/delete --file).
    """
    if not urls and not cluster_url:
        urls = tuple(u.strip() for u in os.environ.get("ZCLUSTER_URLS", "").split(",") if u.strip())
        cluster_url = os.environ.get("ZCLUSTER_CLUSTER_URL") or None
    settings = Settings(urls, cluster_url, prefix, routing, max_size, json_)
    ctx.obj = settings
    ctx.call_on_close(settings.close)


def _emit_json(document: Any) -> None:
    click.echo(json.dumps(document, ensure_ascii=False, allow_nan=False))


def _fail_if(settings: Settings, failures: Iterable[str]) -> None:
    """Report each failure on stderr; exit 1 if there was any."""
    lines = list(failures)
    for line in lines:
        settings.error(line)
    if lines:
        raise click.exceptions.Exit(1)


# -- keys ------------------------------------------------------------------------------------------------


@cli.command()
@click.option("--match", metavar="GLOB", help="Redis glob over the logical key (without the prefix).")
@click.option("--count", type=click.IntRange(min=1), default=1000, show_default=True, help="SCAN batch size per call.")
@click.option("--include-removed", is_flag=True, help="Also keys that hold only deletes (tombstones).")
@json_option
@pass_settings
def keys(settings: Settings, match: str | None, count: int, include_removed: bool) -> None:
    """Every logical key on every shard, each once (SCAN; never blocks the servers)."""
    cluster = settings.cluster()
    err = console(stderr=True)
    collected: list[Blob] = []
    with Progress(
        SpinnerColumn(),
        TextColumn("scanning {task.description}"),
        TextColumn("{task.completed} keys"),
        TimeElapsedColumn(),
        console=err,
        transient=True,
        disable=not err.is_terminal,
    ) as progress:
        tasks: dict[str, Any] = {}

        def on_progress(shard: str, found: int) -> None:
            if shard not in tasks:
                tasks[shard] = progress.add_task(shard, total=None)
            progress.update(tasks[shard], completed=found)

        for batch in cluster.keys(count, include_removed=include_removed, match=match, progress=on_progress):
            if settings.json:
                collected.extend(batch)
            else:
                click.echo("\n".join(human(k) for k in batch))
    if settings.json:
        _emit_json({"keys": [json_blob(k) for k in collected]})


# -- select / score --------------------------------------------------------------------------------------


@cli.command()
@click.argument("keys", nargs=-1, required=True)
@click.option("--offset", type=click.IntRange(min=0), default=None, help="Skip this many members (not with cursors).")
@click.option("--limit", type=click.IntRange(min=1), default=10, show_default=True, help="Members per key.")
@click.option("--start", metavar="CURSOR", callback=_cursor, help="Page after this cursor (from a previous page).")
@click.option("--stop", metavar="CURSOR", callback=_cursor, help="Stop before this cursor.")
@json_option
@pass_settings
def select(
    settings: Settings, keys: tuple[str, ...], offset: int | None, limit: int, start: Cursor | None, stop: Cursor | None
) -> None:
    """Members of each KEY, highest score first; prints each key's next-page cursor when the page is full."""
    cluster = settings.cluster()
    if start is not None or stop is not None:
        if offset is not None:
            raise click.UsageError("--offset cannot be combined with --start/--stop")
        result = cluster.select_range(keys, start=start, stop=stop, limit=limit, strict=False)
    else:
        result = cluster.select(keys, offset=offset or 0, limit=limit, strict=False)
    pages: list[tuple[str, list[KeyScoreMember], str | None]] = []
    for key in keys:
        page = result.get(key, [])
        nxt = str(Cursor(page[-1].score, page[-1].member)) if len(page) == limit else None
        pages.append((key, page, nxt))
    if settings.json:
        _emit_json(
            {
                "keys": [
                    {
                        "key": json_blob(key),
                        "members": [{"score": m.score, "member": json_blob(m.member)} for m in page],
                        "next": nxt,
                        "error": _read_error(settings, result, key),
                    }
                    for key, page, nxt in pages
                ]
            }
        )
    else:
        rows = [(human(key), human_score(m.score), human(m.member)) for key, page, _ in pages for m in page]
        print_table(None, ("key", "score", "member"), rows)
        for key, page, nxt in pages:
            if not page and key not in result.errors:
                click.echo(f"{human(key)}: no members")
            if nxt is not None:
                click.echo(f"{human(key)}: next page: --start {nxt}")
    _fail_if(settings, (f"{human(k)}: {f}" for k, f in result.errors.items()))


def _read_error(settings: Settings, result: ReadResult[Any, Any], item: object) -> str | None:
    """The redacted failure of ``item``'s shard, or None when it was answered."""
    failure: ShardFailure | None = result.errors.get(item)
    return None if failure is None else redact(str(failure), settings.secrets())


@cli.command()
@click.argument("args", nargs=-1, required=True, metavar="KEY MEMBER [KEY MEMBER]...")
@json_option
@pass_settings
def score(settings: Settings, args: tuple[str, ...]) -> None:
    """Whether each MEMBER of KEY is inserted, deleted (a tombstone) or absent, and at which score."""
    if len(args) % 2:
        raise click.UsageError(f"score takes KEY MEMBER pairs; got {len(args)} argument(s)")
    items = [KeyMember(args[i], args[i + 1]) for i in range(0, len(args), 2)]
    result = settings.cluster().score(items, strict=False)
    found = [(km, result.get(km)) for km in items]
    if settings.json:
        _emit_json(
            {
                "members": [
                    {
                        "key": json_blob(km.key),
                        "member": json_blob(km.member),
                        "present": p.present if p else None,
                        "inserted": p.inserted if p else None,
                        "score": json_score(p.score) if p else None,
                        "error": _read_error(settings, result, km),
                    }
                    for km, p in found
                ]
            }
        )
    else:
        rows = [
            (
                human(km.key),
                human(km.member),
                "error" if p is None else "inserted" if p.inserted else "deleted" if p.present else "absent",
                "-" if p is None else human_score(p.score),
            )
            for km, p in found
        ]
        print_table(None, ("key", "member", "state", "score"), rows)
    _fail_if(settings, (f"{human(km.key)} {human(km.member)}: {f}" for km, f in result.errors.items()))


# -- insert / delete -------------------------------------------------------------------------------------


def _triples(args: Sequence[str]) -> list[KeyScoreMember]:
    if len(args) % 3:
        raise click.UsageError(f"expected KEY SCORE MEMBER triples; got {len(args)} argument(s)")
    out = []
    for i in range(0, len(args), 3):
        try:
            value = parse_score(args[i + 1], f"argument {i + 2}")
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="SCORE") from None
        out.append(KeyScoreMember(args[i], value, args[i + 2]))
    return out


def _read_file(stream: IO[bytes], fmt: str) -> list[KeyScoreMember]:
    """Tuples of a TSV (``key<TAB>score<TAB>member``) or JSON-lines file; all lines are checked first."""
    name = getattr(stream, "name", "-")
    lines = [(n, line.rstrip(b"\n").rstrip(b"\r")) for n, line in enumerate(stream, 1)]
    lines = [(n, line) for n, line in lines if line.strip()]
    if fmt == "auto":
        fmt = "jsonl" if lines and lines[0][1].lstrip()[:1] in (b"{", b"[") else "tsv"
    out = []
    for n, line in lines:
        where = f"{name} line {n}"
        try:
            out.append(_json_line(line, where) if fmt == "jsonl" else _tsv_line(line, where))
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--file") from None
    return out


def _tsv_line(line: bytes, where: str) -> KeyScoreMember:
    fields = line.split(b"\t", 2)
    if len(fields) != 3:
        raise ValueError(f"{where}: expected key<TAB>score<TAB>member")
    return KeyScoreMember(fields[0], parse_score(fields[1].decode("ascii", "replace").strip(), where), fields[2])


def _json_line(line: bytes, where: str) -> KeyScoreMember:
    try:
        doc = json.loads(line.decode("utf-8", "surrogateescape"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where}: invalid JSON ({exc})") from None
    if isinstance(doc, dict) and set(doc) == {"key", "score", "member"}:
        key, value, member = doc["key"], doc["score"], doc["member"]
    elif isinstance(doc, list) and len(doc) == 3:
        key, value, member = doc
    else:
        raise ValueError(f'{where}: expected {{"key": ..., "score": ..., "member": ...}} or [key, score, member]')
    return KeyScoreMember(
        parse_json_blob(key, f"{where}: key"), parse_score(value, where), parse_json_blob(member, f"{where}: member")
    )


def write_options(f: F) -> F:
    """Arguments and options shared by insert and delete."""
    f = click.argument("args", nargs=-1, metavar="[KEY SCORE MEMBER]...")(f)
    f = click.option(
        "--file",
        "file",
        type=click.File("rb"),
        metavar="PATH",
        help="More tuples, one per line, from PATH ('-' for stdin): TSV or JSON lines.",
    )(f)
    f = click.option(
        "--format",
        "fmt",
        type=click.Choice(["auto", "tsv", "jsonl"]),
        default="auto",
        show_default=True,
        help="--file format; auto: JSON lines if the first line starts with '{' or '['.",
    )(f)
    return json_option(f)


def _write(settings: Settings, op: str, args: Sequence[str], file: IO[bytes] | None, fmt: str) -> None:
    tuples = _triples(args) + (_read_file(file, fmt) if file is not None else [])
    if not tuples:
        raise click.UsageError(f"nothing to {op}: give KEY SCORE MEMBER triples or --file")
    cluster = settings.cluster()
    write = cluster.insert if op == "insert" else cluster.delete
    result: WriteResult = write(tuples, raise_on_error=False)
    unconfirmed = len(result.failed_indices)
    stale = len(tuples) - result.applied_count - unconfirmed
    failures = [
        f"shard {f.shard}: {type(f.error).__name__}: {f.error}; {len(f.indices)} tuple(s) not confirmed "
        "(resending them is safe)"
        for f in result.failures
    ]
    if settings.json:
        _emit_json(
            {
                "op": op,
                "tuples": len(tuples),
                "applied": result.applied_count,
                "stale": stale,
                "unconfirmed": unconfirmed,
                "failures": [
                    {
                        "shard": f.shard,
                        "error": redact(f"{type(f.error).__name__}: {f.error}", settings.secrets()),
                        "tuples": len(f.indices),
                    }
                    for f in result.failures
                ],
            }
        )
    else:
        tail = f", {unconfirmed} unconfirmed" if unconfirmed else ""
        click.echo(f"{op}: {len(tuples)} tuple(s): {result.applied_count} applied, {stale} stale{tail}")
    _fail_if(settings, failures)


#: Negative scores (``-2.5``, ``-inf``) are arguments, not options. Keys or members starting with ``-`` may
#: need ``--`` before the first argument.
_WRITE_SETTINGS = {"ignore_unknown_options": True}
_WRITE_HELP = """{summary}

Tuples come as KEY SCORE MEMBER arguments and/or from --file: TSV lines (key<TAB>score<TAB>member; the
member may contain tabs) or JSON lines ({{"key": ..., "score": ..., "member": ...}} or [key, score, member];
keys and members are strings or {{"b64": "<base64>"}}). Every tuple is checked before anything is sent.
Scores are finite numbers (integers exact, |x| <= 2**53); negative ones work as arguments. Put -- before
the arguments when a key or member starts with '-'.

Exit status 1 when a shard failed: its tuples are reported as unconfirmed (resending them is safe).
"""


@cli.command(
    context_settings=_WRITE_SETTINGS,
    help=_WRITE_HELP.format(summary="Insert members; prints how many took effect and how many were stale."),
)
@write_options
@pass_settings
def insert(settings: Settings, args: tuple[str, ...], file: IO[bytes] | None, fmt: str) -> None:
    """Insert members; prints how many took effect and how many were stale (a newer write won)."""
    _write(settings, "insert", args, file, fmt)


@cli.command(
    context_settings=_WRITE_SETTINGS,
    help=_WRITE_HELP.format(summary="Delete members (leaving tombstones); prints how many took effect."),
)
@write_options
@pass_settings
def delete(settings: Settings, args: tuple[str, ...], file: IO[bytes] | None, fmt: str) -> None:
    """Delete members (leaving tombstones); prints how many took effect and how many were stale."""
    _write(settings, "delete", args, file, fmt)


# -- info ------------------------------------------------------------------------------------------------


def _shard_info(cluster: Cluster, shard: Shard, scan: bool) -> dict[str, Any]:
    client = shard.client
    server = client.info("server")
    memory = client.info("memory")
    doc: dict[str, Any] = {
        "shard": shard.name,
        "dbsize": int(client.dbsize()),
        "keys": None,
        "removed_only": None,
        "used_memory": int(memory["used_memory"]),
        "used_memory_human": str(memory.get("used_memory_human", "")),
        "script_loaded": bool(client.script_exists(scripts.write_script().sha)[0]),
        "version": f"{server.get('server_name', 'redis')} {server.get('valkey_version', server['redis_version'])}",
        "error": None,
    }
    if scan:
        layout = cluster.layout
        adds: set[bytes] = set()
        removes: set[bytes] = set()
        for raw in client.scan_iter(match=layout.scan_pattern(None, include_removed=True), count=1000):
            parts = layout.logical(bytes(raw))
            if parts is not None:
                (adds if parts[1] == ADD else removes).add(parts[0])
        doc["keys"], doc["removed_only"] = len(adds), len(removes - adds)
    return doc


@cli.command()
@click.option("--no-scan", is_flag=True, help="Skip counting logical keys (a SCAN of every shard).")
@json_option
@pass_settings
def info(settings: Settings, no_scan: bool) -> None:
    """Per shard: Redis keys (DBSIZE), logical keys of the prefix, memory, write script loaded, version."""
    cluster = settings.cluster()
    docs = []
    for shard in cluster.topology.masters():
        try:
            docs.append(_shard_info(cluster, shard, not no_scan))
        except (redis.RedisError, OSError) as exc:
            text = redact(f"{type(exc).__name__}: {exc}", settings.secrets())
            docs.append({"shard": shard.name, "error": text})
    if settings.json:
        _emit_json({"prefix": cluster.layout.prefix.decode("utf-8", "backslashreplace"), "shards": docs})
    else:
        columns = ("shard", "dbsize", "keys", "removed-only", "memory", "script", "version")
        rows = [
            (d["shard"], "-", "-", "-", "-", "-", "-")
            if d["error"] is not None
            else (
                d["shard"],
                d["dbsize"],
                "-" if d["keys"] is None else d["keys"],
                "-" if d["removed_only"] is None else d["removed_only"],
                d["used_memory_human"],
                "loaded" if d["script_loaded"] else "not loaded",
                d["version"],
            )
            for d in docs
        ]
        print_table(f"prefix {human(cluster.layout.prefix)}", columns, rows)
    _fail_if(settings, (f"shard {d['shard']}: {d['error']}" for d in docs if d["error"] is not None))


def main() -> None:
    """Entry point of the ``zcluster`` command."""
    cli(prog_name="zcluster")


if __name__ == "__main__":
    main()
