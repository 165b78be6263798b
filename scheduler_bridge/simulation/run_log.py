"""What one simulation run produces: per-job times, utilisation over time, extras."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RunLog:
    """Raw output of a driver. ``util_t`` / ``util_busy``: busy GPUs from each
    time on (a step function); ``extra``: policy-specific counters."""

    first_start: list[float]
    finish: list[float]
    restarts: list[int]
    util_t: object
    util_busy: object
    extra: dict = field(default_factory=dict)
    power_t: object = ()
    power_on: object = ()
    power_model: object = None
    packing: object = ()
