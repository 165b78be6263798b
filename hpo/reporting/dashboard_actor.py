"""The sweep's face in the Ray dashboard: a named actor `hpo:sweep:<sweep>` and Prometheus metrics.

Tune's driver state is invisible in the dashboard; this actor makes a running sweep show up in
the Actors view and exports `hpo_trials_running`, `hpo_trials_finished` and `hpo_best_metric`
(tagged with the sweep name) through `ray.util.metrics`, which Ray serves on every node's
Prometheus endpoint.
"""

from __future__ import annotations

import math
import time
from typing import Any

import ray
from ray.tune import Callback

from hpo.base.actor_names import NAMESPACE, controller_name
from hpo.reporting.results_files import is_number, metric_value


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
        # Counted as trials change, not by walking `status` at each update: a 10,000-trial sweep
        # would pay a walk over every trial per update, on the cores the trials run on.
        self.running = 0
        self.best: float | None = None
        self.best_trial: str | None = None
        self._publish()

    def update(self, statuses: dict[str, str | None], values: list[tuple[float, str]] = ()) -> None:
        """What happened since the driver's last update: each trial's new status (None: it
        reported, so it runs unless its status is known) and the metric values reported, each
        with its trial."""
        for trial_id, status in statuses.items():
            before = self.status.get(trial_id)
            if status is None and before is not None:
                continue
            self.status[trial_id] = status or "RUNNING"
            self.running += (self.status[trial_id] == "RUNNING") - (before == "RUNNING")
        for value, trial_id in values:
            if math.isfinite(value) and self._better(value):
                self.best, self.best_trial = value, trial_id
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
    """Forwards Tune's trial events to the sweep's controller actor (fire-and-forget), gathered
    for at most `FLUSH_S` seconds: one call per event cost the driver five remote calls per trial,
    and the gauges it feeds are scraped every few seconds."""

    FLUSH_S = 0.5

    def __init__(self, sweep: str, metric: str, mode: str):
        self.sweep, self.metric, self.mode = sweep, metric, mode
        self.actor: Any = None
        self._statuses: dict[str, str | None] = {}
        self._values: list[tuple[float, str]] = []
        self._sent_at = -math.inf

    def setup(self, **info: Any) -> None:
        self.actor = start_controller(self.sweep, self.metric, self.mode)

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._statuses[trial.trial_id] = "RUNNING"

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
        self._statuses.setdefault(trial.trial_id, None)
        value = metric_value(result, self.metric)
        if is_number(value):
            self._values.append((float(value), trial.trial_id))

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._statuses[trial.trial_id] = "TERMINATED"

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._statuses[trial.trial_id] = "ERROR"

    def on_step_end(self, iteration: int, trials: list, **info: Any) -> None:
        if time.monotonic() - self._sent_at >= self.FLUSH_S:
            self._send()

    def on_experiment_end(self, trials: list, **info: Any) -> None:
        self._send()

    def _send(self) -> None:
        self._sent_at = time.monotonic()
        if self._statuses or self._values:
            self.actor.update.remote(self._statuses, self._values)
            self._statuses, self._values = {}, []
