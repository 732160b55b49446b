"""The one way a package defers an import: names resolved from their modules on first use (PEP 562).

Used where eager imports would pull torch onto a path that must stay light (``lifeline --help``
imports every part's ``cli``; kopf's start-up imports the operator) — nowhere else.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["exports"]


def exports(package: str, where: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package`` that import ``where[name]`` (a module of the
    package, e.g. ``"_context"``) when ``name`` is first read, and cache the value.

    Raises (from ``__getattr__``):
        AttributeError: ``name`` is not exported.
    """
    module = importlib.import_module(package)

    def __getattr__(name: str) -> Any:
        target = where.get(name)
        if target is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{target}"), name)
        setattr(module, name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(where) | set(vars(module)))

    return __getattr__, __dir__
