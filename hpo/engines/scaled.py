"""How a sweep with `scaling:` runs: tune the muP proxy, then carry its best config to the target.

The path: the user's workload -> `proxy_workload` (muP at the proxy width, base shapes at the
target; at the proxy depth, CompleteP's base depth by default) -> an ordinary (or fused) sweep ->
`transfer_config` on the best proxy trial ->
`transfer.json`, and, when asked, the target trained with it (eagerly during the sweep, or after).
`ScaledEngine` is that path as the Tuner's engine, wrapped around the engine that tunes the proxy.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, replace
from functools import partial
from pathlib import Path
from typing import Any

from hpo.base.exceptions import describe_exception
from hpo.base.workload import Workload
from hpo.engines._base import SweepEngine, SweepPlan, TuneRun, space_constants
from hpo.reporting.progress import ProgressCallback
from hpo.reporting.results_files import error_line
from hpo.reporting.sweep_result import SweepResult
from hpo.scaling import (
    EagerTransferCallback,
    ScalingError,
    coord_check,
    depth_contract_problem,
    depth_coord_check,
    proxy_workload,
    train_transferred,
    transfer_config,
)
from hpo.scaling._config import ScalingConfig
from hpo.scaling._transfer import TARGET_CHECKPOINT_DIR


def as_scaling_config(scaling: ScalingConfig | Mapping[str, Any]) -> ScalingConfig:
    return scaling if isinstance(scaling, ScalingConfig) else ScalingConfig.model_validate(dict(scaling))


def build_proxy(workload: Workload, scaling: ScalingConfig, param_space: Mapping[str, Any], plot_dir: Path) -> Workload:
    """The proxy workload; with `coord_check`, only after the coordinate check of every scaled
    dimension (width: muP's; depth: CompleteP's) passes."""
    if scaling.scales_depth and (problem := depth_contract_problem(workload)):
        raise ScalingError(f"scaling.target_depth: {problem}")
    if searched := scaling.searched_size_problems(param_space, workload.depth_key):
        raise ScalingError(next(iter(searched.values())))
    constants = space_constants(param_space)  # what every proxy is built with
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
    progress: ProgressCallback | None = None,
) -> None:
    """Write `transfer.json` beside the results and attach the transfer (and target run) to `result`.

    An eager run already trained the target during the sweep, so it replaces `final_training`.
    The trained target is saved beside `transfer.json` (`result.target_checkpoint`, printed).
    `progress`, the sweep's progress lines, prints the target's iterations as they end.
    `result.target` says it all for `summary.json` and `hpo results`: the sizes, the config, what
    does not transfer, and how the target's run ended (a target that diverged or raised is the
    sweep's error, one line, not a traceback: the transfer is kept).

    Nothing is transferred from a proxy sweep stopped before its end (`--resume` goes on, and
    transfers once, from the complete sweep) or from one where no proxy trial finished.
    """
    label = target_label(scaling, workload.depth_key)
    if result.interrupted or _no_best(result):
        reason = (
            "the proxy sweep was stopped before its end; --resume trains it" if result.interrupted
            else f"no proxy trial finished with {result.metric}"
        )
        if eager is not None:
            eager.stop()
        result.extras["target"] = f"not trained: {reason}"
        result.target = {"status": "not trained", "reason": reason}
        return
    best = result.best_result
    if eager is not None and not eager.heard_the_sweep:
        # a resumed sweep: Tune ran the callback it pickled when the sweep began (inert, see
        # EagerTransferCallback.restored), so the target trains after the proxy sweep, once
        result.extras["eager transfer"] = "the sweep was resumed: the target trained after the proxy sweep"
        eager, scaling = None, scaling.model_copy(update={"final_training": True})
    elif eager is not None:
        scaling = scaling.model_copy(update={"final_training": False})
    out_dir = Path(result.experiment_path)
    transfer = transfer_config(
        best.config, scaling, depth_key=workload.depth_key, metric=result.metric, proxy_metric=float(best.metrics[result.metric])
    )
    transfer.write_json(out_dir)  # first, so the transfer survives a target that fails
    run: dict[str, Any] | None = None
    failure = ""
    try:
        if eager is not None:
            report = eager.finish()
            result.extras["eager transfer"] = {
                "time_to_first_target_result_s": report["time_to_first_target_result_s"],
                "restarts": report["restarts"],
            }
            run = report["target_run"]
            saved = eager.save_target(out_dir / TARGET_CHECKPOINT_DIR)
            result.target_checkpoint = None if saved is None else str(saved)
        elif scaling.final_training:
            on_iteration = None
            if progress is not None:
                progress.target_started(label, scaling.iterations_of_target(max_iterations))
                on_iteration = partial(progress.target_line, label)
            target_run = train_transferred(workload, transfer, scaling, out_dir, max_iterations=max_iterations,
                                           on_iteration=on_iteration)
            run = asdict(target_run)
            result.target_checkpoint = target_run.checkpoint
    except Exception as exc:  # the user's model at the target's size: one line, the transfer kept
        failure = f"the target ({label}) failed: {_exception_line(exc)}"
    if run is not None:
        key = "target (eager)" if eager is not None else "target"
        result.extras[key] = f"{run['metric']} = {run['value']:.4g} after {run['iterations']} iterations"
        result.curves[f"target ({label})"] = target_curve(run["history"], result.metric)
    if result.target_checkpoint:
        result.extras["target checkpoint"] = result.target_checkpoint
    result.transfer = transfer
    result.extras["transferred target config"] = transfer.target_config
    if transfer.flagged:
        result.extras["re-tune on the target (does not transfer)"] = sorted(transfer.flagged)
    result.extras["transfer"] = str(out_dir / "transfer.json")
    result.target = target_summary(transfer, scaling, workload.depth_key, run, failure, result.target_checkpoint, label)
    result.target["transfer"] = result.extras["transfer"]


def _no_best(result: SweepResult) -> bool:
    try:
        result.best_result
    except RuntimeError:
        return True
    return False


def _exception_line(exc: BaseException) -> str:
    """One line for what the target's training raised (Ray's wrapper around an eager target's
    exception puts the user's line last)."""
    from ray.exceptions import RayError

    return error_line(exc) if isinstance(exc, RayError) else describe_exception(exc)


