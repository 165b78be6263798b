"""CES (Helios, SC'21): cluster energy saving on top of any queue policy.

CES keeps powered on the nodes that forecast demand needs and lets the rest
power down. Which jobs run, and where, is the base policy's business
(``base``); CES only decides how many nodes are powered:

    target = ceil(forecast x (1 + margin) / GPUs per node) + spare_nodes

with ``forecast`` from ``demand_forecast.DemandForecaster`` (the cluster's own
demand history). Drivers power down idle nodes above the target, but only
while no job is waiting, boot nodes up to it, and boot at once whatever a
waiting job could use if it were on: a runnable job never waits for a
powered-down node longer than the boot delay of ``power``.
Re-evaluated every ``interval`` seconds.

>>> from scheduler_bridge.policies.queue import FIFO
>>> ces = CES(FIFO(backfill=True)); ces.name
'ces:fifo'
>>> ces.target_nodes(now=0.0, gpus_per_node=8, num_nodes=10)   # nothing seen yet: spare only
1
"""

from __future__ import annotations

import math

from .demand_forecast import DemandForecaster
from ..jobs import Job
from .queue import QueuePolicy
from .tuning_aware import TuningAware
from ..power_model import PowerModel


class CES(QueuePolicy):
    def __init__(self, base: QueuePolicy, power: PowerModel | None = None,
                 forecaster: DemandForecaster | None = None, margin: float = 0.1,
                 spare_nodes: int = 1, interval: float = 300.0):
        if isinstance(base, (CES, TuningAware)):
            raise ValueError(f"CES wraps a plain queue policy, not {base.name}")
        if margin < 0 or spare_nodes < 0 or not interval > 0:
            raise ValueError(f"CES: margin >= 0, spare_nodes >= 0, interval > 0; got "
                             f"{margin}, {spare_nodes}, {interval}")
        super().__init__(base.backfill)
        self.base = base
        self.name = f"ces:{base.name}"
        self.preemptive = base.preemptive
        self.ranks_running = base.ranks_running
        self.power = power or PowerModel()
        self.forecaster = forecaster or DemandForecaster()
        self.margin, self.spare_nodes, self.interval = margin, spare_nodes, interval

    # ---- power -------------------------------------------------------------------
    def record(self, now: float, demand_gpus: float) -> None:
        """Demand now: busy GPUs plus GPUs that waiting jobs ask for."""
        self.forecaster.record(now, demand_gpus)

    def target_nodes(self, now: float, gpus_per_node: int, num_nodes: int) -> int:
        need = self.forecaster.forecast(now) * (1 + self.margin) / gpus_per_node
        return min(num_nodes, math.ceil(need - 1e-9) + self.spare_nodes)

    # ---- the base policy decides everything else -----------------------------------
    def reset(self, t0: float = 0.0) -> None:
        self.base.reset(t0)
        self.forecaster.reset()

    def priority(self, job: Job, remaining: float, now: float) -> float:
        return self.base.priority(job, remaining, now)

    def priorities(self, jobs, now):
        return self.base.priorities(jobs, now)

    def on_start(self, job, now):
        self.base.on_start(job, now)

    def observe(self, job, now):
        return self.base.observe(job, now)

    def victims(self, head, candidates, now):
        return self.base.victims(head, candidates, now)

    def running_priority(self, job, remaining, now):
        return self.base.running_priority(job, remaining, now)

    def next_change(self, job, remaining, now):
        return self.base.next_change(job, remaining, now)

    def wake_at(self):
        return self.base.wake_at()

    def __repr__(self) -> str:
        return (f"CES({self.base!r}, margin={self.margin}, spare_nodes={self.spare_nodes}, "
                f"interval={self.interval}, power={self.power})")
