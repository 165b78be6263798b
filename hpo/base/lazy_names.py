"""A package's public names, loaded on first use (PEP 562): one `__getattr__` for every package.

A package's `__init__` runs whenever any of its submodules is imported. One that imported its
public names eagerly would load what stands behind them (torch, DeepSpeed, scikit-learn) into
processes that need one small module: `hpo --help`, a fused member's relay, a rank of a live job.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_names(package: str, names: Mapping[str, str]) -> Callable[[str], Any]:
    """The module-level `__getattr__` of `package`, where `names` maps each public name to the
    module that defines it; that module is imported when the name is first looked up."""

    def __getattr__(name: str) -> Any:
        if name in names:
            return getattr(importlib.import_module(names[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
