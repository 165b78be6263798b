"""Where sweeps and pipeline jobs meet: fused groups waiting for bubbles, and the stages lending them.

A sweep with `fusion.placement: bubbles` launches each fused group as a `BubbleGroup` actor that
holds no resources and trains nothing itself: it only relays results to the group's member
trials (`fusion.group_actor.MemberRelay`) and keeps each member's latest checkpoint. The group
waits in the `BubblePool` (one named actor per Ray cluster, `hpo:bubbles`) until a pipeline stage
that lends its bubbles (`pipeline_bubble.lending.lend_bubbles`) takes it. The stage trains the
group step by step in its idle windows and publishes every iteration back to the `BubbleGroup`.

A stage that is evicted, or whose job ends, gives the group back; the next stage to take it
resumes from the members' last published checkpoints, so only the steps since then are redone.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import ray

from fusion.broker import GroupLauncher
from fusion.group_actor import MemberRelay, member_state_from_bytes
from hpo.ray_runtime import NAMESPACE
from hpo.workload import Workload

POOL_NAME = "hpo:bubbles"


def bubble_pool() -> Any:
    """The cluster's pool, created by whichever side (sweep or pipeline job) comes first."""
    return BubblePool.options(name=POOL_NAME, namespace=NAMESPACE, get_if_exists=True, lifetime="detached").remote()


@ray.remote(num_cpus=0)
class BubblePool:
    """A FIFO of groups waiting for a stage, and which stage trains which group."""

    def __init__(self) -> None:
        self.waiting: deque[Any] = deque()
        self.hosts: dict[str, Any] = {}

    def register(self, host_id: str) -> None:
        self.hosts.setdefault(host_id, None)

    def unregister(self, host_id: str) -> None:
        self.hosts.pop(host_id, None)

    def submit(self, group: Any) -> None:
        self.waiting.append(group)

    def take(self, host_id: str) -> Any:
        """The oldest waiting group for `host_id` to train, or None."""
        if not self.waiting or host_id not in self.hosts:
            return None
        group = self.hosts[host_id] = self.waiting.popleft()
        return group

    def give_back(self, host_id: str, group: Any) -> None:
        """`host_id` stopped training `group` before it finished: first in line for the next stage."""
        if host_id in self.hosts:
            self.hosts[host_id] = None
        self.waiting.appendleft(group)

    def done(self, host_id: str) -> None:
        if host_id in self.hosts:
            self.hosts[host_id] = None

    def state(self) -> dict[str, Any]:
        """How many groups wait, and which registered stages train one (for sizing and for tests)."""
        return {"waiting": len(self.waiting), "hosts": {h: g is not None for h, g in self.hosts.items()}}


@ray.remote(num_cpus=0)
class BubbleGroup(MemberRelay):
    """A fused group trained wherever the pool sends it; holds its members' latest checkpoints."""

    def __init__(
        self,
        workload: Workload,
        configs: Sequence[Mapping[str, Any]],
        member_ids: Sequence[Hashable],
        states: Sequence[bytes | None],
        max_iterations: int,
        dtype: str,
    ):
        iteration = int(member_state_from_bytes(states[0])["iteration"]) if states[0] is not None else 0
        super().__init__(member_ids, iteration)
        self.workload = workload
        self.configs = dict(zip(member_ids, configs))
        self.latest = dict(zip(member_ids, states))
        self.max_iterations = max_iterations
        self.dtype = dtype

    async def assignment(self) -> dict[str, Any]:
        """Everything a stage needs to train the group on from its last published iteration."""
        members = [m for m in self.member_ids if m not in self.leaving]
        return {
            "workload": self.workload,
            "member_ids": members,
            "configs": [self.configs[m] for m in members],
            "states": [self.latest[m] for m in members],
            "iteration": self.iteration,
            "max_iterations": self.max_iterations,
            "dtype": self.dtype,
        }

    async def publish(self, iteration: int, results: Mapping[Hashable, dict[str, Any]]) -> None:
        for member_id, result in results.items():
            self.latest[member_id] = result["checkpoint"]
        await self._publish(iteration, results)

    async def released(self) -> list[Hashable]:
        """Wait until every member has its latest iteration (or left); the members that go on."""
        return await self._wait_released()

    async def fail(self, error: str) -> None:
        """The stage training the group failed: its member trials fail, and Tune retries them."""
        await self._fail(error)


def bubble_group_launcher(workload: Workload, max_iterations: int, dtype: str = "fp32") -> GroupLauncher:
    """Each group a `BubbleGroup`, queued in the cluster's pool for the next free stage."""

    def launch(configs: list[Mapping[str, Any]], members: list[Hashable], states: list[bytes | None]) -> Any:
        group = BubbleGroup.remote(workload, configs, members, states, max_iterations, dtype)
        bubble_pool().submit.remote(group)
        return group

    return launch


def lending_stages() -> int:
    """How many pipeline stages lend their bubbles right now (a sweep sizes its concurrency by it)."""
    return len(ray.get(bubble_pool().state.remote())["hosts"])
