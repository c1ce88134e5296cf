"""The compiled hot path's build and its fallbacks (:mod:`zcluster._native`): a build older than its sources is
ignored with a warning (never silently shadowing an edit), ``ZCLUSTER_PURE`` loads the sources, and a failed
compile leaves the package pure Python, said on stderr in one line (mypy's own report aside, on stdout)."""

from __future__ import annotations

import importlib.machinery
import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from zcluster import _native
from zcluster._native_build import build, current
from zcluster.message.envelope import Envelope
from zcluster.message.records import JsonMessage
from zcluster.state import Applier, BatchStats
from zcluster.testing.traffic import timeline_mapper

ROOT = Path(__file__).resolve().parent.parent


def _copy(dest: Path) -> Path:
    """The package and this tree's build outputs, copied under ``dest`` (a tree of its own)."""
    shutil.copytree(ROOT / "zcluster", dest / "zcluster", ignore=shutil.ignore_patterns("__pycache__"))
    for lib in ROOT.glob(f"{_native.GROUP}__mypyc.*"):
        shutil.copy2(lib, dest / lib.name)
    shutil.copytree(ROOT / "lua", dest / "lua")
    return dest


def _loaded(root: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """How many of the modules a fresh interpreter with ``root`` on its path loads compiled (last stdout line)."""
    environ = {k: v for k, v in os.environ.items() if k != "ZCLUSTER_PURE"} | env | {"PYTHONPATH": str(root)}
    code = "import zcluster._native as n; print(len(n.compiled()))"
    return subprocess.run([sys.executable, "-c", code], env=environ, cwd=root, capture_output=True, text=True)


@pytest.mark.skipif(not _native.built() or bool(_native.stale()), reason="no current build of the hot path here")
def test_a_build_older_than_its_sources_is_ignored_with_a_warning(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    done = _loaded(root)
    assert done.stdout.split()[-1] == str(len(_native.MODULES + _native.EXTENSIONS)) and "older than" not in done.stderr
    pure = _loaded(root, ZCLUSTER_PURE="1")
    assert pure.stdout.split()[-1] == "0" and "older than" not in pure.stderr
    edited = _native.source("zcluster.message.sequencer", root)
    edited.write_text(edited.read_text() + "\n# an edit the build has not seen\n")
    assert _native.stale(root) == ["zcluster.message.sequencer"]
    done = _loaded(root)
    assert done.returncode == 0 and done.stdout.split()[-1] == "0"  # the sources, all of them
    assert "older than their sources (zcluster.message.sequencer)" in done.stderr
    assert "python -m zcluster._native_build build" in done.stderr


def _sources(root: Path) -> None:
    """A source tree under ``root``: every compiled module's source, and the C modules' header."""
    for name in _native.MODULES + _native.EXTENSIONS:
        target = _native.source(name, root)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(f"# {name}\n")
    (root / _native.HEADER).write_text("/* the header */\n")


def test_digests_name_exactly_the_changed_sources(tmp_path: Path) -> None:
    _sources(tmp_path)
    assert _native.stale(tmp_path) == []  # nothing built: nothing stale
    (tmp_path / f"{_native.GROUP}__mypyc.test.so").write_bytes(b"")
    assert _native.stale(tmp_path) == list(_native.MODULES + _native.EXTENSIONS)  # built, but no digests recorded
    (tmp_path / _native.SUMS).write_text(json.dumps(_native.digests(tmp_path)))
    assert _native.stale(tmp_path) == []
    _native.source("zcluster._encode", tmp_path).write_text("# changed\n")
    assert _native.stale(tmp_path) == ["zcluster._encode"]
    (tmp_path / _native.SUMS).write_text(json.dumps(_native.digests(tmp_path)))
    (tmp_path / _native.HEADER).write_text("/* changed */\n")
    assert _native.stale(tmp_path) == list(_native.EXTENSIONS)  # every C module includes it


def test_the_wheel_takes_only_a_whole_current_build_for_this_interpreter(tmp_path: Path) -> None:
    """What the wheel's build hook reuses instead of compiling (hatch_build.py): all of a build made from
    these sources with this interpreter's extension suffix, or nothing."""
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    everything = _native.MODULES + _native.EXTENSIONS
    _sources(tmp_path)
    assert current(tmp_path) is None  # nothing built
    (tmp_path / f"{_native.GROUP}__mypyc{suffix}").write_bytes(b"")
    for name in everything[1:]:
        _native.source(name, tmp_path).with_suffix(suffix).write_bytes(b"")
    (tmp_path / _native.SUMS).write_text(json.dumps(_native.digests(tmp_path)))
    assert current(tmp_path) is None  # one module's extension missing
    _native.source(everything[0], tmp_path).with_suffix(suffix).write_bytes(b"")
    outputs = current(tmp_path)
    assert outputs is not None and len(outputs) == len(everything) + 2
    assert all((tmp_path / rel).is_file() and not rel.is_absolute() for rel in outputs)
    _native.source("zcluster._keys", tmp_path).write_text("# edited since\n")
    assert current(tmp_path) is None  # stale


@pytest.mark.timeout(600)
def test_a_failed_compile_leaves_the_package_pure_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ZCLUSTER_PURE", raising=False)  # (it would skip the build: another outcome)
    root = tmp_path
    shutil.copytree(ROOT / "zcluster", root / "zcluster", ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    shutil.copy2(ROOT / "pyproject.toml", root / "pyproject.toml")
    broken = _native.source("zcluster._keys", root)
    broken.write_text(broken.read_text() + "\n\ndef _broken() -> int:\n    return 'not an int'\n")
    (root / f"{_native.GROUP}__mypyc.old.so").write_bytes(b"")  # an earlier build's: removed, not left stale
    assert build(root) is False
    err = capsys.readouterr().err
    assert "compiling failed" in err and "the package runs pure Python" in err and len(err.splitlines()) == 1
    assert not list(root.rglob("*.so")) and not (root / _native.SUMS).exists()


def test_the_compiled_classes_pickle_as_the_pure_ones() -> None:
    """An Applier (a frozen dataclass: compiled, unpickling it attribute by attribute failed), its figures, a
    message and an envelope survive pickling, in this process's mode (compiled where built)."""
    applier = Applier(None, "app", timeline_mapper, journals="file:///nowhere", ring=7, prune_horizon=60.0)
    again = pickle.loads(pickle.dumps(applier))
    assert again == applier and again.ring == 7 and again.publishing is None
    stats = BatchStats(frames=3, outcomes={"OUTSIDE_COMMIT": 2})
    assert pickle.loads(pickle.dumps(stats)) == stats
    message = JsonMessage({"user": "u1"})
    envelope = Envelope("j", 0, 18, message, bytes(range(16)))
    assert pickle.loads(pickle.dumps(envelope)) == envelope
