"""The ``markers`` subcommand: each listed shard's layout marker of the store (:mod:`zcluster._guard`), the
migration its markers describe (:mod:`zcluster._moves`) and its mover's lease; ``markers reset`` deletes the
store's markers on the listed shards, refused while a migration is under way. ``info`` shows the same
migration summary (:func:`migration_of`).

Everything here reads the markers with plain connections of its own (no layout guard: a store the guard
refuses can still be inspected, and reset).
"""

from __future__ import annotations

import dataclasses
import shlex
import time
from typing import Any

import click
import redis

from zcluster._keys import KeyLayout
from zcluster._markers import DROP, marker_key, parse, when
from zcluster._moves import public_url, with_credentials
from zcluster._topology import StandaloneTopology
from zcluster.cli.context import Settings, json_option, pass_settings
from zcluster.cli.output import emit_json, print_table
from zcluster.errors import ZClusterError

__all__ = ["LEASE_KEY", "Seen", "markers", "migration_of", "read_markers"]

LEASE_KEY = b"{zcfence:}"
"""The mover's lease (:mod:`zcluster.migration`): a hash at this key followed by the prefix, on the source's
first listed shard, with fields ``lease`` (id), ``gen``, ``holder`` (``host:pid:uuid``), ``since`` and ``beat``
(unix seconds)."""

UNDER_WAY = ("copying", "cutting")
"""The ``move`` states of a migration under way (``done``: the store moved; the markers then say where)."""


@dataclasses.dataclass
class Seen:
    """One listed shard's marker of the store: ``marker`` parsed (None: no marker), ``raw`` as stored (what
    a reset deletes, only while it still holds that), ``error`` when it could not be read."""

    shard: str
    url: str
    marker: dict[str, Any] | None = None
    raw: bytes | None = None
    error: str | None = None


def _topology(settings: Settings) -> StandaloneTopology:
    config = settings.config()
    if config.cluster_url:
        key = marker_key(KeyLayout(settings.prefix)).decode("utf-8", "backslashreplace")
        raise click.UsageError(
            "markers reads standalone shards (--url); a Redis Cluster holds one marker for the store, which no "
            f"migration uses: read it with redis-cli -c GET {shlex.quote(key)}"
        )
    return StandaloneTopology(list(config.urls), config.routing)


def read_markers(settings: Settings) -> list[Seen]:
    """The marker of the store on each listed shard. A shard that cannot be read has ``error`` set
    (redacted); nothing raises for one shard."""
    key = marker_key(KeyLayout(settings.prefix))
    topology = _topology(settings)
    try:
        out = []
        for shard, url in zip(topology.shards, settings.urls, strict=True):
            seen = Seen(shard.name, url)
            try:
                raw: Any = shard.client.get(key)
                if raw is not None:
                    seen.raw = bytes(raw)
                    seen.marker = parse(shard.name, seen.raw)
            except (redis.RedisError, OSError, ZClusterError) as exc:
                seen.error = settings.redact(f"{type(exc).__name__}: {exc}")
            out.append(seen)
        return out
    finally:
        topology.close()


def read_lease(url: str, prefix: str) -> dict[str, Any] | None:
    """The mover's lease on the shard at ``url`` (see :data:`LEASE_KEY`), None when there is none; its
    fields parsed where they have the documented types, ``age`` the seconds since its last beat."""
    client = StandaloneTopology([url]).shards[0].client
    try:
        fields: Any = client.hgetall(LEASE_KEY + prefix.encode())
    finally:
        client.close()
    if not fields:
        return None
    text = {k.decode("utf-8", "replace"): v.decode("utf-8", "replace") for k, v in fields.items()}
    lease: dict[str, Any] = dict(text)
    for name, kind in (("gen", int), ("since", float), ("beat", float)):
        try:
            lease[name] = kind(text[name])
        except (KeyError, ValueError):
            lease[name] = None
    lease["age"] = None if lease["beat"] is None else round(max(0.0, time.time() - lease["beat"]), 1)
    return lease


def _marker_at(url: str, prefix: str) -> dict[str, Any] | None:
    """The store's marker on the shard at ``url`` (another list's: a migration's other side); None when it
    has none or cannot be read."""
    client = StandaloneTopology([url]).shards[0].client
    try:
        raw: Any = client.get(marker_key(KeyLayout(prefix)))
        return None if raw is None else parse(url, raw)
    except (redis.RedisError, OSError, ZClusterError):
        return None
    finally:
        client.close()


