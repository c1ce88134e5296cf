"""The ``consumers`` subcommand: how far behind each exactly-once application is, and the audited way past a
lost range (:mod:`zcluster.state.monitor`, :mod:`zcluster.state.lost`).

* ``zcluster consumers``: the applications whose checkpoints the cluster holds (a SCAN of the state
  namespace), with their journals (and, given the journal store, their total lag);
* ``zcluster consumers APP``: per journal: checkpoint offset, journal end (write head), lag in bytes (and
  frames with ``--frames``), producer states and open transactions held, when the checkpoint last moved, the
  lost ranges ahead and those skipped (from the audit log), and what stops the application, if anything;
* ``zcluster consumers APP skip-lost JOURNAL --reason TEXT [--range BEGIN..END]``: move the checkpoint past
  the lost range it stopped at, exactly that range (``--range``, when given, must name it), recorded in the
  audit log; anything else is refused and changes nothing (exit 2). On a publishing application's journal the
  skip is fenced (:meth:`zcluster.state.StateStore.skip_lost`: a running applier's next save is refused), and the
  ACK intents of its last transaction stay in the moved checkpoint (this command appends to no journal): the
  application's next claim appends them.

The journal store (needed for ends, lags, lost ranges and skip-lost) is ``--journals URL`` or the environment's
``ZCLUSTER_JOURNALS`` (``file:///dir``, ``redis://...?prefix=...``); its password, if any, never appears in
output; it is opened read-only (a ``file://`` root that does not exist is a usage error, never created). Each
lag is read as the consumer's next poll reads it, so damage not yet recovered is shown as the error the
consumer meets (:func:`zcluster.state.progress`). ``--max-lag BYTES`` makes the command a health check: exit 3
when a journal lags by more than that or cannot go on (a lost range, damage, a journal created again, a
checkpoint past its end or one that does not parse), and when there is nothing to check (an application
with no checkpoint: a typo, or a consumer that never saved one; no application at all). Each journal that
fails the check is named on stderr with why (one ``Error:`` line each: its lag over ``--max-lag``, or what
stops it), and a lag over it shows in the status column as ``over --max-lag (LAG > BYTES)``. A shard that
fails is named after what the others answered, with exit 1 (also when the health check failed).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import click

from zcluster.cli.context import Settings, fail_if, json_option, pass_settings
from zcluster.cli.output import emit_json, print_table
from zcluster.errors import ConfigError
from zcluster.journal.store import JournalStore, close_store
from zcluster.journal.urls import open_store
from zcluster.message.errors import JournalNotFoundError
from zcluster.message.labels import parse_selector
from zcluster.state import JournalProgress, StateStore, checkpoints, progress
from zcluster.types import ShardFailure

__all__ = ["consumers"]


def _ago(moment: float | None, now: float) -> str:
    if moment is None:
        return "-"
    seconds = max(0.0, now - moment)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit} ago"
    return f"{int(seconds)}s ago"


def _range(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    begin, sep, end = text.partition("..")
    try:
        if sep:
            return int(begin), int(end)
    except ValueError:
        pass
    raise click.BadParameter(f"expected BEGIN..END (byte offsets), got {text!r}", param_hint="--range")


def _open(settings: Settings, url: str | None) -> JournalStore | None:
    if url is None:
        return None
    settings.secrets.append(url)
    try:
        # A reader: recovering is the writers' business, and a view creates nothing (a typo stays a typo).
        return open_store(url, recover=False, create=False)
    except (ValueError, JournalNotFoundError) as exc:
        settings.usage_failure(f"--journals: {exc}")


def _doc(p: JournalProgress) -> dict[str, Any]:
    out = dataclasses.asdict(p)
    out["lost"] = [{"begin": b, "end": e, "reason": r} for b, e, r in p.lost]
    return out


@click.command()
@click.argument("args", nargs=-1, metavar="[APP [skip-lost JOURNAL]]")
@click.option(
    "--journals",
    "journals_url",
    envvar="ZCLUSTER_JOURNALS",
    metavar="URL",
    help="The journal store (file:///dir, redis://host:port?prefix=p), for ends, lags and lost ranges. "
    "Env: ZCLUSTER_JOURNALS.",
)
@click.option("--selector", default=None, help="Also show the store's journals matching this label selector.")
@click.option("--frames", "count_frames", is_flag=True, help="Count the frames of each lag too (reads them).")
@click.option(
    "--max-lag",
    type=click.IntRange(min=0),
    default=None,
    metavar="BYTES",
    help="Exit 3 when a journal lags by more than BYTES or cannot go on (a health check).",
)
@click.option("--reason", default=None, help="skip-lost: why (recorded in the audit log; required).")
@click.option("--range", "range_", default=None, metavar="BEGIN..END", help="skip-lost: the lost range expected.")
@click.option("--namespace", default="zcstate:", show_default=True, help="The state namespace of the checkpoints.")
@json_option
@pass_settings
def consumers(
    settings: Settings,
    args: tuple[str, ...],
    journals_url: str | None,
    selector: str | None,
    count_frames: bool,
    max_lag: int | None,
    reason: str | None,
    range_: str | None,
    namespace: str,
) -> None:
    """Exactly-once applications: their progress and lag per journal, and skip-lost.

    \b
    zcluster consumers                          the applications with checkpoints
    zcluster consumers APP                      per journal: offset, end, lag, producers, last moved, lost ranges
    zcluster consumers APP skip-lost JOURNAL --reason TEXT [--range BEGIN..END]
    """
    if len(args) not in (0, 1, 3) or (len(args) == 3 and args[1] != "skip-lost"):
        raise click.UsageError("expected: consumers [APP [skip-lost JOURNAL]]")
    if len(args) != 3 and (reason is not None or range_ is not None):
        raise click.UsageError("--reason and --range go with skip-lost")
    if selector is not None:
        parse_selector(selector)  # a malformed one is a usage error (exit 2), also without a journal store
    store = _open(settings, journals_url)
    try:
        if not args:
            _list(settings, store, namespace, max_lag)
        elif len(args) == 1:
            _show(settings, args[0], store, selector, count_frames, namespace, max_lag)
        else:
            _skip(settings, args[0], args[2], store, reason, _range(range_), namespace)
    finally:
        if store is not None:
            close_store(store)


def _over(p: JournalProgress, max_lag: int | None) -> bool:
    return max_lag is not None and p.error is None and (p.lag_bytes or 0) > max_lag


def _unhealthy(found: list[JournalProgress], max_lag: int | None, app: str | None = None) -> list[str]:
    """Why the health check fails, one line per journal that fails it (empty: it passes, or no check)."""
    if max_lag is None:
        return []
    where = "" if app is None else f"application {app}, "
    lines = [f"{where}journal {p.journal} cannot go on: {p.error}" for p in found if p.error is not None]
    lines += [
        f"{where}journal {p.journal} lags {p.lag_bytes} bytes, over --max-lag {max_lag}"
        for p in found
        if _over(p, max_lag)
    ]
    return lines


def _finish(settings: Settings, failures: list[ShardFailure], unhealthy: list[str] | None) -> None:
    """Exit 1 naming the failed shards (what the others answered is printed), else 3 with ``unhealthy``'s
    lines (why the health check failed) when it is not None; those lines are printed in both cases."""
    for line in unhealthy or ():
        settings.error(line)
    seen = {(f.shard, str(f.error)) for f in failures}
    fail_if(settings, (f"shard {s}: {e}; what it holds is not shown" for s, e in sorted(seen)))
    if unhealthy is not None:
        raise click.exceptions.Exit(3)


def _list(settings: Settings, store: Any, namespace: str, max_lag: int | None) -> None:
    cluster = settings.store()
    rows: list[tuple[object, ...]] = []
    docs: list[dict[str, Any]] = []
    unhealthy: list[str] = []
    now = time.time()
    failures: list[ShardFailure] = []
    apps = checkpoints(cluster, namespace, failures=failures)  # one SCAN for every application
    for app, names in apps.items():
        if store is None and max_lag is None:
            rows.append((app, len(names), "-", "-", "-"))
            docs.append({"app": app, "journals": len(names), "lag_bytes": None, "last_moved": None, "problems": None})
            continue
        found = progress(cluster, app, store, namespace=namespace, failures=failures, checkpointed=names)
        lag = sum(p.lag_bytes or 0 for p in found) if store is not None else None
        moved = max((p.last_moved for p in found if p.last_moved is not None), default=None)
        problems = sum(1 for p in found if p.error is not None)
        unhealthy += _unhealthy(found, max_lag, app)
        rows.append((app, len(found), "-" if lag is None else lag, _ago(moved, now), problems))
        docs.append({"app": app, "journals": len(found), "lag_bytes": lag, "last_moved": moved, "problems": problems})
    if settings.json:
        emit_json({"applications": docs})
    else:
        print_table(None, ("application", "journals", "lag (bytes)", "last moved", "problems"), rows)
    if max_lag is not None and not apps and not failures:
        nothing = f"no application holds checkpoints under namespace {namespace!r}: nothing to check"
        _finish(settings, failures, [nothing])
    _finish(settings, failures, unhealthy or None)


def _show(
    settings: Settings,
    app: str,
    store: Any,
    selector: str | None,
    count_frames: bool,
    namespace: str,
    max_lag: int | None,
) -> None:
    if count_frames and store is None:
        raise click.UsageError("--frames reads the journals: give --journals (or ZCLUSTER_JOURNALS)")
    failures: list[ShardFailure] = []
    found = progress(
        settings.store(), app, store, selector=selector, frames=count_frames, namespace=namespace, failures=failures
    )
    if settings.json:
        emit_json({"app": app, "journals": [_doc(p) for p in found]})
    else:
        _print(app, found, count_frames, failures, max_lag)
    unhealthy = _unhealthy(found, max_lag) or None
    if max_lag is not None and not failures and not any(p.checkpointed for p in found):
        unhealthy = [
            f"application {app} holds no checkpoint under namespace {namespace!r}: nothing to check (a typo, "
            "or a consumer that never saved one)"
        ]
    _finish(settings, failures, unhealthy)


def _status(p: JournalProgress, max_lag: int | None) -> str:
    if p.error is not None:
        return p.error
    return f"over --max-lag ({p.lag_bytes} > {max_lag})" if _over(p, max_lag) else "ok"


def _print(
    app: str, found: list[JournalProgress], count_frames: bool, failures: list[ShardFailure], max_lag: int | None
) -> None:
    now = time.time()
    columns = ["journal", "offset", "end", "lag (bytes)", *(["lag (frames)"] if count_frames else [])]
    columns += ["producers", "open txns", "last moved", "status"]
    rows = []
    for p in found:
        row: list[object] = [p.journal, p.offset, "-" if p.end is None else p.end]
        row.append("-" if p.lag_bytes is None else p.lag_bytes)
        if count_frames:
            row.append("-" if p.lag_frames is None else p.lag_frames)
        row += [p.producers, p.open_transactions, _ago(p.last_moved, now), _status(p, max_lag)]
        rows.append(row)
    print_table(f"application {app}", columns, rows)
    if not found and not failures:
        click.echo(f"application {app}: no checkpoints")
    for p in found:
        if p.ack_intents:
            click.echo(
                f"{p.journal}: ACK intents for {', '.join(p.ack_intents)} (generation {p.generation}): appended "
                "after the checkpoint's save, and again when a process next claims the journal"
            )
        for b, e, why in p.lost:
            click.echo(f"{p.journal}: lost range {b}..{e} ahead ({why})")
        for s in p.skipped:
            at = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(s.at))
            click.echo(f"{p.journal}: lost range {s.begin}..{s.end} skipped by {s.by} at {at}Z: {s.reason}")


def _skip(
    settings: Settings,
    app: str,
    journal: str,
    store: Any,
    reason: str | None,
    expected: tuple[int, int] | None,
    namespace: str,
) -> None:
    if store is None:
        raise click.UsageError(
            "skip-lost checks the lost range in the journal store: give --journals (or ZCLUSTER_JOURNALS)"
        )
    if not reason:
        raise click.UsageError("skip-lost needs --reason (recorded in the audit log)")
    state = StateStore(settings.store(), app, namespace)
    if expected is None:
        offset = state.load_journal(journal).offset
        ranges = [(r.begin, r.end) for r in store.lost_ranges(journal)] if hasattr(store, "lost_ranges") else []
        at = [r for r in ranges if r[0] <= offset < r[1]]
        if not at:
            known = ", ".join(f"{b}..{e}" for b, e in ranges) or "none"
            raise ConfigError(
                f"application {app}: the checkpoint of journal {journal} (offset {offset}) is at no lost range "
                f"(its lost ranges: {known}). Nothing was changed"
            )
        expected = at[0]
    held = state.load_journal(journal)
    moved = state.skip_lost(store, journal, expected[0], expected[1], reason=reason)
    if settings.json:
        emit_json(
            {
                "app": app,
                "journal": journal,
                "begin": expected[0],
                "end": expected[1],
                "from": held.offset,
                "offset": moved.offset,
            }
        )
    else:
        click.echo(
            f"application {app}, journal {journal}: skipped lost range {expected[0]}..{expected[1]} (checkpoint "
            f"{held.offset} -> {moved.offset}); recorded in the audit log"
        )
