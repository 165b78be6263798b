"""`hpo.Tuner` mirrors `ray.tune.Tuner` (and `hpo.run`, in `hpo.tuner.sweep`, mirrors `tune.run`).

It accepts what Tune accepts (a function trainable, Tune domains, Tune searchers and schedulers)
and additionally a `Workload`, which unlocks muP scaling and trial fusion. It returns a
`SweepResult`; Ray's own `ResultGrid` stays reachable as `result.result_grid`. What differs
between plain, fused and scaled sweeps is one `SweepEngine`, chosen when the Tuner is built.

Where a sweep's run lives on disk is decided here too. A run is never overwritten: a second
sweep under a name already on disk gets the next free versioned folder (`name-2`, `name-3`, ...),
and `--resume` continues the newest of them. Before Tune reads a stored run back, its experiment
state is checked, so a torn write (a full disk, a killed driver) is refused with the damaged file
named instead of silently starting over.

Example::

    import hpo
    from ray import tune
    tuner = hpo.Tuner("mlp_digits", param_space={"lr": tune.loguniform(1e-4, 1e-1)},
                      tune_config=tune.TuneConfig(metric="val_loss", mode="min", num_samples=8))
    print(tuner.fit().best_config)
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from datetime import timedelta
from pathlib import Path
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol, Union, runtime_checkable

from ray import tune
from ray.tune.schedulers import FIFOScheduler, HyperBandScheduler, PopulationBasedTraining

from hpo.base.checkpointing import checkpoints_to_keep
from hpo.reporting.dashboard_actor import ControllerCallback, start_controller
from hpo.base.ray_runtime import ensure_ray
from hpo.reporting.results_files import SweepResult, ended, results_file_callback
from hpo.base.scoped_environ import scoped_environ
from hpo.config.spec import DEFAULT_MAX_ITERATIONS, CheckpointPolicy, FusionConfig
from hpo.config.trainable_lookup import is_workload, resolve_trainable
from hpo.reporting.trial_errors import TrialErrorCallback
from hpo.reporting.trial_output import with_trial_output
from hpo.reporting.tune_state import DAMAGED, STATE_PATTERN, newest_state, state_files, trial_entries

if TYPE_CHECKING:
    from hpo.base.workload import Workload

# A sweep of a function trainable never imports torch in the driver (about 2 s on 2 cores, 20 s on a
# loaded box, paid again by every `hpo run --resume`): the Workload engines load where they are used.
Trainable = Union["Workload", Callable[..., Any], str]


@runtime_checkable
class SweepEngine(Protocol):
    """How one mode runs a sweep in Tune; the `Tuner` composes one, chosen when it is built.

    The modes: plain trials (`PlainEngine`), fused groups that are Tune's trials
    (`hpo.engines.fused.engine.FusedEngine`), fused groups in pipeline bubbles with a relay trial per
    configuration (`hpo.engines.fused.engine.BubbleEngine`), and a muP proxy sweep around any of those
    (`hpo.engines.scaled.ScaledEngine`). `start` comes first: what it starts (Ray must be up) is
    what the other calls hand to Tune.
    """

    def start(self, experiment: Path) -> list[Any]:
        """Start what the mode needs before Tune runs; the actors returned live as long as the result."""

    def trainable(self) -> Any:
        """The trainable Tune runs, with its per-trial resources."""

    def param_space(self) -> dict[str, Any]:
        """The search space Tune is given."""

    def tune_config(self, tune_config: tune.TuneConfig) -> tune.TuneConfig:
        """The sweep's TuneConfig as this mode hands it to Tune (searcher, scheduler, concurrency)."""

    def run_config(self, run_config: tune.RunConfig) -> tune.RunConfig:
        """The sweep's RunConfig with the mode's callbacks (results files, relays) and checkpointing."""

    def result(self, grid: tune.ResultGrid, metric: str, mode: str, iterations: int | None) -> SweepResult:
        """Tune's grid as the sweep's result: one result per configuration."""