def migration_of(settings: Settings, seen: list[Seen]) -> dict[str, Any] | None:
    """What the listed shards' markers say of a migration: None when they describe none. Otherwise its
    ``id``, ``state`` (``copying``/``cutting``: under way, the least advanced marker's; ``done``: the store
    moved; ``incoming``: these shards are the target of one not cut over yet), ``role`` (``source`` or
    ``target``), ``to`` (the target's URLs, without credentials), ``since`` (unix seconds: when the lease was
    taken, else when the target was marked; None when neither is known), ``lease`` (see :func:`read_lease`)
    and ``resume``, the command that resumes it (or, once done, the list to open)."""
    markers = [s.marker for s in seen if s.marker is not None]
    moves = [m["move"] for m in markers if isinstance(m.get("move"), dict)]
    incoming = [m for m in markers if isinstance(m.get("incoming"), dict)]
    if not moves and not incoming:
        return None
    source: list[str]
    if moves:
        states = {str(m.get("state")) for m in moves}
        state = next((s for s in (*UNDER_WAY, "done") if s in states), sorted(states)[0])
        move = moves[0]
        to = move.get("to") if isinstance(move.get("to"), dict) else {}
        mig, urls, role = str(move.get("id")), [str(u) for u in to.get("urls", [])], "source"
        source = [public_url(u) for u in settings.urls]
        namespaces = [str(n) for n in move.get("namespaces", [])]
        target_id = to.get("id")
    else:
        origin = incoming[0]["incoming"]
        state, mig, role = "incoming", str(origin.get("id")), "target"
        urls = [str(u) for u in incoming[0].get("urls", [])]
        source = [f"redis://{name}" for name in origin.get("from", [])]
        target_id = incoming[0].get("id")
        theirs = _marker_at(with_credentials(source[0], settings.urls[0]), settings.prefix) if source else None
        move = theirs.get("move") if theirs is not None else None  # the source's: its namespaces, its target
        move = move if isinstance(move, dict) and move.get("id") == mig else {}
        namespaces = [str(n) for n in move.get("namespaces", [])]
        to = move.get("to") if isinstance(move.get("to"), dict) else {}
    since = None
    target_created = [float(m["created"]) for m in markers if m.get("id") == target_id and m.get("created")]
    if not target_created and state in UNDER_WAY and urls and to.get("routing") != "cluster":
        theirs = _marker_at(with_credentials(urls[0], settings.urls[0]), settings.prefix)
        created = theirs.get("created") if theirs is not None and theirs.get("id") == target_id else None
        target_created = [float(created)] if isinstance(created, int | float) else []
    lease = None
    if source:
        try:
            lease = read_lease(with_credentials(source[0], settings.urls[0]), settings.prefix)
        except (redis.RedisError, OSError, ZClusterError):
            lease = None  # shown as unknown: the markers say enough to resume
    if lease is not None and lease.get("since") is not None:
        since = lease["since"]
    elif target_created:
        since = min(target_created)
    resume = None
    if state != "done":
        args = ["zcluster", *(a for u in source for a in ("--url", u)), "--prefix", settings.prefix]
        if settings.max_size is not None:
            args += ["--max-size", str(settings.max_size)]
        args.append("migrate")
        # the same namespaces as the run it resumes: --prefix's own is implied, and none given means the defaults
        extra = [ns for ns in namespaces if ns != settings.prefix] or namespaces[:1]
        args += [a for ns in extra for a in ("--namespace", ns)]
        cluster = to.get("routing") == "cluster"
        args += ["--to-cluster", urls[0]] if cluster and urls else [a for u in urls for a in ("--to", u)]
        resume = " ".join(shlex.quote(a) for a in args)
    return {
        "id": mig,
        "state": state,
        "role": role,
        "to": urls,
        "since": since,
        "lease": lease,
        "resume": resume,
    }


