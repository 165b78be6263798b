"""`hpo.Tuner` mirrors `ray.tune.Tuner` (and `hpo.run`, in `hpo.tuner.sweep`, mirrors `tune.run`).

It accepts what Tune accepts (a function trainable, Tune domains, Tune searchers and schedulers)
and additionally a `Workload`, which unlocks muP scaling and trial fusion. It returns a
`SweepResult`; Ray's own `ResultGrid` stays reachable as `result.result_grid`. What differs
between plain, fused and scaled sweeps is one `SweepEngine` (`hpo.engines`), chosen when the
Tuner is built (`hpo.engines.choice.engine_for`); the Tuner asks it, never the mode.

A run is never overwritten: a second sweep under a name already on disk gets the next free
versioned folder, and `resume` refuses a damaged run (`hpo.tuner.run_folders`).

Example::

    import hpo
    from ray import tune
    tuner = hpo.Tuner("mlp_digits", param_space={"lr": tune.loguniform(1e-4, 1e-1)},
                      tune_config=tune.TuneConfig(metric="val_loss", mode="min", num_samples=8))
    print(tuner.fit().best_config)
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union

from ray import tune
from ray.tune.schedulers import HyperBandScheduler, PopulationBasedTraining

from hpo.base import figures
from hpo.base.ray_runtime import ensure_ray
from hpo.base.scoped_environ import scoped_environ
from hpo.config.errors import checked_block
from hpo.config.preflight import beyond_capacity, largest_node
from hpo.config.spec import DEFAULT_MAX_ITERATIONS, CheckpointPolicy, FusionConfig
from hpo.config.trainable_lookup import ResolvedTrainable, resolve_trainable
from hpo.engines._base import SweepEngine, TuneRun
from hpo.engines.choice import engine_for
from hpo.engines.stop_thresholds import directed_stop
from hpo.reporting.dashboard_actor import ControllerCallback, start_controller
from hpo.reporting.results_files import ended
from hpo.reporting.sweep_result import SweepResult, saved_ended_trials
from hpo.reporting.trial_errors import TrialErrorCallback
from hpo.reporting.trial_output import with_trial_output
from hpo.tuner.atomic_storage import atomic_local_filesystem, is_local_path, one_copying_thread
from hpo.tuner.stop_signal import StopRequest, stop_signals
from hpo.tuner.run_folders import claim_run_name, release_claim, verify_run_state
from hpo.tuner.trial_memory import ReleaseFinishedWindows

if TYPE_CHECKING:
    from hpo.base.workload import Workload

# A sweep of a function trainable never imports torch in the driver (about 2 s on 2 cores, 20 s on a
# loaded box, paid again by every `hpo run --resume`): the Workload engines load where they are used.
Trainable = Union["Workload", Callable[..., Any], str, ResolvedTrainable]


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
        fusion: FusionConfig | Mapping[str, Any] | None = None,
        checkpoint: CheckpointPolicy | Mapping[str, Any] | None = None,
        search_seed: int | None = None,
    ):
        if isinstance(trainable, str):
            trainable = resolve_trainable(trainable)
        elif not isinstance(trainable, ResolvedTrainable):  # a sweep file's comes resolved (`build_tuner`)
            trainable = ResolvedTrainable.of(trainable)
        if tune_config is not None and tune_config.metric and tune_config.mode not in ("min", "max"):
            # Tune's get_best_result refuses to guess too; guessing 'min' ranked an accuracy backwards
            raise ValueError(f"mode: give mode='min' or mode='max' with metric={tune_config.metric!r}, got {tune_config.mode!r}")
        self.trainable = trainable.obj
        self.checkpoint = _checkpoint_policy(checkpoint, (tune_config or tune.TuneConfig()).scheduler)
        self.param_space = dict(param_space or {})
        self.tune_config = tune_config or tune.TuneConfig()
        self.run_config = _atomic_local_storage(run_config or tune.RunConfig())
        self.resources = dict(resources or {"cpu": 1})
        #: The run folder of the last `fit` or `resume`, once it is chosen (before Tune starts).
        self.run_path: Path | None = None
        self.engine: SweepEngine = engine_for(
            trainable, self.param_space, self.tune_config, self.run_config, self.resources, self.checkpoint,
            self.max_iterations, self.storage / self.name, scaling, _fusion_config(fusion), search_seed,
        )

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

    def _start(self) -> TuneRun:
        """The sweep's controller, then its engine's run: what Tune is given, and every actor the
        sweep owns (the controller first). Whichever engine built the trainable, every line a trial
        prints carries the trial's id."""
        self._refuse_resources_beyond_any_node()
        metric = self.tune_config.metric
        controller = start_controller(self.name, metric, self.mode) if metric else None
        if metric:  # the sweep ends with a plot of the metric
            figures.import_meanwhile()
        callbacks = list(self.run_config.callbacks or [])
        if metric and not any(isinstance(cb, ControllerCallback) for cb in callbacks):
            callbacks.append(ControllerCallback(self.name, metric, self.mode))
        if not any(isinstance(cb, TrialErrorCallback) for cb in callbacks):
            callbacks.append(TrialErrorCallback(verbose=0))  # a failure repeated before any result is not retried
        callbacks.append(ReleaseFinishedWindows())
        run_config = replace(self.run_config, name=self.name, callbacks=callbacks)
        run = self.engine.start(self.storage / self.name, self.tune_config, run_config)
        run_config = replace(run.run_config, stop=directed_stop(run.run_config.stop, metric, self.mode))
        if isinstance(self.tune_config.scheduler, PopulationBasedTraining):
            # its exploit step hands a trial another's newest checkpoint, restored only once that trial
            # runs again: a limit on what is kept had deleted it by then, and the trial errored
            run_config = replace(run_config, checkpoint_config=replace(run_config.checkpoint_config, num_to_keep=None))
        return replace(run, trainable=with_trial_output(run.trainable), run_config=run_config,
                       actors=[controller, *run.actors])

    def _refuse_resources_beyond_any_node(self) -> None:
        """A trial asking for more CPUs or GPUs than any node of the Ray has would wait forever:
        Tune only warns, and its warnings are kept off hpo's console, so the sweep hung without a
        word. Refused as `hpo run` refuses it, once Ray is up (a cluster's nodes, or the local Ray)."""
        capacity = largest_node()
        for kind in ("cpu", "gpu"):
            wanted = float(self.resources.get(kind, self.resources.get(kind.upper(), 0)))
            if beyond := beyond_capacity(kind, wanted, capacity, "the largest node of this Ray"):
                raise ValueError(f"resources: {beyond}")

    def fit(self) -> SweepResult:
        """Run the sweep in a new run folder: a name already on disk gets the next versioned one."""
        name = claim_run_name(self.storage, self.name)
        if name != self.name:
            print(f"{self.storage / self.name} holds an earlier run; this run is {self.storage / name}", flush=True)
            self.run_config = replace(self.run_config, name=name)
        self.run_path = self.storage / name
        try:
            with self._process_settings():
                ensure_ray()
                run = self._start()
                tuner = tune.Tuner(run.trainable, param_space=run.param_space, tune_config=run.tune_config,
                                   run_config=run.run_config)
                return self._fit(tuner, run)
        except BaseException:
            release_claim(self.run_path)  # refused before Tune wrote anything: no folder left behind
            raise

    def resume(self, path: str) -> SweepResult:
        """Continue an interrupted sweep stored at `path`: finished trials are kept, not re-run.

        A damaged run state is refused (`RunStateError`, naming the file) rather than started over.
        """
        self.run_path = Path(path)
        verify_run_state(self.run_path)
        self.run_config = replace(self.run_config, name=self.run_path.name, storage_path=str(self.run_path.parent))
        with self._process_settings():
            ensure_ray()
            run = self._start()
            tuner = tune.Tuner.restore(
                path,
                storage_filesystem=self.run_config.storage_filesystem,
                trainable=run.trainable,
                param_space=run.param_space,
                resume_unfinished=True,
                resume_errored=True,
            )
            return self._fit(tuner, run)

    def _fit(self, tuner: tune.Tuner, run: TuneRun) -> SweepResult:
        """Tune's fit, which SIGTERM stops as Ctrl-C does, as the sweep's result."""
        started = time.monotonic()
        with stop_signals() as stop:
            grid = tuner.fit()
        return self._wrap(grid, run.actors, started, stop)

    @contextmanager
    def _process_settings(self) -> Iterator[None]:
        """What the sweep sets for the whole process while it runs (Tune's save period, pyarrow's IO
        pool for the atomic storage), each put back as it was when the sweep returns or raises."""
        with scoped_environ(self._save_period()), one_copying_thread(self.run_config.storage_filesystem):
            yield

    def _save_period(self) -> dict[str, str]:
        """How often Tune saves the sweep's state, chosen by what a save costs (see
        `PROMPT_SAVE_MAX_TRIALS`); a user's own TUNE_GLOBAL_CHECKPOINT_S wins.

        A trial's row in results.csv and its progress line wait for the save that records its end
        (what they call finished is final: a driver killed before that save would see `--resume`
        run the trial again), so the period is also how late a row can be, and how much of a
        running trial's work past its last recorded checkpoint a driver crash costs."""
        if SAVE_PERIOD_ENV in os.environ:
            return {}
        trials = expected_trials(self.param_space, self.tune_config.num_samples)
        return {SAVE_PERIOD_ENV: PROMPT_SAVE_PERIOD_S} if trials <= PROMPT_SAVE_MAX_TRIALS else {}

    def _wrap(self, grid: tune.ResultGrid, actors: list[Any], started: float, stop: StopRequest) -> SweepResult:
        """The sweep's result; `stop`: whether a stop signal arrived while Tune ran."""
        result = self.engine.result(grid)
        budget = self.tune_config.time_budget_s
        if isinstance(budget, timedelta):
            budget = budget.total_seconds()
        planned = expected_trials(self.param_space, self.tune_config.num_samples)
        out_of_time = budget is not None and time.monotonic() - started >= budget
        if out_of_time:
            result.out_of_time(budget, planned)
        elif stop.received or (not stop.watched and not all(ended(trial) for trial in grid)):
            # Tune returns from a stop as if the sweep had finished; without one its loop ends only
            # once every trial has ended (a trial HyperBand stopped while paused has no `done` in
            # its last result, and Tune's saved state may still call it PAUSED: Tune does not
            # mark a trial without an actor for its next save when it stops it). After a stop
            # the saved state, read only then (90 MB at 10,000 trials), says which trials ended:
            # those `--resume` will not run again; a stop that landed after every trial Tune had
            # made ended still cut the sweep short unless every planned row is there.
            tune_ended = saved_ended_trials(Path(grid.experiment_path))
            if len(result.records) < planned or not all(ended(trial, tune_ended) for trial in grid):
                result.stopped_early(tune_ended)
        self.engine.complete(result)  # told whether the sweep ended: a stopped one trains no target
        # Holding the handle keeps `hpo:sweep:<name>` alive (and in the dashboard) while the result lives.
        result.controller = actors[0]
        result.actors = actors
        if self.tune_config.metric:
            result.paths = result.write()  # the same files the CLI writes, wherever the sweep ran from
        return result


