"""The node power model: what CES trades against queueing delay (energy is
``simulation.metrics.energy_summary``).

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

