"""Lazy package exports: a name is imported from its module on first use, then kept in the package."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any


def exports(
    package: str, where: dict[str, str], names: list[str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``, loading each name of ``where`` from its module."""
    namespace = vars(sys.modules[package])

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted([*namespace, *names])

    return __getattr__, __dir__
