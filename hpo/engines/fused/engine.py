"""How a sweep with `fusion:` runs: group size, group slots, the pieces Tune is given, and the
Tuner's engine for each placement (`FusedEngine` on the sweep's devices, `BubbleEngine` in
pipeline bubbles)."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import ray
from ray import tune
from ray.tune.logger import LoggerCallback, TBXLoggerCallback

from fusion.broker import start_broker
from hpo.reporting.dashboard_actor import ControllerCallback
from hpo.engines.fused.members import GROUP_DIR_PREFIX, MemberBook, MemberTrial
from hpo.engines.fused.scheduler import GroupScheduler
from hpo.base.actor_names import NAMESPACE, broker_name
from hpo.engines.bubbles.relay_trial import MEMBER_TRIAL_RESOURCES, FusionCallback, fused_member_trainable
from hpo.reporting.progress import ProgressCallback
from hpo.reporting.results_files import SweepResult, results_file_callback
from hpo.config.spec import CheckpointPolicy, FusionConfig
from hpo.base.workload import Workload

logger = logging.getLogger(__name__)

#: `max_members: auto` never fuses more than this, however much memory is free.
AUTO_MAX_MEMBERS = 128


def largest_config(workload: Workload, param_space: Mapping[str, Any]) -> dict[str, Any]:
    """A config as large as any the space can produce: constants, and the largest value of each
    numeric categorical (widths); sampled hyperparameters don't change memory and keep defaults."""
    config: dict[str, Any] = {}
    for key, value in param_space.items():
        if isinstance(value, dict) and "grid_search" in value:
            value = value["grid_search"]
        elif hasattr(value, "categories"):
            value = list(value.categories)
        elif hasattr(value, "sampler"):
            continue
        if isinstance(value, list):
            numeric = [v for v in value if isinstance(v, (int, float)) and not isinstance(v, bool)]
            value = max(numeric) if len(numeric) == len(value) else value[0]
        config[key] = value
    return workload.resolve(config)


def group_size(
    workload: Workload, fusion: FusionConfig, group_resources: Mapping[str, float], param_space: Mapping[str, Any]
) -> int:
    """B: the configured number, or one measured where the groups will run (`max_members: auto`)."""
    if fusion.max_members != "auto":
        return int(fusion.max_members)
    from fusion.sizing import choose_num_members

    device = "cuda" if group_resources.get("gpu", 0) > 0 else "cpu"
    measure = ray.remote(choose_num_members).options(
        num_cpus=group_resources.get("cpu", 1), num_gpus=group_resources.get("gpu", 0)
    )
    decision = ray.get(
        measure.remote(workload, largest_config(workload, param_space), device=device, max_members=AUTO_MAX_MEMBERS)
    )
    logger.info("%s", decision)
    print(decision, flush=True)
    return decision.num_members


