"""How a sweep with `fusion:` runs on the sweep's own devices: the pieces Tune is given, built by
`FusedEngine` once Ray is up (group size and slots first, `hpo.engines.fused.group_size`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ray import tune
from ray.tune.logger import LoggerCallback

from hpo.config.spec import FusionConfig
from hpo.engines._base import SweepEngine, SweepPlan, TuneRun, workload_run_config, workload_tune_config
from hpo.engines.fused.callbacks import member_callbacks, member_results_callback
from hpo.engines.fused.group_size import group_size, group_slots
from hpo.engines.fused.members import GROUP_DIR_PREFIX, MemberBook
from hpo.engines.fused.scheduler import GroupScheduler
from hpo.engines.stop_thresholds import split_stop
from hpo.reporting.dashboard_actor import ControllerCallback
from hpo.reporting.progress import ProgressCallback
from hpo.reporting.sweep_result import SweepResult, saved_ended_trials


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
    #: The configurations the sweep trains, where known (a grid or random expansion, a searcher's
    #: `num_samples`): Tune's own count is of groups, unknown (-1) to it.
    configurations: int | None = None

    @staticmethod
    def group_dirname(trial: Any) -> str:
        return f"{GROUP_DIR_PREFIX}{trial.trial_id}"


class FusedEngine(SweepEngine):
    """A sweep fused on the sweep's own devices: Tune runs groups of up to B configurations, one
    process each, and its searcher and scheduler stand for the user's, which act on every member.

    `start` measures B (`max_members: auto` trains a dry run where the groups will run) and builds
    what Tune is given (`build`), so it needs Ray up."""

    def __init__(self, plan: SweepPlan, fusion: FusionConfig, search_seed: int | None = None):
        self.plan, self.fusion, self.search_seed = plan, fusion, search_seed
        self._sweep: FusedSweep | None = None

    @property
    def sweep(self) -> FusedSweep:
        if self._sweep is None:
            raise RuntimeError("FusedEngine.start(experiment, ...) builds the sweep's groups; call it first")
        return self._sweep

    def start(self, experiment: Path, tune_config: tune.TuneConfig, run_config: tune.RunConfig) -> TuneRun:
        """Groups are suggested whole by the group searcher, which holds the real space: Tune's is
        empty. The group's trial stops by Tune's counters only: a `stop` threshold on what members
        report is each member's (`GroupScheduler`)."""
        members = group_size(self.plan.trainable, self.fusion, self.plan.resources, self.plan.param_space)
        group_stop, thresholds, stopper = split_stop(run_config.stop)
        self._sweep = self.build(experiment, members, self.slots(), thresholds, stopper)
        return TuneRun(self._sweep.trainable, {}, self._tune_config(tune_config),
                       self._run_config(replace(run_config, stop=group_stop)))

    def build(self, experiment: Path, members_per_group: int, slots: int,
              thresholds: Mapping[str, float] | None = None, stopper: Any = None) -> FusedSweep:
        """Group trials of up to `members_per_group` configurations; the user's searcher (or the
        grid/random expansion of the space) and scheduler act on each member.

        When the sweep's size is known, groups are made no larger than it takes to give each of the
        `slots` group slots one: sixteen configurations on two slots train as two groups of eight at
        once, not one group of sixteen beside an idle slot. Either way, and when the user's searcher
        hands out fewer configurations at a time than a group holds (its `ConcurrencyLimiter`), one
        line says how large the groups will be and why. `thresholds` (the `stop` keys a member
        reports) end each member that reaches one; the user's `stopper` (a `Stopper` or stop
        function) is asked about each member's results."""
        from ray.tune.search import BasicVariantGenerator, ConcurrencyLimiter

        from fusion.grouping import structural_signature
        from hpo.engines.fused.group_trial import fused_group_trainable, group_checkpoint_config
        from hpo.engines.fused.search import ConfigList, GroupSearcher

        plan, fusion = self.plan, self.fusion
        workload, tune_config, checkpoint = plan.trainable, plan.tune_config, plan.checkpoint
        metric, mode = plan.metric, plan.mode
        book = MemberBook(experiment, workload.name)
        search_alg = tune_config.search_alg
        if search_alg is None or isinstance(search_alg, BasicVariantGenerator):
            variants = search_alg or BasicVariantGenerator(random_state=self.search_seed)
            inner, num_samples = ConfigList(plan.param_space, tune_config.num_samples, variants), None
            size = None if inner.endless else len(inner.configs)
        else:  # num_samples=-1: until the searcher finishes or the sweep is stopped, as Tune reads it
            inner = search_alg
            num_samples = size = tune_config.num_samples if tune_config.num_samples >= 0 else None
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
            inner, plan.param_space, members_per_group, lambda config: structural_signature(workload.resolve(config)),
            book, num_samples, metric, mode,
        )
        gpus = plan.resources.get("gpu", 0)
        trainable = fused_group_trainable(
            workload, experiment, metric, mode, plan.max_iterations,
            threads=max(1, int(plan.resources.get("cpu", 1))), device="cuda" if gpus > 0 else "cpu", dtype=fusion.dtype,
            checkpoint_every=checkpoint.every, checkpoint_at_end=checkpoint.at_end, verify=fusion.verify,
            compile=fusion.compile,
        )
        return FusedSweep(
            book=book,
            trainable=tune.with_resources(trainable, dict(plan.resources)),
            search_alg=searcher,
            scheduler=GroupScheduler(tune_config.scheduler, book, plan.max_iterations, thresholds, metric, mode, stopper),
            checkpoint_config=group_checkpoint_config(checkpoint.every, checkpoint.at_end),
            callback=member_results_callback(book, experiment, metric, mode, plan.max_iterations),
            members_per_group=members_per_group,
            configurations=size,
        )

    def slots(self) -> int:
        """Groups trained at once: one per `resources` the cluster holds, at most `max_concurrent_trials`.
        With fusion the limit counts groups, the trials Tune runs; how many configurations share one
        is the fused engine's to decide, so a limit meant for unfused trials never shrinks groups."""
        slots, limit = group_slots(self.plan.resources), self.plan.tune_config.max_concurrent_trials
        return min(slots, limit) if limit else slots

    def _tune_config(self, tune_config: tune.TuneConfig) -> tune.TuneConfig:
        """As many groups at once as there are group slots (`slots`)."""
        return replace(
            workload_tune_config(tune_config),
            search_alg=self.sweep.search_alg,
            scheduler=self.sweep.scheduler,
            num_samples=-1,
            max_concurrent_trials=self.slots(),
            trial_dirname_creator=self.sweep.group_dirname,
        )

    def _run_config(self, run_config: tune.RunConfig) -> tune.RunConfig:
        """Progress, the dashboard and the results files count configurations: they hear of each
        member's events, not of the groups Tune runs."""
        run_config = workload_run_config(run_config, self.plan.max_iterations)
        callbacks = list(run_config.callbacks or [])
        per_member = [cb for cb in callbacks if isinstance(cb, (ControllerCallback, ProgressCallback, LoggerCallback))
                      or getattr(cb, "per_configuration", False)]  # a scaled sweep's eager transfer
        callbacks = [cb for cb in callbacks if all(cb is not p for p in per_member)]
        callbacks += member_callbacks(self.sweep.book, [*per_member, self.sweep.callback], self.sweep.configurations)
        return replace(run_config, callbacks=callbacks, checkpoint_config=self.sweep.checkpoint_config)

    def result(self, grid: Any) -> SweepResult:
        """The members of the groups Tune ran (restored ones included), one result each."""
        book = self.sweep.book
        groups = {Path(r.path).name.removeprefix(GROUP_DIR_PREFIX) for r in grid}
        # A time budget or a stopper's stop_all ends every trial without a word to the scheduler:
        # the live members of a group Tune's saved state holds as ended were cut short, as an
        # unfused trial stopped so is (a Ctrl-C leaves its groups unended there, for --resume).
        book.end_cut_short(groups & saved_ended_trials(Path(grid.experiment_path)))
        return book.result(grid, self.plan.metric or "", self.plan.mode, self.plan.iterations, groups)
