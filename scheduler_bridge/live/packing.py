"""Lucid's packing in the live allocator: which running job hosts a waiting one, and when to part them.

Which pairs may share a GPU is the ``policies.lucid.Lucid`` object's rule
(``pack_check``: both measured in its interference table, slowdowns under its
limit, memory fits, priorities close), the same the simulator applies. What
only a live cluster adds is here:

- a waiting job whose ``workload`` is known goes beside the allowed running
  host of as many GPUs with the smallest predicted slowdown of the pair; the host keeps
  running untouched (Lucid is non-intrusive), and the packed job runs in the
  other half of the host's GPU (``placement_groups``: a shareable job's group holds its
  whole GPU and its rank ``SHARE`` of it; the partner's rank takes the rest in
  the same bundle, so Ray gives both that GPU, and the group stays while either
  runs: the one left may host a new partner there);
- the table's prediction is checked against the host's own progress reports:
  its rate of progress alone (before the partner started) against its rate
  beside it. Measured more than ``margin`` above the prediction, the partner is
  stopped (checkpointed), requeued, and never packed with that host again.

A job that may be packed runs one rank per GPU (``ranks``): a Ray actor holds
one bundle, and a rank of several GPUs cannot hold half of each of them. Its
partner's rank i then shares GPU i with its rank i.

>>> from scheduler_bridge.interference import InterferenceTable
>>> from scheduler_bridge.policies.lucid import Lucid
>>> p = LivePacking(Lucid(InterferenceTable({("a", "b"): 1.2, ("b", "a"): 1.1}, {"a": 900.0, "b": 500.0})))
>>> p.cost("a", 10.0, "b", 12.0)
2.3
>>> p.too_slow("b", "a", measured=1.2), p.too_slow("b", "a", measured=1.5)
(False, True)
"""

from __future__ import annotations

import math

from .job_state import Where

from ..policies.lucid import Lucid

SHARE = 0.5   # the fraction of a GPU each job of a packed pair holds


class LivePacking:
    def __init__(self, lucid: Lucid, margin: float = 0.25):
        if not margin >= 0:
            raise ValueError(f"packing margin must be >= 0, got {margin}")
        self.lucid, self.margin = lucid, margin

    def shareable(self, workload: str) -> bool:
        return workload in self.lucid.table.memory_mb

    def cost(self, job: str, job_priority: float, host: str, host_priority: float,
             gpus: tuple[int, int] = (1, 1)) -> float | None:
        """The pair's summed predicted slowdown, or None where Lucid's rule forbids packing
        (``gpus``: the GPU counts of the two, which must be equal)."""
        ok, _ = self.lucid.pack_check(job, job_priority, host, host_priority, gpus=gpus)
        return round(sum(self.lucid.slowdowns(job, host)), 9) if ok else None

    def too_slow(self, host: str, partner: str, measured: float) -> bool:
        """The host's measured slowdown beside ``partner`` exceeds the prediction by the margin."""
        return measured > self.lucid.slowdowns(host, partner)[0] * (1.0 + self.margin)


def ranks(where: Where) -> Where:
    """One rank of one GPU per GPU of ``where``: how a job that may be packed runs.

    >>> ranks((("n1", 2), ("n2", 1)))
    (('n1', 1), ('n1', 1), ('n2', 1))
    """
    return tuple((node, 1) for node, k in where for _ in range(k))


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
