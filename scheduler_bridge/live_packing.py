"""Lucid-style packing in the live allocator: who may share a running job's GPU, and when to part them.

A queued job that cannot start alone may share the GPU of a running job (its
*host*) when both are one-GPU jobs whose workloads the interference table has
measured together, each is predicted to slow down by at most ``max_slowdown``
beside the other, their memory fits one GPU, and their priorities are within
``priority_gap`` of each other. The host keeps running untouched (Lucid is
non-intrusive); the packed job runs in the other half of the host's GPU (see
``allocator``: a shareable job holds its GPU as two ``{"GPU": 0.5}`` bundles,
its own and a reserved one that a packed job moves into).

The table's prediction is checked against the host's own progress reports:
its rate of progress alone (before the packed job started) against its rate
beside it. If the measured slowdown exceeds the prediction by more than
``margin``, the packed job is stopped (checkpointed), requeued, and never
packed with that host again.

>>> rule = PackingRule(slowdown={("a", "b"): 1.2, ("b", "a"): 1.1}, memory_mb={"a": 900.0, "b": 500.0},
...                    gpu_memory_mb=1000.0)
>>> rule.predicted("a", "b"), rule.fits("a", "b")
((1.2, 1.1), False)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

SHARE = 0.5   # the fraction of a GPU each of a packed pair holds


@dataclass
class PackingRule:
    """Pairwise slowdowns ``slowdown[(a, b)]`` (``a`` beside ``b``) and each workload's memory."""

    slowdown: dict[tuple[str, str], float]
    memory_mb: dict[str, float]
    max_slowdown: float = 1.5
    gpu_memory_mb: float = 16384.0
    priority_gap: float = math.inf
    margin: float = 0.25
    machine: str = field(default="", repr=False)

    def __post_init__(self) -> None:
        if not (self.max_slowdown >= 1.0 and self.gpu_memory_mb > 0 and self.priority_gap >= 0
                and self.margin >= 0):
            raise ValueError(f"packing: max_slowdown >= 1, gpu_memory_mb > 0, priority_gap >= 0 and "
                             f"margin >= 0; got {self.max_slowdown}, {self.gpu_memory_mb}, "
                             f"{self.priority_gap}, {self.margin}")

    @classmethod
    def from_table(cls, table, **knobs) -> "PackingRule":
        """From an ``interference.InterferenceTable`` (``hpo profile colocate``'s CSV)."""
        return cls(dict(table.slowdown), dict(table.memory_mb), machine=table.machine, **knobs)

    def shareable(self, workload: str, gpus: int) -> bool:
        return gpus == 1 and workload in self.memory_mb

    def predicted(self, a: str, b: str) -> tuple[float, float] | None:
        """(slowdown of ``a`` beside ``b``, of ``b`` beside ``a``), or None if never measured."""
        sa, sb = self.slowdown.get((a, b)), self.slowdown.get((b, a))
        return None if sa is None or sb is None else (sa, sb)

    def fits(self, a: str, b: str) -> bool:
        return self.memory_mb[a] + self.memory_mb[b] <= self.gpu_memory_mb

    def cost(self, job: str, host: str, job_priority: float, host_priority: float) -> float | None:
        """How much packing ``job`` beside ``host`` slows the pair (sum of slowdowns), or None if
        the rule forbids it."""
        pair = self.predicted(job, host)
        if (pair is None or max(pair) > self.max_slowdown or not self.fits(job, host)
                or abs(job_priority - host_priority) > self.priority_gap):
            return None
        return pair[0] + pair[1]

    def too_slow(self, host: str, partner: str, measured: float) -> bool:
        """The host's measured slowdown beside ``partner`` exceeds the prediction by the margin."""
        pair = self.predicted(host, partner)
        return pair is not None and measured > pair[0] * (1.0 + self.margin)


def measured_slowdown(samples: list[tuple[float, float]], since: float) -> float | None:
    """Rate of progress before ``since`` over the rate after it, from (time, fraction done)
    samples; None until each side has two samples with progress between them."""
    before = [s for s in samples if s[0] <= since]
    after = [s for s in samples if s[0] > since]
    if len(before) < 2 or len(after) < 2:
        return None
    alone = (before[-1][1] - before[0][1]) / max(before[-1][0] - before[0][0], 1e-9)
    packed = (after[-1][1] - after[0][1]) / max(after[-1][0] - after[0][0], 1e-9)
    if alone <= 0:
        return None
    return math.inf if packed <= 0 else alone / packed
