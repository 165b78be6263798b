"""The scheduling policy interface: what the simulator and the live allocator may ask of a policy.

A policy is a plain object that decides; it never advances time and never touches Ray. Every
policy names the replay that runs it in the simulator (``replay``: rigid jobs in a queue, elastic
jobs, or Lucid's two partitions), so no driver has to guess a policy's kind from its class. A
queue policy (``QueuePolicy``) must say one thing, a job's ``priority`` in the queue (lower runs
first); everything else is an optional hook with a default that does nothing:

- ``reset(t0)`` once before a run (``t0``: absolute time of time 0);
- ``priority(job, remaining, now)`` when a job (re-)enters the queue;
- ``on_start(job, now)`` when a job starts (or restarts) running;
- ``observe(job, now)`` when a job finishes; returning True asks the driver to
  recompute every queued job's priority with ``priorities`` (QSSF after a refit);
- ``victims(head, candidates, now)`` for ``preemptive`` policies.

Ranking (Tiresias): a policy with ``ranks_running`` also ranks running jobs
(``running_priority``), says when a running job's rank next changes (``next_change``) and when
queued jobs must be re-ranked (``wake_at``); the driver then preempts a running job whenever a
queued one outranks it.

Power and tuning: a policy may name ``layers`` that run beside its queue, each with hooks of its
own: ``"power"`` powers idle nodes down (``PowerHooks``: CES) and ``"tuning"`` lends idle GPUs
and pipeline bubbles to tuning jobs' fused groups (``TuningHooks``: tuning-aware). Both are
``LayeredPolicy``s: a layer over a base queue policy, which keeps deciding everything else.

Who calls these: ``scheduler_bridge.simulation`` (``simulator.simulate`` runs the named replay)
and ``scheduler_bridge.live.driver``. A policy must not keep a clock of its own: ``now`` is the
driver's.

>>> class LongestFirst(QueuePolicy):
...     name = "longest-first"
...     def priority(self, job, remaining, now):
...         return -job.duration
>>> LongestFirst().priority(Job(0, submit=0.0, gpus=1, duration=9.0), remaining=9.0, now=0.0)
-9.0
"""

from __future__ import annotations

import abc
import math
from typing import ClassVar, Literal, Protocol

from ..jobs import Job
from ..power_model import PowerModel

#: The simulator's replays (``simulation.simulator.REPLAYS``): one per kind of job a policy runs.
Replay = Literal["rigid", "elastic", "lucid"]
#: What a queue policy may run beside its queue (``simulation.rigid_replay.LAYERS``, and the live
#: allocator's guests and autoscaler requests).
Layer = Literal["power", "tuning"]


class Policy(abc.ABC):
    """Every scheduling policy: a name for tables and command lines, the replay that runs it, and
    the state it forgets between runs."""

    #: Its name in ``make_policy``, tables and JSON.
    name: str
    #: Which simulator replay runs it.
    replay: ClassVar[Replay]
    #: What runs beside its decisions (see the module docstring); none by default.
    layers: tuple[Layer, ...] = ()

    def reset(self, t0: float = 0.0) -> None:
        """Forget all state learnt in an earlier run; ``t0`` is the absolute time of time 0."""


