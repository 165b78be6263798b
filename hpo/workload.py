"""A tuning workload: the model factory, data and loss of a trial, kept apart.

A plain Tune function trainable is opaque: nothing outside it can build its model at another
width (muP proxies) or stack B of its models into one (fusion). A `Workload` exposes exactly
those pieces, and `hpo.training` turns any workload into an ordinary Tune trainable, so one
description serves the plain sweep, the fused group and the muP proxy alike.

Example::

    class MyWorkload(Workload):
        name = "my_mlp"
        def build_model(self, config):
            return MLP(width=config["width"])
        def train_batches(self, config, seed):
            ...  # yields (inputs, targets) forever
        def eval_batches(self, config):
            return [(x_val, y_val)]
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

Batch = tuple[torch.Tensor, torch.Tensor]


class Workload(ABC):
    """What one trial trains. Subclasses fill in the model factory, the data and the loss.

    Contract the engines rely on:
    - `build_model(config)` builds a fresh model whose size is set by `config["width"]`;
      it must not depend on anything but the config (the caller seeds torch first).
    - `train_batches(config, seed)` is deterministic for a seed and depends only on
      `batch_size` among the hyperparameters, so fused members can share inputs.
    - `loss(output, target)` is a *mean* over the batch, so summing members' losses gives each
      member exactly its own gradient.
    """

    name: str = "workload"
    metric: str = "val_loss"
    mode: str = "min"
    #: Hyperparameters the workload needs when the search space leaves them out.
    defaults: Mapping[str, Any] = {}
    #: Keys of `batch_metrics`; reported as `val_<key>` (checked against the sweep's metric up front).
    eval_metric_names: tuple[str, ...] = ("loss", "accuracy")
    #: Optimizer steps between two reports to Tune (one "training iteration").
    steps_per_iteration: int = 20

    def resolve(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """The config a trial actually runs with: workload defaults overlaid by the sweep's values."""
        return {**self.defaults, **config}

    @abstractmethod
    def build_model(self, config: Mapping[str, Any]) -> nn.Module:
        """A fresh, randomly initialised model for this config."""

    @abstractmethod
    def train_batches(self, config: Mapping[str, Any], seed: int) -> Iterator[Batch]:
        """An endless, seeded stream of training batches."""

    @abstractmethod
    def eval_batches(self, config: Mapping[str, Any]) -> list[Batch]:
        """The fixed validation set, in batches."""

    def lr_multipliers(self, model: nn.Module, optimizer: str) -> Mapping[str, float]:
        """Per-parameter learning-rate multipliers, by parameter name; missing names mean 1.0.

        Plain workloads need none. A muP proxy returns its width-dependent factors here, and both
        the plain trainer and the fused optimizers apply them, so one rule serves both paths.
        """
        return {}

    def weight_decay_multipliers(self, model: nn.Module, optimizer: str) -> Mapping[str, float]:
        """Per-parameter weight-decay multipliers, by parameter name; missing names mean 1.0.

        muP's optimizers scale decay per parameter too (decoupled decay stays lr * wd per weight).
        """
        return {}

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy over every position; override for other tasks."""
        return F.cross_entropy(output.reshape(-1, output.shape[-1]), target.reshape(-1))

    def batch_metrics(self, output: torch.Tensor, target: torch.Tensor) -> dict[str, torch.Tensor]:
        """Per-batch means of every metric reported at evaluation (prefixed `val_` by the caller)."""
        flat_out = output.reshape(-1, output.shape[-1])
        flat_target = target.reshape(-1)
        return {
            "loss": F.cross_entropy(flat_out, flat_target),
            "accuracy": (flat_out.argmax(dim=-1) == flat_target).float().mean(),
        }
