"""Lucid-style non-intrusive scheduling (Hu et al., ASPLOS'23), built from our own parts.

Lucid never preempts. It beats preemptive schedulers with three parts:

1. A profiling partition: the first ``profile_nodes`` nodes. A new job that
   fits runs there first for at most ``profile_s`` seconds. Debugging jobs
   (the many that end within that time) finish there and never queue; the
   rest leave with their workload known and restart from scratch on the main
   partition (no checkpoint is assumed: the profiling run is work thrown away).
2. A duration model for priorities: QSSF's ``DurationPredictor`` (history
   plus gradient-boosted model, refit online); priority = predicted GPU time.
   ``explain(job)`` says which features drove a job's prediction.
3. Interference-aware packing: a queued job that cannot start may share the
   GPUs of a running job running alone when (a) both workloads are measured
   in the ``InterferenceTable`` and each one's slowdown beside the other is at
   most ``max_slowdown`` and their combined speed 1/s_a + 1/s_b is at least
   ``1 + min_gain`` (sharing must beat taking turns), (b) their memory fits in
   ``gpu_memory_mb``, (c) their priorities are within ``priority_ratio`` of
   each other, and (d) they ask for the same GPUs. At most two jobs share a
   GPU. Packed jobs run at their measured co-located speed (never faster
   than alone: a measured slowdown below 1 is noise and counts as 1).

Trace jobs name no model, so the job's workload (what profiling observes) is
one of the table's workloads, drawn by a seeded hash of the job's name.

>>> from scheduler_bridge.interference import InterferenceTable
>>> t = InterferenceTable({("a", "a"): 1.2}, {"a": 1000.0})
>>> Lucid(t).pack_check("a", 100.0, "a", 150.0, gpus=(1, 1))
(True, 'ok')
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from ..interference import InterferenceTable
from ..jobs import Job
from .qssf import QSSF

DEFAULT_TABLE = Path(__file__).resolve().parents[1] / "data" / "interference_cpu.csv"


class Lucid(QSSF):
    name = "lucid"
    replay = "lucid"   # its two partitions and packing are a replay of their own

    def __init__(self, table: InterferenceTable | None = None, backfill: bool = True, seed: int = 0,
                 profile_nodes: int = 2, profile_s: float = 300.0, max_slowdown: float = 2.0,
                 min_gain: float = 0.1, priority_ratio: float = 4.0,
                 gpu_memory_mb: float = 32768.0, **predictor_kw):
        if profile_nodes < 0 or not profile_s > 0 or not max_slowdown >= 1 or min_gain < 0 \
                or not priority_ratio >= 1 or not gpu_memory_mb > 0:
            raise ValueError("Lucid: profile_nodes >= 0, profile_s > 0, max_slowdown >= 1, "
                             "min_gain >= 0, priority_ratio >= 1, gpu_memory_mb > 0")
        super().__init__(backfill, seed=seed, **predictor_kw)
        self.table = table if table is not None else InterferenceTable.load(DEFAULT_TABLE)
        self.seed = seed
        self.profile_nodes, self.profile_s = profile_nodes, profile_s
        self.max_slowdown, self.min_gain = max_slowdown, min_gain
        self.priority_ratio, self.gpu_memory_mb = priority_ratio, gpu_memory_mb

    def workload_of(self, job: Job) -> str:
        """The workload profiling observes for ``job`` (stable across runs and drivers)."""
        names = self.table.workloads
        h = hashlib.blake2b(f"{self.seed}:{job.name or job.job_id}".encode(), digest_size=8)
        return names[int.from_bytes(h.digest(), "big") % len(names)]

    def pack_check(self, queued: str, queued_prio: float, running: str, running_prio: float,
                   gpus: tuple[int, int]) -> tuple[bool, str]:
        """May a queued job of workload ``queued`` share the GPUs of a lone running one?
        Returns (decision, reason), the reason naming the rule that refused."""
        if gpus[0] != gpus[1]:
            return False, "different GPU counts"
        pair = self.slowdowns(queued, running)
        if pair is None:
            return False, f"pair ({queued}, {running}) not in the interference table"
        if max(pair) > self.max_slowdown:
            return False, f"slowdown {max(pair):.2f} > {self.max_slowdown}"
        if 1 / pair[0] + 1 / pair[1] < 1 + self.min_gain:
            return False, f"combined speed {1 / pair[0] + 1 / pair[1]:.2f} < {1 + self.min_gain:.2f}"
        mem = self.table.memory_mb[queued] + self.table.memory_mb[running]
        if mem > self.gpu_memory_mb:
            return False, f"memory {mem:.0f} MB > {self.gpu_memory_mb:.0f} MB"
        lo, hi = sorted((max(queued_prio, 1e-9), max(running_prio, 1e-9)))
        if hi / lo > self.priority_ratio:
            return False, f"priorities {hi / lo:.1f}x apart > {self.priority_ratio}x"
        return True, "ok"

    def slowdowns(self, a: str, b: str) -> tuple[float, float] | None:
        """Measured slowdowns of ``a`` and ``b`` sharing GPUs. A value below 1 is
        measurement noise (sharing a device never speeds a job up) and counts as 1."""
        pair = self.table.pair(a, b)
        return None if pair is None else (max(pair[0], 1.0), max(pair[1], 1.0))

    def explain(self, job: Job) -> dict:
        """Which features drove ``job``'s priority (see ``DurationPredictor.explain``)."""
        out = self.predictor.explain(job.user, job.vc, job.gpus, self._hour(job))
        out["priority_gpu_s"] = out["predicted_s"] * job.gpus
        return out

    def __repr__(self) -> str:
        return (f"Lucid(profile_nodes={self.profile_nodes}, profile_s={self.profile_s}, "
                f"max_slowdown={self.max_slowdown}, min_gain={self.min_gain}, "
                f"priority_ratio={self.priority_ratio}, gpu_memory_mb={self.gpu_memory_mb})")

