"""W&B-style parameter specs mapped exactly onto Ray Tune domains.

Two traps are handled here: Tune's `randint` upper bound is exclusive while W&B's `int_uniform`
max is inclusive, and W&B's `log_uniform` takes natural-log exponents while
`log_uniform_values` takes the values themselves.
"""

from __future__ import annotations

import math
from typing import Any

from ray import tune

from hpo.spec import ParameterSpec, SweepSpec


def to_tune_domain(param: ParameterSpec, grid: bool = False) -> Any:
    kind = param.distribution
    if kind == "constant":
        return param.value
    if kind == "categorical":
        return tune.grid_search(list(param.values)) if grid else tune.choice(list(param.values))
    if kind == "int_uniform":
        return tune.randint(int(param.min), int(param.max) + 1)
    if kind == "uniform":
        return tune.uniform(param.min, param.max)
    if kind == "q_uniform":
        return tune.quniform(param.min, param.max, param.q)
    if kind == "log_uniform":
        return tune.loguniform(math.exp(param.min), math.exp(param.max))
    if kind == "log_uniform_values":
        return tune.loguniform(param.min, param.max)
    if kind == "q_log_uniform_values":
        return tune.qloguniform(param.min, param.max, param.q)
    if kind == "normal":
        return tune.randn(param.mu, param.sigma)
    if kind == "q_normal":
        return tune.qrandn(param.mu, param.sigma, param.q)
    raise ValueError(f"unsupported distribution {kind!r}")  # unreachable: SweepSpec validates names


def param_space(spec: SweepSpec) -> dict[str, Any]:
    """The Tune `param_space` of a sweep."""
    grid = spec.searcher_kind == "grid"
    return {key: to_tune_domain(param, grid=grid) for key, param in spec.parameters.items()}


def describe(space: dict[str, Any]) -> dict[str, str]:
    """A readable line per parameter, for `hpo run --dry-run`."""
    lines = {}
    for key, domain in space.items():
        if isinstance(domain, dict) and "grid_search" in domain:
            lines[key] = f"grid {domain['grid_search']}"
        elif hasattr(domain, "sampler"):
            lines[key] = f"{type(domain).__name__}({_bounds(domain)}) sampler={type(domain.get_sampler()).__name__}"
        else:
            lines[key] = f"constant {domain!r}"
    return lines


def _bounds(domain: Any) -> str:
    if hasattr(domain, "categories"):
        return repr(list(domain.categories))
    return f"{domain.lower}, {domain.upper}" if hasattr(domain, "lower") else ""
