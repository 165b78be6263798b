"""`MemberRelay`: where a fused group's per-member results wait for their Tune trials.

This is the half of a fused group that faces member trials which are Tune trials of their own:
the groups trained in pipeline stages' bubbles or on the allocator's idle GPUs
(`pipeline_bubble.bubble_pool.BubbleGroup`). An iteration runs when every current member has
fetched the previous one (or left), so the group trains at most one iteration ahead of the
results Tune is judging: a member that ASHA stops is dropped from the group (its parameters and
optimizer state repacked away) before the iteration after next, and one that diverges before
the next. (Sweeps fused on devices the sweep holds run each group as one Tune trial instead:
`hpo.engines.fused.group_trial`.)
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fusion.trainer import FusedTrainer
from hpo.base.trial_state import trial_state_bytes, trial_state_from_bytes
from hpo.base.workload import Workload


class GroupFailed(RuntimeError):
    pass


class MemberRelay:
    """Per-member results of a fused group, handed to member trials one iteration at a time.

    Subclasses train the group and call `_publish` after each iteration; `_released(iteration)`
    says when every member has fetched it (or left), so the next iteration may start.
    """

    def __init__(self, member_ids: Sequence[Hashable], iteration: int):
        self.member_ids = list(member_ids)
        self.iteration = iteration
        self.results: dict[Hashable, dict[int, dict[str, Any]]] = {m: {} for m in member_ids}
        self.fetched: dict[Hashable, int] = {m: iteration for m in member_ids}
        self.leaving: set[Hashable] = set()
        self.error: str | None = None
        self._changed: asyncio.Condition | None = None

    @property
    def changed(self) -> asyncio.Condition:
        if self._changed is None:  # created inside the actor's event loop
            self._changed = asyncio.Condition()
        return self._changed

    def _released(self, iteration: int) -> bool:
        return all(self.fetched[m] >= iteration or m in self.leaving for m in self.member_ids)

    async def _publish(self, iteration: int, results: Mapping[Hashable, dict[str, Any]]) -> None:
        """Iteration `iteration`'s result (metrics and checkpoint bytes) of every member."""
        async with self.changed:
            for member_id, result in results.items():
                if member_id in self.results:
                    self.results[member_id][iteration] = result
            self.iteration = iteration
            diverged = [m for m, r in results.items() if r["metrics"]["diverged"]]
            if diverged and len(diverged) < len(results):
                self.leaving.update(diverged)  # their trials end after reporting; repack them away now
            self.changed.notify_all()

    async def _fail(self, error: str) -> None:
        async with self.changed:
            self.error = error
            self.changed.notify_all()

    async def _wait_released(self) -> list[Hashable]:
        """Wait until every member fetched the current iteration or left; returns who stays."""
        async with self.changed:
            await self.changed.wait_for(lambda: self._released(self.iteration))
            self.member_ids = [m for m in self.member_ids if m not in self.leaving]
            return list(self.member_ids)

    async def fetch(self, member_id: Hashable, iteration: int) -> dict[str, Any]:
        """Member `member_id`'s metrics and checkpoint (bytes) after `iteration` (1-based)."""
        await self._on_first_call()
        async with self.changed:
            self.fetched[member_id] = iteration - 1
            self.changed.notify_all()
            await self.changed.wait_for(lambda: iteration in self.results[member_id] or self.error is not None)
            if iteration not in self.results[member_id]:
                raise GroupFailed(f"the fused group failed: {self.error}")
            result = self.results[member_id].pop(iteration)
            self.fetched[member_id] = iteration
            self.changed.notify_all()
            return result

    async def leave(self, member_id: Hashable) -> None:
        """The member's trial ended (stopped early, finished, failed): stop training it."""
        await self._on_first_call()
        async with self.changed:
            self.leaving.add(member_id)
            self.changed.notify_all()

    async def members(self) -> list[Hashable]:
        return list(self.member_ids)

    async def _on_first_call(self) -> None:
        """Hook for subclasses that start work once the actor's event loop runs."""


@dataclass(frozen=True)
class GroupAssignment:
    """A fused group as whoever trains it next needs it: its members (configs, ids, and the
    checkpoints they resume from, None for a fresh member) and how it trains. The actor that holds
    the group hands one to each stage or idle GPU that takes the group over."""

    workload: Workload
    configs: Sequence[Mapping[str, Any]]
    member_ids: Sequence[Hashable]
    states: Sequence[bytes | None]
    max_iterations: int
    dtype: str = "fp32"
    verify: bool = True

    def trainer(self, device: Any) -> FusedTrainer:
        """A group of fresh members, or of members resuming from their checkpoints."""
        if any(state is not None for state in self.states):
            return FusedTrainer.from_member_states(
                self.workload, self.configs, [trial_state_from_bytes(s) for s in self.states],
                member_ids=self.member_ids, device=device, dtype=self.dtype, verify=self.verify,
            )
        return FusedTrainer(self.workload, self.configs, member_ids=self.member_ids, device=device,
                            dtype=self.dtype, verify=self.verify)


def member_results(
    trainer: FusedTrainer, metrics: Sequence[Mapping[str, Any]], checkpoint: bool = True
) -> dict[Hashable, dict[str, Any]]:
    """What a member trial fetches after an iteration: its metrics and, when `checkpoint`, its
    checkpoint as bytes (None otherwise)."""
    return {
        member_id: {
            "metrics": {**member_metrics, "fused_members": trainer.num_members},
            "checkpoint": trial_state_bytes(trainer.member_state_dict(member_id)) if checkpoint else None,
        }
        for member_id, member_metrics in zip(trainer.member_ids, metrics)
    }
