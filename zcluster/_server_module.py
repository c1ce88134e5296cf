"""zcluster's Redis module (``module/zcluster_module.c``): its source, and building it into a shared library that
``redis-server --loadmodule`` (or Valkey's) loads.

What it serves: ``ZCLUSTER.WRITE`` and ``ZCLUSTER.INCR``, the scripts ``lua/write.lua`` (its calls without a
bound, floors or a wait) and ``lua/incr.lua`` as native commands, at a fraction of their server cost
(bench/README.md), and ``ZCLUSTER.VERSION``, the protocol it speaks. A client sends a standalone server the
calls it serves once that server answered :data:`PROTOCOL` (:meth:`zcluster._transport.Transport.natively`);
everything else, and every server without it, gets the scripts. Replicas and the AOF never need it: it
replicates plain commands.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import redis

from zcluster.errors import ZClusterError

__all__ = ["PROTOCOL", "build", "loadmodule", "source_dir", "version"]

PROTOCOL = 1
"""What ``ZCLUSTER.VERSION`` answers when the module speaks this client's argument layout."""

_HERE = Path(__file__).resolve().parent
# In a wheel the source sits inside the package; in a checkout beside it (as the Lua scripts do).
_SEARCH = (_HERE / "module", _HERE.parent / "module")
_SOURCES = ("zcluster_module.c", "abi.h")


def source_dir() -> Path:
    """The folder holding the module's C source; raises FileNotFoundError naming where it looked."""
    for folder in _SEARCH:
        if (folder / _SOURCES[0]).is_file():
            return folder
    raise FileNotFoundError(f"zcluster's module source not found in {', '.join(str(p) for p in _SEARCH)}")


def version(client: redis.Redis) -> int | None:
    """What the module on ``client``'s server answers ``ZCLUSTER.VERSION`` with; None where no module answers
    (an unknown command) or the user may not run it. Connection errors propagate."""
    try:
        answer = client.execute_command("ZCLUSTER.VERSION")
    except redis.ResponseError:
        return None
    return answer if isinstance(answer, int) else None


def _cache() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "zcluster"


def build(dest: Path | None = None) -> Path:
    """The module built from this package's source; returns the shared library's path.

    Without ``dest``, it goes to ``$XDG_CACHE_HOME/zcluster`` (``~/.cache/zcluster``) under a name made of
    the source's digest, and a build already there is reused. Compiled with ``$CC`` (default ``cc``). Safe
    to run at once from several processes (each writes its own file, then renames it into place). Raises
    :class:`zcluster.ZClusterError` with the compiler's output when compiling fails, FileNotFoundError
    without the source.
    """
    src = source_dir()
    digest = hashlib.sha256(b"".join((src / name).read_bytes() for name in _SOURCES)).hexdigest()[:16]
    target = dest if dest is not None else _cache() / f"zcluster-module-{digest}.so"
    if dest is None and target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    cc = os.environ.get("CC", "cc")
    partial = target.with_name(f".{target.name}.{os.getpid()}")
    args = [cc, "-O2", "-shared", "-fPIC", "-o", str(partial), str(src / "zcluster_module.c")]
    try:
        done = subprocess.run(args, capture_output=True, text=True, check=False)
    except OSError as exc:
        raise ZClusterError(f"building zcluster's Redis module: cannot run {cc!r}: {exc}") from exc
    if done.returncode != 0:
        partial.unlink(missing_ok=True)
        raise ZClusterError(f"building zcluster's Redis module with {cc!r} failed:\n{done.stderr.strip()}")
    os.replace(partial, target)
    return target


def loadmodule() -> list[str]:
    """The server options that load the module (built by :func:`build` if needed): ``--loadmodule <path>``."""
    return ["--loadmodule", str(build())]
