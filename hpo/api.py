"""The Python API: `hpo.run` mirrors `tune.run`, `hpo.Tuner` mirrors `ray.tune.Tuner`.

Both accept what Tune accepts (a function trainable, Tune domains, Tune searchers and
schedulers) and additionally a `Workload`, which unlocks muP scaling and trial fusion. They return
a `SweepResult`; Ray's own `ResultGrid` stays reachable as `result.result_grid`.

Example::

    import hpo
    from ray import tune
    result = hpo.run("mlp_digits", config={"lr": tune.loguniform(1e-4, 1e-1)},
                     metric="val_loss", mode="min", num_samples=8)
    print(result.best_config)
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from ray import tune

from hpo.controller import ControllerCallback, start_controller
from hpo.fused_sweep import group_size, group_slots
from hpo.ray_runtime import ensure_ray
from hpo.results import SweepResult, results_file_callback
from hpo.run_dirs import fresh_run_name, verify_run_state
from hpo.spec import DEFAULT_MAX_ITERATIONS, CheckpointPolicy, FusionConfig
from hpo.trainables import resolve_trainable
from hpo.training import workload_trainable
from hpo.trial_output import with_trial_output
from hpo.workload import Workload

Trainable = Workload | Callable[..., Any] | str


class Tuner:
    """`ray.tune.Tuner` with hydro-hpo's engines; `scaling` and `fusion` need a `Workload`."""

    def __init__(
        self,
        trainable: Trainable,
        *,
        param_space: Mapping[str, Any] | None = None,
        tune_config: tune.TuneConfig | None = None,
        run_config: tune.RunConfig | None = None,
        resources: Mapping[str, float] | None = None,
        scaling: Any = None,
        fusion: FusionConfig | None = None,
        checkpoint: CheckpointPolicy | Mapping[str, Any] | None = None,
        search_seed: int | None = None,
    ):
        self.search_seed = search_seed  # a fused sweep expands grid and random spaces itself
        self.fused: Any = None  # a fused sweep's groups, built when the sweep starts (`FusedSweep`)
        self.trainable = resolve_trainable(trainable) if isinstance(trainable, str) else trainable
        self.checkpoint = _checkpoint_policy(checkpoint, (tune_config or tune.TuneConfig()).scheduler)
        self.param_space = dict(param_space or {})
        self.tune_config = tune_config or tune.TuneConfig()
        self.run_config = run_config or tune.RunConfig()
        self.resources = dict(resources or {"cpu": 1})
        self.fusion = fusion if fusion is None or fusion.enabled else None
        if (scaling is not None or self.fusion is not None) and not isinstance(self.trainable, Workload):
            raise TypeError("scaling and fusion need a Workload trainable (model factory, data and loss kept apart)")
        from ray.tune.schedulers import PopulationBasedTraining

        if self.fusion is not None and isinstance(self.tune_config.scheduler, PopulationBasedTraining):
            raise ValueError("fusion does not support PopulationBasedTraining: its exploit step copies one trial's "
                             "state into another, across fused groups; use ASHA or HyperBand, or turn fusion off")
        self.scaling = None
        self._eager: Any = None  # the eager-transfer callback of a fresh (not resumed) scaled sweep
        if scaling is not None:
            from hpo import scaled_sweep

            self.scaling = scaled_sweep.as_scaling_config(scaling)
            self.user_workload = self.trainable
            experiment = Path(self.run_config.storage_path or "~/ray_results").expanduser() / self.name
            self.trainable = scaled_sweep.build_proxy(self.trainable, self.scaling, self.param_space, experiment)

    @property
    def name(self) -> str:
        return self.run_config.name or "sweep"

    @property
    def storage(self) -> Path:
        return Path(self.run_config.storage_path or "~/ray_results").expanduser()

    @property
    def mode(self) -> str:
        return self.tune_config.mode or "min"

    @property
    def max_iterations(self) -> int:
        stop = self.run_config.stop
        if isinstance(stop, Mapping) and "training_iteration" in stop:
            return int(stop["training_iteration"])
        return DEFAULT_MAX_ITERATIONS

    @property
    def fuses_on_devices(self) -> bool:
        """Fused groups that are Tune's trials; groups in pipeline bubbles have member trials."""
        return self.fusion is not None and self.fusion.placement != "bubbles"

    def _tune_trainable(self) -> Any:
        """The Tune trainable this sweep runs, with its per-trial resources attached."""
        trainable = self.trainable
        if self.fused is not None:
            return self.fused.trainable
        if self.fusion is not None:
            from hpo.member_trial import MEMBER_TRIAL_RESOURCES, fused_member_trainable

            return tune.with_resources(fused_member_trainable(self.name, self.max_iterations), MEMBER_TRIAL_RESOURCES)
        threads = max(1, int(self.resources.get("cpu", 1)))
        if isinstance(trainable, Workload):
            trainable = workload_trainable(
                trainable, self.max_iterations, threads=threads,
                checkpoint_every=self.checkpoint.every, checkpoint_at_end=self.checkpoint.at_end,
            )
        return with_trial_output(tune.with_resources(trainable, dict(self.resources)))

    def _run_config(self) -> tune.RunConfig:
        metric = self.tune_config.metric
        callbacks = list(self.run_config.callbacks or [])
        if metric and not any(isinstance(cb, ControllerCallback) for cb in callbacks):
            callbacks.append(ControllerCallback(self.name, metric, self.mode))
        if self.fused is not None:
            # Progress, the dashboard, the results files and the loggers count configurations:
            # they hear of each member's events, not of the groups Tune runs.
            from ray.tune.logger import LoggerCallback

            from hpo.fused_sweep import member_callbacks
            from hpo.progress import ProgressCallback

            per_member = [cb for cb in callbacks if isinstance(cb, (ControllerCallback, ProgressCallback, LoggerCallback))]
            callbacks = [cb for cb in callbacks if all(cb is not p for p in per_member)]
            callbacks += member_callbacks(self.fused.book, [*per_member, self.fused.callback])
        elif metric:
            callbacks.append(results_file_callback(self.storage / self.name, metric, self.mode, self._iterations()))
        if self.fusion is not None and self.fused is None:
            from hpo.member_trial import FusionCallback

            callbacks.append(FusionCallback(self.name))
        if self.scaling is not None and self.scaling.eager_transfer is not None:
            from hpo.scaling import EagerTransferCallback

            self._eager = EagerTransferCallback(
                self.user_workload, self.scaling, metric=metric, mode=self.mode,
                max_iterations=self.max_iterations,
            )
            callbacks.append(self._eager)
        stop = self.run_config.stop
        if isinstance(self.trainable, Workload) and stop is None:
            stop = {"training_iteration": self.max_iterations}
        run_config = replace(self.run_config, name=self.name, callbacks=callbacks, stop=stop)
        if self.fused is not None:
            run_config = replace(run_config, checkpoint_config=self.fused.checkpoint_config)
        return run_config

    def _start_actors(self) -> list[Any]:
        """The sweep's controller and, with fusion, its group broker; the Tuner owns both."""
        metric = self.tune_config.metric
        actors = [start_controller(self.name, metric, self.mode) if metric else None]
        if self.fuses_on_devices:
            from hpo.fused_sweep import fused_sweep

            self.fused = fused_sweep(
                self.storage / self.name, self.trainable,
                group_size(self.trainable, self.fusion, self.resources, self.param_space), self.resources,
                self.param_space, self.tune_config, self.max_iterations, self.checkpoint, self.fusion.dtype,
                group_slots(self.resources), self.search_seed,
            )
            self.members_per_group = self.fused.members_per_group
        elif self.fusion is not None:
            from fusion.broker import start_broker
            from hpo.member_trial import broker_name
            from hpo.ray_runtime import NAMESPACE

            self.members_per_group = group_size(self.trainable, self.fusion, self.resources, self.param_space)
            actors.append(
                start_broker(broker_name(self.name), NAMESPACE, self.trainable, self.members_per_group, self._group_launcher())
            )
        return actors

    def _group_launcher(self) -> Any:
        """Fused groups queued for pipeline jobs' bubbles."""
        from pipeline_bubble.bubble_pool import bubble_group_launcher

        return bubble_group_launcher(self.name, self.trainable, self.max_iterations, self.fusion.dtype)

    def _tune_config(self) -> tune.TuneConfig:
        tune_config = self.tune_config
        if isinstance(self.trainable, Workload) and not tune_config.reuse_actors:
            # hydro-hpo's own trainables reset cleanly, so a trial process (and its torch import)
            # serves trial after trial instead of being started anew for each configuration.
            tune_config = replace(tune_config, reuse_actors=True)
        if self.fused is not None:
            # Tune runs groups: the group searcher and scheduler stand for the user's, which act
            # on every member; as many groups at once as there are group slots.
            return replace(
                tune_config,
                search_alg=self.fused.search_alg,
                scheduler=self.fused.scheduler,
                num_samples=-1,
                max_concurrent_trials=(
                    math.ceil(tune_config.max_concurrent_trials / self.members_per_group)
                    if tune_config.max_concurrent_trials else group_slots(self.resources)
                ),
                trial_dirname_creator=self.fused.group_dirname,
            )
        if self.fusion is None or tune_config.max_concurrent_trials:
            return tune_config
        # Enough member trials at once to fill every lending stage with a full group.
        from pipeline_bubble.bubble_pool import lending_stages

        return replace(tune_config, max_concurrent_trials=self.members_per_group * max(1, lending_stages()))

    def fit(self) -> SweepResult:
        """Run the sweep in a new run folder: a name already on disk gets the next versioned one."""
        _snapshot_state_promptly()
        name = fresh_run_name(self.storage, self.name)
        if name != self.name:
            print(f"{self.storage / self.name} holds an earlier run; this run is {self.storage / name}", flush=True)
            self.run_config = replace(self.run_config, name=name)
        ensure_ray()
        actors = self._start_actors()
        tuner = tune.Tuner(
            self._tune_trainable(),
            param_space={} if self.fused is not None else self.param_space,
            tune_config=self._tune_config(),
            run_config=self._run_config(),
        )
        return self._wrap(tuner.fit(), actors)

    def resume(self, path: str) -> SweepResult:
        """Continue an interrupted sweep stored at `path`: finished trials are kept, not re-run.

        A damaged run state is refused (`RunStateError`, naming the file) rather than started over.
        """
        verify_run_state(Path(path))
        _snapshot_state_promptly()
        self.run_config = replace(self.run_config, name=Path(path).name, storage_path=str(Path(path).parent))
        ensure_ray()
        actors = self._start_actors()
        tuner = tune.Tuner.restore(
            path,
            storage_filesystem=self.run_config.storage_filesystem,
            trainable=self._tune_trainable(),
            param_space={} if self.fused is not None else self.param_space,
            resume_unfinished=True,
            resume_errored=True,
        )
        return self._wrap(tuner.fit(), actors)

    def _iterations(self) -> int | None:
        """Iterations a trial that was not stopped early runs (None when nothing says)."""
        stop = self.run_config.stop
        if isinstance(self.trainable, Workload) or (isinstance(stop, Mapping) and "training_iteration" in stop):
            return self.max_iterations
        return None

    def _wrap(self, grid: tune.ResultGrid, actors: list[Any]) -> SweepResult:
        metric = self.tune_config.metric or ""
        members = None
        if self.fused is not None:  # the members of the groups Tune ran (restored ones included)
            from hpo.fused_members import GROUP_DIR_PREFIX

            members = self.fused.book.results({Path(r.path).name.removeprefix(GROUP_DIR_PREFIX) for r in grid})
        result = SweepResult(grid, metric, self.mode, self._iterations(), results=members)
        if self.fused is not None:
            result.extras["fused_groups"] = self.fused.book.groups()
        # Holding the handle keeps `hpo:sweep:<name>` alive (and in the dashboard) while the result lives.
        result.controller = actors[0]
        result.actors = actors
        if self.scaling is not None:
            from hpo import scaled_sweep

            scaled_sweep.finish(result, self.user_workload, self.scaling, self.max_iterations, self._eager)
        if metric:
            result.paths = result.write()  # the same files the CLI writes, wherever the sweep ran from
        return result


