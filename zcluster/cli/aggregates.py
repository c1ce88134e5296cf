"""The aggregate subcommands: ``top`` (a leaderboard page of a sums key, :class:`zcluster.Incr`),
``counters`` (the totals of counters keys, :class:`zcluster.Count`) and ``fences`` (how far each source's
increments reached a key)."""

from __future__ import annotations

import click

from zcluster import Blob, Fence, ReadResult
from zcluster.cli.context import Settings, counts, fail_if, json_option, pass_settings
from zcluster.cli.output import emit_json, human, human_score, json_blob, json_score, print_table

__all__ = ["counters", "fences", "top"]


@click.command()
@click.argument("key")
@click.option("-n", "--limit", type=counts(1), default=10, show_default=True, help="Entries to show.")
@click.option("--offset", type=counts(0), default=0, show_default=True, help="Skip this many (a page).")
@json_option
@pass_settings
def top(settings: Settings, key: str, limit: int, offset: int) -> None:
    """The leaderboard of sums KEY: members by total, highest first (ties: member descending), ranked from 1.
    On a farm (--replica), read from the replica whose copy holds the most, the others repaired."""
    result = settings.store().top([key], offset=offset, limit=limit, strict=False)
    page = result.get(key, [])
    ranked = [(offset + i + 1, e) for i, e in enumerate(page)]
    if settings.json:
        emit_json(
            {
                "key": json_blob(key),
                "entries": [
                    {"rank": r, "member": json_blob(e.member), "total": json_score(e.score)} for r, e in ranked
                ],
                "error": None if key not in result.errors else settings.redact(str(result.errors[key])),
            }
        )
    else:
        print_table(
            f"top of {human(key)}",
            ("rank", "member", "total"),
            [(str(r), human(e.member), human_score(e.score)) for r, e in ranked],
        )
        if not page and key not in result.errors:
            click.echo(f"{human(key)}: no entries")
    fail_if(settings, (f"{human(k)}: {f}" for k, f in result.errors.items()))


@click.command()
@click.argument("keys", nargs=-1, required=True)
@json_option
@pass_settings
def counters(settings: Settings, keys: tuple[str, ...]) -> None:
    """Every counter of each counters KEY (exact int64 totals), by field. With --json each key's counters are a
    list of {"field": ..., "total": ...}, fields as keys and members are (text, or {"b64": ...})."""
    result = settings.store().counters(keys, strict=False)
    if settings.json:
        emit_json(
            {
                "keys": [
                    {
                        "key": json_blob(k),
                        "counters": [{"field": json_blob(f), "total": v} for f, v in sorted(result.get(k, {}).items())],
                        "error": None if k not in result.errors else settings.redact(str(result.errors[k])),
                    }
                    for k in keys
                ]
            }
        )
    else:
        rows = [(human(k), human(f), str(v)) for k in keys for f, v in sorted(result.get(k, {}).items())]
        print_table(None, ("key", "field", "total"), rows)
    fail_if(settings, (f"{human(k)}: {f}" for k, f in result.errors.items()))


@click.command()
@click.argument("keys", nargs=-1, required=True)
@json_option
@pass_settings
def fences(settings: Settings, keys: tuple[str, ...]) -> None:
    """How far each source's increments reached each aggregate KEY: the position of the last one applied
    and how many the key holds (on a farm, per replica: the replica that leads holds the most)."""
    asked: list[Blob] = list(keys)
    named: list[tuple[str, ReadResult[Blob, dict[Blob, Fence] | None]]]
    if settings.replicas:
        farm = settings.farm()
        named = list(zip(farm.names, farm.per_replica(lambda c: c.fences(asked, strict=False), asked), strict=True))
    else:
        named = [("", settings.cluster().fences(keys, strict=False))]
    entries = [(replica, k, result.get(k), result.errors.get(k)) for k in keys for replica, result in named]
    if settings.json:
        emit_json(
            {
                "keys": [
                    {
                        **({"replica": replica} if settings.replicas else {}),
                        "key": json_blob(k),
                        "aggregate": held is not None,
                        "fences": [
                            {"source": json_blob(s), "position": list(f.position), "held": f.held}
                            for s, f in sorted((held or {}).items())
                        ],
                        "error": None if error is None else settings.redact(str(error)),
                    }
                    for replica, k, held, error in entries
                ]
            }
        )
    else:
        head = (
            ("replica", "key", "source", "position", "held")
            if settings.replicas
            else ("key", "source", "position", "held")
        )
        rows = [
            (
                *((replica,) if settings.replicas else ()),
                human(k),
                human(s),
                ":".join(map(str, f.position)),
                str(f.held),
            )
            for replica, k, held, _ in entries
            for s, f in sorted((held or {}).items())
        ]
        print_table(None, head, rows)
        for replica, k, held, error in entries:
            if held is None and error is None:
                click.echo(f"{(replica + ' ') if replica else ''}{human(k)}: not an aggregate key (no increments)")
    fail_if(settings, (f"{human(k)}: {e}" for _, k, _, e in entries if e is not None))
