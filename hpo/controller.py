"""The sweep's face in the Ray dashboard: a named actor `hpo:sweep:<sweep>` and Prometheus metrics.

Tune's driver state is invisible in the dashboard; this actor makes a running sweep show up in
the Actors view and exports `hpo_trials_running`, `hpo_trials_finished` and `hpo_best_metric`
(tagged with the sweep name) through `ray.util.metrics`, which Ray serves on every node's
Prometheus endpoint.
"""

from __future__ import annotations

import math
from typing import Any

import ray
from ray.tune import Callback

from hpo.base.actor_names import NAMESPACE, controller_name


def start_controller(sweep: str, metric: str, mode: str) -> Any:
    """The controller actor of `sweep`, started unless it runs already.

    A named actor dies with the last handle to it; whoever must keep it visible (the Tuner, for
    as long as its result lives) holds the handle this returns.
    """
    return SweepController.options(name=controller_name(sweep), namespace=NAMESPACE, get_if_exists=True).remote(
        sweep, metric, mode
    )


@ray.remote(num_cpus=0, max_restarts=0)
class SweepController:
    def __init__(self, sweep: str, metric: str, mode: str):
        from ray.util.metrics import Gauge

        tags = {"sweep": sweep}
        self._running = Gauge("hpo_trials_running", "Trials of the sweep that are running", tag_keys=("sweep",))
        self._finished = Gauge("hpo_trials_finished", "Trials of the sweep that have ended", tag_keys=("sweep",))
        self._best = Gauge("hpo_best_metric", "Best value of the sweep's metric so far", tag_keys=("sweep",))
        for gauge in (self._running, self._finished, self._best):
            gauge.set_default_tags(tags)
        self.sweep, self.metric, self.mode = sweep, metric, mode
        self.status: dict[str, str] = {}
        # Counted as trials change, not by walking `status`: each of a 10,000-trial sweep's 50,000
        # events would otherwise cost a walk over every trial, on the cores the trials run on.
        self.running = 0
        self.best: float | None = None
        self.best_trial: str | None = None
        self._publish()

    def _set_status(self, trial_id: str, status: str) -> None:
        before = self.status.get(trial_id)
        self.status[trial_id] = status
        self.running += (status == "RUNNING") - (before == "RUNNING")

    def trial_started(self, trial_id: str) -> None:
        self._set_status(trial_id, "RUNNING")
        self._publish()

    def trial_result(self, trial_id: str, value: float | None) -> None:
        if trial_id not in self.status:
            self._set_status(trial_id, "RUNNING")
        if value is not None and math.isfinite(value) and self._better(value):
            self.best, self.best_trial = value, trial_id
        self._publish()

    def trial_ended(self, trial_id: str, status: str) -> None:
        self._set_status(trial_id, status)
        self._publish()

    def summary(self) -> dict[str, Any]:
        return {
            "sweep": self.sweep,
            "running": self.running,
            "finished": len(self.status) - self.running,
            "best": self.best,
            "best_trial": self.best_trial,
        }

    def _better(self, value: float) -> bool:
        if self.best is None:
            return True
        return value < self.best if self.mode == "min" else value > self.best

    def _publish(self) -> None:
        summary = self.summary()
        self._running.set(summary["running"])
        self._finished.set(summary["finished"])
        if self.best is not None:
            self._best.set(self.best)


class ControllerCallback(Callback):
    """Forwards Tune's trial events to the sweep's controller actor (fire-and-forget)."""

    def __init__(self, sweep: str, metric: str, mode: str):
        self.sweep, self.metric, self.mode = sweep, metric, mode
        self.actor: Any = None

    def setup(self, **info: Any) -> None:
        self.actor = start_controller(self.sweep, self.metric, self.mode)

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self.actor.trial_started.remote(trial.trial_id)

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
        value = result.get(self.metric)
        self.actor.trial_result.remote(trial.trial_id, float(value) if isinstance(value, (int, float)) else None)

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self.actor.trial_ended.remote(trial.trial_id, "TERMINATED")

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self.actor.trial_ended.remote(trial.trial_id, "ERROR")