class PlainEngine:
    """Every configuration is a Tune trial of its own; a `Workload` trains as `hpo.engines.workload_trial` says."""

    def __init__(
        self,
        trainable: Workload | Callable[..., Any],
        resources: Mapping[str, float],
        param_space: Mapping[str, Any],
        max_iterations: int,
        checkpoint: CheckpointPolicy,
        metric: str | None,
        mode: str,
        iterations: int | None,
    ):
        self.user_trainable, self.resources, self.user_space = trainable, dict(resources), dict(param_space)
        self.max_iterations, self.checkpoint = max_iterations, checkpoint
        self.metric, self.mode, self.iterations = metric, mode, iterations
        self.experiment: Path | None = None

    def start(self, experiment: Path) -> list[Any]:
        self.experiment = experiment
        return []

    def trainable(self) -> Any:
        trainable = self.user_trainable
        if is_workload(trainable):
            from hpo.engines.workload_trial import workload_trainable

            trainable = workload_trainable(
                trainable, self.max_iterations, threads=max(1, int(self.resources.get("cpu", 1))),
                checkpoint_every=self.checkpoint.every, checkpoint_at_end=self.checkpoint.at_end,
            )
        return tune.with_resources(trainable, dict(self.resources))

    def param_space(self) -> dict[str, Any]:
        return self.user_space

    def tune_config(self, tune_config: tune.TuneConfig) -> tune.TuneConfig:
        return tune_config

    def run_config(self, run_config: tune.RunConfig) -> tune.RunConfig:
        """Every trial's row in `results.csv` as soon as it ends; a Workload's checkpoints kept as
        `checkpoints_to_keep` says (a function trainable checkpoints as it likes)."""
        if is_workload(self.user_trainable):
            keep = checkpoints_to_keep(self.max_iterations, self.checkpoint.every, self.checkpoint.at_end)
            run_config = replace(run_config, checkpoint_config=replace(run_config.checkpoint_config, num_to_keep=keep))
        if not self.metric:
            return run_config
        if self.experiment is None:
            raise RuntimeError("PlainEngine.start(experiment) names the folder its results go to; call it first")
        callback = results_file_callback(self.experiment, self.metric, self.mode, self.iterations)
        return replace(run_config, callbacks=[*(run_config.callbacks or []), callback])

    def result(self, grid: tune.ResultGrid, metric: str, mode: str, iterations: int | None) -> SweepResult:
        return SweepResult(grid, metric, mode, iterations)


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
        self.trainable = resolve_trainable(trainable) if isinstance(trainable, str) else trainable
        self.checkpoint = _checkpoint_policy(checkpoint, (tune_config or tune.TuneConfig()).scheduler)
        self.param_space = dict(param_space or {})
        self.tune_config = tune_config or tune.TuneConfig()
        self.run_config = run_config or tune.RunConfig()
        self.resources = dict(resources or {"cpu": 1})
        #: The run folder of the last `fit` or `resume`, once it is chosen (before Tune starts).
        self.run_path: Path | None = None
        fusion = fusion if fusion is None or fusion.enabled else None
        if (scaling is not None or fusion is not None) and not is_workload(self.trainable):
            raise TypeError("scaling and fusion need a Workload trainable (model factory, data and loss kept apart): "
                            "docs/workload_guide.md shows how, from a Tune function")
        if fusion is not None and isinstance(self.tune_config.scheduler, PopulationBasedTraining):
            raise ValueError("fusion does not support PopulationBasedTraining: its exploit step copies one trial's "
                             "state into another, across fused groups; use ASHA or HyperBand, or turn fusion off")
        user_workload = self.trainable
        if scaling is not None:
            from hpo.engines import scaled as scaled_sweep  # muP is an optional extra (`hydro-hpo[mup]`): loaded by scaled sweeps only

            scaling = scaled_sweep.as_scaling_config(scaling)
            self.trainable = scaled_sweep.build_proxy(user_workload, scaling, self.param_space, self.storage / self.name)
        self.engine: SweepEngine = self._engine(fusion, search_seed)
        if scaling is not None:
            self.engine = scaled_sweep.ScaledEngine(
                self.engine, user_workload, scaling, self.tune_config.metric, self.mode, self.max_iterations
            )

    def _engine(self, fusion: FusionConfig | None, search_seed: int | None) -> SweepEngine:
        """The engine of the sweep's mode; a fused sweep expands grid and random spaces itself (`search_seed`)."""
        metric = self.tune_config.metric
        if fusion is None:
            return PlainEngine(
                self.trainable, self.resources, self.param_space, self.max_iterations, self.checkpoint,
                metric, self.mode, self._iterations(),
            )
        from hpo.engines.fused.engine import BubbleEngine, FusedEngine

        if fusion.placement == "bubbles":
            return BubbleEngine(self.trainable, fusion, self.resources, self.param_space, self.max_iterations, metric, self.mode)
        return FusedEngine(
            self.trainable, fusion, self.resources, self.param_space, self.tune_config, self.max_iterations,
            self.checkpoint, search_seed,
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

    def _tune_trainable(self) -> Any:
        """The Tune trainable this sweep runs, with its per-trial resources attached; whichever
        engine built it, every line a trial prints carries the trial's id."""
        return with_trial_output(self.engine.trainable())

    def _run_config(self) -> tune.RunConfig:
        metric = self.tune_config.metric
        callbacks = list(self.run_config.callbacks or [])
        if metric and not any(isinstance(cb, ControllerCallback) for cb in callbacks):
            callbacks.append(ControllerCallback(self.name, metric, self.mode))
        if not any(isinstance(cb, TrialErrorCallback) for cb in callbacks):
            callbacks.append(TrialErrorCallback(verbose=0))  # a failure repeated before any result is not retried
        stop = self.run_config.stop
        if is_workload(self.trainable) and stop is None:
            stop = {"training_iteration": self.max_iterations}
        return self.engine.run_config(replace(self.run_config, name=self.name, callbacks=callbacks, stop=stop))

    def _start_actors(self) -> list[Any]:
        """The sweep's controller and whatever its engine starts (a fused sweep's broker); the Tuner owns them."""
        metric = self.tune_config.metric
        controller = start_controller(self.name, metric, self.mode) if metric else None
        return [controller, *self.engine.start(self.storage / self.name)]

    def _tune_config(self) -> tune.TuneConfig:
        tune_config = self.tune_config
        if is_workload(self.trainable) and not tune_config.reuse_actors:
            # hydro-hpo's own trainables reset cleanly, so a trial process (and its torch import)
            # serves trial after trial instead of being started anew for each configuration.
            tune_config = replace(tune_config, reuse_actors=True)
        return self.engine.tune_config(tune_config)

    def fit(self) -> SweepResult:
        """Run the sweep in a new run folder: a name already on disk gets the next versioned one."""
        name = fresh_run_name(self.storage, self.name)
        if name != self.name:
            print(f"{self.storage / self.name} holds an earlier run; this run is {self.storage / name}", flush=True)
            self.run_config = replace(self.run_config, name=name)
        self.run_path = self.storage / name
        with scoped_environ(self._save_period()):
            ensure_ray()
            actors = self._start_actors()
            tuner = tune.Tuner(
                self._tune_trainable(),
                param_space=self.engine.param_space(),
                tune_config=self._tune_config(),
                run_config=self._run_config(),
            )
            started = time.monotonic()
            return self._wrap(tuner.fit(), actors, started)

    def resume(self, path: str) -> SweepResult:
        """Continue an interrupted sweep stored at `path`: finished trials are kept, not re-run.

        A damaged run state is refused (`RunStateError`, naming the file) rather than started over.
        """
        self.run_path = Path(path)
        verify_run_state(self.run_path)
        self.run_config = replace(self.run_config, name=self.run_path.name, storage_path=str(self.run_path.parent))
        with scoped_environ(self._save_period()):
            ensure_ray()
            actors = self._start_actors()
            tuner = tune.Tuner.restore(
                path,
                storage_filesystem=self.run_config.storage_filesystem,
                trainable=self._tune_trainable(),
                param_space=self.engine.param_space(),
                resume_unfinished=True,
                resume_errored=True,
            )
            started = time.monotonic()
            return self._wrap(tuner.fit(), actors, started)

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

    def _iterations(self) -> int | None:
        """Iterations a trial that was not stopped early runs; a trial with fewer is `early_stopped`.

        None when nothing says, and for a function trainable when nothing but the function could
        have ended it sooner (no scheduler that stops trials, no time budget, no other stop key):
        a function's own loop that ends before `max_iterations` has completed, not stopped early.
        """
        stop = self.run_config.stop
        if is_workload(self.trainable):
            return self.max_iterations
        if not (isinstance(stop, Mapping) and "training_iteration" in stop):
            return None
        scheduler = self.tune_config.scheduler
        stoppers = (scheduler is not None and type(scheduler) is not FIFOScheduler  # Tune's stopping ones subclass it
                    or self.tune_config.time_budget_s is not None or set(stop) != {"training_iteration"})
        return self.max_iterations if stoppers else None

    def _wrap(self, grid: tune.ResultGrid, actors: list[Any], started: float) -> SweepResult:
        metric = self.tune_config.metric or ""
        result = self.engine.result(grid, metric, self.mode, self._iterations())
        budget = self.tune_config.time_budget_s
        if isinstance(budget, timedelta):
            budget = budget.total_seconds()
        out_of_time = budget is not None and time.monotonic() - started >= budget
        if not out_of_time and not all(ended(trial) for trial in grid):
            result.stopped_early()  # Tune returns from a Ctrl-C as if the sweep had finished
        # Holding the handle keeps `hpo:sweep:<name>` alive (and in the dashboard) while the result lives.
        result.controller = actors[0]
        result.actors = actors
        if metric:
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


def _checkpoint_policy(checkpoint: CheckpointPolicy | Mapping[str, Any] | None, scheduler: Any) -> CheckpointPolicy:
    """The sweep's checkpoint policy. Schedulers that pause trials (HyperBand, PBT) resume them
    from their last checkpoint, so under them every iteration is checkpointed."""
    policy = checkpoint if isinstance(checkpoint, CheckpointPolicy) else CheckpointPolicy(**(checkpoint or {}))
    if isinstance(scheduler, (HyperBandScheduler, PopulationBasedTraining)) and policy.every != 1:
        return policy.model_copy(update={"every": 1})
    return policy


# ---- run folders ----------------------------------------------------------------------------
class RunStateError(RuntimeError):
    """A stored run that cannot be resumed as it is; the message names the file and the fix."""


def _versions(storage: Path, name: str) -> list[tuple[int, Path]]:
    found = []
    if (storage / name).exists():
        found.append((1, storage / name))
    pattern = re.compile(rf"{re.escape(name)}-(\d+)")
    if storage.is_dir():
        for path in storage.iterdir():
            match = pattern.fullmatch(path.name)
            if match:
                found.append((int(match.group(1)), path))
    return sorted(found)


def fresh_run_name(storage: Path, name: str) -> str:
    """`name`, or the next versioned name when a run of that name is already on disk."""
    versions = _versions(storage, name)
    if not versions or (versions == [(1, storage / name)] and not any((storage / name).iterdir())):
        return name
    return f"{name}-{versions[-1][0] + 1}"


def latest_run(storage: Path, name: str) -> Path | None:
    """The newest stored run of `name` (the one `--resume` continues), or None."""
    versions = _versions(storage, name)
    return versions[-1][1] if versions else None


def nothing_ran(path: Path) -> bool:
    """Whether a run folder holds neither a saved Tune state nor a trial's folder: a run stopped
    before it began, which loses nothing by being started again."""
    return not state_files(path) and not any(path.glob("*/params.json"))


def verify_run_state(path: Path) -> None:
    """Refuse a run whose Tune state is missing or damaged, naming the file; see RunStateError."""
    rebuild = f"rebuild its results from the trials' own folders with: hpo results {path} --rebuild"
    newest = newest_state(path)
    if newest is None:
        if nothing_ran(path):
            raise RunStateError(f"{path}: nothing ran in this run (it was stopped before Tune saved any state); "
                                "start the sweep again, without --resume")
        raise RunStateError(f"{path}: no {STATE_PATTERN}; this is not a resumable run ({rebuild})")
    try:
        trials = trial_entries(newest)
        for parts in trials:
            for part in parts:
                json.loads(part)
    except DAMAGED as exc:
        raise RunStateError(f"{newest}: damaged run state ({type(exc).__name__}: {exc}); {rebuild}") from None
    tuner = path / "tuner.pkl"
    if not tuner.exists() or tuner.stat().st_size == 0:
        raise RunStateError(f"{tuner}: missing or empty; {rebuild}")
    folders = len(list(path.glob("*/params.json")))
    if len(trials) < folders:  # an older state file, or one cut short: trials would be lost
        raise RunStateError(f"{newest}: lists {len(trials)} trials but {folders} trial folders exist; {rebuild}")
