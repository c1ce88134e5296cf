"""Running the ``zcluster`` command in-process (click's CliRunner) and checking how it ended."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from click.testing import CliRunner, Result

from zcluster.cli import cli


def run(args: Sequence[str], input: str | bytes | None = None, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(cli, list(args), input=input, env=env)


def ok(args: Sequence[str], **kw: Any) -> Result:
    """Run and require success; the failure message shows stderr."""
    result = run(args, **kw)
    assert result.exit_code == 0, (result.exit_code, result.stdout, result.stderr, result.exception)
    return result


def fails(args: Sequence[str], code: int = 1, **kw: Any) -> Result:
    """Run and require a clean failure: the exit code, an ``Error:`` line, no traceback."""
    result = run(args, **kw)
    assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr, result.exception)
    assert isinstance(result.exception, SystemExit), result.exception
    assert "Error:" in result.stderr
    assert "Traceback" not in result.output
    return result


def doc(args: Sequence[str], **kw: Any) -> Any:
    """Run with --json and parse stdout, which must be exactly one JSON document."""
    return json.loads(ok([*args, "--json"], **kw).stdout)


def rows(result: Result) -> list[list[str]]:
    """Whitespace-split lines of a human table."""
    return [line.split() for line in result.stdout.splitlines()]
