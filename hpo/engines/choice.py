"""The one place a sweep's mode is decided: which engine runs it.

The mode follows from what the user gave: a function trainable runs plain; a `Workload` runs
plain, fused on the sweep's devices (`fusion:`), fused into pipeline bubbles
(`fusion: {placement: bubbles}`), and any of these around a muP proxy (`scaling:`). Nothing
after `engine_for` asks again: the `hpo.Tuner` asks its engine what differs.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ray import tune
from ray.tune.schedulers import PopulationBasedTraining

from hpo.config.spec import CheckpointPolicy, FusionConfig, fused_placement
from hpo.config.trainable_lookup import ResolvedTrainable
from hpo.engines._base import SweepEngine, SweepPlan
from hpo.engines.plain import FunctionEngine, WorkloadEngine, function_iterations


def engine_for(
    trainable: ResolvedTrainable,
    param_space: Mapping[str, Any],
    tune_config: tune.TuneConfig,
    run_config: tune.RunConfig,
    resources: Mapping[str, float],
    checkpoint: CheckpointPolicy,
    max_iterations: int,
    experiment: Path,
    scaling: Any = None,
    fusion: FusionConfig | None = None,
    search_seed: int | None = None,
) -> SweepEngine:
    """The engine of the sweep's mode. A scaled sweep's proxy is built (and coordinate-checked,
    its plots in `experiment`) here; a fused sweep expands grid and random spaces itself (`search_seed`).
    Whether `trainable` is a Workload was decided when it was resolved: it is read here, not asked."""
    placement = fused_placement(fusion)

    def plan(swept: Any, iterations: int | None) -> SweepPlan:
        return SweepPlan(swept, dict(resources), dict(param_space), tune_config, max_iterations, checkpoint, iterations)

    if not trainable.is_workload:
        if scaling is not None or placement is not None:
            raise TypeError("scaling and fusion need a Workload trainable (model factory, data and loss kept apart): "
                            "docs/workload_guide.md shows how, from a Tune function")
        return FunctionEngine(plan(trainable.obj, function_iterations(tune_config, run_config, max_iterations)))
    if placement is not None and isinstance(tune_config.scheduler, PopulationBasedTraining):
        raise ValueError("fusion does not support PopulationBasedTraining: its exploit step copies one trial's "
                         "state into another, across fused groups; use ASHA or HyperBand, or turn fusion off")
    if scaling is None:
        return _workload_engine(plan(trainable.obj, max_iterations), fusion, placement, search_seed)
    from hpo.engines import scaled  # muP is an optional extra (`hydro-hpo[mup]`): loaded by scaled sweeps only

    scaling = scaled.as_scaling_config(scaling)
    proxy = plan(scaled.build_proxy(trainable.obj, scaling, param_space, experiment), max_iterations)
    return scaled.ScaledEngine(_workload_engine(proxy, fusion, placement, search_seed), trainable.obj, scaling, proxy)


def _workload_engine(
    plan: SweepPlan, fusion: FusionConfig | None, placement: str | None, search_seed: int | None
) -> SweepEngine:
    if fusion is None or placement is None:
        return WorkloadEngine(plan)
    if placement == "bubbles":
        from hpo.engines.bubbles.engine import BubbleEngine  # torch: only fused sweeps

        return BubbleEngine(plan, fusion)
    from hpo.engines.fused.engine import FusedEngine

    return FusedEngine(plan, fusion, search_seed)


