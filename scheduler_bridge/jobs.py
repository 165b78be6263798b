"""Job model: rigid training jobs, elastic jobs and tuning jobs.

A rigid job asks for a fixed number of GPUs and runs for ``duration`` seconds on
them. An elastic job (``elastic`` set) may run on any GPU count in its feasible
range with a batch size of the policy's choosing; its work is measured in
training progress from a throughput / statistical-efficiency profile. A tuning
job is a set of fused groups (``TuningJob``) that only ever runs on GPUs nobody
else is using, or inside pipeline jobs' bubbles.

>>> job = Job(job_id=0, submit=0.0, gpus=4, duration=3600.0, vc="vc1")
>>> job.gpu_time
14400.0
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class ElasticSpec:
    """What an elastic job may be given.

    ``application`` names a measured profile (``app_profiles.AppProfile``);
    ``batch_size`` is the global batch the user asked for (kept by the
    fixed-batch baseline); ``min_gpus`` / ``max_gpus`` bound the GPU count.
    """

    application: str
    batch_size: int
    min_gpus: int = 1
    max_gpus: int = 64


@dataclass(slots=True)
class Job:
    """One job of a trace. Times are seconds from the start of the trace.

    ``duration`` is the run time on ``gpus`` GPUs when nothing else interferes
    (for an elastic job: the isolated run time at its requested GPUs and
    batch size, used for fairness and by the oracle policies).
    ``bubble_fraction`` > 0 marks a pipeline-parallel job whose GPUs sit idle
    that fraction of the time (its pipeline bubbles).
    """

    job_id: int
    submit: float
    gpus: int
    duration: float
    user: str = ""
    name: str = ""
    vc: str = ""
    elastic: ElasticSpec | None = None
    bubble_fraction: float = 0.0

    @property
    def gpu_time(self) -> float:
        return self.duration * self.gpus


@dataclass(frozen=True, slots=True)
class TuningJob:
    """A hyperparameter-tuning job: ``groups`` fused groups of ``group_work``
    GPU-seconds each. A group holds one GPU (or one pipeline job's bubbles on
    one GPU) and may be evicted at any time, keeping the progress of its last
    checkpoint."""

    job_id: int
    submit: float
    groups: int
    group_work: float
    name: str = ""


@dataclass(frozen=True, slots=True)
class Trace:
    """Jobs sorted by (submit, job_id), with submit times starting at 0."""

    jobs: tuple[Job, ...]
    source: str = ""
    tuning: tuple[TuningJob, ...] = field(default=())
    t0: float = 0.0  # absolute time (Unix seconds when known) of submit time 0

    def __len__(self) -> int:
        return len(self.jobs)

    def job_label(self, job: Job) -> str:
        """``job`` as an error names it: its trace file (when it came from one) and its name, so
        that a job the replay refuses is found in the file."""
        name = f"job {job.name or job.job_id}"
        return f"{self.source}: {name}" if self.source else name


def make_trace(jobs, source: str = "", tuning=()) -> Trace:
    """Sort ``jobs`` by submit time, shift times to start at 0, renumber ids 0..n-1
    in that order (the original id stays in ``name`` when it had none)."""
    jobs = sorted(jobs, key=lambda j: (j.submit, j.job_id))
    t0 = jobs[0].submit if jobs else 0.0
    out = []
    for i, j in enumerate(jobs):
        out.append(Job(job_id=i, submit=j.submit - t0, gpus=j.gpus, duration=j.duration,
                       user=j.user, name=j.name or str(j.job_id), vc=j.vc,
                       elastic=j.elastic, bubble_fraction=j.bubble_fraction))
    tuning = tuple(TuningJob(t.job_id, max(0.0, t.submit - t0), t.groups, t.group_work, t.name)
                   for t in tuning)
    return Trace(tuple(out), source, tuning, t0)
