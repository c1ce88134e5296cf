"""The build step of :mod:`zcluster._native`: ``python -m zcluster._native_build [build | clean | status]``.

``build`` compiles :data:`zcluster._native.MODULES` with mypyc in place (run by ``./run`` after the editable
install); it never fails the caller: without mypyc or a C compiler, or under ``ZCLUSTER_PURE``, it says so on
stderr and the package stays pure Python. ``clean`` removes the build's outputs; ``status`` says how many of
the modules this interpreter loads compiled.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from zcluster._native import GROUP, MODULES, ROOT, compiled, pure

__all__ = ["build", "clean"]


def _outputs(root: Path) -> list[Path]:
    """The build's outputs under ``root``: each module's extension and the shared library."""
    out = sorted(root.glob(f"{GROUP}__mypyc.*"))
    for name in MODULES:
        parent = root.joinpath(*name.split(".")[:-1])
        out += sorted(parent.glob(name.rsplit(".", 1)[1] + ".*.so")) + sorted(
            parent.glob(name.rsplit(".", 1)[1] + ".*.pyd")
        )
    return out


def clean(root: Path = ROOT) -> int:
    """Remove the build's outputs; returns how many files went."""
    outputs = _outputs(root)
    for path in outputs:
        path.unlink()
    return len(outputs)


def build(root: Path = ROOT) -> bool:
    """Compile :data:`MODULES` in place under ``root``; True if built, False (said on stderr) if it cannot be:
    ``ZCLUSTER_PURE`` set, no mypy, no C compiler, or a failed compile (the old build is removed first, so
    a failed build leaves the package pure rather than stale)."""
    import shutil
    import tempfile

    if pure():
        print("zcluster._native: ZCLUSTER_PURE is set: not compiling; the package runs pure Python", file=sys.stderr)
        return False
    clean(root)
    try:
        from mypyc.build import mypycify
        from setuptools import Distribution
    except ImportError as exc:
        print(f"zcluster._native: no mypyc ({exc}): the package runs pure Python", file=sys.stderr)
        return False
    paths = [str(root.joinpath(*name.split(".")).with_suffix(".py")) for name in MODULES]
    work = Path(tempfile.mkdtemp(prefix="zcluster-native-"))
    cwd = Path.cwd()
    try:
        # From a scratch folder: setuptools would read the project's pyproject.toml from the current one.
        os.chdir(work)
        shutil.copytree(root / "zcluster", work / "zcluster", ignore=shutil.ignore_patterns("*.so", "__pycache__"))
        if (root / "pyproject.toml").exists():  # mypy's settings, for mypyc's type check (a wheel has none)
            shutil.copy2(root / "pyproject.toml", work / "pyproject.toml")
        local = [str(Path(p).relative_to(root)) for p in paths]
        dist = Distribution(
            {
                "name": "zcluster-native",
                "ext_modules": mypycify(local, opt_level="3", debug_level="0", group_name=GROUP),
            }
        )
        cmd = dist.get_command_obj("build_ext")
        cmd.inplace = True
        dist.run_command("build_ext")
        for built in _outputs(work):
            target = root / built.relative_to(work)
            shutil.copy2(built, target)
    except (Exception, SystemExit) as exc:  # a compiler missing or failing: distutils raises SystemExit too
        clean(root)
        print(f"zcluster._native: compiling failed ({exc}): the package runs pure Python", file=sys.stderr)
        return False
    finally:
        os.chdir(cwd)
        shutil.rmtree(work, ignore_errors=True)
    print(f"zcluster._native: compiled {len(MODULES)} modules with mypyc", file=sys.stderr)
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
        print(f"compiled: {len(names)} of {len(MODULES)} modules" + (" (ZCLUSTER_PURE)" if pure() else ""))
        return 0
    print("usage: python -m zcluster._native_build [build | clean | status]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
