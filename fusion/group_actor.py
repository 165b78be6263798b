"""`FusedGroup`: the Ray actor that holds one device slot and trains one fused group.

Each member of the group is still an ordinary Tune trial (its own config, metrics, checkpoint and
results row); the trial only fetches its results from this actor. An iteration runs when every
current member has fetched the previous one (or left), so the group never races ahead of the
trials Tune is still judging, and a member that ASHA stops, or that diverges, is dropped from the
group (its parameters and optimizer state repacked away) before the next iteration.
"""

from __future__ import annotations

import asyncio
import io
import logging
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import ray
import torch

from fusion.trainer import FusedTrainer
from hpo.workload import Workload

logger = logging.getLogger(__name__)


def member_state_to_bytes(state: Mapping[str, Any]) -> bytes:
    buffer = io.BytesIO()
    torch.save(dict(state), buffer)
    return buffer.getvalue()


def member_state_from_bytes(blob: bytes) -> dict[str, Any]:
    return torch.load(io.BytesIO(blob), weights_only=False)


class GroupFailed(RuntimeError):
    pass


@ray.remote
class FusedGroup:
    """Trains `configs` fused; members are Tune trial ids. Created by `fusion.broker.GroupBroker`."""

    def __init__(
        self,
        workload: Workload,
        configs: Sequence[Mapping[str, Any]],
        member_ids: Sequence[Hashable],
        states: Sequence[bytes | None],
        max_iterations: int,
        device: str,
        dtype: str,
        threads: int,
    ):
        torch.set_num_threads(threads)
        if any(state is not None for state in states):
            self.trainer = FusedTrainer.from_member_states(
                workload, configs, [member_state_from_bytes(s) for s in states], member_ids=member_ids,
                device=device, dtype=dtype,
            )
        else:
            self.trainer = FusedTrainer(workload, configs, member_ids=member_ids, device=device, dtype=dtype)
        self.max_iterations = max_iterations
        self.results: dict[Hashable, dict[int, dict[str, Any]]] = {m: {} for m in member_ids}
        self.fetched: dict[Hashable, int] = {m: self.trainer.iteration for m in member_ids}
        self.leaving: set[Hashable] = set()
        self.error: str | None = None
        self.changed: asyncio.Condition | None = None
        self.loop: asyncio.Task | None = None

    async def _ensure_loop(self) -> None:
        if self.loop is None:
            self.changed = asyncio.Condition()
            self.loop = asyncio.get_running_loop().create_task(self._train_loop())

    def _members_done_with(self, iteration: int) -> bool:
        return all(self.fetched[m] >= iteration or m in self.leaving for m in self.trainer.member_ids)

    async def _train_loop(self) -> None:
        try:
            while self.trainer.member_ids and self.trainer.iteration < self.max_iterations:
                async with self.changed:
                    await self.changed.wait_for(lambda: self._members_done_with(self.trainer.iteration))
                    self._drop(self.leaving & set(self.trainer.member_ids))
                if not self.trainer.member_ids:
                    break
                iteration_results = await asyncio.to_thread(self._train_iteration)
                async with self.changed:
                    for member_id, result in iteration_results.items():
                        self.results[member_id][self.trainer.iteration] = result
                    self.changed.notify_all()
        except Exception as exc:  # reported to every member; each trial fails and is retried by Tune
            logger.exception("fused group failed")
            async with self.changed:
                self.error = f"{type(exc).__name__}: {exc}"
                self.changed.notify_all()

    def _train_iteration(self) -> dict[Hashable, dict[str, Any]]:
        metrics = self.trainer.train_iteration()
        results = {}
        for member_id, member_metrics in zip(self.trainer.member_ids, metrics):
            member_metrics = {**member_metrics, "fused_members": self.trainer.num_members}
            results[member_id] = {
                "metrics": member_metrics,
                "checkpoint": member_state_to_bytes(self.trainer.member_state_dict(member_id)),
            }
        diverged = [m for m, r in results.items() if r["metrics"]["diverged"]]
        if diverged and len(diverged) < self.trainer.num_members:
            self.leaving.update(diverged)  # their trials end after reporting; repack them away now
        return results

    def _drop(self, members: set[Hashable]) -> None:
        if not members:
            return
        survivors = [m for m in self.trainer.member_ids if m not in members]
        if survivors:
            self.trainer.keep_members(survivors)
            logger.info("fused group shrank to %d members", len(survivors))
        else:
            self.trainer.member_ids = []

    async def fetch(self, member_id: Hashable, iteration: int) -> dict[str, Any]:
        """Member `member_id`'s metrics and checkpoint (bytes) after `iteration` (1-based)."""
        await self._ensure_loop()
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
        await self._ensure_loop()
        async with self.changed:
            self.leaving.add(member_id)
            self.changed.notify_all()

    async def members(self) -> list[Hashable]:
        return list(self.trainer.member_ids)
