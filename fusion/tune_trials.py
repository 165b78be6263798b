"""Fused groups inside a Tune sweep, through Tune's public API only.

Every configuration stays its own Tune trial: it asks the sweep's `GroupBroker` for a group,
fetches its metrics and checkpoint from the group actor every iteration and reports them with
`tune.report`, so searchers, ASHA/HyperBand, results and checkpoints treat it like any trial.
`FusionCallback` tells the broker when Tune ends a trial, so the group stops training it.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from typing import Any

import ray
from ray import tune

from fusion.broker import GroupBroker, GroupLauncher
from fusion.trainer import MEMBER_CHECKPOINT_FILE
from hpo.ray_runtime import NAMESPACE
from hpo.workload import Workload

PROGRESS_FILE = "member_progress.json"
#: A member trial only relays results; the group actor holds the real resources.
MEMBER_TRIAL_RESOURCES = {"cpu": 0.01}


def broker_name(sweep: str) -> str:
    return f"hpo:{sweep}:fusion"


def start_broker(sweep: str, workload: Workload, max_members: int, launch_group: GroupLauncher) -> Any:
    """The sweep's broker, owned by the caller (it lives as long as the returned handle)."""
    return GroupBroker.options(name=broker_name(sweep), namespace=NAMESPACE, get_if_exists=True).remote(
        workload, max_members, launch_group
    )


def fused_member_trainable(sweep: str, max_iterations: int) -> Callable[[dict[str, Any]], None]:
    """The Tune trainable of one member: join a group, then relay its results and checkpoints."""

    def fused_member(config: dict[str, Any]) -> None:
        trial_id = tune.get_context().get_trial_id()
        broker = ray.get_actor(broker_name(sweep), namespace=NAMESPACE)
        state, iteration, step = None, 0, 0
        checkpoint = tune.get_checkpoint()
        if checkpoint is not None:
            with checkpoint.as_directory() as directory:
                with open(os.path.join(directory, MEMBER_CHECKPOINT_FILE), "rb") as handle:
                    state = handle.read()
                with open(os.path.join(directory, PROGRESS_FILE)) as handle:
                    progress = json.load(handle)
            iteration, step = progress["iteration"], progress["step"]
        group = ray.get(broker.join.remote(trial_id, config, state, step))
        while iteration < max_iterations:
            iteration += 1
            result = ray.get(group.fetch.remote(trial_id, iteration))
            metrics = result["metrics"]
            with tempfile.TemporaryDirectory() as directory:
                with open(os.path.join(directory, MEMBER_CHECKPOINT_FILE), "wb") as handle:
                    handle.write(result["checkpoint"])
                with open(os.path.join(directory, PROGRESS_FILE), "w") as handle:
                    json.dump({"iteration": iteration, "step": metrics["step"]}, handle)
                tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(directory))
            if metrics["diverged"]:
                return

    fused_member.__name__ = f"fused_{sweep}"
    return fused_member


class FusionCallback(tune.Callback):
    """Tells the broker that Tune ended or paused a member's trial, so its group stops training it.

    A paused trial (HyperBand) resumes later from its checkpoint and joins a new group.
    """

    def __init__(self, sweep: str):
        self.sweep = sweep

    def _leave(self, trial: Any) -> None:
        broker = ray.get_actor(broker_name(self.sweep), namespace=NAMESPACE)
        broker.leave.remote(trial.trial_id)

    def on_step_end(self, iteration: int, trials: list, **info: Any) -> None:
        for trial in trials:
            if trial.status == "PAUSED":
                self._leave(trial)  # the broker ignores trials that hold no group

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._leave(trial)

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._leave(trial)
