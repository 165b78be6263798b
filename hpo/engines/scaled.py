"""How a sweep with `scaling:` runs: tune the muP proxy, then carry its best config to the target.

The path: the user's workload -> `proxy_workload` (muP at the proxy width, base shapes at the
target; at the proxy depth, CompleteP's base depth by default) -> an ordinary (or fused) sweep ->
`transfer_config` on the best proxy trial ->
`transfer.json`, and, when asked, the target trained with it (eagerly during the sweep, or after).
`ScaledEngine` is that path as the Tuner's engine, wrapped around the engine that tunes the proxy.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from hpo.base.workload import Workload
from hpo.engines._base import SweepEngine, SweepPlan, TuneRun
from hpo.reporting.sweep_result import SweepResult
from hpo.scaling import (
    EagerTransferCallback,
    ScalingError,
    complete_transfer,
    coord_check,
    depth_contract_problem,
    depth_coord_check,
    proxy_workload,
)
from hpo.scaling._config import ScalingConfig
from hpo.scaling._transfer import TARGET_CHECKPOINT_DIR


def as_scaling_config(scaling: ScalingConfig | Mapping[str, Any]) -> ScalingConfig:
    return scaling if isinstance(scaling, ScalingConfig) else ScalingConfig.model_validate(dict(scaling))


def constant_keys(param_space: Mapping[str, Any]) -> dict[str, Any]:
    """The search space's fixed values (no Tune domain, no grid): what every proxy is built with."""
    return {
        key: value
        for key, value in param_space.items()
        if not hasattr(value, "sampler") and not (isinstance(value, dict) and "grid_search" in value)
    }


def build_proxy(workload: Workload, scaling: ScalingConfig, param_space: Mapping[str, Any], plot_dir: Path) -> Workload:
    """The proxy workload; with `coord_check`, only after the coordinate check of every scaled
    dimension (width: muP's; depth: CompleteP's) passes."""
    if scaling.scales_depth and (problem := depth_contract_problem(workload)):
        raise ScalingError(f"scaling.target_depth: {problem}")
    if searched := scaling.searched_size_problems(param_space, workload.depth_key):
        raise ScalingError(next(iter(searched.values())))
    constants = constant_keys(param_space)
    proxy = proxy_workload(workload, scaling, config=constants)
    if scaling.coord_check:
        plot_dir.mkdir(parents=True, exist_ok=True)
        reports = []
        if scaling.scales_width:
            reports.append(coord_check(workload, scaling=scaling, config=constants, plot_path=str(plot_dir / "coord_check.png")))
        if scaling.scales_depth:
            reports.append(
                depth_coord_check(workload, scaling=scaling, config=constants, plot_path=str(plot_dir / "coord_check_depth.png"))
            )
        for report in reports:
            print(report.summary(), flush=True)
            if not report.ok:
                raise ScalingError(report.summary())
    return proxy


def finish(
    result: SweepResult,
    workload: Workload,
    scaling: ScalingConfig,
    max_iterations: int,
    eager: Any = None,
) -> None:
    """Write `transfer.json` beside the results and attach the transfer (and target run) to `result`.

    An eager run already trained the target during the sweep, so it replaces `final_training`.
    The trained target is saved beside `transfer.json` (`result.target_checkpoint`, printed).
    """
    best = result.best_result
    if eager is not None:
        scaling = scaling.model_copy(update={"final_training": False})
    transfer = complete_transfer(
        workload, scaling, best.config, result.experiment_path,
        max_iterations=max_iterations, metric=result.metric, proxy_metric=float(best.metrics[result.metric]),
    )
    if eager is not None:
        report = eager.finish()
        result.extras["eager transfer"] = {
            "time_to_first_target_result_s": report["time_to_first_target_result_s"],
            "restarts": report["restarts"],
        }
        run = report["target_run"]
        if run is not None:
            result.extras["target (eager)"] = f"{run['metric']} = {run['value']:.4g} after {run['iterations']} iterations"
            result.curves[f"target (width {scaling.target_width})"] = target_curve(run["history"], result.metric)
        saved = eager.save_target(Path(result.experiment_path) / TARGET_CHECKPOINT_DIR)
        result.target_checkpoint = None if saved is None else str(saved)
    elif transfer.target_run is not None:
        run = transfer.target_run
        result.extras["target"] = f"{run.metric} = {run.value:.4g} after {run.iterations} iterations"
        result.curves[f"target (width {scaling.target_width})"] = target_curve(run.history, result.metric)
        result.target_checkpoint = run.checkpoint
    if result.target_checkpoint:
        result.extras["target checkpoint"] = result.target_checkpoint
    result.transfer = transfer
    result.extras["transferred target config"] = transfer.target_config
    if transfer.flagged:
        result.extras["re-tune on the target (does not transfer)"] = sorted(transfer.flagged)
    result.extras["transfer"] = str(Path(result.experiment_path) / "transfer.json")


def target_curve(history: list[dict[str, Any]], metric: str) -> tuple[list[int], list[float]]:
    """The target's metric by iteration, drawn beside the proxy trials in `curves.png`."""
    return list(range(1, len(history) + 1)), [float(entry[metric]) for entry in history]


class ScaledEngine(SweepEngine):
    """A sweep with `scaling:`: `inner` (a plain or fused engine) tunes the muP proxy, as `plan`
    says; the best proxy config is then carried to the user's `workload`, the target, which is
    trained eagerly during the sweep (`eager_transfer`) or after it (`final_training`)."""

    def __init__(self, inner: SweepEngine, workload: Workload, scaling: ScalingConfig, plan: SweepPlan):
        self.inner, self.workload, self.scaling, self.plan = inner, workload, scaling, plan
        self.eager: Any = None

    def start(self, experiment: Path, tune_config: Any, run_config: Any) -> TuneRun:
        """The inner engine's run, with the eager transfer's callback last (it hears every result)."""
        run = self.inner.start(experiment, tune_config, run_config)
        if self.scaling.eager_transfer is None:
            return run
        self.eager = EagerTransferCallback(
            self.workload, self.scaling, metric=self.plan.metric, mode=self.plan.mode, max_iterations=self.plan.max_iterations,
        )
        return replace(run, run_config=replace(run.run_config, callbacks=[*run.run_config.callbacks, self.eager]))

    def result(self, grid: Any) -> SweepResult:
        result = self.inner.result(grid)
        finish(result, self.workload, self.scaling, self.plan.max_iterations, self.eager)
        return result
