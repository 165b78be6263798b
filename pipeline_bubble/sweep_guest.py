"""A sweep's fused group (a `BubbleGroup` actor) as guest work, trained one step at a time.

Used by pipeline stages that lend their bubbles (`pipeline_bubble.lending`) and by idle-GPU hosts
(`pipeline_bubble.idle_gpu_host`). Every `steps_per_iteration` steps the group is evaluated and
each member's metrics and checkpoint are published to the `BubbleGroup`, exactly as a `FusedGroup`
actor would send them; the guest then pauses (`ready()` false) until the member trials have taken
them, so Tune's decisions (ASHA stops) apply before the next iteration.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ray
import torch

from fusion.group_actor import GroupAssignment, member_results
from hpo.base.trial_state import rng_devices
from pipeline_bubble.fused_guest import FusedGroupGuest


class SweepGroupGuest(FusedGroupGuest):
    """A sweep's fused group (a `BubbleGroup` actor), trained step by step in a stage's bubbles."""

    def __init__(
        self,
        group: Any,
        assignment: GroupAssignment,
        device: torch.device,
        on_close: Callable[[Any, bool], None],
        yield_requested: Callable[[], bool] = lambda: False,
    ):
        with torch.random.fork_rng(devices=rng_devices(device)):  # members seed the global RNG
            trainer = assignment.trainer(device)
        super().__init__(trainer)
        self.group = group
        self.max_iterations = assignment.max_iterations
        self.finished = trainer.iteration >= self.max_iterations
        self._on_close = on_close
        self._yield_requested = yield_requested
        self._loss_sums = self._zeros()
        self._steps_in_iteration = 0
        # A group taken over mid-sweep waits until its trials have the last published iteration.
        self._release: ray.ObjectRef | None = group.released.remote()

    def _zeros(self) -> torch.Tensor:
        return torch.zeros(self.trainer.num_members, dtype=torch.float64, device=self.trainer.device)

    def ready(self) -> bool:
        if self._yield_requested():
            return False  # the executor evicts the guest before its next step
        if self._release is not None:
            done, _ = ray.wait([self._release], timeout=0)
            if not done:
                return False
            survivors = ray.get(self._release)
            self._release = None
            if survivors and survivors != self.trainer.member_ids:
                self.trainer.keep_members(survivors)
                self._loss_sums = self._zeros()
            self.finished = not survivors or self.trainer.iteration >= self.max_iterations
        return not self.finished

    def step(self) -> float:
        losses = self.member_step()
        self._loss_sums += losses.double()
        self._steps_in_iteration += 1
        if self._steps_in_iteration == self.trainer.steps_per_iteration:
            with self.rng.isolated():
                metrics = self.trainer.finish_iteration(self._loss_sums)
            self.group.publish.remote(self.trainer.iteration, member_results(self.trainer, metrics))
            self._release = self.group.released.remote()
            self._loss_sums, self._steps_in_iteration = self._zeros(), 0
        return float(losses.mean())

    def close(self, failure: str | None) -> None:
        """Leaving the stage: a failure fails the group's trials (Tune retries them); an unfinished
        group goes back to the pool and resumes elsewhere from its last published iteration."""
        if failure is not None:
            self.group.fail.remote(failure)
        done = self.finished or self.trainer.iteration >= self.max_iterations  # its last iteration is out
        self._on_close(self.group, unfinished=failure is None and not done)
