"""The house rules, checked: the public surface, the error tree, the import direction, module sizes."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest

import zcluster
from zcluster._native import EXTENSIONS
from zcluster.errors import ZClusterError

ROOT = Path(zcluster.__file__).parent

# Layers, lowest first: a module may import its own layer and the layers below, never above.
LAYERS = [
    [
        "zcluster.errors",
        "zcluster.types",
        "zcluster.instrumentation",
        "zcluster._lazy",
        "zcluster._reporting",
        "zcluster._resp",  # C (zcluster/_resp.c), imports nothing
        "zcluster._tuples",  # C (zcluster/_tuples.c), imports nothing
        "zcluster._fasttuples",
    ],
    ["zcluster.message"],
    [
        "zcluster._keys",
        "zcluster._urls",
        "zcluster._scripts",
        "zcluster._server_module",
        "zcluster._topology",
        "zcluster._guard",
        "zcluster._encode",
        "zcluster._retry",
        "zcluster._pipelines",
        "zcluster._durability",
        "zcluster._markers",
        "zcluster._moves",
    ],
    [
        "zcluster._transport",
        "zcluster._follow",
        "zcluster._writes",
        "zcluster._reads",
        "zcluster._aggregate_keys",
        "zcluster._slots",
    ],
    ["zcluster._inspect", "zcluster._aggregates", "zcluster._following"],
    ["zcluster.cluster"],
    ["zcluster.config"],
    ["zcluster.migration"],
    ["zcluster.farm"],
    ["zcluster.journal"],
    ["zcluster.channels"],
    ["zcluster.state"],
    ["zcluster.metrics", "zcluster.otel"],  # the Prometheus and OpenTelemetry adapters of the hooks
    ["zcluster.spark"],
    ["zcluster.cli", "zcluster.testing"],
    ["zcluster.demo"],
    # the compiled hot path: names (and, asked which are compiled, imports) modules of every layer
    ["zcluster._native", "zcluster._native_build"],
]


def _modules() -> list[str]:
    """The package's Python modules (a compiled build's C extensions, which have no ``.py``, aside)."""
    names = ["zcluster"]
    for info in pkgutil.walk_packages([str(ROOT)], "zcluster."):
        if info.name not in EXTENSIONS:
            names.append(info.name)
    return sorted(names)


def _layer(module: str) -> int:
    for rank, prefixes in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return rank
    raise AssertionError(f"{module} belongs to no layer: add it to LAYERS in {__file__}")


def _source(module: str) -> Path:
    path = ROOT.joinpath(*module.split(".")[1:])
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def _imports(module: str) -> set[str]:
    """What ``module`` imports (``if TYPE_CHECKING:`` blocks aside: annotations may name any layer's types,
    e.g. the error classes of ``zcluster.errors`` naming the results they carry), lazy tables included."""
    tree = ast.parse(_source(module).read_text())
    skip = _type_checking_nodes(tree)
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("zcluster")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("zcluster") and not node.level:
            out.add(node.module)
    # lazy re-exports by name (the packages' __getattr__ tables)
    out |= set(re.findall(r'"(zcluster(?:\.\w+)+)"', _source(module).read_text()))
    return out


def test_every_module_is_in_a_layer_and_imports_point_down() -> None:
    upward = []
    for module in _modules():
        if module == "zcluster":
            continue
        for target in _imports(module):
            if target == "zcluster":
                continue
            if _layer(target) > _layer(module):
                upward.append(f"{module} -> {target}")
    assert upward == []


def test_message_layer_imports_nothing_redis_specific() -> None:
    for module in _modules():
        if module.startswith("zcluster.message"):
            # errors, and the compiled build's tuple helpers (C; nothing of Redis): the rest is the message layer's own
            allowed = {"zcluster.errors", "zcluster._fasttuples"}
            outside = {t for t in _imports(module) if not t.startswith("zcluster.message")} - allowed
            assert outside == set(), module
            assert "import redis" not in _source(module).read_text(), module


@pytest.mark.parametrize(
    "package",
    ["zcluster", "zcluster.state", "zcluster.journal", "zcluster.channels", "zcluster.farm", "zcluster.spark"],
)
def test_exports_match_all(package: str) -> None:
    mod = importlib.import_module(package)
    for name in mod.__all__:
        assert getattr(mod, name) is not None, f"{package}.{name}"
    public = {n for n in dir(mod) if not n.startswith("_")} - {"annotations", "importlib", "TYPE_CHECKING", "Any"}
    submodules = {info.name for info in pkgutil.iter_modules(mod.__path__)}
    assert public - submodules - set(mod.__all__) == set(), "names exported but missing from __all__"


def _error_classes() -> dict[str, type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for module in _modules():
        if module.startswith(("zcluster.cli", "zcluster.demo")) and importlib.util.find_spec("click") is None:
            continue
        mod = importlib.import_module(module)
        for name, obj in vars(mod).items():
            if inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__.startswith("zcluster"):
                found[name] = obj
    return found


def _drawn_tree() -> dict[str, str | None]:
    """Child -> parent, as drawn in zcluster.errors' docstring."""
    doc = importlib.import_module("zcluster.errors").__doc__ or ""
    parents: dict[str, str | None] = {}
    stack: list[tuple[int, str]] = []
    for line in doc.splitlines():
        m = re.match(r"^(\s*(?:[│ ]   )*(?:[├└]── )?)([A-Z]\w+)(\s|$)", line)
        if not m or ("──" not in line and m.group(2) != "ZClusterError"):
            continue
        depth = len(m.group(1))
        while stack and stack[-1][0] >= depth:
            stack.pop()
        parents[m.group(2)] = stack[-1][1] if stack else None
        stack.append((depth, m.group(2)))
    return parents


