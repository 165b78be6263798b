"""QSSF (Helios, SC'21): quasi-shortest-service-first.

Priority = predicted GPU time (predicted duration x GPUs) of a job, predicted
when it is submitted from the history of finished jobs (``DurationPredictor``:
gradient-boosted regressor refit online plus a per-key history mean); queued
jobs are re-ranked whenever the model is refit and every ``rerank_every``
finished jobs (the history part moves with every finish). Non-preemptive. ``backfill``
(default on) lets a smaller job start when the better-ranked ones do not fit.

>>> policy = QSSF(); policy.reset()
>>> policy.priority(Job(0, submit=0.0, gpus=2, duration=50.0, vc="a"), 50.0, 0.0)
7200.0
"""

from __future__ import annotations

from ..jobs import Job
from ._base import QueuePolicy
from .duration_predictor import DurationPredictor


class QSSF(QueuePolicy):
    name = "qssf"

    def __init__(self, backfill: bool = True, seed: int = 0, rerank_every: int = 200,
                 **predictor_kw):
        super().__init__(backfill)
        self.rerank_every = rerank_every
        self.predictor = DurationPredictor(seed=seed, **predictor_kw)
        self.reset()

    def reset(self, t0: float = 0.0) -> None:
        self.t0 = t0
        self.predictor.reset()
        self._features: dict[int, object] = {}
        self._finished = 0

    def _hour(self, job: Job) -> int:
        return int(((self.t0 + job.submit) // 3600) % 24)

    def priority(self, job, remaining, now):
        if job.job_id not in self._features:
            self._features[job.job_id] = self.predictor.features(job.user, job.vc, job.gpus,
                                                                 self._hour(job))
        return self.predictor.predict(job.user, job.vc, job.gpus, self._hour(job)) * job.gpus

    def priorities(self, jobs, now):
        memo: dict = {}
        out = []
        for job, _ in jobs:
            k = (job.user, job.vc, job.gpus, self._hour(job))
            if k not in memo:
                memo[k] = self.predictor.predict(*k) * job.gpus
            out.append(memo[k])
        return out

    def predicted_duration(self, job: Job) -> float:
        return self.predictor.predict(job.user, job.vc, job.gpus, self._hour(job))

    def observe(self, job, now):
        feats = self._features.pop(job.job_id, None)
        if feats is None:  # started without ever being ranked
            feats = self.predictor.features(job.user, job.vc, job.gpus, self._hour(job))
        refit = self.predictor.observe(feats, job.user, job.vc, job.gpus, job.duration)
        self._finished += 1
        return refit or (self.rerank_every > 0 and self._finished % self.rerank_every == 0)


