"""Queue policies for rigid jobs: FIFO and the oracle bounds SJF / SRTF (the interface is ``_base``).

>>> FIFO().priority(Job(0, submit=5.0, gpus=1, duration=9.0), remaining=9.0, now=5.0)
5.0
"""

from __future__ import annotations

from ..jobs import Job
from ._base import QueuePolicy


class FIFO(QueuePolicy):
    """Baseline: submit order, non-preemptive."""

    name = "fifo"

    def priority(self, job: Job, remaining: float, now: float) -> float:
        return job.submit


class SJF(QueuePolicy):
    """Oracle shortest-job-first: priority = true GPU time (duration x GPUs), the
    quantity QSSF predicts. A bound, not a deployable policy."""

    name = "sjf"

    def priority(self, job, remaining, now):
        return job.duration * job.gpus


class SRTF(QueuePolicy):
    """Oracle shortest-remaining-GPU-time-first, preemptive (preempted jobs pay the
    simulator's checkpoint-restart cost). A job is preempted only for a job with
    less remaining GPU time, largest remaining first."""

    name = "srtf"
    preemptive = True

    def priority(self, job, remaining, now):
        return remaining * job.gpus

    def victims(self, head, candidates, now):
        job, rem = head
        key = rem * job.gpus
        ranked = sorted(((r * j.gpus, j.job_id) for j, r in candidates), reverse=True)
        return [jid for k, jid in ranked if k > key]
