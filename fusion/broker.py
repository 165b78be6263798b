"""`GroupBroker`: the actor that gathers member trials into fused groups as Tune starts them.

Tune starts one light trial per configuration; each asks the broker to `join`. Trials whose
configs may share a group (same structural signature, same training step) are gathered until the
group has `max_members` or no new member arrived for `window_s`, then the group is launched:
by default as one `FusedGroup` actor with the sweep's per-trial resources (one GPU or CPU slot),
or by any `GroupLauncher` the sweep passes (pipeline bubbles: `pipeline_bubble.bubble_pool`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

import ray

from fusion.group_actor import FusedGroup
from fusion.grouping import structural_signature
from hpo.workload import Workload

logger = logging.getLogger(__name__)

#: Starts a group's actor: (configs, member trial ids, member states or None) -> a `MemberRelay` actor.
GroupLauncher = Callable[[list[Mapping[str, Any]], list[Hashable], list[bytes | None]], Any]


def device_group_launcher(
    workload: Workload, max_iterations: int, group_resources: Mapping[str, float], dtype: str = "fp32"
) -> GroupLauncher:
    """Each group a `FusedGroup` actor holding `group_resources` (one GPU, or CPU threads)."""
    cpus = group_resources.get("cpu", 1.0)
    gpus = group_resources.get("gpu", 0.0)

    def launch(configs: list[Mapping[str, Any]], members: list[Hashable], states: list[bytes | None]) -> Any:
        return FusedGroup.options(num_cpus=cpus, num_gpus=gpus, max_restarts=0).remote(
            workload, configs, members, states, max_iterations, "cuda" if gpus > 0 else "cpu", dtype, max(1, int(cpus))
        )

    return launch


@dataclass
class _Forming:
    members: list[Hashable] = field(default_factory=list)
    configs: list[Mapping[str, Any]] = field(default_factory=list)
    states: list[bytes | None] = field(default_factory=list)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    launched: asyncio.Event = field(default_factory=asyncio.Event)
    group: Any = None


@ray.remote(num_cpus=0)
class GroupBroker:
    def __init__(self, workload: Workload, max_members: int, launch_group: GroupLauncher, window_s: float = 3.0):
        self.workload = workload
        self.max_members = max_members
        self.launch_group = launch_group
        self.window_s = window_s
        self.forming: dict[tuple, _Forming] = {}
        self.group_of: dict[Hashable, Any] = {}
        self.members_of: dict[Any, set[Hashable]] = {}
        self.launched_groups: list[list[Hashable]] = []

    async def join(self, trial_id: Hashable, config: Mapping[str, Any], state: bytes | None, step: int) -> Any:
        """Place a member trial (fresh, or resuming at `step` from `state`) and return its group actor."""
        key = (structural_signature(self.workload.resolve(config)), step)
        forming = self.forming.get(key)
        if forming is None:
            forming = self.forming[key] = _Forming()
            asyncio.get_running_loop().create_task(self._launch_when_ready(key, forming))
        forming.members.append(trial_id)
        forming.configs.append(dict(config))
        forming.states.append(state)
        forming.arrived.set()
        await forming.launched.wait()
        self.group_of[trial_id] = forming.group
        return forming.group

    async def _launch_when_ready(self, key: tuple, forming: _Forming) -> None:
        while len(forming.members) < self.max_members:
            forming.arrived.clear()
            try:
                await asyncio.wait_for(forming.arrived.wait(), timeout=self.window_s)
            except asyncio.TimeoutError:
                break
        del self.forming[key]  # later arrivals start a new group
        forming.group = self.launch_group(forming.configs, forming.members, forming.states)
        self.members_of[forming.group] = set(forming.members)
        self.launched_groups.append(list(forming.members))
        logger.info("fused group of %d members launched", len(forming.members))
        forming.launched.set()

    async def leave(self, trial_id: Hashable) -> None:
        """A member's trial ended; the group drops it, and ends once it has no members left."""
        group = self.group_of.pop(trial_id, None)
        if group is None:
            return
        members = self.members_of.get(group, set())
        members.discard(trial_id)
        try:
            await group.leave.remote(trial_id)
        except ray.exceptions.RayActorError:
            pass  # the group died; its members' trials fail and Tune retries them from checkpoints
        if not members:
            self.members_of.pop(group, None)
            ray.kill(group)

    def groups(self) -> list[list[Hashable]]:
        """Every group launched so far, as lists of member trial ids (for reports and tests)."""
        return [list(g) for g in self.launched_groups]
