"""Training one configuration of a workload, unfused, with its state saved and restored.

This is the unfused path and the reference the fused engine is tested against: it uses
PyTorch's own optimizers and the schedule from `hpo.base.hparams`. It knows nothing of Tune:
`hpo.engines.workload_trial` makes it a Tune trainable, and a bubble guest takes the same step.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from hpo.base.hparams import OptimHParams
from hpo.base.trial_state import ResumableBatches, load_trial_state, save_trial_state, trial_optimizer, trial_state
from hpo.base.workload import Workload


def build_trial_model(workload: Workload, config: Mapping[str, Any]) -> torch.nn.Module:
    """One configuration's model, the global RNG seeded from `config["seed"]` before the factory
    runs: the one way a model is built, so a fused member and the same configuration trained
    alone start from the same weights."""
    torch.manual_seed(int(config.get("seed", 0)))
    return workload.build_model(config)


class TrialTrainer:
    """One model, one optimizer, one config; iterations of `steps_per_iteration` steps."""

    def __init__(self, workload: Workload, config: Mapping[str, Any]):
        self.workload = workload
        self.config = workload.resolve(config)
        self.hparams = OptimHParams.from_config(self.config)
        self.model = build_trial_model(workload, self.config)
        self.optimizer, self.schedule = trial_optimizer(workload, self.model, self.hparams)
        self.steps_per_iteration = int(self.config.get("steps_per_iteration", workload.steps_per_iteration))
        self.iteration = 0
        self.step = 0
        self.batches = ResumableBatches.of_workload(workload, self.config)

    def train_iteration(self) -> dict[str, float]:
        """Train `steps_per_iteration` steps and evaluate; a non-finite loss marks the trial diverged."""
        self.model.train()
        train_loss = 0.0
        for _ in range(self.steps_per_iteration):
            inputs, targets = self.batches.batch(self.step)
            loss = self.workload.loss(self.model(inputs), targets)
            optimizer_step(self.model, self.optimizer, loss, grad_clip=self.hparams.grad_clip, schedule=self.schedule)
            self.step += 1
            train_loss += loss.item()
        self.iteration += 1
        return iteration_result(train_loss / self.steps_per_iteration, self.evaluate(), self.step)

    def evaluate(self) -> dict[str, float]:
        return evaluate_model(self.workload, self.config, self.model)

    def state_dict(self) -> dict[str, Any]:
        return trial_state(self.model.state_dict(), self.optimizer, self.schedule, self.iteration, self.step)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.schedule.load_state_dict(state["schedule"])
        self.iteration = int(state["iteration"])
        self.step = int(state["step"])
        torch.set_rng_state(state["rng"])

    def save(self, directory: str) -> None:
        save_trial_state(self.state_dict(), directory)

    def restore(self, directory: str) -> None:
        self.load_state_dict(load_trial_state(directory))


def optimizer_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    loss: torch.Tensor,
    *,
    grad_clip: float = 0.0,
    schedule: torch.optim.lr_scheduler.LRScheduler | None = None,
) -> None:
    """One update from `loss`, written once for every unfused learner: a configuration trained as
    a guest in another job's pipeline bubbles must follow the trajectory it would have followed
    as an ordinary trial, so both take this step."""
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    if schedule is not None:
        schedule.step()


def iteration_result(train_loss: float, evaluation: Mapping[str, float], step: int) -> dict[str, Any]:
    """One iteration's result, as every engine reports it for one configuration: a non-finite
    loss marks the trial diverged, so the sweep stops it instead of training NaNs on."""
    metrics = {"train_loss": train_loss, **evaluation, "step": step}
    metrics["diverged"] = not math.isfinite(train_loss) or not math.isfinite(metrics["val_loss"])
    return metrics


@torch.no_grad()
def evaluate_model(
    workload: Workload, config: Mapping[str, Any], model: torch.nn.Module, device: torch.device | None = None
) -> dict[str, float]:
    """`val_<metric>`: the workload's batch metrics averaged over its validation set, weighted by
    batch size, whichever engine trained `model` (the unfused trainer, a bubble guest)."""
    model.eval()
    totals: dict[str, float] = {}
    count = 0
    for inputs, targets in workload.eval_batches(config):
        if device is not None:
            inputs, targets = inputs.to(device), targets.to(device)
        n = inputs.shape[0]
        for key, value in workload.batch_metrics(model(inputs), targets).items():
            totals[key] = totals.get(key, 0.0) + value.item() * n
        count += n
    return {f"val_{key}": value / count for key, value in totals.items()}