#: At most this many seconds between two snapshots of Tune's experiment state.
STATE_SNAPSHOT_S = "1"


def _snapshot_state_promptly() -> None:
    """Tune snapshots its experiment state on an adaptive period that can outlast a fast sweep; a
    driver killed before the next snapshot would, on --resume, run trials again that had finished
    (and whose rows results.csv already holds). A user's own TUNE_GLOBAL_CHECKPOINT_S wins."""
    os.environ.setdefault("TUNE_GLOBAL_CHECKPOINT_S", STATE_SNAPSHOT_S)


def _checkpoint_policy(checkpoint: CheckpointPolicy | Mapping[str, Any] | None, scheduler: Any) -> CheckpointPolicy:
    """The sweep's checkpoint policy. Schedulers that pause trials (HyperBand, PBT) resume them
    from their last checkpoint, so under them every iteration is checkpointed."""
    from ray.tune.schedulers import HyperBandScheduler, PopulationBasedTraining

    policy = checkpoint if isinstance(checkpoint, CheckpointPolicy) else CheckpointPolicy(**(checkpoint or {}))
    if isinstance(scheduler, (HyperBandScheduler, PopulationBasedTraining)) and policy.every != 1:
        return policy.model_copy(update={"every": 1})
    return policy


def sweep_run_config(
    name: str | None,
    storage_path: str | None,
    stop: Mapping[str, Any] | None,
    max_failures: int,
    callbacks: Sequence[tune.Callback] | None = None,
    **options: Any,
) -> tune.RunConfig:
    """Every sweep's run config: where it is stored, when trials stop, how often a failing trial
    is retried, and the two newest checkpoints kept per trial (enough to resume either way).
    Local storage is written file by file atomically (`hpo.atomic_storage`): a killed driver or a
    full disk never leaves a torn tuner.pkl or experiment state behind."""
    from hpo.atomic_storage import atomic_local_filesystem, is_local_path

    if is_local_path(storage_path) and "storage_filesystem" not in options:
        options["storage_filesystem"] = atomic_local_filesystem()
    return tune.RunConfig(
        name=name,
        storage_path=str(Path(storage_path).resolve()) if storage_path else None,
        stop=dict(stop) if stop else None,
        callbacks=list(callbacks or []),
        failure_config=tune.FailureConfig(max_failures=max_failures),
        checkpoint_config=tune.CheckpointConfig(num_to_keep=2),
        **options,
    )


