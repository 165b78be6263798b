"""Queue policies for rigid jobs: the interface, FIFO and the oracle bounds SJF / SRTF.

A queue policy only ranks jobs (``priority``: lower runs first) and, if
preemptive, picks victims; *where* a job goes is the cluster's placement rule
and *which* jobs start is ``pending_queue.select_starts``. Both drivers (the
simulator and the live allocator) call the same methods:

- ``reset(t0)`` once before a run (``t0``: absolute time of time 0);
- ``priority(job, remaining, now)`` when a job (re-)enters the queue;
- ``on_start(job, now)`` when a job starts (or restarts) running;
- ``observe(job, now)`` when a job finishes; returning True asks the driver to
  recompute every queued job's priority with ``priorities`` (QSSF after a refit);
- ``victims(head, candidates, now)`` for preemptive policies.

A policy with ``ranks_running`` (Tiresias) also ranks running jobs
(``running_priority``), says when a running job's rank next changes
(``next_change``) and when queued jobs must be re-ranked (``wake_at``); the
driver then preempts a running job whenever a queued one outranks it.

>>> FIFO().priority(Job(0, submit=5.0, gpus=1, duration=9.0), remaining=9.0, now=5.0)
5.0
"""

from __future__ import annotations

from ..jobs import Job


class QueuePolicy:
    """Base: first in, first out, non-preemptive."""

    name = "fifo"
    preemptive = False
    ranks_running = False

    def __init__(self, backfill: bool = False):
        self.backfill = backfill

    def reset(self, t0: float = 0.0) -> None:
        """Forget all state learnt in an earlier run."""

    def priority(self, job: Job, remaining: float, now: float) -> float:
        return job.submit

    def priorities(self, jobs: list[tuple[Job, float]], now: float) -> list[float]:
        return [self.priority(j, r, now) for j, r in jobs]

    def on_start(self, job: Job, now: float) -> None:
        """Only policies that track waiting time (Tiresias' promotion) need this."""

    def observe(self, job: Job, now: float) -> bool:
        return False

    def victims(self, head: tuple[Job, float], candidates: list[tuple[Job, float]],
                now: float) -> list[int]:
        """Running jobs (with their remaining seconds) to preempt so ``head`` can
        start; only called on preemptive policies. The driver checks placement."""
        return []

    def __repr__(self) -> str:
        return f"{type(self).__name__}(backfill={self.backfill})"


class FIFO(QueuePolicy):
    """Baseline: submit order."""


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