def group_slots(group_resources: Mapping[str, float]) -> int:
    """How many fused groups the cluster can train at once."""
    total = ray.cluster_resources()
    gpus = group_resources.get("gpu", 0)
    if gpus > 0:
        return max(1, int(total.get("GPU", 0) // gpus))
    return max(1, int(total.get("CPU", 1) // max(group_resources.get("cpu", 1), 1e-3)))


@dataclass
class FusedSweep:
    """What Tune is given to run a sweep as fused groups (see `hpo.engines.fused.members`)."""

    book: MemberBook
    trainable: Any
    search_alg: Any
    scheduler: GroupScheduler
    checkpoint_config: Any
    callback: Any
    members_per_group: int

    @staticmethod
    def group_dirname(trial: Any) -> str:
        return f"{GROUP_DIR_PREFIX}{trial.trial_id}"


def fused_sweep(
    experiment: Path,
    workload: Workload,
    members_per_group: int,
    resources: Mapping[str, float],
    param_space: Mapping[str, Any],
    tune_config: Any,
    max_iterations: int,
    checkpoint: CheckpointPolicy,
    dtype: str,
    slots: int,
    seed: int | None = None,
    verify: bool = True,
    compile: str = "auto",
) -> FusedSweep:
    """Group trials of up to `members_per_group` configurations; the user's searcher (or the
    grid/random expansion of `param_space`) and scheduler act on each member.

    When the sweep's size is known, groups are made no larger than it takes to give each of the
    `slots` group slots one: sixteen configurations on two slots train as two groups of eight at
    once, not one group of sixteen beside an idle slot. Either way, and when the user's searcher
    hands out fewer configurations at a time than a group holds (its `ConcurrencyLimiter`), one
    line says how large the groups will be and why."""
    from ray import tune
    from ray.tune.search import BasicVariantGenerator, ConcurrencyLimiter

    from fusion.grouping import structural_signature
    from hpo.engines.fused.group_trial import fused_group_trainable, group_checkpoint_config
    from hpo.engines.fused.search import ConfigList, GroupSearcher

    metric, mode = tune_config.metric, tune_config.mode or "min"
    book = MemberBook(experiment, workload.name)
    search_alg = tune_config.search_alg
    if search_alg is None or isinstance(search_alg, BasicVariantGenerator):
        inner, num_samples = ConfigList(param_space, tune_config.num_samples, seed), None
        size = len(inner.configs)
    else:
        inner, num_samples = search_alg, tune_config.num_samples
        size = num_samples if num_samples > 0 else None
    measured, why = members_per_group, ""
    if size and math.ceil(size / slots) < members_per_group:
        members_per_group = max(1, math.ceil(size / slots))
        why = f"{size} configurations over {slots} group slot{'s' if slots > 1 else ''}"
    if isinstance(search_alg, ConcurrencyLimiter) and search_alg.max_concurrent < members_per_group:
        members_per_group = search_alg.max_concurrent
        why = (f"the searcher's ConcurrencyLimiter(max_concurrent={members_per_group}) suggests no more at a time; "
               "with fusion, max_concurrent_trials limits groups, so the limiter can go")
    if why:
        print(f"fusion: groups of up to {members_per_group} members, not {measured}: {why}", flush=True)
    searcher = GroupSearcher(
        inner, param_space, members_per_group, lambda config: structural_signature(workload.resolve(config)),
        book, num_samples, metric, mode,
    )
    # Tune hands a searcher the search space only with a non-empty param_space, and its own is
    # empty (groups are suggested whole): the user's searcher gets the real space here.
    searcher.set_search_properties(metric, mode, {})
    gpus = resources.get("gpu", 0)
    trainable = fused_group_trainable(
        workload, experiment, metric, mode, max_iterations,
        threads=max(1, int(resources.get("cpu", 1))), device="cuda" if gpus > 0 else "cpu", dtype=dtype,
        checkpoint_every=checkpoint.every, checkpoint_at_end=checkpoint.at_end, verify=verify,
        compile=compile,
    )
    return FusedSweep(
        book=book,
        trainable=tune.with_resources(trainable, dict(resources)),
        search_alg=searcher,
        scheduler=GroupScheduler(tune_config.scheduler, book, max_iterations),
        checkpoint_config=group_checkpoint_config(checkpoint.every, checkpoint.at_end),
        callback=member_results_callback(book, experiment, metric, mode, max_iterations),
        members_per_group=members_per_group,
    )


def member_callbacks(book: MemberBook, callbacks: list[Any]) -> list[Any]:
    """The Tune callbacks that replay each group event as its members' events to `callbacks`
    (the progress line, the dashboard's controller, the results files, and Tune's logger
    callbacks: TensorBoard, MLflow, W&B, a user's own), so they count, show and log
    configurations, not groups. Each member's end is announced once, whichever group event
    follows it.

    Tune adds a TensorBoard logger of its own unless it is given one, and that one would log each
    group as a run; so a `MemberTensorBoard`, which logs only members, takes the place of any
    plain `TBXLoggerCallback` and is given to Tune beside the replaying callback.
    """
    from ray.tune import Callback

    callbacks = [cb for cb in callbacks if type(cb) is not TBXLoggerCallback]
    tensorboard = _member_tensorboard()
    if tensorboard is not None:
        callbacks.append(tensorboard)

    class MemberCallbacks(Callback):
        def __init__(self) -> None:
            self.started: set[str] = set()  # members whose start the loggers heard of

        def setup(self, **info: Any) -> None:
            for callback in callbacks:
                callback.setup(**info)

        def _members(self) -> list[Any]:
            return list(book.members.values())

        def on_step_begin(self, iteration: int, trials: list, **info: Any) -> None:
            for callback in callbacks:
                callback.on_step_begin(iteration, self._members(), **info)

        def on_step_end(self, iteration: int, trials: list, **info: Any) -> None:
            for callback in callbacks:
                callback.on_step_end(iteration, self._members(), **info)

        def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            for member in book.group(trial.trial_id):
                if member.live:
                    self.started.add(member.trial_id)
                    for callback in callbacks:
                        callback.on_trial_start(iteration, self._members(), member, **info)

        def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
            book.record_group_result(result)  # the group's last result reaches no scheduler first
            members = self._members()
            for member in book.group(trial.trial_id):
                if member.last_result.get("training_iteration") == result.get("training_iteration"):
                    for callback in callbacks:
                        callback.on_trial_result(iteration, members, member, member.last_result, **info)
            self._announce_ended(iteration)

        def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            self._announce_ended(iteration)

        def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            self._announce_ended(iteration)

        def _announce_ended(self, iteration: int) -> None:
            ended = book.take_ended()
            members = self._members() if ended else []
            for member in ended:
                for callback in callbacks:
                    if isinstance(callback, (LoggerCallback, ProgressCallback)) and member.trial_id not in self.started:
                        continue  # ended in an earlier run of a resumed sweep: no run to close, no line to print
                    if member.ended == "error":
                        callback.on_trial_error(iteration, members, member)
                    else:
                        callback.on_trial_complete(iteration, members, member)

        def on_experiment_end(self, trials: list, **info: Any) -> None:
            for callback in callbacks:
                callback.on_experiment_end(self._members(), **info)

    return [MemberCallbacks(), *([tensorboard] if tensorboard is not None else [])]


def _member_tensorboard() -> Any:
    """Tune's TensorBoard logger for members only (None where tensorboardX is not installed, as
    Tune then adds none either): event files in each member's folder, none in the groups'."""
    class MemberTensorBoard(TBXLoggerCallback):
        def log_trial_start(self, trial: Any) -> None:
            if isinstance(trial, MemberTrial):
                super().log_trial_start(trial)

        def log_trial_result(self, iteration: int, trial: Any, result: dict) -> None:
            if isinstance(trial, MemberTrial):
                super().log_trial_result(iteration, trial, result)

        def log_trial_end(self, trial: Any, failed: bool = False) -> None:
            if isinstance(trial, MemberTrial):
                super().log_trial_end(trial, failed)

    try:
        return MemberTensorBoard()
    except ImportError:
        return None


def member_results_callback(book: MemberBook, experiment: Path, metric: str, mode: str, max_iterations: int) -> Any:
    """Rewrites `results.csv` and `summary.json` (one row per member) after each step of Tune's
    controller in which members ended (a per-member callback: see `member_callbacks`).

    Once per step, not once per member: a group's members mostly end together, and each rewrite
    reads every member's folder, so writing per member cost a sweep of N configurations N times N
    folder reads and 2N fsyncs on the driver's thread, between the groups' steps."""
    from ray.tune import Callback

    from hpo.reporting.results_files import write_run_files

    class MemberResultsCallback(Callback):
        def __init__(self) -> None:
            self.members_ended = False

        def _write(self) -> None:
            self.members_ended = False
            write_run_files(experiment, book.records(), metric, mode, max_iterations)

        def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            self.members_ended = True

        def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            self.members_ended = True

        def on_step_end(self, iteration: int, trials: list, **info: Any) -> None:
            if self.members_ended:
                self._write()

        def on_experiment_end(self, trials: list, **info: Any) -> None:
            if self.members_ended:
                self._write()

    return MemberResultsCallback()


class FusedEngine:
    """A sweep fused on the sweep's own devices: Tune runs groups of up to B configurations, one
    process each, and its searcher and scheduler stand for the user's, which act on every member.

    `start` measures B (`max_members: auto` trains a dry run where the groups will run) and builds
    what Tune is given, so it needs Ray up and comes before the other calls."""

    def __init__(
        self,
        workload: Workload,
        fusion: FusionConfig,
        resources: Mapping[str, float],
        param_space: Mapping[str, Any],
        tune_config: Any,
        max_iterations: int,
        checkpoint: CheckpointPolicy,
        search_seed: int | None = None,
    ):
        self.workload, self.fusion, self.resources = workload, fusion, dict(resources)
        self.user_space, self.user_tune_config = dict(param_space), tune_config
        self.max_iterations, self.checkpoint, self.search_seed = max_iterations, checkpoint, search_seed
        self._sweep: FusedSweep | None = None

    @property
    def sweep(self) -> FusedSweep:
        if self._sweep is None:
            raise RuntimeError("FusedEngine.start(experiment) builds the sweep's groups; call it first")
        return self._sweep

    def start(self, experiment: Path) -> list[Any]:
        members = group_size(self.workload, self.fusion, self.resources, self.user_space)
        self._sweep = fused_sweep(
            experiment, self.workload, members, self.resources, self.user_space, self.user_tune_config,
            self.max_iterations, self.checkpoint, self.fusion.dtype, self.slots(), self.search_seed,
            verify=self.fusion.verify, compile=self.fusion.compile,
        )
        return []

    def slots(self) -> int:
        """Groups trained at once: one per `resources` the cluster holds, at most `max_concurrent_trials`.
        With fusion the limit counts groups, the trials Tune runs; how many configurations share one
        is the fused engine's to decide, so a limit meant for unfused trials never shrinks groups."""
        slots, limit = group_slots(self.resources), self.user_tune_config.max_concurrent_trials
        return min(slots, limit) if limit else slots

    def trainable(self) -> Any:
        return self.sweep.trainable

    def param_space(self) -> dict[str, Any]:
        return {}  # groups are suggested whole by the group searcher, which holds the real space

    def tune_config(self, tune_config: Any) -> Any:
        """As many groups at once as there are group slots (`slots`)."""
        return replace(
            tune_config,
            search_alg=self.sweep.search_alg,
            scheduler=self.sweep.scheduler,
            num_samples=-1,
            max_concurrent_trials=self.slots(),
            trial_dirname_creator=self.sweep.group_dirname,
        )

    def run_config(self, run_config: Any) -> Any:
        """Progress, the dashboard and the results files count configurations: they hear of each
        member's events, not of the groups Tune runs."""
        callbacks = list(run_config.callbacks or [])
        per_member = [cb for cb in callbacks if isinstance(cb, (ControllerCallback, ProgressCallback, LoggerCallback))]
        callbacks = [cb for cb in callbacks if all(cb is not p for p in per_member)]
        callbacks += member_callbacks(self.sweep.book, [*per_member, self.sweep.callback])
        return replace(run_config, callbacks=callbacks, checkpoint_config=self.sweep.checkpoint_config)

    def result(self, grid: Any, metric: str, mode: str, iterations: int | None) -> SweepResult:
        """The members of the groups Tune ran (restored ones included), one result each."""
        groups = {Path(r.path).name.removeprefix(GROUP_DIR_PREFIX) for r in grid}
        return self.sweep.book.result(grid, metric, mode, iterations, groups)


class BubbleEngine:
    """A sweep fused into pipeline jobs' bubbles: one light relay Tune trial per configuration
    (`hpo.engines.bubbles.relay_trial`); the broker forms groups and the bubble pool trains them outside Tune.

    `start` starts the broker (B is measured first with `max_members: auto`); the other calls
    come after it."""

    def __init__(
        self,
        workload: Workload,
        fusion: FusionConfig,
        resources: Mapping[str, float],
        param_space: Mapping[str, Any],
        max_iterations: int,
        metric: str | None,
        mode: str,
    ):
        self.workload, self.fusion, self.resources = workload, fusion, dict(resources)
        self.user_space, self.max_iterations, self.metric, self.mode = dict(param_space), max_iterations, metric, mode
        self._experiment: Path | None = None
        self.members_per_group = 0

    @property
    def experiment(self) -> Path:
        if self._experiment is None:
            raise RuntimeError("BubbleEngine.start(experiment) starts the sweep's broker; call it first")
        return self._experiment

    def start(self, experiment: Path) -> list[Any]:
        from pipeline_bubble.bubble_pool import bubble_group_launcher  # torch: only sweeps that lend bubbles

        self._experiment = experiment
        self.members_per_group = group_size(self.workload, self.fusion, self.resources, self.user_space)
        launcher = bubble_group_launcher(experiment.name, self.workload, self.max_iterations, self.fusion.dtype, self.fusion.verify)
        return [start_broker(broker_name(experiment.name), NAMESPACE, self.workload, self.members_per_group, launcher)]

    def trainable(self) -> Any:
        relay = fused_member_trainable(self.experiment.name, self.max_iterations)
        return tune.with_resources(relay, MEMBER_TRIAL_RESOURCES)

    def param_space(self) -> dict[str, Any]:
        return self.user_space

    def tune_config(self, tune_config: Any) -> Any:
        """Enough member trials at once to fill every lending stage with a full group."""
        if tune_config.max_concurrent_trials:
            return tune_config
        from pipeline_bubble.bubble_pool import lending_stages

        return replace(tune_config, max_concurrent_trials=self.members_per_group * max(1, lending_stages()))

    def run_config(self, run_config: Any) -> Any:
        callbacks = list(run_config.callbacks or [])
        if self.metric:
            callbacks.append(results_file_callback(self.experiment, self.metric, self.mode, self.max_iterations))
        callbacks.append(FusionCallback(self.experiment.name))
        return replace(run_config, callbacks=callbacks)

    def result(self, grid: Any, metric: str, mode: str, iterations: int | None) -> SweepResult:
        return SweepResult(grid, metric, mode, iterations)
