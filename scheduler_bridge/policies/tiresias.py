"""Tiresias (Gu et al., NSDI'19): discretised two-dimensional least-attained-service.

Needs no duration estimate: a job's *attained service* is the GPU-seconds it has
already run (GPUs x seconds run since its last promotion). Jobs sit in ``K``
priority queues separated by ``thresholds`` on attained service; every job
enters queue 0, is demoted when its service crosses the next threshold, and
within a queue jobs run first-come first-served by the time they entered it.
A waiting job of a lower queue is preempted for by nobody; a running job of a
lower queue is preempted (paying the driver's restart cost) for a waiting job
of a higher one. ``starvation`` > 0 is the paper's PROMOTEKNOB: a job that has
waited ``starvation`` x its run time since its last promotion goes back to
queue 0 with its service counted afresh.

Defaults: K = 2 with one threshold of 16 GPU-hours and no promotion, the
configuration of the Pollux artifact that reported Tiresias at 4,038 s average
JCT; the Tiresias paper also finds two queues enough and the JCT insensitive
to the threshold over a wide range.

Drivers pass ``remaining`` = duration - seconds run (the simulator's model, the
live driver's hint minus its run time), so ``duration - remaining`` is the
observed run time, never a peek at the future.

>>> p = Tiresias(); p.reset()
>>> p.priority(Job(0, submit=5.0, gpus=4, duration=9e4), remaining=9e4, now=5.0)
5.0
>>> p.running_priority(Job(0, submit=5.0, gpus=4, duration=9e4), remaining=9e4 - 4 * 3600, now=4 * 3600 + 5)
10000014405.0
"""

from __future__ import annotations

import bisect
import math

from ..jobs import Job
from ._base import QueuePolicy

QUEUE_SPAN = 1e10  # priority = queue x QUEUE_SPAN + entry time; exceeds any submit time (Unix ones too)


class Tiresias(QueuePolicy):
    name = "tiresias"
    preemptive = True
    ranks_running = True  # running jobs hold a priority of their own that drivers compare

    def __init__(self, backfill: bool = True, thresholds: tuple[float, ...] = (16 * 3600.0,),
                 starvation: float = 0.0):
        super().__init__(backfill)
        if list(thresholds) != sorted(thresholds) or any(t <= 0 for t in thresholds):
            raise ValueError(f"Tiresias thresholds must be positive and increasing, got {thresholds}")
        if starvation < 0:
            raise ValueError(f"Tiresias starvation knob must be >= 0, got {starvation}")
        self.thresholds = tuple(float(t) for t in thresholds)
        self.starvation = float(starvation)
        self.reset()

    def reset(self, t0: float = 0.0) -> None:
        # job_id -> [queue, time it entered that queue, service at last promotion]
        self._state: dict[int, list] = {}
        self._waiting: dict[int, tuple[float, float]] = {}  # job_id -> (since, run s since promotion)

    @staticmethod
    def service(job: Job, remaining: float) -> float:
        """Attained GPU-seconds: what the job has run, times its GPUs."""
        return max(job.duration - remaining, 0.0) * job.gpus

    def _update(self, job: Job, remaining: float, now: float) -> list:
        st = self._state.get(job.job_id)
        if st is None:
            st = self._state[job.job_id] = [0, job.submit, 0.0]
        # 1 ms of GPU time of slack: a demotion due now is not missed by rounding
        q = bisect.bisect_right(self.thresholds, self.service(job, remaining) - st[2] + 1e-3)
        if q > st[0]:
            st[0], st[1] = q, now
        return st

    def queue_of(self, job: Job, remaining: float, now: float) -> int:
        return self._update(job, remaining, now)[0]

    def running_priority(self, job: Job, remaining: float, now: float) -> float:
        """Priority of a running job (lower runs first); demotes it when due."""
        st = self._update(job, remaining, now)
        return st[0] * QUEUE_SPAN + st[1]

    def priority(self, job, remaining, now):
        """Priority of a job entering the queue now; it waits from now on."""
        p = self.running_priority(job, remaining, now)
        st = self._state[job.job_id]
        self._waiting[job.job_id] = (now, (self.service(job, remaining) - st[2]) / job.gpus)
        return p

    def on_start(self, job: Job, now: float) -> None:
        self._waiting.pop(job.job_id, None)

    def observe(self, job, now):
        self._state.pop(job.job_id, None)
        self._waiting.pop(job.job_id, None)
        return False

    def next_change(self, job: Job, remaining: float, now: float) -> float:
        """When a running job's service crosses its queue's threshold (inf in the last)."""
        st = self._update(job, remaining, now)
        if st[0] >= len(self.thresholds):
            return math.inf
        left = self.thresholds[st[0]] - (self.service(job, remaining) - st[2])
        return now + max(left, 0.0) / job.gpus

    def wake_at(self) -> float:
        """Earliest time a waiting job is due for promotion (inf without the knob)."""
        if self.starvation <= 0:
            return math.inf
        return min((since + self.starvation * ran for jid, (since, ran) in self._waiting.items()
                    if self._state[jid][0] > 0 and ran > 0), default=math.inf)

    def priorities(self, jobs, now):
        """Re-rank waiting jobs, promoting the starved ones to queue 0 first."""
        out = []
        for job, rem in jobs:
            st = self._update(job, rem, now)
            w = self._waiting.get(job.job_id)
            if (self.starvation > 0 and w and st[0] > 0 and w[1] > 0
                    and now - w[0] >= self.starvation * w[1] - 1e-9):
                st[:] = [0, now, self.service(job, rem)]
                self._waiting[job.job_id] = (now, 0.0)
            out.append(st[0] * QUEUE_SPAN + st[1])
        return out

    def victims(self, head, candidates, now):
        """Running jobs of a worse priority than ``head``, worst first."""
        job, rem = head
        key = self.running_priority(job, rem, now)
        ranked = sorted(((self.running_priority(j, r, now), j.job_id) for j, r in candidates),
                        reverse=True)
        return [jid for k, jid in ranked if k > key]

    def __repr__(self) -> str:
        return (f"Tiresias(backfill={self.backfill}, thresholds={self.thresholds}, "
                f"starvation={self.starvation})")