def migration_lines(migration: dict[str, Any]) -> list[tuple[str, str]]:
    """The rows of a migration summary for a table."""
    lease = migration.get("lease")
    since = migration.get("since")
    rows = [
        ("migration", str(migration["id"])),
        ("state", str(migration["state"]) + (" (the store moved)" if migration["state"] == "done" else "")),
        ("these shards are its", str(migration["role"])),
        ("target", ", ".join(migration["to"]) or "-"),
        ("since", when({"created": since}) if since is not None else "unknown"),
    ]
    if lease is not None:
        age = "unknown" if lease.get("age") is None else f"{lease['age']} s ago"
        rows += [
            ("lease holder", f"{lease.get('holder', '?')} (lease {lease.get('lease', '?')}, gen {lease.get('gen')})"),
            ("lease since", when({"created": lease.get("since")})),
            ("last heartbeat", age),
        ]
    else:
        rows.append(("lease", "none found"))
    if migration.get("resume"):
        rows.append(("resume with", str(migration["resume"])))
    return rows


def _cell(marker: dict[str, Any] | None, listed: int) -> tuple[str, ...]:
    if marker is None:
        return ("(no marker)", "-", "-", "-", "-", "-", "-")
    place = marker.get("index")
    shown = "-" if place is None else str(place) + ("" if place == listed else f" (listed {listed})")
    move, incoming, origin = marker.get("move"), marker.get("incoming"), marker.get("from")
    notes = []
    if isinstance(move, dict):
        to: Any = move.get("to") if isinstance(move.get("to"), dict) else {}
        notes.append(f"move {move.get('id')} {move.get('state')} to [{', '.join(to.get('urls', []))}]")
    if isinstance(incoming, dict):
        notes.append(f"incoming {incoming.get('id')} from [{', '.join(incoming.get('from', []))}]")
    if isinstance(origin, dict):
        notes.append(f"from {origin.get('id')} [{', '.join(origin.get('shards', []))}] by {origin.get('migration')}")
    shards = marker.get("shards")
    return (
        str(marker.get("id")),
        str(marker.get("routing")),
        shown,
        "-" if shards is None else f"{len(shards)} [{', '.join(shards)}]",
        str(marker.get("max_size")),
        when(marker),
        "; ".join(notes) or "-",
    )


def _stale(settings: Settings, seen: list[Seen]) -> list[str]:
    """Why the retired shards among ``seen`` (a marker in state done) cannot lose their marker: each one that
    still holds a key of the prefix (a stale copy, which the old list would read as the store)."""
    pattern = KeyLayout(settings.prefix).scan_pattern(None, include_removed=True)
    topology = _topology(settings)
    try:
        out = []
        for shard, s in zip(topology.shards, seen, strict=True):
            move = (s.marker or {}).get("move")
            done = isinstance(move, dict) and move.get("state") == "done"
            if done and next(shard.client.scan_iter(match=pattern, count=1000), None) is not None:
                mig = move.get("id") if isinstance(move, dict) else None
                out.append(
                    f"{s.shard} was retired by migration {mig} and still holds keys of the prefix (stale "
                    "copies): delete them first"
                )
        return out
    finally:
        topology.close()


@click.group(invoke_without_command=True)
@json_option
@pass_settings
@click.pass_context
def markers(ctx: click.Context, settings: Settings) -> None:
    """Show each listed shard's layout marker of the store (--prefix), read directly (no layout check).

    Per shard: the layout id, routing, its place in the layout (and where it is listed when that differs),
    the layout's shards, max_size, when the layout was made, and a migration's fields: move (migration
    id, state copying/cutting/done, target), incoming (the target of a migration not cut over yet, and its
    source), from (the layout a migration moved the store from). Then the migration the markers describe,
    its mover's lease (holder, since, seconds since its last heartbeat) and the command that resumes it.
    Standalone shards (--url) only: a Redis Cluster holds one marker for the store.
    """
    if ctx.invoked_subcommand is not None:
        return
    seen = read_markers(settings)
    migration = migration_of(settings, seen)
    key = marker_key(KeyLayout(settings.prefix)).decode("utf-8", "backslashreplace")
    if settings.json:
        emit_json(
            {
                "prefix": settings.prefix,
                "key": key,
                "shards": [{"shard": s.shard, "marker": s.marker, "error": s.error} for s in seen],
                "migration": migration,
            }
        )
    else:
        columns = ("shard", "id", "routing", "place", "shards", "max_size", "created", "migration")
        rows = [
            (s.shard, "(unreadable)", "-", "-", "-", "-", "-", "-") if s.error else (s.shard, *_cell(s.marker, i))
            for i, s in enumerate(seen)
        ]
        print_table(f"layout markers of prefix {settings.prefix!r} (key {key})", columns, rows)
        if migration is not None:
            print_table(None, ("", "value"), migration_lines(migration))
    failures = [f"shard {s.shard}: {s.error}" for s in seen if s.error]
    for line in failures:
        settings.error(line)
    if failures:
        raise click.exceptions.Exit(1)