def target_label(scaling: ScalingConfig, depth_key: str | None) -> str:
    """The target's sizes, as the report names it: `width 256`, `width 256, n_layer 8`, `n_layer 8`."""
    sizes = []
    if scaling.scales_width:
        sizes.append(f"width {scaling.target_width}")
    if scaling.scales_depth:
        sizes.append(f"{depth_key or 'depth'} {scaling.target_depth}")
    return ", ".join(sizes)


def target_summary(
    transfer: Any, scaling: ScalingConfig, depth_key: str | None, run: dict[str, Any] | None, failure: str,
    checkpoint: str | None, label: str,
) -> dict[str, Any]:
    """`summary.json`'s `target`: the proxy's and the target's sizes, the target's config, what
    transferred and what to re-tune, and how its run ended (`status`: completed, diverged, error,
    or `not trained` without `final_training` or `eager_transfer`; `error`: the one line)."""
    proxy, target = {}, {}
    if scaling.scales_width:
        proxy["width"], target["width"] = scaling.proxy, scaling.target_width
    if scaling.scales_depth:
        proxy[depth_key or "depth"], target[depth_key or "depth"] = scaling.depth_proxy, scaling.target_depth
    summary: dict[str, Any] = {
        "proxy": proxy, "target": target, "config": transfer.target_config, "transferred": transfer.transferred,
        "flagged": sorted(transfer.flagged), "metric": transfer.metric, "proxy_value": transfer.proxy_metric,
        "status": "not trained", "value": None, "iterations": 0, "checkpoint": checkpoint, "error": "",
    }
    if run is not None:
        summary.update(value=run["value"], iterations=run["iterations"], status="completed")
        if run["diverged"]:
            summary["status"] = "diverged"
            summary["error"] = (f"the target ({label}) diverged at iteration {run['iterations']} "
                                f"({run['metric']} = {run['value']:.4g})")
    if failure:
        summary.update(status="error", error=failure)
    return summary


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
        self.progress: ProgressCallback | None = None  # the sweep's progress lines, if it prints them

    def start(self, experiment: Path, tune_config: Any, run_config: Any) -> TuneRun:
        """The inner engine's run, given the eager transfer's callback among the sweep's: the inner
        engine hands it each configuration's events (a fused sweep's members, not its groups)."""
        self.progress = next((cb for cb in run_config.callbacks or [] if isinstance(cb, ProgressCallback)), None)
        if self.scaling.eager_transfer is None:
            return self.inner.start(experiment, tune_config, run_config)
        self.eager = EagerTransferCallback(
            self.workload, self.scaling, metric=self.plan.metric, mode=self.plan.mode, max_iterations=self.plan.max_iterations,
        )
        return self.inner.start(experiment, tune_config, replace(run_config, callbacks=[*(run_config.callbacks or []), self.eager]))

    def result(self, grid: Any) -> SweepResult:
        return self.inner.result(grid)

    def complete(self, result: SweepResult) -> None:
        """The transfer and the target, once the proxy sweep is known to be complete (`finish`)."""
        finish(result, self.workload, self.scaling, self.plan.max_iterations, self.eager, self.progress)
