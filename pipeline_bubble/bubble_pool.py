"""Where sweeps and pipeline jobs meet: fused groups waiting for bubbles, and the stages lending them.

A sweep with `fusion.placement: bubbles` launches each fused group as a `BubbleGroup` actor that
holds no resources and trains nothing itself: it only relays results to the group's member
trials (`fusion.group_actor.MemberRelay`) and keeps each member's latest checkpoint. The group
waits in the `BubblePool` (one named actor per Ray cluster, `hpo:bubbles`) until a pipeline stage
that lends its bubbles (`pipeline_bubble.lending.lend_bubbles`) takes it. The stage trains the
group step by step in its idle windows and publishes every iteration back to the `BubbleGroup`.

A stage that is evicted, or whose job ends, gives the group back; the next stage to take it
resumes from the members' last published checkpoints, so only the steps since then are redone.

On a cluster run by the allocator (`scheduler_bridge`), lending stages carry their job's id
(`owner`) and a sweep submitted as a tuning job is *managed*: the allocator decides in whose
bubbles its groups may run (`set_quotas`), the pool only hands its groups to those jobs' stages,
and a stage holding more than its job's quota (the owner reclaimed its memory, or the sweep
ended) is asked to yield its group (`should_yield`), which it does before its next step.

A sweep that ends, however it ends (its time budget, an error, Ctrl-C), withdraws its groups
(`end_sweep`): those waiting leave the line, and a stage training one yields it without it going
back in line, so no group of an ended sweep trains in the bubbles that the next sweep is given.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import ray

from fusion.broker import GroupLauncher
from fusion.group_actor import GroupAssignment, MemberRelay
from hpo.base.trial_state import trial_state_from_bytes
from hpo.base.actor_names import NAMESPACE, POOL_NAME
from hpo.base.workload import Workload



def bubble_pool() -> Any:
    """The cluster's pool, created by whichever side (sweep or pipeline job) comes first."""
    return BubblePool.options(name=POOL_NAME, namespace=NAMESPACE, get_if_exists=True, lifetime="detached").remote()


@dataclass
class _Host:
    owner: int | str | None
    group: Any = None
    sweep: str | None = None
    yielding: bool = False
    #: The group's sweep has ended: the group goes nowhere when the host gives it back.
    withdrawn: bool = False


