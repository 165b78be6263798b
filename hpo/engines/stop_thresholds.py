"""A sweep's `stop` thresholds, read in the direction of the sweep's goal, for every trial or member.

Tune's dict `stop` ends a trial once `result[key] >= value`. For the sweep's own metric under
`mode: min` that reading ends every trial at its first report (a loss starts above any target one
would write), so a threshold on the sweep's metric is read in its goal's direction:
`stop: {val_loss: 0.05}` ends a trial once its val_loss is at most 0.05. Every other key keeps
Tune's reading (`training_iteration`, `time_total_s`, an accuracy).

A fused group's trial reports for all its members at once, with the best member's value as its
own, so a threshold on anything a member reports is applied to each member's result by the group's
scheduler; Tune's own counters, the same for every member of a group, stay on the group's trial
(`split_stop`). A `Stopper` or stop function is likewise asked about each member's results, and
the group's trial keeps only its `stop_all`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from ray.tune.stopper import Stopper

from hpo.reporting.results_files import is_number, metric_value
from hpo.reporting.tune_errors import own_keys

logger = logging.getLogger(__name__)

#: Keys Tune fills in itself, alike for every member of a fused group.
TUNE_COUNTERS = frozenset({
    "training_iteration", "iterations_since_restore", "time_total_s", "time_since_restore",
    "time_this_iter_s", "timesteps_total", "episodes_total",
})


class Thresholds:
    """A dict `stop` read in the goal's direction (see the module docstring). A key a result lacks
    reaches nothing, as in Tune, but it is said once: Tune's own warning is kept off hpo's
    console, and a mistyped key (`los` for `loss`) silently stopped no trial."""

    def __init__(self, stop: Mapping[str, float], metric: str | None, mode: str):
        self.stop, self.metric, self.mode = dict(stop), metric, mode
        self.said: set[str] = set()

    def reached(self, result: Mapping[str, Any]) -> bool:
        """Whether `result` reaches any threshold."""
        for key, threshold in self.stop.items():
            value = metric_value(result, key)
            if value is None:
                self._say_missing(key, result)
            elif is_number(value) and (value <= threshold if key == self.metric and self.mode == "min" else value >= threshold):
                return True
        return False

    def _say_missing(self, key: str, result: Mapping[str, Any]) -> None:
        if key in self.said:
            return
        self.said.add(key)
        logger.warning("warning: stop: %r is not in a trial's result (it reported: %s); that threshold stops no "
                       "trial unless a later result has it", key, ", ".join(own_keys(result)) or "nothing of its own")

    def __getstate__(self) -> dict[str, Any]:  # Tune saves its stopper with the sweep: what was said is not state
        return {**self.__dict__, "said": set()}


class ThresholdStopper(Stopper):
    """Tune's dict `stop` for every trial, as `Thresholds` reads it."""

    def __init__(self, stop: Mapping[str, float], metric: str | None, mode: str):
        self.thresholds = Thresholds(stop, metric, mode)

    def __call__(self, trial_id: str, result: dict) -> bool:
        return self.thresholds.reached(result)

    def stop_all(self) -> bool:
        return False


def directed_stop(stop: Any, metric: str | None, mode: str) -> Any:
    """What Tune is given for the run config's `stop`: a dict as a `ThresholdStopper`; a
    `Stopper`, a function or None as they are."""
    if isinstance(stop, Mapping):
        return ThresholdStopper(stop, metric, mode)
    return stop


class StopAllOnly(Stopper):
    """The user's `Stopper` as a fused group's trial sees it: only its `stop_all` (a time limit, a
    plateau of the whole sweep) ends the sweep; whether a trial stops is asked of each member's own
    result by the group's scheduler, never of the group's, whose metric is its best member's."""

    def __init__(self, stopper: Any):
        self.stopper = stopper

    def __call__(self, trial_id: str, result: dict) -> bool:
        return False

    def stop_all(self) -> bool:
        return bool(self.stopper.stop_all()) if isinstance(self.stopper, Stopper) else False


def split_stop(stop: Any) -> tuple[Any, dict[str, float], Any]:
    """A fused sweep's `stop`: what the group's trial applies (Tune's counters; a user's `Stopper`
    only as `StopAllOnly`; None where nothing is left, so the group trains to `max_iterations`), the
    thresholds applied to each member's own result, and the user's `Stopper` or stop function, asked
    about each member's own results as Tune asks it about an unfused trial's (None without one)."""
    if stop is None:
        return None, {}, None
    if not isinstance(stop, Mapping):
        return StopAllOnly(stop), {}, stop
    group = {key: value for key, value in stop.items() if key in TUNE_COUNTERS}
    return group or None, {key: value for key, value in stop.items() if key not in TUNE_COUNTERS}, None
