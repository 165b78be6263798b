"""A fused tuning group (`fusion.FusedTrainer`) as a bubble guest: one fused step per `step()`.

`FusedTrainer` seeds and restores the global RNG (as `TrialTrainer` does) when it builds its
members and loads checkpoints; the adapter confines both, and every step, to a private RNG
stream, so the host pipeline job's RNG never moves. Data comes from the group's own stream,
re-created and fast-forwarded after a restore exactly like the trainer does.

Example::

    guest = fused_group_guest(workload, [{"lr": 1e-3}, {"lr": 3e-3}], device="cpu")
    guest.step()                 # one optimizer step of every member
    rows = guest.evaluate()      # one metrics dict per member
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch

from pipeline_bubble.guests import _devices_for_rng, _tensor_bytes


class FusedGroupGuest:
    """Adapts a `fusion.FusedTrainer` to `GuestWork`."""

    def __init__(self, trainer: Any, *, seed: int = 0):
        self.trainer = trainer
        self._rng_devices = _devices_for_rng(trainer.device)
        with torch.random.fork_rng(devices=self._rng_devices):
            torch.manual_seed(seed)
            self._rng = torch.get_rng_state()
        self._batches: Iterator | None = None
        inputs, _ = next(trainer.workload.train_batches(trainer.configs[0], trainer.data_seed))
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
        return 2 * _tensor_bytes(params) + _tensor_bytes(self.trainer.optimizer.state_dict()["state"].values())

    def _stream(self) -> Iterator:
        if self._batches is None:
            self._batches = self.trainer.workload.train_batches(self.trainer.configs[0], self.trainer.data_seed)
            for _ in range(self.trainer.step):
                next(self._batches)
        return self._batches

    def step(self) -> float:
        return float(self.member_step().mean())

    def member_step(self) -> torch.Tensor:
        """One step of every member; their `[B]` losses."""
        inputs, targets = next(self._stream())
        with torch.random.fork_rng(devices=self._rng_devices):
            torch.set_rng_state(self._rng)
            self.trainer.model.train()
            losses = self.trainer.train_step(inputs, targets)
            self._rng = torch.get_rng_state()
        return losses

    def evaluate(self) -> list[dict[str, float]]:
        """Per-member validation metrics, in `trainer.member_ids` order."""
        with torch.random.fork_rng(devices=self._rng_devices):
            return self.trainer.evaluate()

    def state_dict(self) -> dict[str, Any]:
        return {"trainer": self.trainer.state_dict(), "rng": self._rng.clone()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        with torch.random.fork_rng(devices=self._rng_devices):  # FusedTrainer restores the global RNG
            self.trainer.load_state_dict(state["trainer"])
        self._rng = state["rng"].clone()
        self._batches = None


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

    with torch.random.fork_rng(devices=_devices_for_rng(torch.device(device))):  # members seed the global RNG
        trainer = FusedTrainer(workload, configs, member_ids=member_ids, device=device)
    return FusedGroupGuest(trainer, seed=seed)

