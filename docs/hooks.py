"""mkdocs hook for the docs site (mkdocs.yml): the repository's Markdown in place, and the API pages.

Why a hook and not copies: README.md, docs/*.md and bench/README.md stay the only copies of their text.
The hook serves each at its repository path (README.md as the home page, docs/x.md at docs/x/, bench/README.md
at bench/), so every relative link that works on GitHub (README -> docs/capacity.md, bench -> ../docs/...)
resolves in the site as it is, with no link rewriting. The API pages are the nav's ``api/<package>.md``
entries: the package's docstring, then one mkdocstrings block per name of its ``__all__`` (read from the
source, never imported), so a page documents exactly the public surface, names without a docstring included;
a name missing from its rendered page is a warning, so ``mkdocs build --strict`` fails. The docstrings'
Sphinx roles (``:class:`Insert```) become code, linked where the name is documented on the site.
"""

from __future__ import annotations

import ast
import logging
import re
from pathlib import Path
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

log = logging.getLogger("mkdocs.hooks.zcluster")

API = "api/"


def _root(config: MkDocsConfig) -> Path:
    return Path(config.config_file_path).parent


def nav_paths(nav: Any) -> list[str]:
    """Every page path named in the nav (mkdocs.yml's nested lists of {title: path})."""
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, dict):
        return [p for v in nav.values() for p in nav_paths(v)]
    if isinstance(nav, list):
        return [p for v in nav for p in nav_paths(v)]
    return []


def api_packages(config: MkDocsConfig) -> list[str]:
    """The packages with an API page: the nav's ``api/<package>.md`` entries, in nav order."""
    return [p[len(API) : -len(".md")] for p in nav_paths(config.nav) if p.startswith(API)]


def package_all(root: Path, package: str) -> list[str]:
    """``__all__`` of ``package``'s ``__init__.py``, read without importing it."""
    source = root.joinpath(*package.split("."), "__init__.py")
    for node in ast.parse(source.read_text()).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return list(ast.literal_eval(node.value))
    raise ValueError(f"{source} has no __all__: its API page would document nothing")


def on_files(files: Files, config: MkDocsConfig) -> Files:
    root = _root(config)
    docs = Path(config.docs_dir)
    # docs_dir's pages move to their repository path (docs/<name>.md), where the README's links point; the
    # repository's other Markdown joins them at its own path.
    for f in [f for f in files if f.is_documentation_page()]:
        files.remove(f)
        source = docs / f.src_uri
        files.append(File.generated(config, source.relative_to(root).as_posix(), abs_src_path=str(source)))
    for path in ("README.md", "bench/README.md"):
        files.append(File.generated(config, path, abs_src_path=str(root / path)))
    for package in api_packages(config):
        files.append(File.generated(config, f"{API}{package}.md", content=api_page(root, package)))
    return files


def api_page(root: Path, package: str) -> str:
    """The Markdown of ``package``'s API page: its docstring, then each name of ``__all__`` in order."""
    # The package block renders only its docstring, as the page's title; each name then gets its own block.
    options = "members: false", "heading_level: 1", "show_root_full_path: true"
    head = f"::: {package}\n    options:\n" + "".join(f"      {o}\n" for o in options)
    return "\n".join([head, *(f"::: {package}.{name}\n" for name in package_all(root, package))])


# A Sphinx role around inline code, as mkdocstrings renders ``:class:`Insert``` from a docstring.
_ROLE = re.compile(r":(?:mod|class|func|meth|attr|data|exc|obj):<code>~?([\w.]+)(\(\))?</code>")


def _link_roles(html: str, package: str) -> str:
    """Each role becomes an optional cross-reference: a link where the name is on the site (a bare name is
    looked up in ``package``), plain code where it is not (a private module), never a warning."""

    def ref(m: re.Match[str]) -> str:
        name = m.group(1)
        target = name if "." in name else f"{package}.{name}"
        return f'<autoref identifier="{target}" optional><code>{name}{m.group(2) or ""}</code></autoref>'

    return _ROLE.sub(ref, html)


def on_page_content(html: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    if page.file.src_uri.startswith(API):
        package = page.file.src_uri[len(API) : -len(".md")]
        ids = set(re.findall(r'id="([^"]+)"', html))
        missing = [name for name in package_all(_root(config), package) if f"{package}.{name}" not in ids]
        if missing:
            log.warning("API page of %s documents no %s (names of its __all__)", package, ", ".join(missing))
        html = _link_roles(html, package)
    return html
