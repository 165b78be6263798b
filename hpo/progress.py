"""One line per finished trial on the terminal, instead of Tune's wide status tables."""

from __future__ import annotations

import math
from typing import Any

from ray.tune import Callback


class ProgressCallback(Callback):
    def __init__(self, metric: str, mode: str, total: int | None = None):
        self.metric, self.mode, self.total = metric, mode, total
        self.done = 0
        self.best = math.inf if mode == "min" else -math.inf

    def _line(self, trial: Any, outcome: str) -> None:
        self.done += 1
        result = trial.last_result or {}
        value = result.get(self.metric)
        if isinstance(value, (int, float)) and math.isfinite(value):
            self.best = min(self.best, value) if self.mode == "min" else max(self.best, value)
            shown = f"{self.metric}={value:.4g}"
        else:
            shown = f"{self.metric}=n/a"
        total = f"/{self.total}" if self.total else ""
        iterations = result.get("training_iteration", 0)
        print(f"[{self.done:3d}{total}] trial {trial.trial_id} {outcome} after {iterations} it: {shown} (best {self.best:.4g})", flush=True)

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._line(trial, "finished")

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._line(trial, "FAILED")
