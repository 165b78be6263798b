"""Eager transfer: train the target while the proxy sweep is still running.

A `ray.tune.Callback` (public Tune API). Once `scaling.eager_transfer` of the proxy trials have
finished and resources are idle (no proxy trial is PENDING and the target's CPUs/GPUs are free),
it starts the target, as a Ray actor with `scaling.target_cpus`/`target_gpus`, with
the best proxy configuration so far (carried by `transfer_config`); when a better proxy result
arrives it kills that actor and starts again, and when the best has not changed it keeps it.
The decisions are `EagerTransferPolicy`'s; this class only runs them on Ray.

Example::

    callback = EagerTransferCallback(workload, scaling, metric="val_loss", mode="min", max_iterations=10)
    tune.Tuner(trainable, run_config=tune.RunConfig(callbacks=[callback]), ...).fit()
    report = callback.finish()          # waits for the target; report["time_to_first_target_result_s"]
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ray
from ray import tune

from hpo.base.checkpointing import CHECKPOINT_FILE
from hpo.scaling._eager import Decision, EagerTransferPolicy
from hpo.scaling._transfer import summarise_target_run, transfer_config
from hpo.base.workload import Workload

if TYPE_CHECKING:
    from hpo.scaling._config import ScalingConfig


class _TargetTrainer:
    """The Ray actor: one TrialTrainer for the target, one `train_iteration` per call."""

    def __init__(self, workload: Workload, config: Mapping[str, Any], threads: int):
        import torch

        from hpo.base.training import TrialTrainer

        torch.set_num_threads(max(1, threads))
        self.trainer = TrialTrainer(workload, config)

    def train_iteration(self) -> dict[str, Any]:
        return self.trainer.train_iteration()

    def state_bytes(self) -> bytes:
        """The trained state in a trial checkpoint's format, as bytes: the driver writes the file,
        wherever on the cluster this actor runs."""
        import io

        import torch

        buffer = io.BytesIO()
        torch.save(self.trainer.state_dict(), buffer)
        return buffer.getvalue()


class EagerTransferCallback(tune.Callback):
    """Starts, restarts or keeps the target's training as the proxy sweep finds better configs.

    `workload` is the user's workload (the target is built with `target_workload`); `num_trials`
    defaults to Tune's total number of samples. Times are seconds since the sweep started.
    """

    def __init__(
        self,
        workload: Workload,
        scaling: "ScalingConfig",
        *,
        metric: str,
        mode: str,
        max_iterations: int,
        num_trials: int | None = None,
    ):
        if scaling.eager_transfer is None:
            raise ValueError("EagerTransferCallback needs scaling.eager_transfer (a fraction in (0, 1])")
        from hpo.scaling._mup import target_workload

        self.target = target_workload(workload, scaling)
        self.scaling = scaling
        self.metric = metric
        self.mode = mode
        self.iterations = scaling.iterations_of_target(max_iterations)
        self.num_trials = num_trials
        self.policy: EagerTransferPolicy | None = None
        self._t0 = time.monotonic()
        self._actor = None
        self._pending: list[Any] = []  # refs of the running target's remaining iterations, in order
        self._history: list[dict[str, Any]] = []
        self._run_started = 0.0
        self._run_config: dict[str, Any] | None = None  # the target config being trained
        self.starts: list[dict[str, Any]] = []  # one entry per (re)start: time, proxy trial, config
        self.first_result_s: float | None = None

    #: It follows configurations: a fused sweep replays each member's events to it, not its group's.
    per_configuration = True
    #: A copy Tune unpickled from its tuner.pkl to resume the sweep: its hooks do nothing (the
    #: sweep's engine holds the callback that reports the target; see `hpo.engines.scaled.finish`).
    restored = False

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.restored = True

    @property
    def heard_the_sweep(self) -> bool:
        """Whether Tune ran this callback (`setup`): not so in a resumed sweep, which runs the copy
        Tune pickled when the sweep began."""
        return self.policy is not None

    # -- Tune hooks -----------------------------------------------------------------------------

    def setup(self, stop=None, num_samples=None, total_num_samples=None, **info):
        if self.restored:
            return
        self._t0 = time.monotonic()
        trials = self.num_trials or total_num_samples
        if not trials or trials < 1:
            raise ValueError("eager transfer needs a finite number of proxy trials (num_samples)")
        self.policy = EagerTransferPolicy(self.scaling.eager_transfer, int(trials), self.mode)

    def on_trial_complete(self, iteration, trials, trial, **info):
        if self.restored:
            return
        value = (trial.last_result or {}).get(self.metric)
        # A first start waits for on_step_end, when Tune has handed the freed slot on (or not).
        self._act(self._policy().record(trial.trial_id, trial.config, None if value is None else float(value), idle=False))

    def on_trial_error(self, iteration, trials, trial, **info):
        if self.restored:
            return
        self._act(self._policy().record(trial.trial_id, trial.config, None, idle=False))

    def on_step_end(self, iteration, trials, **info):
        if self.restored:
            return
        self._collect()
        policy = self._policy()
        if policy.running_config is None and len(policy.finished) >= policy.threshold:
            self._act(policy.decide(idle=self._idle(trials)))

    def on_experiment_end(self, trials, **info):
        if self.restored:
            return
        self._collect()

    # -- after the sweep ------------------------------------------------------------------------

    def finish(self, timeout_s: float | None = None) -> dict[str, Any]:
        """Wait for the target run with the final best config (starting it if it never started)."""
        if self._actor is None:
            self._act(self._policy().decide(idle=True))
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while self._pending and (deadline is None or time.monotonic() < deadline):
            ray.wait(self._pending[:1], timeout=None if deadline is None else max(0.0, deadline - time.monotonic()))
            self._collect()
        return self.report()

    def save_target(self, directory: str | os.PathLike[str]) -> Path | None:
        """Write the trained target into `directory` (`hpo.base.checkpointing.CHECKPOINT_FILE`, loadable
        with `TrialTrainer.restore`) once its run is complete; None when there is none to save (it
        diverged, or is still training)."""
        if self._actor is None or self._pending or len(self._history) < self.iterations:
            return None
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / CHECKPOINT_FILE).write_bytes(ray.get(self._actor.state_bytes.remote()))
        return directory

    def stop(self) -> None:
        """The sweep stopped before its end: end the target's run, if one trains (`--resume` trains
        the target of the complete sweep)."""
        self._stop_target()

    def report(self) -> dict[str, Any]:
        run = None
        if self._history:
            seconds = time.monotonic() - self._t0 - self._run_started
            run = summarise_target_run(self._run_config, self.metric, self.mode, self._history, seconds)
        return {
            "started": bool(self.starts),
            "restarts": max(0, len(self.starts) - 1),
            "starts": self.starts,
            "time_to_first_target_result_s": self.first_result_s,
            "target_iterations_done": len(self._history),
            "target_iterations": self.iterations,
            "complete": bool(self.starts) and not self._pending,
            "target_run": None if run is None else run.__dict__,
        }

    # -- internals ------------------------------------------------------------------------------

    def _policy(self) -> EagerTransferPolicy:
        if self.policy is None:  # used outside Tune: setup() was not called
            raise RuntimeError("EagerTransferCallback.setup() has not run; pass the callback to tune.RunConfig")
        return self.policy

    def _idle(self, trials) -> bool:
        """No proxy trial waits for resources, and the target's are free."""
        if any(getattr(trial, "status", None) == "PENDING" for trial in trials):
            return False
        free = ray.available_resources()
        return free.get("CPU", 0.0) >= self.scaling.target_cpus and free.get("GPU", 0.0) >= self.scaling.target_gpus

    def _act(self, decision: Decision) -> None:
        if decision not in (Decision.START, Decision.RESTART):
            return
        self._stop_target()
        policy = self._policy()
        config = transfer_config(policy.running_config, self.scaling, depth_key=self.target.depth_key).target_config
        actor_cls = ray.remote(_TargetTrainer).options(
            num_cpus=self.scaling.target_cpus, num_gpus=self.scaling.target_gpus, max_restarts=0
        )
        threads = max(1, int(self.scaling.target_cpus)) if self.scaling.target_cpus >= 1 else 1
        self._actor = actor_cls.remote(self.target, config, threads)
        self._pending = [self._actor.train_iteration.remote() for _ in range(self.iterations)]
        self._history = []
        self._run_config = config
        self._run_started = time.monotonic() - self._t0
        self.starts.append(
            {"at_s": self._run_started, "proxy_trial": policy.running_trial, "proxy_value": policy.best_value, "config": config}
        )

    def _collect(self) -> None:
        """Take the target's finished iterations, in order, without blocking."""
        while self._pending:
            ready, _ = ray.wait(self._pending[:1], timeout=0)
            if not ready:
                return
            result = ray.get(self._pending.pop(0))
            self._history.append(result)
            if self.first_result_s is None:
                self.first_result_s = time.monotonic() - self._t0
            value = result.get(self.metric)
            if result.get("diverged") or (value is not None and not math.isfinite(float(value))):
                self._pending = []  # the target diverged: stop; a better proxy config restarts it
                self._stop_target(keep_history=True)

    def _stop_target(self, keep_history: bool = False) -> None:
        if self._actor is not None:
            ray.kill(self._actor)
        self._actor = None
        self._pending = []
        if not keep_history:
            self._history = []


__all__ = ["EagerTransferCallback"]
