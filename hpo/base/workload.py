"""A tuning workload: the model factory, data and loss of a trial, kept apart.

A plain Tune function trainable is opaque: nothing outside it can build its model at another
width (muP proxies) or stack B of its models into one (fusion). A `Workload` exposes exactly
those pieces, and `hpo.engines.workload_trial` turns any workload into an ordinary Tune trainable, so one
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
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset

Batch = tuple[torch.Tensor, torch.Tensor]

#: Config key of the depth contract: a model multiplies every residual branch by it
#: (`x = x + config["residual_mult"] * branch(x)`); `hpo.scaling` sets it when it scales depth.
RESIDUAL_MULT = "residual_mult"


class Workload(ABC):
    """What one trial trains. Subclasses fill in the model factory, the data and the loss.

    Contract the engines rely on:
    - `build_model(config)` builds a fresh model whose size is set by `config["width"]`;
      it must not depend on anything but the config (the caller seeds torch first).
    - `train_batches(config, seed)` is deterministic for a seed and depends only on
      `batch_size` among the hyperparameters, so fused members can share inputs.
    - `loss(output, target)` is a *mean* over the batch, so summing members' losses gives each
      member exactly its own gradient.

    Depth contract (only for `scaling: {target_depth: ...}`): `depth_key` names the config key
    that sets the number of residual blocks, the blocks live under the module `residual_blocks`,
    and `build_model` multiplies every residual branch by `config["residual_mult"]`. Depth
    scaling needs all three: it changes the depth, the branch multiplier and the learning rate
    and Adam eps of the blocks' parameters together (see `hpo.scaling`).
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
    #: Depth contract: the config key that sets the number of residual blocks (`n_layer`,
    #: `depth`, ...); None: the workload cannot be scaled in depth.
    depth_key: str | None = None
    #: Depth contract: the module (dotted name) holding the residual blocks; its parameters are
    #: the hidden ones whose learning rate and Adam eps depth scaling changes.
    residual_blocks: str = "blocks"

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

    def eps_multipliers(self, model: nn.Module, optimizer: str) -> Mapping[str, float]:
        """Per-parameter multipliers of Adam's `eps`, by parameter name; missing names mean 1.0.

        Depth scaling (CompleteP) shrinks the hidden layers' eps with depth, so that it stays below
        their shrinking updates; plain workloads need none.
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


Data = Dataset | DataLoader


class DatasetWorkload(Workload):
    """A `Workload` from the three things a PyTorch user already has: a model factory, data and a loss.

    The user writes no batch generator: a map-style `Dataset` is batched by a `DataLoader` with
    the trial's `batch_size` (shuffled by the data seed, last partial batch dropped, repeated
    forever); a `DataLoader` is used as built, its shuffling seeded per epoch from the data seed,
    so fused members and a resumed trial see the same batches. Items must be `(inputs, target)`;
    data that yields anything else (a dict of features and label) is a ValueError saying so.

    Example::

        workload = DatasetWorkload(
            model=lambda config: nn.Sequential(nn.Linear(8, config["width"]), nn.ReLU(), nn.Linear(config["width"], 2)),
            train=TensorDataset(x_train, y_train),
            val=TensorDataset(x_val, y_val),
            loss=F.cross_entropy,
            metrics={"accuracy": lambda out, y: (out.argmax(-1) == y).float().mean()},
            defaults={"width": 32, "batch_size": 64},
        )
        hpo.run(workload, config={"lr": tune.loguniform(1e-4, 1e-1)}, metric="val_loss", mode="min")
    """

    def __init__(
        self,
        *,
        model: Callable[[Mapping[str, Any]], nn.Module],
        train: Data,
        val: Data,
        loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        metrics: Mapping[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] | None = None,
        defaults: Mapping[str, Any] | None = None,
        name: str = "workload",
        metric: str = "val_loss",
        mode: str = "min",
        steps_per_iteration: int | None = None,
        depth_key: str | None = None,
        residual_blocks: str = "blocks",
    ):
        self.model_factory, self.train, self.val, self.loss_fn = model, train, val, loss
        self.depth_key, self.residual_blocks = depth_key, residual_blocks
        self.metric_fns = dict(metrics or {})
        if "loss" in self.metric_fns:
            raise ValueError("metrics: 'loss' is always reported (as val_loss); name the extra metric otherwise")
        self.name, self.metric, self.mode = name, metric, mode
        self.eval_metric_names = ("loss", *self.metric_fns)
        fixed = {"batch_size": train.batch_size} if isinstance(train, DataLoader) else {}
        self.defaults = {"batch_size": 32, **dict(defaults or {}), **fixed}
        if steps_per_iteration is None:  # one epoch per report, as a Tune user's loop would do
            steps_per_iteration = len(train) if isinstance(train, DataLoader) else len(train) // self.defaults["batch_size"]
        self.steps_per_iteration = max(1, int(steps_per_iteration))
        self._eval_cache: dict[int, list[Batch]] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_eval_cache": {}}  # batches are rebuilt where the trial runs

    def build_model(self, config: Mapping[str, Any]) -> nn.Module:
        return self.model_factory(config)

    def _batch_size(self, config: Mapping[str, Any]) -> int:
        size = int(config["batch_size"])
        if isinstance(self.train, DataLoader) and size != self.train.batch_size:
            raise ValueError(
                f"config batch_size={size}, but the training DataLoader was built with batch_size="
                f"{self.train.batch_size}; pass its Dataset instead to tune the batch size"
            )
        return size

    def train_batches(self, config: Mapping[str, Any], seed: int) -> Iterator[Batch]:
        batch_size = self._batch_size(config)
        if isinstance(self.train, DataLoader):
            yield from _seeded_epochs(self.train, seed)
            return
        generator = torch.Generator().manual_seed(seed)
        loader = DataLoader(self.train, batch_size=batch_size, shuffle=True, drop_last=True, generator=generator)
        if len(loader) == 0:
            raise ValueError(f"the training set has {len(self.train)} items, fewer than one batch of {batch_size}")
        while True:
            for batch in loader:
                yield _as_pair(batch, "training")

    def eval_batches(self, config: Mapping[str, Any]) -> list[Batch]:
        batch_size = self.val.batch_size if isinstance(self.val, DataLoader) else int(config["batch_size"])
        if batch_size not in self._eval_cache:
            loader = self.val if isinstance(self.val, DataLoader) else DataLoader(self.val, batch_size=batch_size)
            self._eval_cache[batch_size] = [_as_pair(batch, "validation") for batch in loader]
        return self._eval_cache[batch_size]

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return self.loss_fn(output, target)

    def batch_metrics(self, output: torch.Tensor, target: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": self.loss_fn(output, target), **{key: fn(output, target) for key, fn in self.metric_fns.items()}}


def _seeded_epochs(loader: DataLoader, seed: int) -> Iterator[Batch]:
    """The user's DataLoader, epoch after epoch, with the shuffle of epoch e drawn from seed + e.

    A DataLoader without its own generator draws its shuffle (and workers' base seed) from
    torch's global RNG when an epoch starts; seeding that draw, and only it, makes the stream a
    function of the data seed without disturbing the trainer's RNG.
    """
    epoch = 0
    while True:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed + epoch)
            batches = iter(loader)
            first = next(batches, None)
        if first is None:
            raise ValueError("the training DataLoader yields no batch")
        yield _as_pair(first, "training")
        for batch in batches:
            yield _as_pair(batch, "training")
        epoch += 1


def _as_pair(batch: Any, data: str) -> Batch:
    """`batch` as (inputs, target), or a ValueError naming what the data yields instead: a dict of
    two keys would otherwise unpack into the keys' names, and the model fail on a string."""
    if isinstance(batch, (tuple, list)) and len(batch) == 2:
        return batch[0], batch[1]
    if isinstance(batch, Mapping):
        found = f"dicts with keys {sorted(map(str, batch))}"
    elif isinstance(batch, (tuple, list)):
        found = f"{type(batch).__name__}s of {len(batch)} items"
    else:
        found = f"{type(batch).__name__}s"
    raise ValueError(
        f"DatasetWorkload: the {data} data must yield (inputs, target) pairs, and it yields {found}; "
        "wrap the dataset so that each item is (inputs, target)"
    )
