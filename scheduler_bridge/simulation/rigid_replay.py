"""Event-driven replay of rigid jobs under a queue policy (FIFO, SJF, SRTF, QSSF,
tuning-aware). Events are arrivals and completions (no fixed ticks); all
decisions at one instant are taken after every completion and arrival of that
instant. Preempted jobs keep their progress and pay ``restart_cost`` seconds of
checkpoint-restart when they start again.
"""

from __future__ import annotations

import heapq
import math
from array import array
from collections import deque

from ..cluster import ClusterSpec, FreeGPUs
from ..jobs import Trace
from ..policies.pending_queue import PendingQueue, select_starts
from ..policies.ces import CES
from ..policies.queue import QueuePolicy
from ..policies.tuning_aware import TuningAware
from .run_log import RunLog
from .power_states import PowerLayer

INF = math.inf


class _Tuning:
    """Book-keeping of tuning groups for the tuning-aware policy."""

    def __init__(self, trace: Trace, policy: TuningAware, free: FreeGPUs):
        self.policy, self.free = policy, free
        self.ckpt = policy.checkpoint_interval
        self.arrivals = sorted(trace.tuning, key=lambda t: (t.submit, t.job_id))
        self.ai = 0
        self.remaining: dict[tuple[int, int], float] = {}
        self.pending: deque = deque()
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
            self.pending.appendleft(gid)

    def step(self, now: float, touched_nodes, started, ended) -> None:
        while self.heap and self.heap[0][0] <= now:
            t, gid, ver = heapq.heappop(self.heap)
            if ver == self.version.get(gid) and gid in self.running:
                self._stop(gid, now, finished=True)
        while self.ai < len(self.arrivals) and self.arrivals[self.ai].submit <= now:
            tj = self.arrivals[self.ai]
            self.ai += 1
            for g in range(tj.groups):
                self.remaining[(tj.job_id, g)] = tj.group_work
                self.pending.append((tj.job_id, g))
        for node in touched_nodes:  # ordinary jobs took GPUs: evict groups at once
            groups = self.on_node.get(node, [])
            for _ in range(self.policy.evictions(len(groups), self.free.free[node])):
                self._stop(groups[-1], now, finished=False)
        for jid in ended:
            for gid in list(self.in_bubbles.get(jid, [])):
                self._stop(gid, now, finished=False)
            self.in_bubbles.pop(jid, None)
            self.bubble_jobs.pop(jid, None)
        for jid, gpus, frac in started:
            if frac > 0:
                self.bubble_jobs[jid] = (gpus, frac)
                self.in_bubbles[jid] = []
        if not self.pending:
            return
        idle = {n: f - len(self.on_node.get(n, [])) for n, f in enumerate(self.free.free)
                if f > len(self.on_node.get(n, []))}
        slots = {j: g - len(self.in_bubbles[j]) for j, (g, _) in self.bubble_jobs.items()
                 if g > len(self.in_bubbles[j])}
        places, _ = self.policy.fill(idle, slots, len(self.pending))
        for where in places:
            gid = self.pending.popleft()
            rate = 1.0 if where[0] == "gpu" else self.bubble_jobs[where[1]][1]
            self.running[gid] = (where, rate, now)
            (self.on_node.setdefault(where[1], []) if where[0] == "gpu"
             else self.in_bubbles[where[1]]).append(gid)
            ver = self.version[gid] = self.version.get(gid, 0) + 1
            heapq.heappush(self.heap, (now + self.remaining[gid] / rate, gid, ver))

    def summary(self, trace: Trace) -> dict:
        jcts = [self.job_finish[j] - self.submit[j] for j in self.job_finish]
        return {
            "tuning_jobs": len(trace.tuning),
            "tuning_jobs_completed": len(self.job_finish),
            "tuning_groups_completed": self.groups_done,
            "tuning_gpu_hours_idle_gpus": self.work_gpu / 3600,
            "tuning_gpu_hours_bubbles": self.work_bubble / 3600,
            "tuning_gpu_hours_free": (self.work_gpu + self.work_bubble) / 3600,
            "tuning_gpu_hours_lost_to_eviction": self.wasted / 3600,
            "tuning_avg_jct": sum(jcts) / len(jcts) if jcts else None,
        }


