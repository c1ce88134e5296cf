"""The reading subcommands: ``keys`` (a SCAN of every shard), ``select`` (pages of members), ``score``.

On a farm (``--replica``) they read through :class:`zcluster.farm.Farm`: answers of the replicas are merged
by the 2P-set rules, and the differences found are repaired (the library's default read and repair
strategies); failed shards are named ``replica/host:port``.
"""

from __future__ import annotations

from typing import Any

import click
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from zcluster.cli.context import Settings, counts, fail_if, json_option, pass_settings
from zcluster.cli.output import console, emit_json, human, human_score, json_blob, json_score, print_table
from zcluster.cluster import Cluster
from zcluster.errors import PartialScanError
from zcluster.types import Blob, Cursor, KeyMember, KeyScoreMember, ReadResult, ShardFailure

__all__ = ["keys", "score", "select"]


@click.command()
@click.option("--match", metavar="GLOB", help="Redis glob over the logical key (without the prefix).")
@click.option("--count", type=counts(1), default=1000, show_default=True, help="SCAN batch size per call.")
@click.option("--include-removed", is_flag=True, help="Also keys that hold only deletes (tombstones).")
@json_option
@pass_settings
def keys(settings: Settings, match: str | None, count: int, include_removed: bool) -> None:
    """Every logical key on every shard, each once (SCAN; never blocks the servers).

    A shard that fails does not stop the scan: the keys of the others are listed, then the failed shards
    are named (exit status 1). On a farm, every key held by any replica is listed once.
    """
    store = settings.store()
    err = console(stderr=True)
    collected: list[Blob] = []
    failures: list[ShardFailure] = []
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

        if isinstance(store, Cluster):
            batches = store.keys(count, include_removed=include_removed, match=match, progress=on_progress)
        else:  # a farm's sweep reports no per-shard progress
            batches = store.keys(count, include_removed=include_removed, match=match)
        try:
            for batch in batches:
                if settings.json:
                    collected.extend(batch)
                else:
                    click.echo("\n".join(human(k) for k in batch))
        except PartialScanError as exc:
            failures = exc.failures
    reasons = [f"{type(f.error).__name__}: {f.error}" for f in failures]
    if settings.json:
        emit_json(
            {
                "keys": [json_blob(k) for k in collected],
                "errors": [
                    {"shard": f.shard, "error": settings.redact(reason)}
                    for f, reason in zip(failures, reasons, strict=True)
                ],
            }
        )
    fail_if(
        settings,
        (f"shard {f.shard}: {reason}; its keys are not listed" for f, reason in zip(failures, reasons, strict=True)),
    )


def _cursor(ctx: click.Context, param: click.Parameter, value: str | None) -> Cursor | None:
    """Parse roshi's cursor string (``<uint64 score bits>A<urlsafe base64 member>``)."""
    if value is None:
        return None
    try:
        return Cursor.parse(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx, param) from None


def _read_error(settings: Settings, result: ReadResult[Any, Any], item: object) -> str | None:
    """The redacted failure of ``item``'s shard, or None when it was answered."""
    failure: ShardFailure | None = result.errors.get(item)
    return None if failure is None else settings.redact(str(failure))


@click.command()
@click.argument("keys", nargs=-1, required=True)
@click.option("--offset", type=counts(0), default=None, help="Skip this many members (not with cursors).")
@click.option("--limit", type=counts(1), default=10, show_default=True, help="Members per key.")
@click.option("--start", metavar="CURSOR", callback=_cursor, help="Page after this cursor (from a previous page).")
@click.option("--stop", metavar="CURSOR", callback=_cursor, help="Stop before this cursor.")
@json_option
@pass_settings
def select(
    settings: Settings, keys: tuple[str, ...], offset: int | None, limit: int, start: Cursor | None, stop: Cursor | None
) -> None:
    """Members of each KEY, highest score first; prints each key's next-page cursor when the page is full."""
    if (start is not None or stop is not None) and offset is not None:
        raise click.UsageError("--offset cannot be combined with --start/--stop")
    store = settings.store()
    if start is not None or stop is not None:
        result = store.select_range(keys, start=start, stop=stop, limit=limit, strict=False)
    else:
        result = store.select(keys, offset=offset or 0, limit=limit, strict=False)
    pages: list[tuple[str, list[KeyScoreMember], str | None]] = []
    for key in keys:
        page = result.get(key, [])
        nxt = str(Cursor(page[-1].score, page[-1].member)) if len(page) == limit else None
        pages.append((key, page, nxt))
    if settings.json:
        emit_json(
            {
                "keys": [
                    {
                        "key": json_blob(key),
                        "members": [{"score": json_score(m.score), "member": json_blob(m.member)} for m in page],
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
    fail_if(settings, (f"{human(k)}: {f}" for k, f in result.errors.items()))


@click.command()
@click.argument("args", nargs=-1, required=True, metavar="KEY MEMBER [KEY MEMBER]...")
@json_option
@pass_settings
def score(settings: Settings, args: tuple[str, ...]) -> None:
    """Whether each MEMBER of KEY is inserted, deleted (a tombstone) or absent, and at which score."""
    if len(args) % 2:
        raise click.UsageError(f"score takes KEY MEMBER pairs; got {len(args)} argument(s)")
    items = [KeyMember(args[i], args[i + 1]) for i in range(0, len(args), 2)]
    result = settings.store().score(items, strict=False)
    found = [(km, result.get(km)) for km in items]
    if settings.json:
        emit_json(
            {
                "members": [
                    {
                        "key": json_blob(km.key),
                        "member": json_blob(km.member),
                        "present": p.present if p else None,
                        "inserted": p.inserted if p else None,
                        "score": json_score(p.score) if p and p.present else None,
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
                "-" if p is None or not p.present else human_score(p.score),
            )
            for km, p in found
        ]
        print_table(None, ("key", "member", "state", "score"), rows)
    fail_if(settings, (f"{human(km.key)} {human(km.member)}: {f}" for km, f in result.errors.items()))