@markers.command()
@click.option("--yes", is_flag=True, help="Delete them; without it, only say what would be deleted.")
@click.option(
    "--retired",
    is_flag=True,
    help="Also delete the markers of shards a finished migration retired (move done), once they hold no key of "
    "the prefix: to use such a server again.",
)
@json_option
@pass_settings
def reset(settings: Settings, yes: bool, retired: bool) -> None:
    """Delete the store's layout markers on the listed shards, so that the next client to open the store
    adopts it again with its own list, after the layout guard's sample of the keys on each shard.

    Checked first, refusing (exit 1, nothing deleted): every listed shard can be read, and its marker (if
    it has one) is one zcluster reads; no marker shows a migration under way (move copying or cutting, or
    incoming: resume it with the command `zcluster markers` prints) or one that moved the store away (move
    done: those markers are what refuses the old list; reset would let it be opened and written again,
    beside the store's new home). With --retired, a marker in state done is deleted too, but only on a shard
    that holds no key of the prefix any more (delete those stale copies first: a retired server keeps them),
    so that the server can be used again (e.g. as a migration's target). Each marker is deleted only while
    it still holds what was read (a marker changed meanwhile is left, and named).

    Not checked: that the list is the one the store was written with (the next client's sample of up to
    256 keys a shard refuses a list that misplaces them, but cannot see a shard left out, nor keys past its
    sample); the mover's lease; shards not listed (their markers stay); clients already running (they keep
    the layout they settled, and mark a shard again when they reconnect: stop them, or run the reset when
    none of another list runs).
    """
    seen = read_markers(settings)
    problems = [f"{s.shard}: {s.error}" for s in seen if s.error]
    migration = migration_of(settings, seen)
    if migration is not None and migration["state"] == "done" and retired:
        problems += _stale(settings, seen)
    elif migration is not None:
        what = (
            f"migration {migration['id']} moved the store to [{', '.join(migration['to'])}]: these markers refuse "
            "the old list; open the store there (--retired deletes them once their shards hold no key of the "
            "prefix)"
            if migration["state"] == "done"
            else f"migration {migration['id']} is under way (state {migration['state']}): resume it with "
            f"{migration['resume']}"
        )
        problems.append(what)
    if problems:
        raise click.ClickException(settings.redact("refused, nothing deleted: " + "; ".join(problems)))
    marked = [s for s in seen if s.raw is not None]
    deleted: list[str] = []
    changed: list[str] = []
    if yes:
        layout = KeyLayout(settings.prefix)
        topology = _topology(settings)
        try:
            shards = {s.name: s for s in topology.shards}
            for s in marked:
                done = shards[s.shard].client.eval(DROP, 1, marker_key(layout), s.raw or b"")
                (deleted if done else changed).append(s.shard)
        finally:
            topology.close()
    if settings.json:
        emit_json(
            {
                "prefix": settings.prefix,
                "deleted": deleted,
                "changed": changed,
                "would_delete": [] if yes else [s.shard for s in marked],
                "unmarked": [s.shard for s in seen if s.raw is None],
            }
        )
    elif not yes:
        click.echo(
            f"would delete the marker of {settings.prefix!r} on {len(marked)} shard(s): "
            f"{', '.join(s.shard for s in marked) or 'none'}; nothing deleted: pass --yes"
        )
    else:
        click.echo(
            f"deleted the marker of {settings.prefix!r} on {len(deleted)} shard(s): {', '.join(deleted) or 'none'}"
        )
    if changed:
        raise click.ClickException(
            f"the marker changed since it was read on {', '.join(changed)} (a client or a mover wrote it): left "
            "as it is; look again with `zcluster markers`"
        )
