"""The tuning layer of the rigid replay: tuning jobs' fused groups as guests of the ordinary jobs.

Under a policy that names the ``"tuning"`` layer (tuning-aware), each tuning job's groups run on
the GPUs the ordinary jobs leave idle, and in the bubbles of running pipeline jobs, where
``policy.fill`` puts them. A group on an idle GPU runs at full speed, one in a pipeline job's
bubbles at that job's bubble fraction. An ordinary job that takes a GPU evicts its group at once
(``policy.evictions``), and the group keeps the work of its last checkpoint (every
``policy.checkpoint_interval`` seconds); a pipeline job that ends or is preempted takes its
bubbles' groups with it. Ordinary jobs never wait for a group.
"""

from __future__ import annotations

import heapq
import math
from collections import deque

from ..cluster import FreeGPUs
from ..jobs import Trace
from ..policies._base import TuningHooks
from ..policies.pending_queue import PendingQueue
from .layer import Instant
from .run_log import RunLog

INF = math.inf


class TuningLayer:
    """Book-keeping of tuning groups (``layer.ReplayLayer``)."""

    def __init__(self, trace: Trace, policy: TuningHooks, free: FreeGPUs):
        self.policy, self.free = policy, free
        self.ckpt = policy.checkpoint_interval
        self.tuning_jobs = len(trace.tuning)
        self.arrivals = sorted(trace.tuning, key=lambda t: (t.submit, t.job_id))
        self.ai = 0
        self.remaining: dict[tuple[int, int], float] = {}
        self.pending_groups: deque = deque()
        self.running: dict = {}          # gid -> (where, rate, seg_start)
        self.on_node: dict[int, list] = {}
        self.in_bubbles: dict[int, list] = {}
        self.bubble_jobs: dict[int, tuple[int, float]] = {}  # pipeline job -> (gpus, fraction)
        self.heap: list = []
        self.version: dict = {}
        self.left = {t.job_id: t.groups for t in trace.tuning}
        self.submit = {t.job_id: t.submit for t in trace.tuning}
        self.job_finish: dict[int, float] = {}
        self.work_gpu = self.work_bubble = self.wasted = 0.0
        self.groups_done = 0

    def pending(self, queue: PendingQueue) -> bool:
        return self.next_time() < INF

    def next_time(self) -> float:
        while self.heap and self.heap[0][2] != self.version.get(self.heap[0][1]):
            heapq.heappop(self.heap)
        t = self.heap[0][0] if self.heap else INF
        if self.ai < len(self.arrivals):
            t = min(t, self.arrivals[self.ai].submit)
        return t

    def _stop(self, gid, now, finished: bool) -> None:
        where, rate, start = self.running.pop(gid)
        self.version[gid] = self.version.get(gid, 0) + 1
        lst = self.on_node[where[1]] if where[0] == "gpu" else self.in_bubbles[where[1]]
        lst.remove(gid)
        elapsed = now - start
        done = self.remaining[gid] if finished else math.floor(elapsed / self.ckpt) * self.ckpt * rate
        if not finished:
            self.wasted += elapsed * rate - done
        if where[0] == "gpu":
            self.work_gpu += done
        else:
            self.work_bubble += done
        self.remaining[gid] -= done
        if finished:
            self.groups_done += 1
            self.left[gid[0]] -= 1
            if self.left[gid[0]] == 0:
                self.job_finish[gid[0]] = now
        else:
            self.pending_groups.appendleft(gid)

    def begin(self, now: float) -> None:
        """Groups whose work is done finish."""
        while self.heap and self.heap[0][0] <= now:
            t, gid, ver = heapq.heappop(self.heap)
            if ver == self.version.get(gid) and gid in self.running:
                self._stop(gid, now, finished=True)

    def end(self, instant: Instant) -> None:
        """Tuning jobs arrive, groups leave GPUs and bubbles the jobs took, and waiting groups
        take what is left."""
        now = instant.now
        while self.ai < len(self.arrivals) and self.arrivals[self.ai].submit <= now:
            tj = self.arrivals[self.ai]
            self.ai += 1
            for g in range(tj.groups):
                self.remaining[(tj.job_id, g)] = tj.group_work
                self.pending_groups.append((tj.job_id, g))
        for node in instant.touched:  # ordinary jobs took GPUs: evict groups at once
            groups = self.on_node.get(node, [])
            for _ in range(self.policy.evictions(len(groups), self.free.free[node])):
                self._stop(groups[-1], now, finished=False)
        for jid in instant.ended:
            for gid in list(self.in_bubbles.get(jid, [])):
                self._stop(gid, now, finished=False)
            self.in_bubbles.pop(jid, None)
            self.bubble_jobs.pop(jid, None)
        for jid, gpus, frac in instant.started:
            if frac > 0:
                self.bubble_jobs[jid] = (gpus, frac)
                self.in_bubbles[jid] = []
        if not self.pending_groups:
            return
        idle = {n: f - len(self.on_node.get(n, [])) for n, f in enumerate(self.free.free)
                if f > len(self.on_node.get(n, []))}
        slots = {j: g - len(self.in_bubbles[j]) for j, (g, _) in self.bubble_jobs.items()
                 if g > len(self.in_bubbles[j])}
        places, _ = self.policy.fill(idle, slots, len(self.pending_groups))
        for where in places:
            gid = self.pending_groups.popleft()
            rate = 1.0 if where[0] == "gpu" else self.bubble_jobs[where[1]][1]
            self.running[gid] = (where, rate, now)
            (self.on_node.setdefault(where[1], []) if where[0] == "gpu"
             else self.in_bubbles[where[1]]).append(gid)
            ver = self.version[gid] = self.version.get(gid, 0) + 1
            heapq.heappush(self.heap, (now + self.remaining[gid] / rate, gid, ver))

    def report(self, log: RunLog) -> None:
        jcts = [self.job_finish[j] - self.submit[j] for j in self.job_finish]
        log.extra.update({
            "tuning_jobs": self.tuning_jobs,
            "tuning_jobs_completed": len(self.job_finish),
            "tuning_groups_completed": self.groups_done,
            "tuning_gpu_hours_idle_gpus": self.work_gpu / 3600,
            "tuning_gpu_hours_bubbles": self.work_bubble / 3600,
            "tuning_gpu_hours_free": (self.work_gpu + self.work_bubble) / 3600,
            "tuning_gpu_hours_lost_to_eviction": self.wasted / 3600,
            "tuning_avg_jct": sum(jcts) / len(jcts) if jcts else None,
        })
