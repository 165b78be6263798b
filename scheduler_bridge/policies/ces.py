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

from ._base import LayeredPolicy, QueuePolicy
from .demand_forecast import DemandForecaster
from ..power_model import PowerModel


class CES(LayeredPolicy):
    """The ``"power"`` layer's hooks (``_base.PowerHooks``) over a base queue policy."""

    layers = ("power",)

    def __init__(self, base: QueuePolicy, power: PowerModel | None = None,
                 forecaster: DemandForecaster | None = None, margin: float = 0.1,
                 spare_nodes: int = 1, interval: float = 300.0):
        if margin < 0 or spare_nodes < 0 or not interval > 0:
            raise ValueError(f"CES: margin >= 0, spare_nodes >= 0, interval > 0; got "
                             f"{margin}, {spare_nodes}, {interval}")
        super().__init__(base)
        self.name = f"ces:{base.name}"
        self.power = power or PowerModel()
        self.forecaster = forecaster or DemandForecaster()
        self.margin, self.spare_nodes, self.interval = margin, spare_nodes, interval

    def record(self, now: float, demand_gpus: float) -> None:
        """Demand now: busy GPUs plus GPUs that waiting jobs ask for."""
        self.forecaster.record(now, demand_gpus)

    def target_nodes(self, now: float, gpus_per_node: int, num_nodes: int) -> int:
        need = self.forecaster.forecast(now) * (1 + self.margin) / gpus_per_node
        return min(num_nodes, math.ceil(need - 1e-9) + self.spare_nodes)

    def reset(self, t0: float = 0.0) -> None:
        super().reset(t0)
        self.forecaster.reset()

    def __repr__(self) -> str:
        return (f"CES({self.base!r}, margin={self.margin}, spare_nodes={self.spare_nodes}, "
                f"interval={self.interval}, power={self.power})")
