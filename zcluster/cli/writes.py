"""The writing subcommands, ``insert`` and ``delete``, and the tuples they read (arguments, TSV, JSON lines).

Every tuple is parsed and checked before anything is sent: a bad argument or line is a usage error
(exit 2) and nothing of the call is written. On a farm (``--replica``) a tuple is confirmed when the write
quorum of replicas (a majority) confirmed it; a replica that failed a confirmed tuple is reported as a
warning (exit 0: read-repair or ``zcluster walk`` brings it up to date).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import IO, Any, TypeVar

import click

from zcluster.cli.context import Settings, fail_if, json_option, pass_settings
from zcluster.cli.output import emit_json, parse_json_blob, parse_score
from zcluster.farm import FarmWriteResult
from zcluster.types import KeyScoreMember, ShardFailure, WriteResult

__all__ = ["delete", "insert", "read_file", "triples"]

F = TypeVar("F", bound=Callable[..., Any])


def triples(args: Sequence[str]) -> list[KeyScoreMember]:
    """KEY SCORE MEMBER command-line arguments as tuples."""
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


def read_file(stream: IO[bytes], fmt: str) -> list[KeyScoreMember]:
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


def _write_options(f: F) -> F:
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


def _lagging(result: WriteResult) -> list[tuple[ShardFailure, int]]:
    """A farm write's replica failures of tuples the quorum confirmed, with how many such tuples each."""
    if not isinstance(result, FarmWriteResult):
        return []
    unconfirmed = set(result.failed_indices)
    out = []
    for failures in result.replica_failures.values():
        for f in failures:
            n = sum(1 for i in f.indices if i not in unconfirmed)
            if n:
                out.append((f, n))
    return out


def _write(settings: Settings, op: str, args: Sequence[str], file: IO[bytes] | None, fmt: str) -> None:
    tuples = triples(args) + (read_file(file, fmt) if file is not None else [])
    if not tuples:
        raise click.UsageError(f"nothing to {op}: give KEY SCORE MEMBER triples or --file")
    store = settings.store()
    write = store.insert if op == "insert" else store.delete
    result: WriteResult = write(tuples, raise_on_error=False)
    unconfirmed = len(result.failed_indices)
    stale = len(tuples) - result.applied_count - unconfirmed
    reasons = [f"{type(f.error).__name__}: {f.error}" for f in result.failures]
    lagging = _lagging(result)
    if settings.json:
        document: dict[str, Any] = {
            "op": op,
            "tuples": len(tuples),
            "applied": result.applied_count,
            "stale": stale,
            "unconfirmed": unconfirmed,
            "failures": [
                {"shard": f.shard, "error": settings.redact(reason), "tuples": len(f.indices)}
                for f, reason in zip(result.failures, reasons, strict=True)
            ],
        }
        if isinstance(result, FarmWriteResult):
            document["quorum"] = result.quorum
            document["replica_failures"] = [
                {"shard": f.shard, "error": settings.redact(f"{type(f.error).__name__}: {f.error}"), "tuples": n}
                for f, n in lagging
            ]
        emit_json(document)
    else:
        tail = f", {unconfirmed} unconfirmed" if unconfirmed else ""
        click.echo(f"{op}: {len(tuples)} tuple(s): {result.applied_count} applied, {stale} stale{tail}")
    for f, n in lagging:
        click.echo(
            "Warning: "
            + settings.redact(
                f"shard {f.shard}: {type(f.error).__name__}: {f.error}; {n} tuple(s) confirmed by the other "
                "replicas are missing there (read-repair or `zcluster walk` repairs them)"
            ),
            err=True,
        )
    fail_if(
        settings,
        (
            f"shard {f.shard}: {reason}; {len(f.indices)} tuple(s) not confirmed (resending them is safe)"
            for f, reason in zip(result.failures, reasons, strict=True)
        ),
    )


#: Negative scores (``-2.5``, ``-inf``) are arguments, not options. Keys or members starting with ``-`` may
#: need ``--`` before the first argument.
_WRITE_SETTINGS = {"ignore_unknown_options": True}
_WRITE_HELP = """{summary}

Tuples come as KEY SCORE MEMBER arguments and/or from --file: TSV lines (key<TAB>score<TAB>member; the
member may contain tabs) or JSON lines ({{"key": ..., "score": ..., "member": ...}} or [key, score, member];
keys and members are strings or {{"b64": "<base64>"}}). Every tuple is checked before anything is sent.
Scores are finite decimal numbers (integers exact, |x| <= 2**53); negative ones work as arguments. Put --
before the arguments when a key or member starts with '-'.

Exit status 1 when a shard failed: its tuples are reported as unconfirmed (resending them is safe). On a
farm (--replica), a tuple is confirmed by a majority of the replicas; a replica that missed a confirmed
tuple is only a warning (exit 0): read-repair or `zcluster walk` brings it up to date.
"""


@click.command(
    context_settings=_WRITE_SETTINGS,
    help=_WRITE_HELP.format(summary="Insert members; prints how many took effect and how many were stale."),
)
@_write_options
@pass_settings
def insert(settings: Settings, args: tuple[str, ...], file: IO[bytes] | None, fmt: str) -> None:
    """Insert members; prints how many took effect and how many were stale (a newer write won)."""
    _write(settings, "insert", args, file, fmt)


@click.command(
    context_settings=_WRITE_SETTINGS,
    help=_WRITE_HELP.format(summary="Delete members (leaving tombstones); prints how many took effect."),
)
@_write_options
@pass_settings
def delete(settings: Settings, args: tuple[str, ...], file: IO[bytes] | None, fmt: str) -> None:
    """Delete members (leaving tombstones); prints how many took effect and how many were stale."""
    _write(settings, "delete", args, file, fmt)
