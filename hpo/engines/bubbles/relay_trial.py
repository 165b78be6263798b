"""The Tune side of a sweep fused into pipeline bubbles: one light Tune trial per configuration,
and the callback that tells the broker which configurations Tune has scheduled.

Groups in pipeline bubbles are trained by whichever pipeline stage has a bubble, outside Tune, so
each configuration is its own Tune trial whose process only relays (it imports neither torch nor
the model; Tune reuses it between trials): the training happens in the bubble group
(`pipeline_bubble.bubble_pool.BubbleGroup`, a `fusion.group_actor.MemberRelay`). Sweeps fused on
the sweep's own devices don't pay a process per member: Tune runs their groups
(`hpo.engines.fused.group_trial`).

A relay talks only to the broker, never to the group actor: looking up an actor imports its
class's module, and the group's module imports torch.

Groups do not wait for relays to start: `FusionCallback` registers every fresh trial with the
broker as soon as Tune creates it, so the group forms and starts training while the relay
processes are still starting; a relay that joins later finds its group already there.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from typing import Any

import ray
from ray import tune

from hpo.base.actor_names import NAMESPACE, broker_name
from hpo.base.checkpointing import CHECKPOINT_FILE, PROGRESS_FILE

#: A member trial only relays results; the group actor holds the real resources.
MEMBER_TRIAL_RESOURCES = {"cpu": 0.01}


def fused_member_trainable(sweep: str, max_iterations: int) -> Callable[[dict[str, Any]], None]:
    """The Tune trainable of one member: join its group, then relay results and checkpoints."""

    def fused_member(config: dict[str, Any]) -> None:
        trial_id = tune.get_context().get_trial_id()
        broker = ray.get_actor(broker_name(sweep), namespace=NAMESPACE)
        state, iteration, step = None, 0, 0
        checkpoint = tune.get_checkpoint()
        if checkpoint is not None:
            with checkpoint.as_directory() as directory:
                with open(os.path.join(directory, CHECKPOINT_FILE), "rb") as handle:
                    state = handle.read()
                with open(os.path.join(directory, PROGRESS_FILE)) as handle:
                    progress = json.load(handle)
            iteration, step = progress["iteration"], progress["step"]
        ray.get(broker.join.remote(trial_id, config, state, step))
        while iteration < max_iterations:
            iteration += 1
            result = ray.get(broker.fetch.remote(trial_id, iteration))
            metrics = result["metrics"]
            if result.get("checkpoint") is None:  # not due under the sweep's checkpoint policy
                tune.report(metrics)
            else:
                with tempfile.TemporaryDirectory() as directory:
                    with open(os.path.join(directory, CHECKPOINT_FILE), "wb") as handle:
                        handle.write(result["checkpoint"])
                    with open(os.path.join(directory, PROGRESS_FILE), "w") as handle:
                        json.dump({"iteration": iteration, "step": metrics["step"]}, handle)
                    tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(directory))
            if metrics["diverged"]:
                return

    fused_member.__name__ = f"fused_{sweep}"
    return fused_member


class FusionCallback(tune.Callback):
    """Keeps the broker in step with Tune: fresh trials are registered as soon as Tune creates
    them, and a trial Tune ends or pauses leaves its group, which stops training it.

    A paused trial (HyperBand) resumes later from its checkpoint and joins a new group. When the
    sweep ends, the bubble pool withdraws its groups: Tune stops the trials still running at the
    end (a time budget, Ctrl-C) without `on_trial_complete`, so their groups would otherwise stay
    in the pool and train in the next sweep's bubbles.
    """

    def __init__(self, sweep: str, run: str | None = None):
        self.sweep, self.run = sweep, run
        self.registered: set[str] = set()
        self._broker: Any = None

    @property
    def broker(self) -> Any:
        if self._broker is None:
            self._broker = ray.get_actor(broker_name(self.sweep), namespace=NAMESPACE)
        return self._broker

    def on_step_begin(self, iteration: int, trials: list, **info: Any) -> None:
        fresh = [
            (trial.trial_id, dict(trial.config))
            for trial in trials
            if trial.status in ("PENDING", "RUNNING") and trial.trial_id not in self.registered and trial.checkpoint is None
        ]
        if fresh:
            self.registered.update(trial_id for trial_id, _ in fresh)
            self.broker.register.remote(fresh)

    def on_step_end(self, iteration: int, trials: list, **info: Any) -> None:
        for trial in trials:
            if trial.status == "PAUSED":
                self.broker.leave.remote(trial.trial_id)  # the broker ignores trials that hold no group

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self.broker.leave.remote(trial.trial_id)

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self.registered.discard(trial.trial_id)  # a retry without a checkpoint registers afresh
        self.broker.leave.remote(trial.trial_id)

    def on_experiment_end(self, trials: list, **info: Any) -> None:
        from pipeline_bubble.bubble_pool import bubble_pool  # torch: the driver's, which has it already

        ray.get(bubble_pool().end_sweep.remote(self.sweep, self.run))  # before the next sweep can start
