"""Elastic scheduling (Saxena, Jayaram et al., MASCOTS'20) on measured profiles.

Jobs are admitted in arrival order while every admitted job can get at least
one GPU. A dynamic program over (admitted jobs) x (GPU counts) then picks each
job's GPU count to maximise the total normalised goodput

    sum_j goodput_j(n_j) / goodput_j(1)         # speedup of job j on n_j GPUs

where goodput is throughput x statistical efficiency (``app_profiles.AppProfile``)
at the batch size the policy chooses: the goodput-maximising one
(``ElasticPolicy``), or the job's own fixed batch size
(``ElasticPolicy(fixed_batch=True)``, the baseline that only scales GPUs).
GPU counts are 1, 2, 4, ... up to a node and then whole nodes, so any solution
packs onto nodes. A small bonus for keeping a job's current count avoids
resizes (each costs a checkpoint-restart) that buy almost nothing.

Pure: ``allocate`` maps cluster state to decisions and keeps no clock.

>>> from scheduler_bridge.cluster import ClusterSpec
>>> ElasticPolicy().allowed_counts(ClusterSpec(16, 4), max_gpus=64)
[1, 2, 4, 8, 12, 16]
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._base import Policy
from ..cluster import ClusterSpec, FreeGPUs, Placement
from ..app_profiles import AppProfile


@dataclass(frozen=True, slots=True)
class ElasticJobState:
    """What the policy needs to know about one active elastic job."""

    job_id: int
    app: AppProfile
    epoch: int
    batch_size: int          # the job's requested global batch
    max_gpus: int
    current_gpus: int = 0
    current_placement: Placement = ()


@dataclass(frozen=True, slots=True)
class ElasticDecision:
    job_id: int
    gpus: int
    batch_size: int
    goodput: float
    placement: Placement


class ElasticPolicy(Policy):
    name = "elastic"
    replay = "elastic"

    def __init__(self, fixed_batch: bool = False, keep_bonus: float = 0.02):
        self.fixed_batch = fixed_batch
        self.keep_bonus = keep_bonus
        if fixed_batch:
            self.name = "elastic-fixed-batch"

    @staticmethod
    def allowed_counts(spec: ClusterSpec, max_gpus: int) -> list[int]:
        g = spec.gpus_per_node
        small = [1 << k for k in range(g.bit_length()) if (1 << k) <= g]
        counts = sorted(set(small) | set(range(g, spec.num_gpus + 1, g)))
        return [c for c in counts if c <= max_gpus]

    def config(self, job: ElasticJobState, gpus: int, spec: ClusterSpec) -> tuple[int, float]:
        """(global batch, goodput) of ``job`` on ``gpus`` GPUs; goodput 0 if infeasible."""
        gpn = spec.gpus_per_node
        if self.fixed_batch:
            b = job.batch_size
            return b, job.app.goodput(gpus, gpn, b, job.epoch)
        return job.app.best_batch(gpus, gpn, job.epoch)

    def _utilities(self, job, spec) -> tuple[list[int], np.ndarray, list]:
        counts = self.allowed_counts(spec, job.max_gpus)
        cfgs = [self.config(job, n, spec) for n in counts]
        base = cfgs[0][1]
        if base <= 0:
            raise ValueError(f"job {job.job_id} ({job.app.name}) cannot run on one GPU")
        u = np.array([c[1] / base for c in cfgs])
        if job.current_gpus in counts:
            u[counts.index(job.current_gpus)] += self.keep_bonus
        return counts, u, cfgs

    def allocate(self, jobs: list[ElasticJobState], spec: ClusterSpec) -> dict[int, ElasticDecision]:
        """Decisions for ``jobs`` (given in arrival order); jobs left out wait."""
        G = spec.num_gpus
        admitted = jobs[:G]
        if not admitted:
            return {}
        NEG = -1e18
        value = np.full(G + 1, NEG)
        value[0] = 0.0
        choices, infos = [], []
        for job in admitted:
            counts, u, cfgs = self._utilities(job, spec)
            new = np.full(G + 1, NEG)
            ch = np.zeros(G + 1, dtype=np.int64)
            for n, un in zip(counts, u):
                if un <= 0 and n > counts[0]:
                    continue
                cand = np.full(G + 1, NEG)
                cand[n:] = value[: G + 1 - n] + un
                better = cand > new
                new[better] = cand[better]
                ch[better] = n
            value = new
            choices.append(ch)
            infos.append(dict(zip(counts, cfgs)))
        g = int(np.argmax(value))
        if value[g] <= NEG / 2:
            raise RuntimeError("elastic DP found no feasible allocation")
        counts = [0] * len(admitted)
        for i in range(len(admitted) - 1, -1, -1):
            counts[i] = int(choices[i][g])
            g -= counts[i]
        return self._place(admitted, counts, infos, spec)

    def _place(self, admitted, counts, infos, spec) -> dict[int, ElasticDecision]:
        """Pack onto nodes: jobs keeping their GPU count stay put, then the rest
        largest first; a job that no longer fits steps down to a smaller count."""
        free = FreeGPUs(spec)
        placed: dict[int, Placement] = {}
        for job, n in zip(admitted, counts):
            if n == job.current_gpus and job.current_placement:
                if all(free.free[node] >= k for node, k in job.current_placement):
                    free.take(job.current_placement)
                    placed[job.job_id] = job.current_placement
        order = sorted(range(len(admitted)), key=lambda i: (-counts[i], i))
        out = {}
        for i in order:
            job, n = admitted[i], counts[i]
            p = placed.get(job.job_id)
            if p is None:
                options = [c for c in sorted(infos[i], reverse=True) if c <= n]
                for c in options:
                    p = free.place(c)
                    if p is not None:
                        n = c
                        free.take(p)
                        break
            if p is None:
                continue
            b, gp = infos[i][n]
            out[job.job_id] = ElasticDecision(job.job_id, n, b, gp, p)
        return out
