"""Shipping the sink's mapper: its own modules travel by value with it, wherever Spark runs it.

A job's mapper usually lives in a module of the job's own (``jobs.py`` next to the driver script), on the
driver's ``sys.path`` only. Spark pickles the mapper with cloudpickle, which pickles a module's functions
and classes by name: an executor (or a Spark Connect server's ``foreachBatch`` process, which loads the sink
without the session's artifacts) then fails with ``No module named 'jobs'``. :func:`ship_by_value` registers
such modules with ``pyspark.cloudpickle.register_pickle_by_value``, so their code travels with the mapper;
:func:`explain_missing_module` turns a batch that failed on a missing module into an error saying what to do.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import types
from typing import Any

from zcluster.errors import ConfigError

log = logging.getLogger("zcluster.spark")

AVAILABLE = frozenset({"zcluster", "pyspark", "py4j"})
"""Top-level packages that every Spark Python process running the sink must import anyway: never shipped."""


def ship_by_value(*objects: Any, owner: str = "ZClusterSink") -> tuple[str, ...]:
    """Make ``objects`` (a sink's mapper and decode) loadable where the executors cannot import their modules.

    Pickles ``objects`` as Spark will (cloudpickle), collects the modules they reference by name (the module of
    every function and class they reach, and every module object), and registers each one that is not
    installed (neither ``__main__``, nor the standard library, nor part of an installed distribution, nor
    zcluster / pyspark / py4j) with ``pyspark.cloudpickle.register_pickle_by_value``; again until the pickle
    references no such module (a shipped module's functions reach the modules they use). Their functions and
    classes then travel by value with the mapper, to classic executors and to a Spark Connect server alike.
    Not shipped: installed packages (the workers' Python must have them), compiled modules (logged), modules
    a function imports in its body, and files a module reads. When the shipped modules cannot be pickled (a
    module global the mapper uses holds a lock or a socket), nothing is shipped (logged: the executors must
    import them). Raises ConfigError if ``objects`` cannot be pickled at all. Returns the modules shipped.
    """
    from pyspark import cloudpickle

    shipped: list[str] = []
    skipped: set[str] = set()
    installed: set[str] | None = None
    for _ in range(64):  # each round reaches one level further into the modules the mapper uses
        try:
            names = _referenced_modules(objects)
        except Exception as exc:
            if not shipped:
                raise ConfigError(
                    f"{owner} cannot pickle its mapper (and decode) to send them to Spark's executors: {exc!r}"
                ) from exc
            for name in shipped:
                cloudpickle.unregister_pickle_by_value(sys.modules[name])
            log.warning(
                "%s cannot ship %s by value with its mapper (%r): the executors must import them "
                "(install them into the workers' Python, or addPyFile / --py-files)",
                owner,
                ", ".join(shipped),
                exc,
            )
            return ()
        todo = [n for n in sorted(names - skipped) if n not in shipped and _maybe_local(n)]
        if todo and installed is None:
            installed = _installed_top_levels()
        todo = [n for n in todo if installed is not None and n.partition(".")[0] not in installed]
        if not todo:
            break
        for name in todo:
            if _compiled(sys.modules[name]):
                skipped.add(name)
                log.warning(
                    "%s cannot ship %s (a compiled module outside any installed distribution): the "
                    "executors must import it (install it into the workers' Python)",
                    owner,
                    name,
                )
            else:
                cloudpickle.register_pickle_by_value(sys.modules[name])
                shipped.append(name)
    if shipped:
        log.info("%s ships %s by value with its mapper (not installed here)", owner, ", ".join(shipped))
    return tuple(shipped)


def _referenced_modules(objects: tuple[Any, ...]) -> set[str]:
    """The modules that pickling ``objects`` with cloudpickle references by name, and the registered ones it
    pickles by value (a function defined in a module, but not found there by name, travels by value anyway: a
    lambda, a closure). Raises what pickling raises."""
    import io
    import pickle

    from pyspark import cloudpickle

    names: set[str] = set()
    by_value = cloudpickle.list_registry_pickle_by_value()

    def registered(name: str) -> bool:
        return any(name == m or name.startswith(m + ".") for m in by_value)

    class Recorder(cloudpickle.Pickler):
        def reducer_override(self, obj: Any) -> Any:
            reduced = super().reducer_override(obj)  # NotImplemented: by name (a module: unless registered)
            if isinstance(obj, types.ModuleType):
                names.add(obj.__name__)
            elif isinstance(obj, type | types.FunctionType | types.BuiltinFunctionType):
                module = getattr(obj, "__module__", None)
                if isinstance(module, str) and (reduced is NotImplemented or registered(module)):
                    names.add(module)  # by name, or by value as a module shipped before
            return reduced

    Recorder(io.BytesIO(), protocol=pickle.HIGHEST_PROTOCOL).dump(objects)
    return names


def _maybe_local(name: str) -> bool:
    """Whether module ``name`` may be one of the user's own (the cheap tests; installed ones are ruled out later)."""
    module = sys.modules.get(name)
    top = name.partition(".")[0]
    if module is None or name in ("__main__", "__mp_main__") or top in AVAILABLE:
        return False
    if top in sys.stdlib_module_names or name in sys.builtin_module_names:
        return False
    path = getattr(module, "__file__", None)
    if not path:  # built in, frozen or a namespace package: nothing to ship
        return False
    real = os.path.realpath(path)
    return not any(real.startswith(site + os.sep) for site in _site_dirs())


def _site_dirs() -> list[str]:
    import site
    import sysconfig

    dirs = [sysconfig.get_paths()[k] for k in ("purelib", "platlib")]
    dirs += site.getsitepackages() if hasattr(site, "getsitepackages") else []
    dirs.append(site.getusersitepackages())
    return [os.path.realpath(d) for d in dirs]


def _installed_top_levels() -> set[str]:
    """Top-level import names of the installed distributions."""
    import importlib.metadata

    return set(importlib.metadata.packages_distributions())


def _compiled(module: types.ModuleType) -> bool:
    import importlib.machinery

    return str(getattr(module, "__file__", "")).endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))


_MISSING = re.compile(r"No module named '([^']+)'")


def explain_missing_module(exc: BaseException, shipped: tuple[str, ...]) -> None:
    """Raise a ConfigError saying what to do when ``exc`` (a failed batch) is a Spark worker missing a module."""
    found = _MISSING.search(str(exc))
    if found is None:
        return
    name = found.group(1)
    sent = f"; the sink shipped {', '.join(shipped)} by value" if shipped else ""
    raise ConfigError(
        f"a Spark Python worker cannot import {name!r} (No module named {name!r}){sent}. Installed packages the "
        "job uses (zcluster and its dependencies, and the packages the mapper imports) must be installed into the "
        "Python the workers run, on every machine: point PYSPARK_PYTHON (or spark.pyspark.python) at it. A module "
        "of your own that the sink could not ship by value: install it there too, or ship it with "
        "spark.sparkContext.addPyFile / spark-submit --py-files (on Spark Connect, install it on the server)"
    ) from exc