@ray.remote(num_cpus=0)
class BubblePool:
    """A FIFO of groups waiting for a stage, which stage trains which group, and the allocator's
    quotas: for a managed sweep, how many of its groups each pipeline job's stages may hold."""

    def __init__(self) -> None:
        self.waiting: deque[tuple[Any, str]] = deque()
        self.hosts: dict[str, _Host] = {}
        self.quotas: dict[str, dict[int | str, int]] = {}
        #: Runs (one start of a sweep, `run_id`) that have ended: a group one of them submits late
        #: (its broker launched it while Tune was ending the sweep) goes nowhere.
        self.ended_runs: set[str] = set()

    def register(self, host_id: str, owner: int | str | None = None) -> None:
        self.hosts.setdefault(host_id, _Host(owner))

    def unregister(self, host_id: str) -> None:
        """The host is gone (or about to be killed): a group it still held goes back in line,
        unless its sweep has ended."""
        host = self.hosts.pop(host_id, None)
        if host is not None and host.group is not None and not host.withdrawn:
            self.waiting.appendleft((host.group, host.sweep))

    def submit(self, group: Any, sweep: str, run: str | None = None) -> None:
        """Queue `group` of `sweep`, unless `run` (the start of the sweep that launched it) has ended.

        A broker submits without waiting, and Tune's end of the sweep reaches the pool from the
        driver, so a group launched as the sweep ended could arrive after `end_sweep` and wait
        here for the next pipeline job, which took it, found its actor gone, and counted a group it
        never trained. A sweep's name comes back when it is resumed; its run does not."""
        if run is None or run not in self.ended_runs:
            self.waiting.append((group, sweep))

    def _held(self, sweep: str, owner: int | str | None) -> list[_Host]:
        return [h for h in self.hosts.values() if h.sweep == sweep and h.owner == owner and h.group is not None]

    def _may_take(self, host: _Host, sweep: str) -> bool:
        if sweep not in self.quotas:
            return True  # an unmanaged sweep: any stage lending its bubbles
        return host.owner is not None and len(self._held(sweep, host.owner)) < self.quotas[sweep].get(host.owner, 0)

    def take(self, host_id: str) -> Any:
        """The oldest waiting group `host_id` may train, or None."""
        host = self.hosts.get(host_id)
        if host is None or host.group is not None:
            return None
        for index, (group, sweep) in enumerate(self.waiting):
            if self._may_take(host, sweep):
                del self.waiting[index]
                host.group, host.sweep = group, sweep
                return group
        return None

    def give_back(self, host_id: str, group: Any) -> None:
        """`host_id` stopped training `group` before it finished: first in line for the next stage."""
        host = self.hosts.get(host_id)
        if host is None or host.group is None:
            return  # unregistered already, which put the group back in line
        if not host.withdrawn:
            self.waiting.appendleft((group, host.sweep))
        self.done(host_id)

    def done(self, host_id: str) -> None:
        host = self.hosts.get(host_id)
        if host is not None:
            host.group, host.sweep, host.yielding, host.withdrawn = None, None, False, False

    def end_sweep(self, sweep: str, run: str | None = None) -> None:
        """`sweep` has ended: its waiting groups leave the line, and the stages training one are
        asked to yield it, which then goes nowhere. (A group left in line or handed back would run
        in the next sweep's bubbles, long after its trials ended.) A group `run` submits after this
        is dropped (`submit`)."""
        if run is not None:
            self.ended_runs.add(run)
        self.waiting = deque((group, s) for group, s in self.waiting if s != sweep)
        for host in self.hosts.values():
            if host.sweep == sweep and host.group is not None:
                host.yielding = host.withdrawn = True

    def set_quotas(self, sweep: str, quotas: dict[int | str, int] | None) -> None:
        """How many of `sweep`'s groups each owner's hosts may hold: a pipeline job's id, or an
        idle-GPU host's id (None: the sweep is unmanaged again). Hosts holding more than their
        owner's new quota are asked to yield."""
        if quotas is None:
            self.quotas.pop(sweep, None)
            return
        self.quotas[sweep] = {owner: int(n) for owner, n in quotas.items()}
        owners = {h.owner for h in self.hosts.values() if h.sweep == sweep}
        for owner in owners:
            allowed = self.quotas[sweep].get(owner, 0) if owner is not None else 0
            for host in [h for h in self._held(sweep, owner) if not h.yielding][allowed:]:
                host.yielding = True

    def should_yield(self, host_id: str) -> bool:
        host = self.hosts.get(host_id)
        return host is not None and host.yielding

    def state(self) -> dict[str, Any]:
        """Waiting groups, which registered stages train one, and the quotas (for sizing and tests)."""
        return {
            "waiting": len(self.waiting),
            "hosts": {h: host.group is not None for h, host in self.hosts.items()},
            "quotas": {sweep: dict(q) for sweep, q in self.quotas.items()},
        }


@ray.remote(num_cpus=0)
class BubbleGroup(MemberRelay):
    """A fused group trained wherever the pool sends it; holds its members' latest checkpoints."""

    def __init__(self, assignment: GroupAssignment):
        first = assignment.states[0]
        iteration = int(trial_state_from_bytes(first)["iteration"]) if first is not None else 0
        super().__init__(assignment.member_ids, iteration)
        self.assigned = assignment
        self.configs = dict(zip(assignment.member_ids, assignment.configs))
        self.latest = dict(zip(assignment.member_ids, assignment.states))

    async def assignment(self) -> GroupAssignment:
        """Everything a stage needs to train the group on from its last published iteration."""
        members = [m for m in self.member_ids if m not in self.leaving]
        return replace(self.assigned, member_ids=members, configs=[self.configs[m] for m in members],
                       states=[self.latest[m] for m in members])

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


def bubble_group_launcher(
    sweep: str, workload: Workload, max_iterations: int, dtype: str = "fp32", verify: bool = True,
    run: str | None = None,
) -> GroupLauncher:
    """Each group a `BubbleGroup`, queued in the cluster's pool for the next free stage (`run`:
    this start of the sweep, whose end drops a group it submits late; see `BubblePool.submit`)."""

    def launch(configs: list[Mapping[str, Any]], members: list[Hashable], states: list[bytes | None]) -> Any:
        group = BubbleGroup.remote(GroupAssignment(workload, configs, members, states, max_iterations, dtype, verify))
        bubble_pool().submit.remote(group, sweep, run)
        return group

    return launch


def lending_stages() -> int:
    """How many pipeline stages lend their bubbles right now (a sweep sizes its concurrency by it).
    Asking creates no pool: where there is none, no stage has lent its bubbles yet."""
    try:
        pool = ray.get_actor(POOL_NAME, namespace=NAMESPACE)
    except ValueError:
        return 0
    return len(ray.get(pool.state.remote())["hosts"])
