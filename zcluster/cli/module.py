"""The ``server-module`` subcommand: build zcluster's Redis module (:mod:`zcluster._server_module`) from the
installed package's source and print the shared library's path, for ``redis-server --loadmodule`` (or
``MODULE LOAD``) on every master that should serve 2P-set writes natively."""

from __future__ import annotations

from pathlib import Path

import click

from zcluster._server_module import build

__all__ = ["server_module"]


@click.command("server-module")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), help="Where to write it (default: a cache).")
def server_module(out: Path | None) -> None:
    """Build zcluster's Redis module; print its path (stdout) and how to load it (stderr)."""
    path = build(out)
    click.echo(str(path))
    click.echo(
        f"load it on each master: redis-server --loadmodule {path} (or MODULE LOAD {path}); "
        "clients find it by themselves, replicas and the AOF do not need it",
        err=True,
    )
