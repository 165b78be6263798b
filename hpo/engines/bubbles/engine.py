"""How a sweep with `fusion: {placement: bubbles}` runs: one light relay Tune trial per
configuration (`hpo.engines.bubbles.relay_trial`); the broker forms groups and the bubble pool
trains them in pipeline jobs' bubbles, outside Tune."""

from __future__ import annotations

import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

from ray import tune

from fusion.broker import start_broker
from hpo.base.actor_names import NAMESPACE, broker_name
from hpo.config.spec import FusionConfig
from hpo.engines._base import SweepEngine, SweepPlan, TuneRun, workload_run_config, workload_tune_config
from hpo.engines.bubbles.relay_trial import MEMBER_TRIAL_RESOURCES, FusionCallback, fused_member_trainable
from hpo.engines.fused.group_size import group_size
from hpo.reporting.live_results import results_file_callback
from hpo.reporting.sweep_result import SweepResult


#: What a bubble sweep says when it starts on a Ray where no pipeline stage lends its bubbles.
NO_LENDING_STAGE = (
    "fusion: no pipeline stage lends its bubbles on this Ray cluster yet: the groups wait until a DeepSpeed "
    "pipeline job connected to it calls pipeline_bubble.lend_bubbles (a sweep on a Ray of its own, "
    "started without --address, has none), and trials that never get one end without a result"
)


class BubbleEngine(SweepEngine):
    """A sweep fused into pipeline jobs' bubbles: a relay Tune trial per configuration."""

    def __init__(self, plan: SweepPlan, fusion: FusionConfig):
        self.plan, self.fusion = plan, fusion
        self.members_per_group = 0
        #: This start of the sweep, for the pool: a resumed sweep keeps its name, not its run.
        self.run_id = uuid.uuid4().hex

    def start(self, experiment: Path, tune_config: tune.TuneConfig, run_config: tune.RunConfig) -> TuneRun:
        """Start the sweep's broker (B measured first with `max_members: auto`) and give Tune one
        relay per configuration, over the user's space."""
        from pipeline_bubble.bubble_pool import bubble_group_launcher, lending_stages  # torch: only sweeps that lend bubbles

        plan = self.plan
        self.members_per_group = group_size(plan.trainable, self.fusion, plan.resources, plan.param_space)
        stages = lending_stages()
        if not stages:  # else the sweep waits in silence, and its trials end without a result
            print(NO_LENDING_STAGE, flush=True)
        launcher = bubble_group_launcher(experiment.name, plan.trainable, plan.max_iterations, self.fusion.dtype,
                                         self.fusion.verify, self.run_id)
        broker = start_broker(broker_name(experiment.name), NAMESPACE, plan.trainable, self.members_per_group, launcher)
        relay = tune.with_resources(fused_member_trainable(experiment.name, plan.max_iterations), MEMBER_TRIAL_RESOURCES)
        return TuneRun(relay, dict(plan.param_space), self._tune_config(tune_config, stages),
                       self._run_config(experiment, run_config), [broker])

    def _tune_config(self, tune_config: tune.TuneConfig, stages: int) -> tune.TuneConfig:
        """Enough member trials at once to fill every lending stage with a full group."""
        tune_config = workload_tune_config(tune_config)
        if tune_config.max_concurrent_trials:
            return tune_config
        return replace(tune_config, max_concurrent_trials=self.members_per_group * max(1, stages))

    def _run_config(self, experiment: Path, run_config: tune.RunConfig) -> tune.RunConfig:
        run_config = workload_run_config(run_config, self.plan.max_iterations)
        callbacks = list(run_config.callbacks or [])
        if self.plan.metric:
            callbacks.append(results_file_callback(experiment, self.plan.metric, self.plan.mode, self.plan.max_iterations))
        callbacks.append(FusionCallback(experiment.name, self.run_id))
        return replace(run_config, callbacks=callbacks)

    def result(self, grid: Any) -> SweepResult:
        return SweepResult(grid, self.plan.metric or "", self.plan.mode, self.plan.iterations)
