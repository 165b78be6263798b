"""What runs beside the rigid replay: the one protocol of the power and tuning layers.

A queue policy names its layers (``policy.layers``: ``"power"`` for CES, ``"tuning"`` for
tuning-aware) and ``rigid_replay.LAYERS`` builds them. A layer has events of its own (a node
finishes booting, a fused group finishes its work), which the replay visits in time order with
the jobs' own, and it sees what each instant did to the jobs: ``begin`` runs before the
instant's completions and arrivals, ``end`` after its starts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from ..policies.pending_queue import PendingQueue
from .run_log import RunLog


@dataclass
class Instant:
    """What one decision instant of the rigid replay did to the jobs."""

    now: float
    #: The jobs still waiting after the instant's starts.
    queue: PendingQueue
    #: GPUs busy after the instant's starts.
    busy: int = 0
    #: (job, GPUs, bubble fraction) of each job started.
    started: list[tuple[int, int, float]] = field(default_factory=list)
    #: Jobs that finished or were preempted.
    ended: list[int] = field(default_factory=list)
    #: Nodes where jobs started.
    touched: set[int] = field(default_factory=set)


class ReplayLayer(Protocol):
    """A layer of the rigid replay, built as ``Layer(trace, policy, free)`` where ``free`` is the
    replay's own ``FreeGPUs``, shared: what the jobs take, the layer cannot use, and the reverse."""

    def pending(self, queue: PendingQueue) -> bool:
        """Whether the replay must go on for this layer once no job is left to arrive or finish."""

    def next_time(self) -> float:
        """When this layer's next event is due (inf: none)."""

    def begin(self, now: float) -> None:
        """This layer's own events due at ``now``, before the jobs'."""

    def end(self, instant: Instant) -> None:
        """React to what the instant did to the jobs."""

    def report(self, log: RunLog) -> None:
        """Add this layer's counters (and series) to the run's log."""