class QueuePolicy(Policy):
    """Rigid jobs in one queue, ranked by ``priority`` (lower runs first). Where a job goes is the
    cluster's placement rule, and which jobs start is ``pending_queue.select_starts``."""

    replay = "rigid"
    #: May a running job be stopped (it pays the driver's restart cost) for a queued one?
    preemptive = False
    #: Do running jobs hold a rank that drivers compare with the queue's (the ranking hooks)?
    ranks_running = False

    def __init__(self, backfill: bool = False):
        #: A job may start when better-ranked ones do not fit the free GPUs.
        self.backfill = backfill

    @abc.abstractmethod
    def priority(self, job: Job, remaining: float, now: float) -> float:
        """Rank of ``job`` entering the queue at ``now`` with ``remaining`` seconds of work."""

    def priorities(self, jobs: list[tuple[Job, float]], now: float) -> list[float]:
        """Re-rank queued (job, remaining) pairs; the driver calls it when ``observe`` asks."""
        return [self.priority(j, r, now) for j, r in jobs]

    def on_start(self, job: Job, now: float) -> None:
        """A job started (or restarted) running; only policies that track waiting time need it."""

    def observe(self, job: Job, now: float) -> bool:
        """A job finished; True asks the driver to re-rank the queue with ``priorities``."""
        return False

    def victims(self, head: tuple[Job, float], candidates: list[tuple[Job, float]],
                now: float) -> list[int]:
        """Running jobs (with their remaining seconds) to preempt so ``head`` can
        start; only called on preemptive policies. The driver checks placement."""
        return []

    # ---- ranking hooks: called only when ``ranks_running`` ---------------------------------
    def running_priority(self, job: Job, remaining: float, now: float) -> float:
        """Rank of a running job, compared with queued jobs' ``priority``."""
        return self.priority(job, remaining, now)

    def next_change(self, job: Job, remaining: float, now: float) -> float:
        """When a running job's rank next changes (inf: never), so the driver re-ranks it then."""
        return math.inf

    def wake_at(self) -> float:
        """When queued jobs must next be re-ranked though nothing else happens (inf: never)."""
        return math.inf

    def __repr__(self) -> str:
        return f"{type(self).__name__}(backfill={self.backfill})"


class PowerHooks(Protocol):
    """What a policy naming the ``"power"`` layer decides: how many nodes stay powered."""

    power: PowerModel
    #: Seconds between two moves of the powered node count towards ``target_nodes``.
    interval: float
    #: The queue policy's: nodes boot for the jobs that could start if they were on.
    backfill: bool

    def record(self, now: float, demand_gpus: float) -> None:
        """Demand now: busy GPUs plus GPUs that waiting jobs ask for."""

    def target_nodes(self, now: float, gpus_per_node: int, num_nodes: int) -> int:
        """Nodes to keep powered from ``now`` on."""


class TuningHooks(Protocol):
    """What a policy naming the ``"tuning"`` layer decides: where tuning jobs' fused groups run."""

    #: Seconds of a group's work between checkpoints: what an evicted group keeps.
    checkpoint_interval: float

    def evictions(self, groups_on_node: int, free_on_node: int) -> int:
        """How many groups must leave a node that now has ``free_on_node`` idle GPUs."""

    def fill(self, idle_by_node: dict[int, int], bubble_slots: dict[int, int], pending: int
             ) -> tuple[list[tuple[str, int]], int]:
        """Where to put up to ``pending`` groups, and how many stay pending."""


class LayeredPolicy(QueuePolicy):
    """A layer (power, tuning) over a base queue policy, which keeps every queue decision: the
    ordinary jobs run exactly as under ``base`` alone."""

    def __init__(self, base: QueuePolicy):
        if base.replay != "rigid" or base.layers:
            raise ValueError(f"{type(self).__name__} runs over a plain queue policy, not {base.name}")
        super().__init__(base.backfill)
        self.base = base
        self.preemptive = base.preemptive
        self.ranks_running = base.ranks_running

    def reset(self, t0: float = 0.0) -> None:
        self.base.reset(t0)

    def priority(self, job: Job, remaining: float, now: float) -> float:
        return self.base.priority(job, remaining, now)

    def priorities(self, jobs: list[tuple[Job, float]], now: float) -> list[float]:
        return self.base.priorities(jobs, now)

    def on_start(self, job: Job, now: float) -> None:
        self.base.on_start(job, now)

    def observe(self, job: Job, now: float) -> bool:
        return self.base.observe(job, now)

    def victims(self, head: tuple[Job, float], candidates: list[tuple[Job, float]],
                now: float) -> list[int]:
        return self.base.victims(head, candidates, now)

    def running_priority(self, job: Job, remaining: float, now: float) -> float:
        return self.base.running_priority(job, remaining, now)

    def next_change(self, job: Job, remaining: float, now: float) -> float:
        return self.base.next_change(job, remaining, now)

    def wake_at(self) -> float:
        return self.base.wake_at()
