"""How a sweep with `fusion: {placement: bubbles}` runs: one light relay Tune trial per
configuration (`hpo.engines.bubbles.relay_trial`); the broker forms groups and the bubble pool
trains them in pipeline jobs' bubbles, outside Tune."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from ray import tune

from fusion.broker import start_broker
from hpo.base.actor_names import NAMESPACE, broker_name
from hpo.config.spec import FusionConfig
from hpo.engines._base import SweepEngine, SweepPlan, started, workload_run_config, workload_tune_config
from hpo.engines.bubbles.relay_trial import MEMBER_TRIAL_RESOURCES, FusionCallback, fused_member_trainable
from hpo.engines.fused.group_size import group_size
from hpo.reporting.live_results import results_file_callback
from hpo.reporting.sweep_result import SweepResult


class BubbleEngine(SweepEngine):
    """A sweep fused into pipeline jobs' bubbles: a relay Tune trial per configuration.

    `start` starts the broker (B is measured first with `max_members: auto`); the other calls
    come after it."""

    def __init__(self, plan: SweepPlan, fusion: FusionConfig):
        self.plan, self.fusion = plan, fusion
        self._experiment: Path | None = None
        self.members_per_group = 0

    @property
    def experiment(self) -> Path:
        return started(self, self._experiment, "starts the sweep's broker")

    def start(self, experiment: Path) -> list[Any]:
        from pipeline_bubble.bubble_pool import bubble_group_launcher  # torch: only sweeps that lend bubbles

        plan = self.plan
        self._experiment = experiment
        self.members_per_group = group_size(plan.trainable, self.fusion, plan.resources, plan.param_space)
        launcher = bubble_group_launcher(experiment.name, plan.trainable, plan.max_iterations, self.fusion.dtype, self.fusion.verify)
        return [start_broker(broker_name(experiment.name), NAMESPACE, plan.trainable, self.members_per_group, launcher)]

    def trainable(self) -> Any:
        relay = fused_member_trainable(self.experiment.name, self.plan.max_iterations)
        return tune.with_resources(relay, MEMBER_TRIAL_RESOURCES)

    def param_space(self) -> dict[str, Any]:
        return dict(self.plan.param_space)

    def tune_config(self, tune_config: Any) -> Any:
        """Enough member trials at once to fill every lending stage with a full group."""
        tune_config = workload_tune_config(tune_config)
        if tune_config.max_concurrent_trials:
            return tune_config
        from pipeline_bubble.bubble_pool import lending_stages

        return replace(tune_config, max_concurrent_trials=self.members_per_group * max(1, lending_stages()))

    def run_config(self, run_config: Any) -> Any:
        run_config = workload_run_config(run_config, self.plan.max_iterations)
        callbacks = list(run_config.callbacks or [])
        if self.plan.metric:
            callbacks.append(results_file_callback(self.experiment, self.plan.metric, self.plan.mode, self.plan.max_iterations))
        callbacks.append(FusionCallback(self.experiment.name))
        return replace(run_config, callbacks=callbacks)

    def result(self, grid: Any) -> SweepResult:
        return SweepResult(grid, self.plan.metric or "", self.plan.mode, self.plan.iterations)