#: Tune's setting of its save period: seconds, or "auto" (its default).
SAVE_PERIOD_ENV = "TUNE_GLOBAL_CHECKPOINT_S"
#: Sweeps of at most this many trials save their state every `PROMPT_SAVE_PERIOD_S` seconds. A save
#: writes every trial's state (about 10 KB a trial), so up to here it takes a few milliseconds and a
#: save a second costs about 1% of the driver; rows and progress lines then follow a trial's end
#: within a second. Larger sweeps keep Tune's own rule ("auto": every max(10 s, 19 x the last save's
#: time), under 5% of the driver's time however large the sweep grows): a period of a second
#: rewrote a 1000-trial sweep's 10 MB state every second, ten times the bytes plain Tune writes.
PROMPT_SAVE_MAX_TRIALS = 100
PROMPT_SAVE_PERIOD_S = "1"


def expected_trials(param_space: Mapping[str, Any], num_samples: int) -> float:
    """How many trials a sweep of `num_samples` over `param_space` runs at most: each sample is
    every combination of the space's grid searches (`inf` for `num_samples=-1`)."""
    if num_samples < 0:
        return math.inf
    return num_samples * grid_size(param_space)


def grid_size(space: Any) -> int:
    """How many configurations one sample of `space` expands to: the product of its grid searches."""
    if isinstance(space, Mapping):
        if set(space) == {"grid_search"}:
            return len(space["grid_search"])
        return math.prod(grid_size(value) for value in space.values())
    return 1


