"""The pending queue of rigid jobs and the start decision shared by all queue policies.

Jobs are bucketed by GPU demand, each bucket a heap by (priority, arrival order).
Whether a job can be placed depends only on its demand, so if a bucket's head
does not fit, nothing in that bucket does: choosing the best job that fits costs
O(#distinct demands), not O(queue length).

>>> from scheduler_bridge.cluster import ClusterSpec, FreeGPUs
>>> q = PendingQueue(); q.push(7, gpus=8, priority=1.0); q.push(8, gpus=1, priority=2.0)
>>> select_starts(q, FreeGPUs(ClusterSpec(4, 4)), backfill=True)
[(8, ((0, 1),))]
"""

from __future__ import annotations

import heapq
from itertools import count

from ..cluster import FreeGPUs, Placement


class PendingQueue:
    """Pending jobs: ``push``, ``heads`` (best job per demand), ``pop``."""

    def __init__(self) -> None:
        self._buckets: dict[int, list[tuple[float, int, int]]] = {}
        self._demand: dict[int, int] = {}
        self._seq = count()

    def __len__(self) -> int:
        return len(self._demand)

    def copy(self) -> "PendingQueue":
        """An independent queue with the same jobs and order (for what-if starts)."""
        other = PendingQueue()
        other._buckets = {g: list(b) for g, b in self._buckets.items()}
        other._demand = dict(self._demand)
        other._seq = self._seq  # shared counter: orders stay comparable
        return other

    def demand(self) -> int:
        """GPUs all queued jobs ask for together."""
        return sum(self._demand.values())

    def __contains__(self, job_id: int) -> bool:
        return job_id in self._demand

    def job_ids(self) -> list[int]:
        return list(self._demand)

    def push(self, job_id: int, gpus: int, priority: float) -> None:
        if job_id in self._demand:
            raise ValueError(f"job {job_id} is already queued")
        self._demand[job_id] = gpus
        heapq.heappush(self._buckets.setdefault(gpus, []), (priority, next(self._seq), job_id))

    def min_demand(self) -> int:
        """The smallest GPU demand of any queued job (0 if empty)."""
        return min(self._buckets, default=0)

    def heads(self) -> list[tuple[float, int, int, int]]:
        """(priority, seq, job_id, gpus) of each bucket's best job, best first."""
        return sorted((b[0][0], b[0][1], b[0][2], g) for g, b in self._buckets.items() if b)

    def pop(self, gpus: int) -> int:
        """Remove and return the best job of demand ``gpus``."""
        b = self._buckets[gpus]
        _, _, job_id = heapq.heappop(b)
        if not b:
            del self._buckets[gpus]
        del self._demand[job_id]
        return job_id

    def reprioritise(self, priorities: dict[int, float]) -> None:
        """Give every queued job a new priority (keeping arrival order for ties)."""
        for g, b in self._buckets.items():
            b[:] = [(priorities[j], s, j) for _, s, j in b]
            heapq.heapify(b)


def select_starts(queue: PendingQueue, free: FreeGPUs, backfill: bool) -> list[tuple[int, Placement]]:
    """Start jobs in priority order while they fit; returns (job_id, placement) pairs.

    Without ``backfill`` the first job that does not fit blocks all others (strict
    priority order). With it, a lower-priority job may start when every better one
    is too large for the free GPUs (greedy backfill, no reservation).
    Takes the GPUs from ``free`` and the jobs from ``queue``.
    """
    starts = []
    while len(queue) and free.total_free >= queue.min_demand():
        chosen = None
        for _prio, _seq, _jid, g in queue.heads():
            p = free.place(g) if g <= free.total_free else None
            if p is not None:
                chosen = (g, p)
                break
            if not backfill:
                break
        if chosen is None:
            break
        g, p = chosen
        jid = queue.pop(g)
        free.take(p)
        starts.append((jid, p))
    return starts
