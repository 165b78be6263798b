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


#: How long a controller that a sweep holds gets to answer whether its sweep has ended.
ASK_S = 10.0
#: How long an ended sweep's controller gets to give its name up once it is ended.
RELEASE_S = 30.0


class SweepNameTaken(ValueError):
    """Another sweep of the same name is running on this Ray: the two would feed one controller.
    `reason` is the message without the key it names (`name`)."""

    def __init__(self, reason: str):
        super().__init__(f"name: {reason}")
        self.reason = reason


def start_controller(sweep: str, metric: str, mode: str) -> Any:
    """A new controller actor for `sweep`: a sweep counts its own trials only.

    The name is the sweep's on the whole cluster. One a sweep still runs under is refused
    (`SweepNameTaken`): two sweeps fed one controller, and the first to end took it, and the
    other's dashboard, with it. One whose sweep has ended (a finished result still held, in a
    notebook or in another driver) is replaced: its counts and best belong to that earlier sweep.

    A named actor dies with the last handle to it; whoever must keep it visible (the Tuner, for
    as long as its result lives) holds the handle this returns.
    """
    name = controller_name(sweep)
    deadline = time.monotonic() + RELEASE_S
    while True:
        try:
            return SweepController.options(name=name, namespace=NAMESPACE).remote(sweep, metric, mode)
        except ValueError:  # the name is taken (Ray's ActorAlreadyExistsError is one)
            if time.monotonic() > deadline:
                raise SweepNameTaken(f"the controller {name} of an earlier sweep named {sweep!r} did not end "
                                     f"within {RELEASE_S:.0f} s; give this sweep another name") from None
        try:
            held = ray.get_actor(name, namespace=NAMESPACE)
            ended = ray.get(held.summary.remote(), timeout=ASK_S)["ended"]
        except (ValueError, ray.exceptions.RayActorError):
            time.sleep(0.05)  # gone, or dying: the name is free once Ray has it dead
            continue
        except ray.exceptions.GetTimeoutError:
            ended = False  # it does not answer: its sweep may be running
        if not ended:
            raise SweepNameTaken(f"a sweep named {sweep!r} is running on this Ray cluster (its controller {name}): "
                                 "give this one another name, or run it once that one has ended")
        ray.kill(held)


def controller_of(sweep: str, metric: str, mode: str) -> Any:
    """The controller the sweep's driver started (`start_controller`), or a new one where none runs
    (a `ControllerCallback` given to Tune without hpo's Tuner)."""
    try:
        return ray.get_actor(controller_name(sweep), namespace=NAMESPACE)
    except ValueError:
        return start_controller(sweep, metric, mode)


@ray.remote(num_cpus=0, max_restarts=0)
class SweepController:
    def __init__(self, sweep: str, metric: str, mode: str):
        from ray.util.metrics import Gauge

        self._running = Gauge("hpo_trials_running", "Trials of the sweep that are running", tag_keys=("sweep",))
        self._finished = Gauge("hpo_trials_finished", "Trials of the sweep that have ended", tag_keys=("sweep",))
        # `goal` says which way is better, so a dashboard that meets one sweep in several series
        # (a controller restarted, a resumed sweep's new one beside the old series) keeps the best
        # of them: the least loss, the most accuracy.
        self._best = Gauge("hpo_best_metric", "Best value of the sweep's metric so far", tag_keys=("sweep", "goal"))
        for gauge in (self._running, self._finished):
            gauge.set_default_tags({"sweep": sweep})
        self._best.set_default_tags({"sweep": sweep, "goal": mode})
        self.sweep, self.metric, self.mode = sweep, metric, mode
        self.status: dict[str, str] = {}
        # Counted as trials change, not by walking `status` at each update: a 10,000-trial sweep
        # would pay a walk over every trial per update, on the cores the trials run on.
        self.running = 0
        self.ended = False
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

    def end(self) -> None:
        """The sweep has ended. A time budget, Ctrl-C or a stopper ends it with trials running,
        which Tune stops without a word to its callbacks: they have ended too."""
        for trial_id, status in self.status.items():
            if status == "RUNNING":
                self.status[trial_id] = "STOPPED"
        self.running, self.ended = 0, True
        self._publish()

    def summary(self) -> dict[str, Any]:
        return {
            "sweep": self.sweep,
            "running": self.running,
            "finished": len(self.status) - self.running,
            "best": self.best,
            "best_trial": self.best_trial,
            "ended": self.ended,
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
        self.actor = controller_of(self.sweep, self.metric, self.mode)

    def on_step_begin(self, iteration: int, trials: list, **info: Any) -> None:
        """At the first step, the trials that ended before it: a resumed run's, which Tune restores
        without a word to its callbacks (its controller is new, and counted none of them)."""
        if getattr(self, "_restored_counted", False):  # an older pickled callback has no such field
            return
        self._restored_counted = True
        for trial in trials:
            status = getattr(trial, "status", None)
            if status in ("TERMINATED", "ERROR") and trial.trial_id not in self._statuses:
                self._statuses[trial.trial_id] = status
                value = metric_value(trial.last_result or {}, self.metric)
                if is_number(value):
                    self._values.append((float(value), trial.trial_id))

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
        self.actor.end.remote()  # after the last update: one caller's calls reach an actor in order

    def _send(self) -> None:
        self._sent_at = time.monotonic()
        if self._statuses or self._values:
            self.actor.update.remote(self._statuses, self._values)
            self._statuses, self._values = {}, []
