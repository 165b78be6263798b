"""A package's public names, loaded on first use (PEP 562): one `__getattr__` for every package.

A package's `__init__` runs whenever any of its submodules is imported. One that imported its
public names eagerly would load what stands behind them (torch, DeepSpeed, scikit-learn) into
processes that need one small module: `hpo --help`, a fused member's relay, a rank of a live job.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any


def lazy_names(package: str, modules: Mapping[str, Iterable[str]]) -> Callable[[str], Any]:
    """The module-level `__getattr__` of `package`, where `modules` maps each module to the public
    names it defines; the module is imported when one of its names is first looked up."""
    home = {name: module for module, names in modules.items() for name in names}

    def __getattr__(name: str) -> Any:
        if name in home:
            return getattr(importlib.import_module(home[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__


def public_names(modules: Mapping[str, Iterable[str]]) -> list[str]:
    """Every name of a `lazy_names` table, sorted: the package's `__all__`."""
    return sorted(name for names in modules.values() for name in names)
