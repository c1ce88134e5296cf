"""The build step of :mod:`zcluster._native`: ``python -m zcluster._native_build [build | clean | status]``.

``build`` compiles :data:`zcluster._native.MODULES` with mypyc (and :data:`~zcluster._native.EXTENSIONS`
with the C compiler) in place (run by ``./run`` after the editable
install); it never fails the caller: without mypyc or a C compiler, or under ``ZCLUSTER_PURE``, it says so on
stderr and the package stays pure Python. ``clean`` removes the build's outputs; ``status`` says how many of
the modules this interpreter loads compiled.
"""

from __future__ import annotations

import importlib.machinery
import json
import os
import sys
from pathlib import Path

from zcluster._native import EXTENSIONS, GROUP, MODULES, ROOT, SUMS, built, compiled, digests, pure, source, stale

__all__ = ["build", "clean", "compile_into", "current"]


def _outputs(root: Path) -> list[Path]:
    """The build's outputs under ``root``: the shared library, each module's extension, the digests."""
    out = sorted(root.glob(f"{GROUP}__mypyc.*"))
    for name in MODULES + EXTENSIONS:
        parent, leaf = root.joinpath(*name.split(".")[:-1]), name.rsplit(".", 1)[1]
        out += sorted(parent.glob(leaf + ".*.so")) + sorted(parent.glob(leaf + ".*.pyd"))
    return out + ([root / SUMS] if (root / SUMS).exists() else [])


def current(root: Path = ROOT) -> list[Path] | None:
    """The outputs of an in-place build under ``root`` (paths relative to it) if that build is whole, made
    from these very sources and for this interpreter (its extension suffix); otherwise None. The wheel's
    build hook copies them rather than compile the same sources a second time."""
    if not built(root) or stale(root):
        return None
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    wanted = [root / f"{GROUP}__mypyc{suffix}"]
    wanted += [source(name, root).with_suffix(suffix) for name in MODULES + EXTENSIONS]
    if not all(path.is_file() for path in wanted):
        return None
    return [path.relative_to(root) for path in [*wanted, root / SUMS]]


def clean(root: Path = ROOT) -> int:
    """Remove the build's outputs; returns how many files went."""
    outputs = _outputs(root)
    for path in outputs:
        path.unlink()
    return len(outputs)


def compile_into(root: Path, dest: Path) -> list[Path]:
    """Compile :data:`MODULES` of the source tree ``root`` with mypyc; the outputs go under ``dest`` (their
    paths relative to it returned), with the sources' digests. Raises ImportError without mypyc or
    setuptools, anything else (SystemExit included: distutils) when compiling fails."""
    import shutil
    import tempfile

    from mypyc.build import mypycify
    from setuptools import Distribution, Extension

    work = Path(tempfile.mkdtemp(prefix="zcluster-native-"))
    cwd = Path.cwd()
    try:
        # From a scratch folder: setuptools would read the project's pyproject.toml from the current one.
        os.chdir(work)
        shutil.copytree(root / "zcluster", work / "zcluster", ignore=shutil.ignore_patterns("*.so", "__pycache__"))
        if (root / "pyproject.toml").exists():  # mypy's settings, for mypyc's type check
            shutil.copy2(root / "pyproject.toml", work / "pyproject.toml")
        paths = [str(source(name, work).relative_to(work)) for name in MODULES]
        modules = mypycify(paths, opt_level="3", debug_level="0", group_name=GROUP)
        modules += [
            Extension(name, [str(source(name, work).relative_to(work))], extra_compile_args=["-O2"])
            for name in EXTENSIONS
        ]
        dist = Distribution({"name": "zcluster-native", "ext_modules": modules})
        cmd = dist.get_command_obj("build_ext")
        cmd.inplace = True
        dist.run_command("build_ext")
        (work / SUMS).write_text(json.dumps(digests(work), indent=1) + "\n")
        out = []
        for path in _outputs(work):
            rel = path.relative_to(work)
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, dest / rel)
            out.append(rel)
        return out
    finally:
        os.chdir(cwd)
        shutil.rmtree(work, ignore_errors=True)


def build(root: Path = ROOT) -> bool:
    """Compile :data:`MODULES` in place under ``root``; True if built, False (said on stderr) if it cannot be:
    ``ZCLUSTER_PURE`` set, no mypy or setuptools, no C compiler, or a failed compile (the old build is
    removed first, so a failed build leaves the package pure rather than stale)."""
    if pure():
        print("zcluster._native: ZCLUSTER_PURE is set: not compiling; the package runs pure Python", file=sys.stderr)
        return False
    clean(root)
    try:
        compile_into(root, root)
    except ImportError as exc:
        print(f"zcluster._native: no mypyc ({exc}): the package runs pure Python", file=sys.stderr)
        return False
    except (Exception, SystemExit) as exc:  # a compiler missing or failing: distutils raises SystemExit too
        clean(root)
        print(f"zcluster._native: compiling failed ({exc!r}): the package runs pure Python", file=sys.stderr)
        return False
    print(f"zcluster._native: compiled {len(MODULES)} modules with mypyc, {len(EXTENSIONS)} in C", file=sys.stderr)
    return True


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    command = args[0] if args else "status"
    if command == "build":
        build()
        return 0  # optional: the package works either way
    if command == "clean":
        print(f"zcluster._native: removed {clean()} files", file=sys.stderr)
        return 0
    if command == "status":
        names = compiled()
        why = " (ZCLUSTER_PURE)" if pure() else f" (stale: {', '.join(stale())})" if stale() else ""
        print(f"compiled: {len(names)} of {len(MODULES + EXTENSIONS)} modules{why}")
        return 0
    print("usage: python -m zcluster._native_build [build | clean | status]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
