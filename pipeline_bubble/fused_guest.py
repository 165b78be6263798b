"""A fused tuning group (`fusion.FusedTrainer`) as a bubble guest: one fused step per `step()`.

`FusedTrainer` seeds and restores the global RNG (as `TrialTrainer` does) when it builds its
members and loads checkpoints; the adapter confines both, and every step, to a private RNG
stream (`hpo.base.trial_state.PrivateRNG`), so the host pipeline job's RNG never moves. Data comes from
the trainer's own resumable stream (`FusedTrainer.batches`).

Example::

    guest = fused_group_guest(workload, [{"lr": 1e-3}, {"lr": 3e-3}], device="cpu")
    guest.step()                 # one optimizer step of every member
    rows = guest.evaluate()      # one metrics dict per member
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from hpo.base.trial_state import PrivateRNG, rng_devices
from pipeline_bubble.guests import tensor_bytes


class FusedGroupGuest:
    """Adapts a `fusion.FusedTrainer` to `GuestWork`."""

    def __init__(self, trainer: Any, *, seed: int = 0):
        self.trainer = trainer
        self.rng = PrivateRNG(seed, trainer.device)
        inputs, _ = trainer.batches.batch(trainer.step)
        self._batch_size = int(inputs.shape[0])

    @property
    def config(self) -> list[dict[str, Any]]:
        return list(self.trainer.configs)

    @property
    def member_ids(self) -> list[Any]:
        return list(self.trainer.member_ids)

    @property
    def samples_per_step(self) -> int:
        """Every member trains on the shared batch (members come and go in a sweep's group)."""
        return self._batch_size * self.trainer.num_members

    @property
    def steps(self) -> int:
        return int(self.trainer.step)

    @property
    def memory_bytes(self) -> int:
        params = list(self.trainer.model.parameters())
        return 2 * tensor_bytes(params) + tensor_bytes(self.trainer.optimizer.state_dict()["state"].values())

    def step(self) -> float:
        return float(self.member_step().mean())

    def member_step(self) -> torch.Tensor:
        """One step of every member; their `[B]` losses."""
        inputs, targets = self.trainer.batches.batch(self.trainer.step)
        with self.rng.active():
            self.trainer.model.train()
            losses = self.trainer.train_step(inputs, targets)
        return losses

    def evaluate(self) -> list[dict[str, float]]:
        """Per-member validation metrics, in `trainer.member_ids` order."""
        with self.rng.isolated():
            return self.trainer.evaluate()

    def state_dict(self) -> dict[str, Any]:
        return {"trainer": self.trainer.state_dict(), "rng": self.rng.state_dict()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        saved = [dict(config) for config in state["trainer"].get("configs", self.config)]
        if saved != [dict(config) for config in self.config]:  # the same member ids, other configs
            raise ValueError(f"it holds the progress of configs {saved}, not of {self.config}")
        with self.rng.isolated():  # FusedTrainer restores the global RNG
            self.trainer.load_state_dict(state["trainer"])
        self.rng.load_state_dict(state["rng"])


def fused_group_guest(
    workload: Any,
    configs: Sequence[Mapping[str, Any]],
    *,
    member_ids: Sequence[Any] | None = None,
    device: torch.device | str = "cpu",
    seed: int = 0,
) -> FusedGroupGuest:
    """Build a `fusion.FusedTrainer` for `configs` without touching the global RNG, as a guest."""
    from fusion import FusedTrainer

    with torch.random.fork_rng(devices=rng_devices(device)):  # members seed the global RNG
        trainer = FusedTrainer(workload, configs, member_ids=member_ids, device=device)
    return FusedGroupGuest(trainer, seed=seed)

