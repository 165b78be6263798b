"""`GroupBroker`: the actor that gathers a sweep's configurations into fused groups.

Fresh configurations arrive from the driver (`register`, as soon as Tune creates their trials),
so a group forms without waiting for its members' relay processes; a relay then `join`s and gets
the group that already trains its configuration. Members resuming from checkpoints arrive through
`join` with their state. Configurations that may share a group (same structural signature, same
training step) are gathered until the group has `max_members` or no new member arrived for the
window, then the group is launched by the `GroupLauncher` the sweep passes (pipeline bubbles:
`pipeline_bubble.bubble_pool`). Sweeps fused on devices the sweep holds need no broker: Tune runs
their groups as trials (`hpo.engines.fused.group_trial`).

Member trials talk only to the broker (`join`, then `fetch` per iteration, which the broker
forwards to the member's group): looking up an actor imports its class's module in the caller,
so this module imports no torch at its top, and a member's process never does.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import ray

if TYPE_CHECKING:
    from hpo.base.workload import Workload

logger = logging.getLogger(__name__)

#: Starts a group's actor: (configs, member trial ids, member states or None) -> a `MemberRelay` actor.
GroupLauncher = Callable[[list[Mapping[str, Any]], list[Hashable], list[bytes | None]], Any]
#: How long a forming group of driver-registered members waits for one more: Tune creates a
#: wave of trials within one controller step, so a short pause ends the wave.
REGISTER_WINDOW_S = 0.5
#: How long a forming group of resuming members waits for one more: each arrives only once its
#: relay process has started and read its checkpoint.
JOIN_WINDOW_S = 3.0


def start_broker(name: str, namespace: str, workload: Workload, max_members: int, launch_group: GroupLauncher) -> Any:
    """The sweep's broker, owned by the caller (it lives as long as the returned handle)."""
    return GroupBroker.options(name=name, namespace=namespace, get_if_exists=True).remote(
        workload, max_members, launch_group
    )


@dataclass
class _Forming:
    window_s: float
    members: list[Hashable] = field(default_factory=list)
    configs: list[Mapping[str, Any]] = field(default_factory=list)
    states: list[bytes | None] = field(default_factory=list)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    launched: asyncio.Event = field(default_factory=asyncio.Event)
    group: Any = None


@ray.remote(num_cpus=0)
class GroupBroker:
    def __init__(self, workload: Workload, max_members: int, launch_group: GroupLauncher):
        self.workload = workload
        self.max_members = max_members
        self.launch_group = launch_group
        self.forming: dict[tuple, _Forming] = {}
        self.placed: dict[Hashable, _Forming] = {}  # every member's group, launched or forming
        self.members_of: dict[Any, set[Hashable]] = {}
        self.launched_groups: list[list[Hashable]] = []

    def _add(self, trial_id: Hashable, config: Mapping[str, Any], state: bytes | None, step: int, window_s: float) -> _Forming:
        from fusion.grouping import structural_signature  # torch: only ever imported in the broker's process

        key = (structural_signature(self.workload.resolve(config)), step, state is None)
        forming = self.forming.get(key)
        if forming is None or len(forming.members) >= self.max_members:
            forming = self.forming[key] = _Forming(window_s)
            asyncio.get_running_loop().create_task(self._launch_when_ready(key, forming))
        forming.members.append(trial_id)
        forming.configs.append(dict(config))
        forming.states.append(state)
        forming.arrived.set()
        self.placed[trial_id] = forming
        return forming

    async def register(self, entries: list[tuple[Hashable, Mapping[str, Any]]]) -> None:
        """Fresh configurations Tune has just created trials for (from the driver)."""
        for trial_id, config in entries:
            if trial_id not in self.placed:  # its relay may have joined first
                self._add(trial_id, config, None, 0, REGISTER_WINDOW_S)

    async def join(self, trial_id: Hashable, config: Mapping[str, Any], state: bytes | None, step: int) -> None:
        """A member trial's relay joins its group: the one its registration placed it in, or, for
        a member resuming at `step` from `state`, a group of members at that step. Returns once
        the group is launched."""
        forming = self.placed.get(trial_id) if state is None else None
        if forming is None:
            forming = self._add(trial_id, config, state, step, JOIN_WINDOW_S)
        await forming.launched.wait()

    async def fetch(self, trial_id: Hashable, iteration: int) -> dict[str, Any]:
        """Member `trial_id`'s result of `iteration`, from its group (see `MemberRelay.fetch`)."""
        forming = self.placed[trial_id]
        await forming.launched.wait()
        return await forming.group.fetch.remote(trial_id, iteration)

    async def _launch_when_ready(self, key: tuple, forming: _Forming) -> None:
        while len(forming.members) < self.max_members:
            forming.arrived.clear()
            try:
                await asyncio.wait_for(forming.arrived.wait(), timeout=forming.window_s)
            except asyncio.TimeoutError:
                break
        if self.forming.get(key) is forming:
            del self.forming[key]  # later arrivals start a new group
        forming.group = self.launch_group(forming.configs, forming.members, forming.states)
        self.members_of[forming.group] = set(forming.members)
        self.launched_groups.append(list(forming.members))
        logger.info("fused group of %d members launched", len(forming.members))
        forming.launched.set()

    async def leave(self, trial_id: Hashable) -> None:
        """A member's trial ended; the group drops it, and ends once it has no members left."""
        forming = self.placed.pop(trial_id, None)
        if forming is None:
            return
        await forming.launched.wait()
        group = forming.group
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