def _atomic_local_storage(run_config: tune.RunConfig) -> tune.RunConfig:
    """Local storage is written file by file atomically (`hpo.tuner.atomic_storage`), whichever
    way the sweep was asked for (a sweep file, `hpo.run`, or this Tuner with the user's own
    `RunConfig`): a killed driver or a full disk never leaves a torn tuner.pkl or experiment
    state behind, and `--resume` never meets one. A filesystem the user chose is kept."""
    if run_config.storage_filesystem is None and is_local_path(run_config.storage_path):
        return replace(run_config, storage_filesystem=atomic_local_filesystem())
    return run_config


def _fusion_config(fusion: FusionConfig | Mapping[str, Any] | None) -> FusionConfig | None:
    """The fusion block as given in Python: a FusionConfig, or its keys as a dict, as `checkpoint=`
    and `logging=` take theirs (a dict was read as a FusionConfig and failed on `.enabled`)."""
    return fusion if fusion is None or isinstance(fusion, FusionConfig) else checked_block(FusionConfig, fusion, "fusion")


def _checkpoint_policy(checkpoint: CheckpointPolicy | Mapping[str, Any] | None, scheduler: Any) -> CheckpointPolicy:
    """The sweep's checkpoint policy. Schedulers that pause trials (HyperBand, PBT) resume them
    from their last checkpoint, so under them every iteration is checkpointed."""
    policy = checkpoint if isinstance(checkpoint, CheckpointPolicy) else checked_block(CheckpointPolicy, checkpoint or {}, "checkpoint")
    if isinstance(scheduler, (HyperBandScheduler, PopulationBasedTraining)) and policy.every != 1:
        return policy.model_copy(update={"every": 1})
    return policy