def run(
    trainable: Trainable,
    config: Mapping[str, Any] | None = None,
    metric: str | None = None,
    mode: str | None = None,
    num_samples: int = 1,
    search_alg: Any = None,
    scheduler: Any = None,
    resources_per_trial: Mapping[str, float] | None = None,
    stop: Mapping[str, Any] | None = None,
    storage_path: str | None = None,
    name: str | None = None,
    max_concurrent_trials: int | None = None,
    time_budget_s: float | None = None,
    max_failures: int = 0,
    callbacks: Sequence[tune.Callback] | None = None,
    scaling: Any = None,
    fusion: FusionConfig | None = None,
    checkpoint: CheckpointPolicy | Mapping[str, Any] | None = None,
    reuse_actors: bool = True,
    logging: Mapping[str, Any] | None = None,
) -> SweepResult:
    """`tune.run`'s common arguments, returning a `SweepResult`.

    `checkpoint` (`{"every": N, "at_end": True}`) bounds what a crash costs: a trial loses at most
    N iterations. Trial processes are reused between trials unless `reuse_actors=False`.
    `logging` is a sweep file's `logging:` block as a dict (`{"tensorboard": True, "mlflow":
    {"tracking_uri": ...}, "wandb": {"project": ..., "mode": "offline"}}`): Tune's own logger
    callbacks, added to `callbacks`.
    """
    if logging is not None:
        from hpo.logging_callbacks import as_logging_spec, logger_callbacks

        experiment = Path(storage_path or "~/ray_results").expanduser().resolve() / (name or "sweep")
        callbacks = [*(callbacks or []), *logger_callbacks(as_logging_spec(logging), name or "sweep", experiment)]
    tune_config = tune.TuneConfig(
        metric=metric,
        mode=mode,
        num_samples=num_samples,
        search_alg=search_alg,
        scheduler=scheduler,
        max_concurrent_trials=max_concurrent_trials,
        time_budget_s=time_budget_s,
        reuse_actors=reuse_actors,
    )
    return Tuner(
        trainable,
        param_space=config,
        tune_config=tune_config,
        run_config=sweep_run_config(name, storage_path, stop, max_failures, callbacks),
        resources=resources_per_trial,
        scaling=scaling,
        fusion=fusion,
        checkpoint=checkpoint,
    ).fit()
