"""Small synthetic traces (tests) and tuning / pipeline work added to a real trace.

>>> len(random_trace(seed=0, n_jobs=5))
5
"""

from __future__ import annotations

import random
from dataclasses import replace

from ..jobs import Job, Trace, TuningJob, make_trace


def random_trace(seed: int, n_jobs: int = 50, max_gpus: int = 8, span: float = 3600.0,
                 mean_duration: float = 600.0, vcs: int = 3) -> Trace:
    rng = random.Random(seed)
    sizes = [g for g in (1, 2, 4, 8, 16, 32) if g <= max_gpus]
    jobs = [Job(job_id=i, submit=round(rng.uniform(0, span), 1),
                gpus=rng.choice(sizes), duration=round(rng.expovariate(1 / mean_duration) + 1, 1),
                vc=f"vc{rng.randrange(vcs)}", user=f"u{rng.randrange(5)}")
            for i in range(n_jobs)]
    return make_trace(jobs, source=f"random(seed={seed})")


def add_tuning_work(trace: Trace, *, tuning_jobs: int, groups: int = 8,
                    group_work: float = 3600.0, pipeline_fraction: float = 0.0,
                    bubble_fraction: float = 0.3, seed: int = 0) -> Trace:
    """``tuning_jobs`` tuning jobs submitted uniformly over the trace, and a
    ``pipeline_fraction`` of its multi-GPU jobs marked as pipeline jobs with
    ``bubble_fraction`` idle time per GPU."""
    rng = random.Random(seed)
    span = max((j.submit for j in trace.jobs), default=0.0)
    tuning = tuple(TuningJob(job_id=i, submit=rng.uniform(0, span), groups=groups,
                             group_work=group_work, name=f"tune-{i}") for i in range(tuning_jobs))
    jobs = tuple(replace(j, bubble_fraction=bubble_fraction)
                 if j.gpus > 1 and rng.random() < pipeline_fraction else j for j in trace.jobs)
    return Trace(jobs, trace.source, tuple(sorted(tuning, key=lambda t: t.submit)), trace.t0)
