"""The docs site (mkdocs.yml) covers the public surface: what ``mkdocs build --strict`` (run by ``./run test``)
cannot see. The build fails on a broken link or anchor, a Markdown file left out of the nav, or a name of a
package's ``__all__`` missing from its API page (docs/hooks.py), but not on a public package with no API
page at all."""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
from pathlib import Path
from types import ModuleType

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
