"""Guest work: what a bubble executor trains in a pipeline stage's idle windows.

The executor only needs the small `GuestWork` protocol: one optimizer step at a time, a
checkpointable state, and its memory footprint. `TorchGuest` trains any module/optimizer/data
stream; `workload_guest` builds one from a `hpo.base.workload.Workload` config exactly the way the
plain trainer does (same optimizer and LR schedule from `hpo.base.hparams`).

A guest must never touch the host job's math. Concretely it keeps its own RNG stream
(`hpo.base.trial_state.PrivateRNG`), builds its own tensors, and never reads or writes the main job's
parameters.

Example::

    guest = workload_guest(hpo.examples.mlp_digits.workload, {"lr": 3e-3, "width": 64})
    loss = guest.step()            # one optimizer step
    state = guest.state_dict()     # resumable
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from functools import partial
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn

from hpo.base.hparams import OptimHParams
from hpo.base.training import evaluate_model, optimizer_step
from hpo.base.trial_state import PrivateRNG, ResumableBatches, trial_optimizer
from hpo.base.workload import Batch


@runtime_checkable
class GuestWork(Protocol):
    """One tuning job, advanced one optimizer step at a time by a `BubbleExecutor`.

    `step()` must be self-contained (no state carried in autograd between calls), must leave the
    global RNG state as it found it, and returns the step's training loss.

    Optional, for guests fed by a sweep (`pipeline_bubble.lending`): `ready() -> bool` (false:
    run no step now), `finished: bool` (the stage may take another guest) and
    `close(failure: str | None)` (called when the guest leaves the stage: done, evicted or failed).
    """

    #: Training samples consumed per `step()` (for samples/s harvested).
    samples_per_step: int

    @property
    def memory_bytes(self) -> int:
        """Resident bytes of the guest (parameters, gradients, optimizer state)."""

    def step(self) -> float: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...


def tensor_bytes(tensors) -> int:
    """Bytes the tensors among `tensors` hold: what a guest adds to its stage's memory."""
    return sum(t.numel() * t.element_size() for t in tensors if torch.is_tensor(t))


class TorchGuest:
    """Trains `model` with `optimizer` on `batch_stream()` under a private RNG stream.

    `batch_stream` (or the function that opens it) is read by step as a
    `hpo.base.trial_state.ResumableBatches`, so a restored guest sees the data it would have seen had
    it never stopped.
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        batch_stream: ResumableBatches | Callable[[], Iterator[Batch]],
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        *,
        seed: int = 0,
        scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
        grad_clip: float = 0.0,
        device: torch.device | str = "cpu",
        evaluate: Callable[[nn.Module], dict[str, float]] | None = None,
        config: Mapping[str, Any] | None = None,
    ):
        self.device = torch.device(device)
        self.config = dict(config or {})
        #: The sweep's id for this trial (set by `run_guests_in_bubbles`).
        self.member_id: Any = None
        self._evaluate = evaluate
        self.model = model.to(self.device)
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.loss_fn = loss_fn
        self.grad_clip = grad_clip
        self.steps = 0
        self.batches = batch_stream if isinstance(batch_stream, ResumableBatches) else ResumableBatches(batch_stream)
        self.rng = PrivateRNG(seed, self.device)
        self.samples_per_step = int(self.batches.batch(0)[0].shape[0])

    @property
    def memory_bytes(self) -> int:
        params = list(self.model.parameters())
        state = [t for s in self.optimizer.state.values() for t in s.values()]
        return 2 * tensor_bytes(params) + tensor_bytes(state)

    def step(self) -> float:
        inputs, targets = self.batches.batch(self.steps)
        inputs, targets = inputs.to(self.device, non_blocking=True), targets.to(self.device, non_blocking=True)
        with self.rng.active():
            self.model.train()
            loss = self.loss_fn(self.model(inputs), targets)
            optimizer_step(self.model, self.optimizer, loss, grad_clip=self.grad_clip, schedule=self.scheduler)
        self.steps += 1
        return float(loss.detach())

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Validation metrics of the guest's model (empty if it was built without an evaluator)."""
        if self._evaluate is None:
            return {}
        self.model.eval()
        with self.rng.isolated():
            return self._evaluate(self.model)

    def state_dict(self) -> dict[str, Any]:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
            "steps": self.steps,
            "rng": self.rng.state_dict(),
            "config": self.config,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if "config" in state and state["config"] != self.config:  # (older checkpoints do not say)
            raise ValueError(f"it holds the progress of config {state['config']}, not of {self.config}")
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scheduler is not None and state["scheduler"] is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        self.steps = int(state["steps"])
        self.rng.load_state_dict(state["rng"])


def workload_guest(
    workload: Any, config: Mapping[str, Any], *, device: torch.device | str = "cpu", seed: int | None = None
) -> TorchGuest:
    """A guest that trains one config of a `hpo.base.workload.Workload` like `hpo.base.training.TrialTrainer` does.

    Same model factory, data stream (`data_seed`), optimizer, muP LR multipliers and LR schedule;
    only the RNG is private (seeded from `config["seed"]` unless `seed` is given), so the host
    job's global RNG is never advanced.
    """
    config = workload.resolve(config)
    hparams = OptimHParams.from_config(config)
    seed = int(config.get("seed", 0)) if seed is None else seed
    with PrivateRNG(seed, device).active():
        model = workload.build_model(config).to(device)
    optimizer, schedule = trial_optimizer(workload, model, hparams)
    return TorchGuest(
        model,
        optimizer,
        ResumableBatches.of_workload(workload, config),
        workload.loss,
        seed=seed,
        scheduler=schedule,
        grad_clip=hparams.grad_clip,
        device=device,
        evaluate=lambda model: evaluate_model(workload, config, model, torch.device(device)),
        config=config,
    )


class GuestGroup:
    """Several guests sharing one stage's bubbles, stepped in turn (one member's step per `step()`).

    The unfused fallback for a stage hosting several configs; a fused group (see
    `fused_group_guest`) does the same work in one step per member-batch instead.
    """

    def __init__(self, members: list[GuestWork]):
        if not members:
            raise ValueError("GuestGroup needs at least one member")
        self.members = members
        self.samples_per_step = max(m.samples_per_step for m in members)
        self.turn = 0

    @property
    def memory_bytes(self) -> int:
        return sum(m.memory_bytes for m in self.members)

    def step(self) -> float:
        loss = self.members[self.turn].step()
        self.turn = (self.turn + 1) % len(self.members)
        return loss

    def state_dict(self) -> dict[str, Any]:
        return {"turn": self.turn, "members": [m.state_dict() for m in self.members]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.turn = int(state["turn"])
        for member, member_state in zip(self.members, state["members"], strict=True):
            member.load_state_dict(member_state)


def _teacher_batches(seed: int, batch: int, features: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    teacher = torch.randn(features, 10, generator=generator)
    while True:
        x = torch.randn(batch, features, generator=generator)
        yield x, (x @ teacher).argmax(dim=1)


def teacher_guest(
    seed: int, *, width: int = 64, batch: int = 64, lr: float = 3e-3, device: torch.device | str = "cpu"
) -> TorchGuest:
    """A small MLP learning a random linear teacher: a stand-in tuning trial with no data files,
    whose step takes as long as its `width` and `batch` make it."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1000 + seed)
        model = nn.Sequential(nn.Linear(32, width), nn.ReLU(), nn.Linear(width, 10))
    return TorchGuest(
        model,
        torch.optim.Adam(model.parameters(), lr=lr),
        partial(_teacher_batches, 2000 + seed, batch, 32),
        nn.functional.cross_entropy,
        seed=seed,
        device=device,
    )
