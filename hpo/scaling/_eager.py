"""When to start, restart or keep the eager target run: a pure policy, no Ray.

`EagerTransferCallback` feeds it finished proxy trials and does what it answers.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from enum import Enum
from typing import Any


class Decision(str, Enum):
    WAIT = "wait"  # too few proxy trials finished, no usable result yet, or no idle resources
    START = "start"  # train the target with the best config so far
    RESTART = "restart"  # a better proxy config appeared: drop the running target, start again
    KEEP = "keep"  # the running target already trains the best config


class EagerTransferPolicy:
    """Start the target once `fraction` of `num_trials` proxy trials finished; follow the best.

    Example::

        policy = EagerTransferPolicy(fraction=0.5, num_trials=4, mode="min")
        policy.record("t1", {"lr": 0.1}, 2.0)   # Decision.WAIT  (1 of 2 needed)
        policy.record("t2", {"lr": 0.2}, 1.5)   # Decision.START with {"lr": 0.2}
        policy.record("t3", {"lr": 0.4}, 1.8)   # Decision.KEEP
        policy.record("t4", {"lr": 0.3}, 1.2)   # Decision.RESTART with {"lr": 0.3}
    """

    def __init__(self, fraction: float, num_trials: int, mode: str = "min"):
        if not 0 < fraction <= 1:
            raise ValueError(f"eager_transfer fraction must be in (0, 1], got {fraction}")
        if num_trials < 1:
            raise ValueError(f"eager transfer needs a finite number of proxy trials, got {num_trials}")
        if mode not in ("min", "max"):
            raise ValueError(f"mode must be 'min' or 'max', got {mode!r}")
        self.fraction = fraction
        self.num_trials = num_trials
        self.mode = mode
        self.threshold = max(1, math.ceil(fraction * num_trials - 1e-9))
        self.finished: set[str] = set()
        self.best_value: float | None = None
        self.best_trial: str | None = None
        self.best_config: dict[str, Any] | None = None
        self.running_config: dict[str, Any] | None = None
        self.running_trial: str | None = None

    def record(self, trial_id: str, config: Mapping[str, Any], value: float | None, *, idle: bool = True) -> Decision:
        """Note a finished proxy trial (value None or non-finite: errored or diverged) and decide."""
        self.finished.add(trial_id)
        if value is not None and math.isfinite(value) and self._better(value):
            self.best_value, self.best_trial, self.best_config = float(value), trial_id, dict(config)
        return self.decide(idle=idle)

    def decide(self, *, idle: bool = True) -> Decision:
        """What to do now; START/RESTART also mark the best config as the running one.

        `idle`: whether resources for the target are free now; a restart reuses the running
        target's resources, so only a first start waits for them.
        """
        if len(self.finished) < self.threshold or self.best_config is None:
            return Decision.WAIT
        if self.running_config is None:
            if not idle:
                return Decision.WAIT
            self._run_best()
            return Decision.START
        if self.best_config == self.running_config:
            return Decision.KEEP
        self._run_best()
        return Decision.RESTART

    def _better(self, value: float) -> bool:
        if self.best_value is None:
            return True
        return value < self.best_value if self.mode == "min" else value > self.best_value

    def _run_best(self) -> None:
        self.running_config = dict(self.best_config)
        self.running_trial = self.best_trial