def run_rigid(trace: Trace, spec: ClusterSpec, policy: QueuePolicy,
              restart_cost: float = 30.0) -> RunLog:
    jobs = trace.jobs
    n = len(jobs)
    empty = FreeGPUs(spec)
    unplaceable = {g for g in {j.gpus for j in jobs} if empty.place(g) is None}
    for j in jobs:
        if j.gpus in unplaceable:
            raise ValueError(f"job {j.name or j.job_id} asks for {j.gpus} GPUs; a cluster of "
                             f"{spec.num_gpus} GPUs ({spec.gpus_per_node} per node) can never place it")
    policy.reset(trace.t0)
    free = FreeGPUs(spec)
    queue = PendingQueue()
    remaining = [j.duration for j in jobs]
    first_start = [math.nan] * n
    finish = [math.nan] * n
    restarts = [0] * n
    version = [0] * n
    running: dict[int, tuple] = {}            # jid -> (placement, end, seg_start)
    fin_heap: list = []                       # (end, jid, version)
    run_by_demand: dict[int, list] = {}       # gpus -> heap of (-end, jid, version)
    util_t, util_b = array("d"), array("d")
    busy = 0
    tuning = _Tuning(trace, policy, free) if isinstance(policy, TuningAware) else None
    power = PowerLayer(policy, free) if isinstance(policy, CES) else None
    ai = 0
    ended: list[int] = []

    ranked = policy.ranks_running
    worst: list = []                          # ranked policies: (-priority, jid, rank version)
    changes: list = []                        # ranked policies: (time, jid, rank version)
    rver = [0] * n

    def left(jid, now):
        """Work left of a running job at ``now`` (none is done during a restart)."""
        return min(remaining[jid], running[jid][1] - now)

    def rank(jid, now):
        rver[jid] += 1
        job, rem = jobs[jid], left(jid, now)
        heapq.heappush(worst, (-policy.running_priority(job, rem, now), jid, rver[jid]))
        t = policy.next_change(job, rem, now)
        if t < INF:
            # service grows only once the restart is over
            t += max(0.0, running[jid][1] - remaining[jid] - now)
            heapq.heappush(changes, (t, jid, rver[jid]))

    def start(jid, placement, now):
        nonlocal busy
        cost = restart_cost if not math.isnan(first_start[jid]) else 0.0
        if math.isnan(first_start[jid]):
            first_start[jid] = now
        end = now + cost + remaining[jid]
        version[jid] += 1
        running[jid] = (placement, end, now)
        heapq.heappush(fin_heap, (end, jid, version[jid]))
        heapq.heappush(run_by_demand.setdefault(jobs[jid].gpus, []), (-end, jid, version[jid]))
        busy += jobs[jid].gpus
        policy.on_start(jobs[jid], now)
        if ranked:
            rank(jid, now)

    def clean_worst():
        while worst and (worst[0][1] not in running or worst[0][2] != rver[worst[0][1]]):
            heapq.heappop(worst)

    def preempt_ranked(now):
        """Preempt running jobs outranked by queued ones, best queued job first."""
        for prio, _seq, hid, g in queue.heads():
            clean_worst()
            if not worst or -worst[0][0] <= prio:
                break  # no running job ranks below this one, nor below any later head
            trial, popped, cands, p = free.copy(), [], [], None
            while worst and -worst[0][0] > prio:
                e = heapq.heappop(worst)
                if e[1] not in running or e[2] != rver[e[1]]:
                    continue
                popped.append(e)
                cands.append(e[1])
                trial.give(running[e[1]][0])
                p = trial.place(g)
                if p is not None:
                    break
            for e in popped:
                heapq.heappush(worst, e)
            if p is None:
                continue
            chosen = policy.victims((jobs[hid], remaining[hid]),
                                    [(jobs[c], left(c, now)) for c in cands], now)
            if sorted(chosen) != sorted(cands):
                raise RuntimeError(f"{policy.name}: victims {chosen} differ from the ranking {cands}")
            for v in chosen:
                preempt(v, now)
            free.take(p)
            yield queue.pop(g), p  # the head, or a victim of its size that outranks it

    def preempt(jid, now):
        nonlocal busy
        placement, end, seg = running.pop(jid)
        remaining[jid] = min(remaining[jid], end - now)
        version[jid] += 1
        restarts[jid] += 1
        free.give(placement)
        busy -= jobs[jid].gpus
        ended.append(jid)  # for the tuning layer: its bubbles are gone
        queue.push(jid, jobs[jid].gpus, policy.priority(jobs[jid], remaining[jid], now))

    def candidates(now, limit=32):
        """Running jobs with the largest remaining GPU time ((end - now) x GPUs), merged
        over the per-demand heaps (within one demand, later end = more remaining)."""
        out, popped = [], []
        heads = []
        for g, h in run_by_demand.items():
            while h and (h[0][1] not in running or h[0][2] != version[h[0][1]]):
                heapq.heappop(h)
            if h:
                heads.append(((h[0][0] + now) * g, g))
        heapq.heapify(heads)
        while heads and len(out) < limit:
            _, g = heapq.heappop(heads)
            e = heapq.heappop(run_by_demand[g])
            popped.append((g, e))
            out.append(e[1])
            h = run_by_demand[g]
            while h and (h[0][1] not in running or h[0][2] != version[h[0][1]]):
                heapq.heappop(h)
            if h:
                heapq.heappush(heads, ((h[0][0] + now) * g, g))
        for g, e in popped:
            heapq.heappush(run_by_demand[g], e)
        return out

    while ai < n or fin_heap or (tuning and tuning.next_time() < INF) or (power and len(queue)):
        while fin_heap and fin_heap[0][2] != version[fin_heap[0][1]]:
            heapq.heappop(fin_heap)
        while changes and (changes[0][1] not in running or changes[0][2] != rver[changes[0][1]]):
            heapq.heappop(changes)
        wake = policy.wake_at() if ranked else INF
        now = min(jobs[ai].submit if ai < n else INF, fin_heap[0][0] if fin_heap else INF,
                  tuning.next_time() if tuning else INF, changes[0][0] if changes else INF,
                  wake if len(queue) else INF, power.next_time() if power else INF)
        if now == INF:
            break
        if power:
            power.finish_boots(now)
        reprioritise = False
        ended, started_info, touched = [], [], set()
        while fin_heap and fin_heap[0][0] <= now:
            end, jid, ver = heapq.heappop(fin_heap)
            if ver != version[jid]:
                continue
            placement, _, _ = running.pop(jid)
            finish[jid] = end
            version[jid] += 1
            free.give(placement)
            busy -= jobs[jid].gpus
            ended.append(jid)
            reprioritise |= policy.observe(jobs[jid], now)
        arrived = []
        while ai < n and jobs[ai].submit <= now:
            j = jobs[ai]
            queue.push(j.job_id, j.gpus, policy.priority(j, j.duration, now))
            arrived.append(j.job_id)
            ai += 1
        while changes and changes[0][0] <= now:
            _, jid, rv = heapq.heappop(changes)
            if jid in running and rv == rver[jid]:
                rank(jid, now)
        reprioritise |= wake <= now
        if reprioritise and len(queue):
            ids = queue.job_ids()
            prios = policy.priorities([(jobs[i], remaining[i]) for i in ids], now)
            queue.reprioritise(dict(zip(ids, prios)))
        starts = select_starts(queue, free, policy.backfill)
        if ranked:
            for jid, p in preempt_ranked(now):
                start(jid, p, now)
                started_info.append((jid, jobs[jid].gpus, jobs[jid].bubble_fraction))
                touched.update(node for node, _ in p)
            starts += select_starts(queue, free, policy.backfill)
        elif policy.preemptive:
            for jid in arrived:
                if jid not in queue:
                    continue
                job = jobs[jid]
                cands = [(jobs[c], running[c][1] - now) for c in candidates(now)]
                victims = policy.victims((job, remaining[jid]), cands, now)
                trial, chosen = free.copy(), []
                for v in victims:
                    trial.give(running[v][0])
                    chosen.append(v)
                    if trial.place(job.gpus) is not None:
                        break
                else:
                    chosen = []
                for v in chosen:
                    preempt(v, now)
                if chosen:
                    starts += select_starts(queue, free, policy.backfill)
        for jid, p in starts:
            start(jid, p, now)
            started_info.append((jid, jobs[jid].gpus, jobs[jid].bubble_fraction))
            touched.update(node for node, _ in p)
        if tuning:
            tuning.step(now, touched, started_info, ended)
        if power:
            power.step(now, queue, busy)
        util_t.append(now)
        util_b.append(busy)

    extra = {"preemptions": sum(restarts)}
    if tuning:
        extra.update(tuning.summary(trace))
    if power:
        extra.update(power.summary())
    return RunLog(first_start=first_start, finish=finish, restarts=restarts,
                  util_t=util_t, util_busy=util_b, extra=extra,
                  power_t=power.t if power else (), power_on=power.on if power else (),
                  power_model=policy.power if power else None)
