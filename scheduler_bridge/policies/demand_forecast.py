"""Demand forecaster for CES: how many GPUs the cluster will need soon, from its own past.

Demand is busy GPUs plus the GPUs queued jobs ask for, sampled into ``bin_s``
bins (the bin's peak). The forecast for the next ``horizon`` seconds is the
larger of two views of history:

- recent: the peak over the last ``lookback`` seconds (demand rarely falls
  off a cliff, and a burst that has begun tends to continue);
- seasonal: the ``quantile`` over the past ``days`` days of the peak demand
  in the same time-of-day window [t, t + horizon) (clusters follow the
  working day, Helios' Fig. 3 and Philly alike).

No model is fit to the future: only bins already closed are used.

>>> f = DemandForecaster(bin_s=60, lookback=120, horizon=60)
>>> for t in range(0, 600, 60): f.record(t, 10 if t < 300 else 2)
>>> f.forecast(599.0)
2.0
"""

from __future__ import annotations

import math

import numpy as np

DAY = 86400.0


class DemandForecaster:
    def __init__(self, bin_s: float = 600.0, lookback: float = 3600.0, horizon: float = 3600.0,
                 days: int = 7, quantile: float = 0.9):
        if not (bin_s > 0 and lookback >= 0 and horizon >= 0 and days >= 0 and 0 <= quantile <= 1):
            raise ValueError("forecaster: bin_s > 0, lookback/horizon/days >= 0 and 0 <= quantile <= 1")
        self.bin_s, self.lookback, self.horizon = bin_s, lookback, horizon
        self.days, self.quantile = days, quantile
        self.reset()

    def reset(self) -> None:
        self._peak: dict[int, float] = {}   # bin index -> peak demand

    def _bin(self, t: float) -> int:
        return int(math.floor(t / self.bin_s))

    def raises(self, t: float, demand: float) -> bool:
        """Whether ``record(t, demand)`` would change the history (a new bin, or a higher peak):
        only such samples need to be kept, so the live allocator journals only those."""
        return demand > self._peak.get(self._bin(t), -1.0)

    def record(self, t: float, demand: float) -> None:
        if self.raises(t, demand):
            self._peak[self._bin(t)] = float(demand)

    def _window_peak(self, start: float, end: float) -> float | None:
        vals = [self._peak[k] for k in range(self._bin(start), self._bin(end) + 1) if k in self._peak]
        return max(vals) if vals else None

    def forecast(self, now: float) -> float:
        """Peak GPU demand expected over [now, now + horizon)."""
        recent = self._window_peak(now - self.lookback, now) or 0.0
        past = [p for d in range(1, self.days + 1)
                if (p := self._window_peak(now - d * DAY, now - d * DAY + self.horizon)) is not None]
        seasonal = float(np.quantile(past, self.quantile)) if past else 0.0
        return max(recent, seasonal)
