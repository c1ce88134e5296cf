"""The docs site (mkdocs.yml) covers the public surface: what ``mkdocs build --strict`` (run by ``./run test``)
cannot see. The build fails on a broken link or anchor, a Markdown file left out of the nav, or a name of a
package's ``__all__`` missing from its API page (docs/hooks.py), but not on a public package with no API
page at all."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import pkgutil
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml

import zcluster

ROOT = Path(__file__).resolve().parents[1]
# Public packages without an API page, and why.
NO_API_PAGE = {
    "zcluster.cli": "its surface is the zcluster command, documented by its module docstring and --help",
    "zcluster.demo": "the ./run demo job, no __all__",
}


def _hooks() -> ModuleType:
    """docs/hooks.py, which makes the API pages (a file mkdocs loads, not a package)."""
    spec = importlib.util.spec_from_file_location("zcluster_docs_hooks", ROOT / "docs" / "hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


HOOKS = _hooks()


def test_every_public_package_has_an_api_page_listing_its_all() -> None:
    public = {"zcluster"} | {
        f"zcluster.{m.name}" for m in pkgutil.iter_modules(zcluster.__path__) if m.ispkg and not m.name.startswith("_")
    }
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]
    pages = {p.removeprefix("api/").removesuffix(".md") for p in HOOKS.nav_paths(nav) if p.startswith("api/")}
    assert pages == public - NO_API_PAGE.keys()
    for package in pages:  # the page is made from __all__: each must have one, as the names it exports
        names = HOOKS.package_all(ROOT, package)
        assert names, f"{package}.__all__ is empty"
        assert set(names) <= set(dir(importlib.import_module(package)))


def _public_methods(cls: type) -> list[str]:
    """The public methods of ``cls`` (classmethods and staticmethods too) that zcluster defines, on the class
    or any base (a private one included: Cluster's Aggregates and Inspection); not those of Python's own
    classes (Exception.add_note, tuple.count, ...)."""
    out = []
    for name in dir(cls):
        if name.startswith("_"):
            continue
        owner = next((c for c in cls.__mro__ if name in vars(c)), None)
        if owner is None or not owner.__module__.startswith("zcluster"):
            continue
        attr = vars(owner)[name]
        if isinstance(attr, classmethod | staticmethod) or inspect.isfunction(attr):
            out.append(name)
    return out


def test_every_public_method_of_every_public_class_is_on_the_built_site(tmp_path: Path) -> None:
    """Issue 39, item 11: the site left out every member a class inherits (Cluster's increment, top,
    counters, fences, forget, stats, ranks, ... on its private bases), though the build passed."""
    pytest.importorskip("mkdocs")
    site = tmp_path / "site"
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]
    missing: list[str] = []
    checked = 0
    for page in (p for p in HOOKS.nav_paths(nav) if p.startswith("api/")):
        package = page.removeprefix("api/").removesuffix(".md")
        ids = set(re.findall(r'id="([^"]+)"', (site / "api" / package / "index.html").read_text()))
        module = importlib.import_module(package)
        for name in HOOKS.package_all(ROOT, package):
            cls = getattr(module, name)
            if not inspect.isclass(cls):
                continue
            for method in _public_methods(cls):
                checked += 1
                if f"{package}.{name}.{method}" not in ids:
                    missing.append(f"{package}.{name}.{method}")
    assert checked > 100
    assert missing == [], f"public methods missing from the built site: {missing}"
