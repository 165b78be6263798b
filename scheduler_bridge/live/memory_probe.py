"""The peak memory a workload adds to its process: the one yardstick of Lucid's memory feature.

``hpo profile colocate`` writes it into the interference table (``memory_mb``), and a live
Lucid profiling run measures a job with it (``job_runner.JobRunner``), so the allocator
classifies the job against the table by like-for-like numbers. On a GPU it is the peak
torch allocated on the device; elsewhere, how far the process's peak resident set grew
since the probe was made (a job that never imported torch allocated nothing through it).
"""

from __future__ import annotations

import resource
import sys


def _peak_rss_kb() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss   # KiB on Linux


class PeakMemory:
    """Made before the workload starts; ``mb()`` after it ran."""

    def __init__(self) -> None:
        self._base_kb = _peak_rss_kb()

    def mb(self) -> float:
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
            return torch.cuda.max_memory_allocated() / 2**20
        return max(_peak_rss_kb() - self._base_kb, 1) / 1024
