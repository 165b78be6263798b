"""What the live allocator knows about one job: the submitted spec and its run state.

``JobSpec`` is validated once, at submit; everything inward takes it as typed.
``LiveJob`` is the allocator's mutable record; it only changes by applying
journal events (``driver.LiveDriver.apply``), so a replayed journal gives
back the same records.

>>> JobSpec(entrypoint="pkg.mod:train", gpus=2).kind
'train'
>>> JobSpec(entrypoint="train", gpus=2)
Traceback (most recent call last):
...
ValueError: entrypoint must look like 'package.module:function', got 'train'
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field

Where = tuple[tuple[str, int], ...]  # ((ray node id, gpus), ...): a placement on real nodes

ACTIVE = ("queued", "running", "stopping")
TERMINAL = ("done", "failed", "cancelled")
_ENTRY = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


@dataclass(frozen=True)
class JobSpec:
    """A job as submitted.

    ``entrypoint``: ``"package.module:function"``, called as ``function(ctx)`` with a
    ``job_runner.JobContext``. ``gpus``: the GPUs it asks for (queue policies run it on
    exactly these). ``application`` / ``min_gpus`` / ``max_gpus`` make it elastic
    (the elastic policy picks its GPU count from the named measured profile).
    ``batch_size`` (``min_batch`` .. ``max_batch``): the global batch; an elastic
    decision's batch is clamped into that range. ``expected_seconds``: the run-time
    hint the oracle policies (SJF, SRTF) rank by. ``bubble_fraction`` > 0 marks a
    pipeline-parallel job whose bubbles may host tuning groups; ``bubble_capacity_gpu_s``
    (with ``iteration_s``) is the idle GPU-seconds per iteration its replayed profile
    predicts (``hpo job submit --bubble-profile``), which sends a sweep's groups to the job
    with the most room (``bubble_rate``). ``kind="tuning"``
    with ``groups`` > 0 and ``sweep``: the running sweep of that name (``hpo run
    --allocator``), whose fused groups wait in the bubble pool and run where the
    allocator places them as guests: on idle GPUs (an ``IdleGpuHost`` each) and in
    pipeline jobs' bubbles. ``workload``: its name in the interference table, which
    makes a job eligible for packing (``packing``); under Lucid a job
    without one is profiled first, and classified by what that run measured.
    """

    entrypoint: str
    gpus: int = 1
    kind: str = "train"
    name: str = ""
    user: str = ""
    vc: str = ""
    config: dict = field(default_factory=dict)
    batch_size: int | None = None
    min_batch: int | None = None
    max_batch: int | None = None
    application: str | None = None
    min_gpus: int | None = None
    max_gpus: int | None = None
    expected_seconds: float = 3600.0
    bubble_fraction: float = 0.0
    bubble_capacity_gpu_s: float = 0.0
    iteration_s: float = 0.0
    groups: int = 0
    sweep: str = ""
    max_attempts: int = 5
    workload: str = ""

    def __post_init__(self) -> None:
        if not _ENTRY.match(self.entrypoint):
            raise ValueError(f"entrypoint must look like 'package.module:function', got {self.entrypoint!r}")
        if self.kind not in ("train", "tuning"):
            raise ValueError(f"kind must be 'train' or 'tuning', got {self.kind!r}")
        if not isinstance(self.gpus, int) or self.gpus < 1:
            raise ValueError(f"gpus must be an int >= 1, got {self.gpus!r}")
        if self.kind == "tuning" and self.groups < 1:
            raise ValueError(f"a tuning job needs groups >= 1, got {self.groups}")
        if self.sweep and self.kind != "tuning":
            raise ValueError(f"sweep={self.sweep!r} is for tuning jobs, not kind={self.kind!r}")
        if self.kind == "tuning" and not self.sweep:
            raise ValueError("a tuning job is a running sweep: give sweep=<its name> (hpo run --allocator does)")
        for name in ("min_gpus", "max_gpus", "batch_size", "min_batch", "max_batch"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ValueError(f"{name} must be an int >= 1 when given, got {value!r}")
        for name in ("expected_seconds", "bubble_fraction", "bubble_capacity_gpu_s", "iteration_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value!r}")
        lo, hi = self.min_gpus or 1, self.max_gpus or self.gpus
        if not 1 <= lo <= hi:
            raise ValueError(f"elastic range needs 1 <= min_gpus <= max_gpus, got {lo}..{hi}")
        if (self.min_gpus or self.max_gpus) and not self.application:
            raise ValueError("an elastic GPU range needs application= (a measured profile name)")
        if self.min_batch and self.max_batch and self.min_batch > self.max_batch:
            raise ValueError(f"min_batch {self.min_batch} > max_batch {self.max_batch}")
        if not 0.0 <= self.bubble_fraction < 1.0:
            raise ValueError(f"bubble_fraction must be in [0, 1), got {self.bubble_fraction}")
        if self.bubble_capacity_gpu_s < 0 or self.iteration_s < 0:
            raise ValueError(f"bubble_capacity_gpu_s and iteration_s must be >= 0, got "
                             f"{self.bubble_capacity_gpu_s}, {self.iteration_s}")
        if self.bubble_capacity_gpu_s > 0 and not self.iteration_s > 0:
            raise ValueError("bubble_capacity_gpu_s (per iteration) needs the iteration's length, iteration_s > 0")
        if self.expected_seconds <= 0:
            raise ValueError(f"expected_seconds must be > 0, got {self.expected_seconds}")
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts}")

    @property
    def elastic(self) -> bool:
        return self.application is not None

    @property
    def lends_bubbles(self) -> bool:
        return self.bubble_fraction > 0 or self.bubble_capacity_gpu_s > 0

    @property
    def bubble_rate(self) -> float:
        """GPU-seconds of bubble the job offers per second it runs: its predicted capacity per
        iteration over the iteration's length where it was profiled, else its GPUs' bubble fraction."""
        if self.bubble_capacity_gpu_s > 0:
            return self.bubble_capacity_gpu_s / self.iteration_s
        return self.bubble_fraction * self.gpus

    def clamp_batch(self, batch: int | None) -> int | None:
        if batch is None:
            return self.batch_size
        if self.min_batch:
            batch = max(batch, self.min_batch)
        if self.max_batch:
            batch = min(batch, self.max_batch)
        return int(batch)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "JobSpec":
        return cls(**d)


@dataclass
class LiveJob:
    """The allocator's record of one job. Times are Unix seconds."""

    job_id: int
    spec: JobSpec
    submit_t: float
    request_id: str = ""
    state: str = "queued"
    attempt: int = 0                 # starts so far; names this run's group and actors
    ready_attempt: int = 0           # the last attempt whose ranks all came up
    where: Where = ()                # placement of the current run
    gpus: int = 0
    batch_size: int | None = None
    seg_start: float = 0.0
    run_s: float = 0.0               # seconds run over all finished segments
    first_start: float | None = None
    finish_t: float | None = None
    priority: float = 0.0
    qseq: int = 0                    # enqueue order: ties in priority go first-come
    stop_reason: str = ""
    faults: int = 0
    progress: float | None = None    # fraction of its work the job's last checkpoint holds
    result: object = None
    error: str = ""
    runs: list = field(default_factory=list)     # [{attempt, gpus, batch_size, where}]
    requeues: list = field(default_factory=list)  # reasons, in order
    guests: dict = field(default_factory=dict)    # tuning: group -> ["gpu", node] | ["bubble", job]
    reclaimed: bool = False          # pipeline owner asked its bubbles back
    share: list | None = None        # packed: [host job, host attempt] whose GPU it shares
    gpu_group: list | None = None    # [job, attempt] whose placement group holds its GPUs
    avoid: list = field(default_factory=list)    # hosts it was unpacked from (too slow beside them)
    samples: list = field(default_factory=list)  # [(t, progress)] of the current attempt
    profiling: bool = False          # the current run is a Lucid profiling run
    profiled: dict | None = None     # its profiling run's {"memory_mb", "workload"} (class)

    @property
    def active(self) -> bool:
        return self.state in ACTIVE

    @property
    def ready(self) -> bool:
        """Running, and every rank of this run is up (its code runs): a placed job's ranks may take
        seconds to a minute to start, and its run time counts from here."""
        return self.state == "running" and self.ready_attempt == self.attempt

    def summary(self) -> dict:
        return {
            "job_id": self.job_id, "name": self.spec.name, "kind": self.spec.kind,
            "state": self.state, "ready": self.ready, "gpus": self.gpus, "requested_gpus": self.spec.gpus,
            "batch_size": self.batch_size, "where": [list(w) for w in self.where],
            "attempt": self.attempt, "progress": self.progress, "priority": self.priority,
            "submit_t": self.submit_t, "first_start": self.first_start, "finish_t": self.finish_t,
            "run_s": self.run_s, "requeues": list(self.requeues), "runs": list(self.runs),
            "result": self.result, "error": self.error, "guests": dict(self.guests),
            "entrypoint": self.spec.entrypoint, "share": self.share, "avoid": list(self.avoid),
            "gpu_group": self.gpu_group,
            "profiling": self.profiling, "profiled": self.profiled,
            "bubble_capacity_gpu_s": self.spec.bubble_capacity_gpu_s, "iteration_s": self.spec.iteration_s,
        }
