"""Plain sweeps: every configuration is a Tune trial of its own.

`FunctionEngine` hands Tune the user's function as it is; `WorkloadEngine` trains a `Workload` as
`hpo.engines.workload_trial` says, with hydro-hpo's checkpoint policy.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from ray import tune
from ray.tune.schedulers import FIFOScheduler
from ray.tune.trainable import FunctionTrainable

from hpo.base.checkpointing import checkpoints_to_keep
from hpo.engines._base import SweepEngine, SweepPlan, TuneRun, workload_run_config, workload_tune_config
from hpo.reporting.live_results import results_file_callback
from hpo.reporting.sweep_result import SweepResult


class FunctionEngine(SweepEngine):
    """A function or `tune.Trainable` class, one Tune trial per configuration: a function
    checkpoints as it likes (`tune.report(..., checkpoint=...)`), a class that saves its state
    as the sweep's checkpoint policy says."""

    def __init__(self, plan: SweepPlan):
        self.plan = plan

    def start(self, experiment: Path, tune_config: tune.TuneConfig, run_config: tune.RunConfig) -> TuneRun:
        """The user's function and space as they are; every trial's row in `results.csv` as soon as it ends."""
        return TuneRun(self._trainable(), dict(self.plan.param_space), self._tune_config(tune_config),
                       self._run_config(experiment, run_config))

    def _trainable(self) -> Any:
        return tune.with_resources(self.plan.trainable, dict(self.plan.resources))

    def _tune_config(self, tune_config: tune.TuneConfig) -> tune.TuneConfig:
        """Trial processes are reused (`reuse_actors=None`, `hpo.run`'s default) where the trainable
        can take a new trial's config in place: Tune hands a process on only through the trainable's
        `reset_config`, and a class without one fails every trial it is handed."""
        trainable = _trainable_class(self.plan.trainable)
        resets = _resets_itself(trainable)
        if tune_config.reuse_actors is None:
            return replace(tune_config, reuse_actors=resets)
        if tune_config.reuse_actors and not resets:
            raise ValueError(
                f"reuse_actors=True needs {trainable.__name__}.reset_config(new_config) returning True: Tune "
                "hands a trial's process to the next trial only through it; implement it, or leave reuse_actors unset"
            )
        return tune_config

    def _run_config(self, experiment: Path, run_config: tune.RunConfig) -> tune.RunConfig:
        run_config = self._checkpointing(run_config)
        if not self.plan.metric:
            return run_config
        callback = results_file_callback(experiment, self.plan.metric, self.plan.mode, self.plan.iterations)
        return replace(run_config, callbacks=[*(run_config.callbacks or []), callback])

    def _checkpointing(self, run_config: tune.RunConfig) -> tune.RunConfig:
        """A `tune.Trainable` class with its own `save_checkpoint` is saved every `checkpoint.every`
        iterations and at its end, through Tune's own checkpoint settings, so a crash costs it
        what it costs a `Workload`'s trial: the policy was ignored, and a crashed trial of such a
        class began again from its first iteration. A checkpoint frequency or end the run config
        already sets wins; a function, which Tune cannot checkpoint, is left as it is."""
        checkpoints = run_config.checkpoint_config
        if not _saves_itself(_trainable_class(self.plan.trainable)) or checkpoints.checkpoint_frequency \
                or checkpoints.checkpoint_at_end is not None:
            return run_config
        policy = self.plan.checkpoint
        return replace(run_config, checkpoint_config=replace(
            checkpoints, checkpoint_frequency=policy.every, checkpoint_at_end=policy.at_end))

    def result(self, grid: tune.ResultGrid) -> SweepResult:
        return SweepResult(grid, self.plan.metric or "", self.plan.mode, self.plan.iterations)


class WorkloadEngine(FunctionEngine):
    """A `Workload`, one Tune trial per configuration: trained to `max_iterations`, its
    checkpoints written and kept as the sweep's checkpoint policy says."""

    def _trainable(self) -> Any:
        from hpo.engines.workload_trial import workload_trainable  # torch: only sweeps of a Workload

        plan = self.plan
        trainable = workload_trainable(
            plan.trainable, plan.max_iterations, threads=max(1, int(plan.resources.get("cpu", 1))),
            checkpoint_every=plan.checkpoint.every, checkpoint_at_end=plan.checkpoint.at_end,
        )
        return tune.with_resources(trainable, dict(plan.resources))

    def _tune_config(self, tune_config: tune.TuneConfig) -> tune.TuneConfig:
        return workload_tune_config(tune_config)

    def _run_config(self, experiment: Path, run_config: tune.RunConfig) -> tune.RunConfig:
        """Checkpoints kept as `checkpoints_to_keep` says, and every trial's row as soon as it ends."""
        plan = self.plan
        keep = checkpoints_to_keep(plan.max_iterations, plan.checkpoint.every, plan.checkpoint.at_end)
        run_config = workload_run_config(run_config, plan.max_iterations)
        run_config = replace(run_config, checkpoint_config=replace(run_config.checkpoint_config, num_to_keep=keep))
        return super()._run_config(experiment, run_config)


def _trainable_class(trainable: Any) -> Any:
    """What a name registered with `tune.register_trainable` stands for; anything else as it is."""
    if isinstance(trainable, str):
        from ray.tune.registry import get_trainable_cls

        return get_trainable_cls(trainable)
    return trainable


def _resets_itself(trainable: Any) -> bool:
    """Whether a trial of `trainable` can take the next trial's config in its process: a function
    (Tune's wrapper resets it), or a `tune.Trainable` class that overrides `reset_config`."""
    return not _is_trainable_class(trainable) or _overrides(trainable, "reset_config")


def _saves_itself(trainable: Any) -> bool:
    """Whether Tune checkpoints a trial of `trainable` by its settings: a `tune.Trainable` class,
    not Tune's wrapper of a function, that overrides `save_checkpoint` (Tune's own raises)."""
    return (_is_trainable_class(trainable) and not issubclass(trainable, FunctionTrainable)
            and _overrides(trainable, "save_checkpoint"))


def _is_trainable_class(trainable: Any) -> bool:
    return isinstance(trainable, type) and issubclass(trainable, tune.Trainable)


def _overrides(trainable: type, method: str) -> bool:
    """Whether a `tune.Trainable` class has its own `method`, not the base class's."""
    return getattr(trainable, method) is not getattr(tune.Trainable, method)


def function_iterations(tune_config: tune.TuneConfig, run_config: tune.RunConfig, max_iterations: int) -> int | None:
    """Iterations a function's trial that was not stopped early runs; a trial with fewer is `early_stopped`.

    None when nothing says, and when nothing but the function could have ended it sooner (no
    scheduler that stops trials, no time budget, no other stop key): a function's own loop that
    ends before `max_iterations` has completed, not stopped early.
    """
    stop = run_config.stop
    if not (isinstance(stop, Mapping) and "training_iteration" in stop):
        return None
    scheduler = tune_config.scheduler
    stoppers = (scheduler is not None and type(scheduler) is not FIFOScheduler  # Tune's stopping ones subclass it
                or tune_config.time_budget_s is not None or set(stop) != {"training_iteration"})
    return max_iterations if stoppers else None
