"""Event-driven replay under the Lucid-style policy (``policies.lucid.Lucid``).

Two partitions of one cluster: the first ``profile_nodes`` nodes profile new
jobs, the rest run them. Events are arrivals, ends of profiling runs and job
completions. Nothing is ever preempted. A job's progress is tracked at its
current speed (1, or 1 / its measured slowdown while it shares its GPUs), so a
partner arriving or leaving re-times it. Busy GPUs count physical GPUs (a
shared GPU once) on both partitions.

The log's ``packing`` records every packing as (time, queued job, running job,
GPUs, memory MB) so that tests can check the limits were kept.
"""

from __future__ import annotations

import heapq
import math
from array import array

from ..cluster import ClusterSpec, FreeGPUs, Placement
from ..jobs import Job, Trace
from ..policies.lucid import Lucid
from ..policies.pending_queue import PendingQueue, select_starts
from .run_log import RunLog

INF = math.inf
SCAN = 64  # lone running jobs looked at per workload class when packing one job


class LucidReplay:
    """One replay of ``trace`` on ``spec`` under ``policy``: ``run()`` returns its ``RunLog``."""

    def __init__(self, trace: Trace, spec: ClusterSpec, policy: Lucid):
        self.jobs = jobs = trace.jobs
        n = len(jobs)
        gpn = spec.gpus_per_node
        self.prof_gpus = prof_gpus = min(policy.profile_nodes * gpn, spec.num_gpus)
        if spec.num_gpus - prof_gpus < 1:
            raise ValueError(f"lucid: {policy.profile_nodes} profiling nodes leave no GPUs of "
                             f"{spec.num_gpus} to run jobs on")
        main_spec = ClusterSpec(spec.num_gpus - prof_gpus, gpn, spec.gpu_type, spec.consolidate)
        self.free = FreeGPUs(main_spec)
        for j in jobs:
            if self.free.place(j.gpus) is None:
                raise ValueError(f"{trace.job_label(j)} asks for {j.gpus} GPUs; the main partition of "
                                 f"{main_spec.num_gpus} GPUs ({gpn} per node) can never place it")
        self.prof = FreeGPUs(ClusterSpec(prof_gpus, gpn)) if prof_gpus else None
        policy.reset(trace.t0)
        self.policy = policy
        self.queue = PendingQueue()
        self.work = [j.duration for j in jobs]        # seconds of work left at full speed
        self.rate = [1.0] * n
        self.seg = [0.0] * n
        self.version = [0] * n
        self.placement: list = [()] * n
        self.partner: list = [None] * n
        self.prio = [0.0] * n
        self.kind: list = [None] * n                  # workload, once profiling has seen it
        self.first_start = [math.nan] * n
        self.finish = [math.nan] * n
        self.fin_heap: list = []
        self.prof_heap: list = []
        self.lone: dict[tuple[int, str], dict[int, None]] = {}  # (gpus, workload) -> lone running jobs
        self.util_t, self.util_b = array("d"), array("d")
        self.busy = 0
        self.counts = {"debug_jobs_finished_in_profiling": 0, "jobs_profiled": 0, "packed_starts": 0,
                       "profiling_gpu_hours": 0.0}
        self.packing: list = []
        self.ai = 0                                   # next arrival

    def run(self) -> RunLog:
        jobs = self.jobs
        while self.ai < len(jobs) or self.fin_heap or self.prof_heap:
            fin_heap = self.fin_heap
            while fin_heap and fin_heap[0][2] != self.version[fin_heap[0][1]]:
                heapq.heappop(fin_heap)
            now = min(jobs[self.ai].submit if self.ai < len(jobs) else INF, fin_heap[0][0] if fin_heap else INF,
                      self.prof_heap[0][0] if self.prof_heap else INF)
            reprioritise = self._end_profiling(now)
            reprioritise |= self._complete(now)
            self._arrive(now)
            if reprioritise and len(self.queue):
                ids = self.queue.job_ids()
                new = self.policy.priorities([(jobs[i], self.work[i]) for i in ids], now)
                for i, p in zip(ids, new):
                    self.prio[i] = p
                self.queue.reprioritise(dict(zip(ids, new)))
            for jid, p in select_starts(self.queue, self.free, self.policy.backfill):
                self._start(jid, p, now)
            self._pack(now)
            self.util_t.append(now)
            self.util_b.append(self.busy)
        self.counts["preemptions"] = 0
        return RunLog(first_start=self.first_start, finish=self.finish, restarts=[0] * len(jobs),
                      util_t=self.util_t, util_busy=self.util_b, extra=self.counts, packing=self.packing)

    # ---- the events --------------------------------------------------------------------
    def _end_profiling(self, now: float) -> bool:
        """Profiling runs whose time is up end: a debugging job is done, any other queues for the
        main partition with its workload known. True if the policy asks to re-rank the queue."""
        reprioritise = False
        jobs, policy = self.jobs, self.policy
        while self.prof_heap and self.prof_heap[0][0] <= now:
            _, jid, p = heapq.heappop(self.prof_heap)
            self.prof.give(p)
            self.busy -= jobs[jid].gpus
            self.counts["profiling_gpu_hours"] += jobs[jid].gpus * (now - self.first_start[jid]) / 3600
            if jobs[jid].duration <= policy.profile_s:   # a debugging job: done
                self.finish[jid] = now
                self.counts["debug_jobs_finished_in_profiling"] += 1
                reprioritise |= policy.observe(jobs[jid], now)
            else:                                        # profiled: queue for the main partition
                self.kind[jid] = policy.workload_of(jobs[jid])
                self.counts["jobs_profiled"] += 1
                self.first_start[jid] = math.nan
                self._enqueue(jobs[jid], self.work[jid], now)
        return reprioritise

    def _complete(self, now: float) -> bool:
        """Jobs whose work is done finish; a partner left alone runs at full speed again. True if
        the policy asks to re-rank the queue."""
        reprioritise = False
        while self.fin_heap and self.fin_heap[0][0] <= now:
            end, jid, ver = heapq.heappop(self.fin_heap)
            if ver != self.version[jid]:
                continue
            self.finish[jid] = end
            self.version[jid] += 1
            self.work[jid] = 0.0
            self._set_lone(jid, False)
            mate = self.partner[jid]
            if mate is not None and math.isnan(self.finish[mate]):
                self.partner[mate] = None
                self._retime(mate, now, 1.0)
                self._set_lone(mate, True)
            else:
                self.free.give(self.placement[jid])
                self.busy -= self.jobs[jid].gpus
            reprioritise |= self.policy.observe(self.jobs[jid], now)
        return reprioritise

    def _arrive(self, now: float) -> None:
        """Jobs submitted by ``now`` start profiling where the partition has room, else queue
        unprofiled (and are then never packed)."""
        while self.ai < len(self.jobs) and self.jobs[self.ai].submit <= now:
            j = self.jobs[self.ai]
            self.ai += 1
            p = self.prof.place(j.gpus) if self.prof is not None and j.gpus <= self.prof_gpus else None
            if p is not None:
                self.prof.take(p)
                self.busy += j.gpus
                self.first_start[j.job_id] = now
                heapq.heappush(self.prof_heap, (now + min(j.duration, self.policy.profile_s), j.job_id, p))
            else:
                self._enqueue(j, j.duration, now)

    def _enqueue(self, job: Job, remaining: float, now: float) -> None:
        self.prio[job.job_id] = self.policy.priority(job, remaining, now)
        self.queue.push(job.job_id, job.gpus, self.prio[job.job_id])

    def _start(self, jid: int, placement: Placement, now: float, with_job: int | None = None) -> None:
        """Start ``jid`` on ``placement``, alone or sharing the GPUs of ``with_job``."""
        self.first_start[jid] = now
        self.placement[jid] = placement
        self.seg[jid] = now
        if with_job is None:
            self.busy += self.jobs[jid].gpus
            self._retime(jid, now, 1.0)
            self._set_lone(jid, True)
        else:
            s_q, s_r = self.policy.slowdowns(self.kind[jid], self.kind[with_job])
            self.partner[jid], self.partner[with_job] = with_job, jid
            self._set_lone(with_job, False)
            self._retime(with_job, now, 1.0 / s_r)
            self._retime(jid, now, 1.0 / s_q)

    def _pack(self, now: float) -> None:
        """Pack queued jobs that could not start onto lone running jobs, best first."""
        queue, policy, lone = self.queue, self.policy, self.lone
        packed = True
        while packed and len(queue):
            packed = False
            for q_prio, _seq, qid, g in queue.heads():
                if self.kind[qid] is None:
                    continue
                for w in policy.table.workloads:
                    cands = lone.get((g, w))
                    if not cands:
                        continue
                    for k, rid in enumerate(cands):
                        if k >= SCAN:
                            break
                        ok, _ = policy.pack_check(self.kind[qid], q_prio, w, self.prio[rid],
                                                  (g, self.jobs[rid].gpus))
                        if ok:
                            break
                    else:
                        continue
                    if not ok:
                        continue
                    queue.pop(g)
                    mem = policy.table.memory_mb[self.kind[qid]] + policy.table.memory_mb[w]
                    self.packing.append((now, qid, rid, g, mem))
                    self.counts["packed_starts"] += 1
                    self._start(qid, self.placement[rid], now, with_job=rid)
                    packed = True
                    break
                if packed:
                    break

    # ---- book-keeping ---------------------------------------------------------------------
    def _retime(self, jid: int, now: float, new_rate: float) -> None:
        """``jid`` runs at ``new_rate`` from ``now``: its finish moves."""
        self.work[jid] -= (now - self.seg[jid]) * self.rate[jid]
        self.seg[jid], self.rate[jid] = now, new_rate
        self.version[jid] += 1
        heapq.heappush(self.fin_heap, (now + self.work[jid] / new_rate, jid, self.version[jid]))

    def _set_lone(self, jid: int, on: bool) -> None:
        """Whether ``jid`` runs alone on its GPUs, where packing looks for hosts."""
        if self.kind[jid] is None:
            return
        d = self.lone.setdefault((self.jobs[jid].gpus, self.kind[jid]), {})
        if on:
            d[jid] = None
        else:
            d.pop(jid, None)