def test_the_error_tree_in_the_docstring_is_true() -> None:
    drawn = _drawn_tree()
    classes = _error_classes()
    assert drawn["ZClusterError"] is None
    assert set(classes) == set(drawn), "every error class is drawn, and every drawn class exists"
    for name, cls in classes.items():
        assert issubclass(cls, ZClusterError), f"{name} is not a ZClusterError"
        if name == "ZClusterError":
            continue
        nearest = next(b for b in cls.__mro__[1:] if issubclass(b, ZClusterError))
        assert nearest.__name__ == drawn[name], f"{name}: drawn under {drawn[name]}, derives from {nearest.__name__}"


def test_modules_over_400_lines_say_why() -> None:
    long = []
    for module in _modules():
        text = _source(module).read_text()
        if text.count("\n") > 400 and "Why this module is long" not in text[:3000]:
            long.append(module)
    assert long == []


def test_at_most_two_modules_pass_500_lines_and_none_700() -> None:
    sizes = {m: _source(m).read_text().count("\n") for m in _modules()}
    over = sorted(m for m, n in sizes.items() if n > 500)
    assert len(over) <= 2, over
    assert [m for m in over if sizes[m] > 700] == []


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip |= {id(n) for child in node.body for n in ast.walk(child)}
    return skip


def _runtime_imports(module: str) -> set[str]:
    """The zcluster modules ``module`` imports outside ``if TYPE_CHECKING:`` blocks (lazy tables excluded)."""
    tree = ast.parse(_source(module).read_text())
    skip = _type_checking_nodes(tree)
    known = set(_modules())
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name in known}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("zcluster") and not node.level:
            out |= {f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in known}
            if node.module in known:
                out.add(node.module)
    return out - {module, "zcluster"}


def test_no_import_circles_between_modules() -> None:
    graph = {m: {t for t in _runtime_imports(m) if not m.startswith(t + ".")} for m in _modules()}
    circles = []
    for start in graph:
        stack, seen = [(start, [start])], set()
        while stack:
            node, path = stack.pop()
            for nxt in graph.get(node, ()):
                if nxt == start:
                    circles.append(" -> ".join([*path, nxt]))
                elif nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, [*path, nxt]))
    assert circles == []


def _package(module: str) -> str:
    return module if _source(module).name == "__init__.py" else module.rpartition(".")[0]


def test_nothing_imports_a_private_name_of_another_package() -> None:
    """A private module of a subpackage (``zcluster/farm/_merge.py``) or a private name defined in a module
    is used only inside its own package; the core's private modules (``zcluster._*``) are the internals the
    layers share."""
    bad = []
    for module in _modules():
        tree = ast.parse(_source(module).read_text())
        for node in ast.walk(tree):
            if not (isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("zcluster.")):
                continue
            target = node.module
            owner = (
                target
                if target in set(_modules()) and _source(target).name == "__init__.py"
                else target.rpartition(".")[0]
            )
            private_module = any(part.startswith("_") for part in target.split(".")[2:])
            names = [a.name for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
            if (private_module or names) and owner != "zcluster" and not _package(module).startswith(owner):
                bad.append(f"{module}: from {target} import {', '.join(a.name for a in node.names)}")
    assert bad == []


@pytest.mark.parametrize(
    "package", ["zcluster", "zcluster.journal", "zcluster.message", "zcluster.state", "zcluster.farm"]
)
def test_importing_the_library_pulls_in_no_optional_dependency(package: str) -> None:
    code = (
        f"import sys, {package}\n"
        "optional = ('click', 'rich', 'pyspark', 'prometheus_client', 'opentelemetry', 'pandas')\n"
        "bad = sorted(m for m in optional if m in sys.modules)\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout.strip()
    assert out == ""


def test_importing_zcluster_or_its_journals_loads_no_redis_client() -> None:
    code = "import sys, zcluster, zcluster.journal, zcluster.message\nprint('redis' in sys.modules)\n"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout.strip()
    assert out == "False"


def test_a_spark_worker_running_the_source_loads_no_sink_state_or_redis_client() -> None:
    # Every query of a Python data source starts a worker that imports the source: keep that import small.
    code = (
        "import sys, zcluster.spark.source\n"
        "print(sorted(m for m in ('redis', 'zcluster.state', 'zcluster.spark.sink') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout.strip()
    assert out == "[]"


def test_the_state_layer_loads_no_farm() -> None:
    """A Cluster-only user of the state layer (the applier, the consumer, checkpoints) never loads the farm."""
    code = (
        "import sys, zcluster.state.applier, zcluster.state.consumer, zcluster.state.store, zcluster.state.dedup;"
        "print(sorted(m for m in sys.modules if m.startswith('zcluster.farm')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
