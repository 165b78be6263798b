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

from ..cluster import ClusterSpec, FreeGPUs
from ..jobs import Trace
from ..policies.pending_queue import PendingQueue, select_starts
from ..policies.lucid import Lucid
from .run_log import RunLog

INF = math.inf
SCAN = 64  # lone running jobs looked at per workload class when packing one job


def run_lucid(trace: Trace, spec: ClusterSpec, policy: Lucid) -> RunLog:
    jobs = trace.jobs
    n = len(jobs)
    gpn = spec.gpus_per_node
    prof_gpus = min(policy.profile_nodes * gpn, spec.num_gpus)
    if spec.num_gpus - prof_gpus < 1:
        raise ValueError(f"lucid: {policy.profile_nodes} profiling nodes leave no GPUs of "
                         f"{spec.num_gpus} to run jobs on")
    main_spec = ClusterSpec(spec.num_gpus - prof_gpus, gpn, spec.gpu_type, spec.consolidate)
    free = FreeGPUs(main_spec)
    for j in jobs:
        if free.place(j.gpus) is None:
            raise ValueError(f"job {j.name or j.job_id} asks for {j.gpus} GPUs; the main partition of "
                             f"{main_spec.num_gpus} GPUs ({gpn} per node) can never place it")
    prof = FreeGPUs(ClusterSpec(prof_gpus, gpn)) if prof_gpus else None
    policy.reset(trace.t0)
    queue = PendingQueue()
    work = [j.duration for j in jobs]        # seconds of work left at full speed
    rate = [1.0] * n
    seg = [0.0] * n
    version = [0] * n
    placement: list = [()] * n
    partner: list = [None] * n
    prio = [0.0] * n
    kind: list = [None] * n                  # workload, once profiling has seen it
    first_start = [math.nan] * n
    finish = [math.nan] * n
    fin_heap: list = []
    prof_heap: list = []
    lone: dict[tuple[int, str], dict[int, None]] = {}  # (gpus, workload) -> lone running jobs
    util_t, util_b = array("d"), array("d")
    busy = 0
    counts = {"debug_jobs_finished_in_profiling": 0, "jobs_profiled": 0, "packed_starts": 0,
              "profiling_gpu_hours": 0.0}
    packing: list = []
    ai = 0

    def retime(jid, now, new_rate):
        work[jid] -= (now - seg[jid]) * rate[jid]
        seg[jid], rate[jid] = now, new_rate
        version[jid] += 1
        heapq.heappush(fin_heap, (now + work[jid] / new_rate, jid, version[jid]))

    def set_lone(jid, on: bool):
        if kind[jid] is None:
            return
        d = lone.setdefault((jobs[jid].gpus, kind[jid]), {})
        if on:
            d[jid] = None
        else:
            d.pop(jid, None)

    def start(jid, p, now, with_job=None):
        nonlocal busy
        first_start[jid] = now
        placement[jid] = p
        seg[jid] = now
        if with_job is None:
            busy += jobs[jid].gpus
            retime(jid, now, 1.0)
            set_lone(jid, True)
        else:
            s_q, s_r = policy.slowdowns(kind[jid], kind[with_job])
            partner[jid], partner[with_job] = with_job, jid
            set_lone(with_job, False)
            retime(with_job, now, 1.0 / s_r)
            retime(jid, now, 1.0 / s_q)

    def pack(now):
        """Pack queued jobs that could not start onto lone running jobs, best first."""
        packed = True
        while packed and len(queue):
            packed = False
            for q_prio, _seq, qid, g in queue.heads():
                if kind[qid] is None:
                    continue
                for w in policy.table.workloads:
                    cands = lone.get((g, w))
                    if not cands:
                        continue
                    for k, rid in enumerate(cands):
                        if k >= SCAN:
                            break
                        ok, _ = policy.pack_check(kind[qid], q_prio, w, prio[rid], (g, jobs[rid].gpus))
                        if ok:
                            break
                    else:
                        continue
                    if not ok:
                        continue
                    queue.pop(g)
                    mem = policy.table.memory_mb[kind[qid]] + policy.table.memory_mb[w]
                    packing.append((now, qid, rid, g, mem))
                    counts["packed_starts"] += 1
                    start(qid, placement[rid], now, with_job=rid)
                    packed = True
                    break
                if packed:
                    break

    while ai < n or fin_heap or prof_heap:
        while fin_heap and fin_heap[0][2] != version[fin_heap[0][1]]:
            heapq.heappop(fin_heap)
        now = min(jobs[ai].submit if ai < n else INF, fin_heap[0][0] if fin_heap else INF,
                  prof_heap[0][0] if prof_heap else INF)
        reprioritise = False
        while prof_heap and prof_heap[0][0] <= now:
            _, jid, p = heapq.heappop(prof_heap)
            prof.give(p)
            busy -= jobs[jid].gpus
            counts["profiling_gpu_hours"] += jobs[jid].gpus * (now - first_start[jid]) / 3600
            if jobs[jid].duration <= policy.profile_s:   # a debugging job: done
                finish[jid] = now
                counts["debug_jobs_finished_in_profiling"] += 1
                reprioritise |= policy.observe(jobs[jid], now)
            else:                                        # profiled: queue for the main partition
                kind[jid] = policy.workload_of(jobs[jid])
                counts["jobs_profiled"] += 1
                first_start[jid] = math.nan
                prio[jid] = policy.priority(jobs[jid], work[jid], now)
                queue.push(jid, jobs[jid].gpus, prio[jid])
        while fin_heap and fin_heap[0][0] <= now:
            end, jid, ver = heapq.heappop(fin_heap)
            if ver != version[jid]:
                continue
            finish[jid] = end
            version[jid] += 1
            work[jid] = 0.0
            set_lone(jid, False)
            mate = partner[jid]
            if mate is not None and math.isnan(finish[mate]):
                partner[mate] = None
                retime(mate, now, 1.0)
                set_lone(mate, True)
            else:
                free.give(placement[jid])
                busy -= jobs[jid].gpus
            reprioritise |= policy.observe(jobs[jid], now)
        while ai < n and jobs[ai].submit <= now:
            j = jobs[ai]
            ai += 1
            p = prof.place(j.gpus) if prof is not None and j.gpus <= prof_gpus else None
            if p is not None:
                prof.take(p)
                busy += j.gpus
                first_start[j.job_id] = now
                heapq.heappush(prof_heap, (now + min(j.duration, policy.profile_s), j.job_id, p))
            else:  # no room to profile: queue unprofiled (never packed)
                prio[j.job_id] = policy.priority(j, j.duration, now)
                queue.push(j.job_id, j.gpus, prio[j.job_id])
        if reprioritise and len(queue):
            ids = queue.job_ids()
            new = policy.priorities([(jobs[i], work[i]) for i in ids], now)
            for i, p in zip(ids, new):
                prio[i] = p
            queue.reprioritise(dict(zip(ids, new)))
        for jid, p in select_starts(queue, free, policy.backfill):
            start(jid, p, now)
        pack(now)
        util_t.append(now)
        util_b.append(busy)

    counts["preemptions"] = 0
    return RunLog(first_start=first_start, finish=finish, restarts=[0] * n,
                  util_t=util_t, util_busy=util_b, extra=counts, packing=packing)
