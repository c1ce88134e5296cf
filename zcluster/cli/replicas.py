"""The farm subcommands: ``walk`` (sweep the replicas and repair every difference) and ``diff`` (what each
replica holds for some keys).

Both need a farm of two or more replicas (``--replica``, once per replica; a usage error, exit 2,
otherwise). Replicas are named ``replica0``, ``replica1``, ... in the order given; their shards
``replicaN/host:port``.

``walk`` runs :class:`zcluster.farm.Walker` in a background thread while the main thread shows its
progress on stderr (on a terminal) and waits for Ctrl-C: the first one sets the walker's stop event, so
the current step finishes (its repairs included) and the position to resume from is printed (exit 130).
Exit statuses: 0 when the walk ended (complete, or stopped at ``--max-keys``) with no failure, 1 when a
replica shard could not be scanned or read or a repair could not be written, 130 on Ctrl-C.

``diff`` compares each key's records on every replica (:meth:`zcluster.farm.Farm.diff`: read whole, no
repair) with the merged one (the walker's merge: the highest score wins, a delete wins a tie). Exit
statuses: 0 when the replicas agree on every key, 3 when some records differ, 1 when a replica failed (its
error is shown; that takes precedence over 3).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import click
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.text import Text

from zcluster.cli.context import Settings, counts, fail_if, json_option, pass_settings
from zcluster.cli.output import console, emit_json, human, human_score, json_blob, json_score, print_table
from zcluster.farm import Farm, KeyDiff, Merged, Walker, WalkReport
from zcluster.types import Presence, ShardFailure

__all__ = ["diff", "walk"]

#: Exit status of ``diff`` when some replicas hold different records.
DIFFER = 3
#: Exit status of ``walk`` stopped by Ctrl-C (128 + SIGINT, as shells report it).
INTERRUPTED = 130


# -- walk ---------------------------------------------------------------------------------------------------


def _check_position(walker: Walker, position: str) -> None:
    """A usage error (exit 2) unless ``position`` is a walk position of this farm (and its topology)."""
    try:
        walker.check_position(position)
    except ValueError as exc:
        raise click.BadParameter(
            f"{exc}; use a position printed by an earlier walk of the same replicas", param_hint="'--resume'"
        ) from None


def _failure_lines(settings: Settings, failures: Sequence[ShardFailure]) -> list[tuple[str, str, int]]:
    """(shard, redacted reason, count) per failing shard, in order of first failure."""
    grouped: dict[str, tuple[str, int]] = {}
    for f in failures:
        reason, count = grouped.get(f.shard, (settings.redact(f"{type(f.error).__name__}: {f.error}"), 0))
        grouped[f.shard] = (reason, count + 1)
    return [(shard, reason, count) for shard, (reason, count) in grouped.items()]


@click.command()
@click.option(
    "--rate",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    metavar="KEYS_PER_S",
    help="Compare at most this many keys per second (default: as fast as the replicas answer).",
)
@click.option("--batch-size", type=counts(1), default=1000, show_default=True, help="Keys per step (SCAN count).")
@click.option("--resume", metavar="POSITION", help="Continue a walk from the position it printed when it stopped.")
@click.option("--max-keys", type=counts(1), default=None, help="Stop after the step that reaches this many keys.")
@json_option
@pass_settings
def walk(settings: Settings, rate: float | None, batch_size: int, resume: str | None, max_keys: int | None) -> None:
    """Sweep every replica's keyspace and repair every difference (the farm's walker).

    Each key held by any replica is compared once by fingerprint; the keys that differ are read whole,
    merged (the highest score wins, a delete wins a tie) and the winning records written where missing.
    Progress (keys compared, diverged, repaired, current replica) is shown on stderr on a terminal; the
    summary gives the position to resume from when the walk did not reach the end (JSON: null once complete).

    Ctrl-C stops after the current step and prints the position for --resume (exit 130). Exit 1 when a
    replica shard could not be scanned or read, or a repair could not be written; 0 otherwise.
    """
    farm = settings.farm(minimum=2)
    walker = Walker(farm, rate=rate, batch_size=batch_size)
    if resume is not None:
        _check_position(walker, resume)
    stop = threading.Event()
    outcome: dict[str, Any] = {}
    err = console(stderr=True)
    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        TextColumn("{task.completed} keys compared"),
        TextColumn("{task.fields[diverged]} diverged"),
        TextColumn("{task.fields[repaired]} repaired"),
        TimeElapsedColumn(),
        console=err,
        transient=True,
        disable=not err.is_terminal,
    ) as progress:
        task = progress.add_task(f"walking {farm.names[0]}", total=None, diverged=0, repaired=0)

        def on_progress(report: WalkReport, replica: int) -> None:
            outcome["position"] = report.position
            description = "stopping after this step" if stop.is_set() else f"walking {farm.names[replica]}"
            progress.update(
                task,
                description=description,
                completed=report.keys,
                diverged=report.diverged,
                repaired=report.repaired,
            )

        done = threading.Event()

        def run() -> None:
            try:
                outcome["report"] = walker.run(resume, stop=stop, max_keys=max_keys, progress=on_progress)
            except BaseException as exc:  # raised again by the main thread
                outcome["error"] = exc
            finally:
                done.set()

        thread = threading.Thread(target=run, name="zcluster-walk", daemon=True)
        outcome["position"] = resume
        interrupted = _wait(thread, done, stop, lambda: progress.update(task, description="stopping after this step"))
    if "error" in outcome:
        raise outcome["error"]
    if "report" not in outcome:  # a second Ctrl-C: the step in flight was abandoned
        position = outcome["position"]
        settings.error(f"interrupted again before the current step finished; resume with --resume {position}")
        raise click.exceptions.Exit(INTERRUPTED)
    _summary(settings, farm, outcome["report"], interrupted, max_keys)


def _wait(thread: threading.Thread, done: threading.Event, stop: threading.Event, stopping: Any) -> bool:
    """Start ``thread`` and wait until it sets ``done``; the first Ctrl-C sets ``stop`` and waits on (True:
    interrupted), a second one stops waiting. (An Event, not ``Thread.join``: a join that a Ctrl-C
    interrupts may leave the thread looking finished while it still runs.)"""
    interrupted = False
    try:
        thread.start()
        while not done.wait(0.1):
            pass
    except KeyboardInterrupt:
        interrupted = True
        stop.set()
        stopping()
        try:
            while not done.wait(0.1):
                pass
        except KeyboardInterrupt:
            pass
    return interrupted


def _summary(settings: Settings, farm: Farm, report: WalkReport, interrupted: bool, max_keys: int | None) -> None:
    failures = _failure_lines(settings, report.failures)
    complete = report.position is None
    if settings.json:
        emit_json(
            {
                "replicas": [{"name": name, "where": where} for name, where in settings.replica_names()],
                "keys": report.keys,
                "diverged": report.diverged,
                "repaired": report.repaired,
                "repair_failures": report.repair_failures,
                "seconds": round(report.seconds, 6),
                "keys_per_second": round(report.keys_per_second, 3),
                "complete": complete,
                "interrupted": interrupted,
                "position": report.position,
                "failures": [{"shard": s, "error": reason, "count": n} for s, reason, n in failures],
            }
        )
    else:
        click.echo(
            f"walk of {len(farm.clusters)} replicas: {report.keys} key(s) compared, {report.diverged} diverged, "
            f"{report.repaired} record(s) repaired, {report.repair_failures} repair failure(s) "
            f"in {report.seconds:.2f} s ({report.keys_per_second:.0f} keys/s)"
        )
        if complete:
            click.echo("complete: every replica's keyspace was walked")
        else:
            why = "interrupted" if interrupted else f"stopped at --max-keys {max_keys}" if max_keys else "stopped"
            click.echo(f"{why}: resume with --resume {report.position}")
    lines = [f"shard {s} could not be scanned or read: {reason} ({n} time(s))" for s, reason, n in failures]
    if report.repair_failures:
        where = f" on {', '.join(sorted(settings.repair_failed))}" if settings.repair_failed else ""
        lines.append(f"{report.repair_failures} record(s) could not be repaired{where}; walk again to retry")
    if interrupted:
        for line in lines:
            settings.error(line)
        if not complete:
            click.echo(f"Interrupted: resume with --resume {report.position}", err=True)
        raise click.exceptions.Exit(INTERRUPTED)
    fail_if(settings, lines)


# -- diff ---------------------------------------------------------------------------------------------------


def _errors(d: KeyDiff) -> dict[str, str]:
    """The failure of each replica that could not read the key, by replica name."""
    return {name: f"shard {f.shard}: {type(f.error).__name__}: {f.error}" for name, f in d.failures.items()}


def _state(p: Presence | None) -> dict[str, Any] | None:
    if p is None:
        return None
    state = "inserted" if p.inserted else "deleted" if p.present else "absent"
    return {"state": state, "score": json_score(p.score) if p.present else None}


def _cell(p: Presence | None, differs_: bool) -> Text:
    if p is None:
        return Text("error")
    text = f"{'inserted' if p.inserted else 'deleted'} {human_score(p.score)}" if p.present else "absent"
    return Text(f"{text} *", style="bold red") if differs_ else Text(text)


@click.command()
@click.argument("keys", nargs=-1, required=True)
@click.option("--differing", is_flag=True, help="Show only the members whose records differ between replicas.")
@json_option
@pass_settings
def diff(settings: Settings, keys: tuple[str, ...], differing: bool) -> None:
    """What each replica holds for each KEY, and which of its records differ.

    Every member and tombstone of each replica, with its score, and the merged record (the highest score
    wins, a delete wins a tie). A record marked * differs from the merged one: a read or `zcluster walk`
    would repair it. Reads each key whole on every replica; repairs nothing.

    Exit status 0 when every replica agrees on every KEY, 3 when some records differ, 1 when a replica could
    not be read (its error is shown; this takes precedence over 3).
    """
    farm = settings.farm(minimum=2)
    n = len(farm.clusters)
    compared = farm.diff(list(keys))
    differ = not all(d.agree for d in compared)
    if settings.json:
        emit_json(
            {
                "replicas": [{"name": name, "where": where} for name, where in settings.replica_names()],
                "agree": not differ,
                "failed": any(d.failures for d in compared),
                "keys": [
                    {
                        "key": json_blob(d.key),
                        "agree": d.agree,
                        "differing": sum(1 for m in d.members if m.fixes),
                        "members": [
                            {
                                "member": json_blob(m.member),
                                "merged": _state(m.best),
                                "replicas": {
                                    name: None if h is None else {**(_state(h) or {}), "differs": flag}
                                    for name, h, flag in zip(farm.names, _held(m, n), m.differing(n), strict=True)
                                },
                            }
                            for m in d.members
                            if not differing or m.fixes
                        ],
                        "errors": {name: settings.redact(text) for name, text in _errors(d).items()},
                    }
                    for d in compared
                ],
            }
        )
    else:
        for d in compared:
            _print_key(farm, d, differing)
        if differ:
            click.echo("* differs from the merged record: a read or `zcluster walk` repairs it")
    fail_if(settings, (f"{human(d.key)}: {text}" for d in compared for text in _errors(d).values()))
    if differ:
        raise click.exceptions.Exit(DIFFER)


def _held(m: Merged, replicas: int) -> list[Presence | None]:
    """Each replica's record of ``m`` (None: that replica failed)."""
    return [m.held.get(i) for i in range(replicas)]


def _print_key(farm: Farm, d: KeyDiff, differing: bool) -> None:
    key, members, n = d.key, d.members, len(farm.clusters)
    differ = sum(1 for m in members if m.fixes)
    failed = f" ({', '.join(d.failures)} failed)" if d.failures else ""
    if not members:
        click.echo(f"{human(key)}: no records on any replica{failed}")
        return
    verdict = f"replicas differ on {differ} of {len(members)} member(s)" if differ else "replicas agree"
    shown = [m for m in members if not differing or m.fixes]
    if not shown:
        click.echo(f"{human(key)}: {verdict}{failed}")
        return
    rows = [[Text(human(m.member)), *map(_cell, _held(m, n), m.differing(n)), _cell(m.best, False)] for m in shown]
    print_table(f"{human(key)}: {verdict}{failed}", ["member", *farm.names, "merged"], rows)
