"""W&B-style parameter specs mapped exactly onto Ray Tune domains, and described as written.

Two traps are handled here: Tune's `randint` upper bound is exclusive while W&B's `int_uniform`
max is inclusive, and W&B's `log_uniform` takes natural-log exponents while
`log_uniform_values` takes the values themselves. The dry run describes the spec the user wrote
(inclusive bounds, grid sizes), never Tune's internal domains, and so needs no Ray.
"""

from __future__ import annotations

import math
from typing import Any

from hpo.spec import ParameterSpec, SweepSpec


def to_tune_domain(param: ParameterSpec, grid: bool = False) -> Any:
    from ray import tune

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


def grid_size(spec: SweepSpec) -> int:
    """Combinations in one pass of a grid sweep: the product of every `values` list's length."""
    return math.prod(len(p.values) for p in spec.parameters.values() if p.distribution == "categorical")


def trial_count(spec: SweepSpec) -> int:
    """Trials the sweep runs (at most, for a time-budgeted one): a grid repeats `num_samples` times."""
    return grid_size(spec) * spec.num_samples if spec.searcher_kind == "grid" else spec.num_samples


def describe(spec: SweepSpec) -> dict[str, str]:
    """A line per parameter as the user wrote it, for `hpo run --dry-run` and `hpo validate`."""
    grid = spec.searcher_kind == "grid"
    return {key: describe_parameter(param, grid) for key, param in spec.parameters.items()}


def describe_parameter(param: ParameterSpec, grid: bool = False) -> str:
    kind = param.distribution
    if kind == "constant":
        return f"constant {param.value!r}"
    if kind == "categorical":
        label = "grid over" if grid else "one of"
        return f"{label} {len(param.values)} values {param.values!r}"
    lo, hi = _number(param.min), _number(param.max)
    step = f" in steps of {_number(param.q)}" if param.q is not None else ""
    if kind == "int_uniform":
        return f"integer from {lo} to {hi} inclusive, uniform"
    if kind in ("uniform", "q_uniform"):
        return f"uniform from {lo} to {hi}{step}"
    if kind in ("log_uniform_values", "q_log_uniform_values"):
        return f"log-uniform from {lo} to {hi}{step}"
    if kind == "log_uniform":
        return f"log-uniform from exp({lo}) = {math.exp(param.min):.4g} to exp({hi}) = {math.exp(param.max):.4g}"
    return f"normal, mean {_number(param.mu)}, std {_number(param.sigma)}{step}"


def _number(value: float | None) -> str:
    """Whole numbers without a trailing `.0`, so `max: 3` reads back as 3."""
    if value is not None and float(value).is_integer():
        return str(int(value))
    return f"{value:g}"
