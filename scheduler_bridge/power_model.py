"""Node power states and energy: what CES trades against queueing delay.

A node is on, off, or booting (for ``boot_delay`` seconds, drawing idle power,
usable only once booted). Power draw of an on or booting node is
``idle_watts`` plus ``busy_gpu_watts`` for each busy GPU; an off node draws
``off_watts``. Defaults describe an 8 x V100 server like Philly's and Helios's
(V100: ~50 W idle of its 300 W TDP; host ~200 W idle): 600 W idle per node,
+250 W per busy GPU, 10 W off (BMC), 5 minutes to boot and rejoin.

>>> PowerModel().watts(on_nodes=2, busy_gpus=8)
3200.0
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class PowerModel:
    idle_watts: float = 600.0
    busy_gpu_watts: float = 250.0
    off_watts: float = 10.0
    boot_delay: float = 300.0

    def __post_init__(self) -> None:
        for name in ("idle_watts", "busy_gpu_watts", "off_watts", "boot_delay"):
            v = getattr(self, name)
            if not (np.isfinite(v) and v >= 0):
                raise ValueError(f"power model: {name} must be a finite number >= 0, got {v!r}")

    def watts(self, on_nodes: float, busy_gpus: float, off_nodes: float = 0.0) -> float:
        return on_nodes * self.idle_watts + busy_gpus * self.busy_gpu_watts + off_nodes * self.off_watts


def energy_summary(util_t, util_busy, power_t, power_on, num_nodes: int, gpus: int,
                   end: float, model: PowerModel | None = None) -> dict:
    """Powered node-hours, kWh and utilisation of powered-on GPUs over [0, end].

    ``util_*``: busy GPUs from each time on; ``power_*``: nodes on or booting from
    each time on (empty: every node on throughout, the cluster without CES)."""
    model = model or PowerModel()
    t = np.asarray(util_t, dtype=float)
    b = np.asarray(util_busy, dtype=float)
    if end <= 0 or not len(t):
        return {"powered_node_hours": 0.0, "energy_kwh": 0.0, "on_utilization": 0.0,
                "powered_down_node_hours": 0.0}
    pt = np.asarray(power_t, dtype=float) if len(power_t) else np.array([0.0])
    pn = np.asarray(power_on, dtype=float) if len(power_on) else np.array([float(num_nodes)])
    grid = np.union1d(t, pt)
    grid = grid[grid < end]
    dt = np.diff(np.append(grid, end))
    busy = b[np.clip(np.searchsorted(t, grid, side="right") - 1, 0, None)]
    on = pn[np.clip(np.searchsorted(pt, grid, side="right") - 1, 0, None)]
    busy = np.where(grid < t[0], 0.0, busy)
    node_s = float(np.sum(on * dt))
    busy_s = float(np.sum(busy * dt))
    joules = float(np.sum(model.watts(on, busy, num_nodes - on) * dt))
    gpn = gpus / num_nodes
    return {"powered_node_hours": node_s / 3600,
            "powered_down_node_hours": (num_nodes * end - node_s) / 3600,
            "energy_kwh": joules / 3.6e6,
            "on_utilization": busy_s / (node_s * gpn) if node_s > 0 else 0.0}
