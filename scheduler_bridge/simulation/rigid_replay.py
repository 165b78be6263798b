"""Event-driven replay of rigid jobs under a queue policy (FIFO, SJF, SRTF, QSSF, Tiresias, and
the layered ones: tuning-aware, CES).

Events are arrivals, completions, a running job's change of rank and a queue's wake-up (ranking
policies: Tiresias), and the events of the policy's layers (``layer.ReplayLayer``: a node that
finishes booting, a fused group that finishes its work); there are no fixed ticks. All decisions
at one instant are taken after every completion and arrival of that instant. Preempted jobs keep
their progress and pay ``restart_cost`` seconds of checkpoint-restart when they start again.
"""

from __future__ import annotations

import heapq
import math
from array import array
from collections.abc import Callable, Iterator

from ..cluster import ClusterSpec, FreeGPUs, Placement
from ..jobs import Trace
from ..policies._base import Layer, QueuePolicy
from ..policies.pending_queue import PendingQueue, select_starts
from .layer import Instant, ReplayLayer
from .power_states import PowerLayer
from .run_log import RunLog
from .tuning_guests import TuningLayer

INF = math.inf
#: The layer each name in ``policy.layers`` stands for.
LAYERS: dict[Layer, Callable[[Trace, QueuePolicy, FreeGPUs], ReplayLayer]] = {
    "power": PowerLayer, "tuning": TuningLayer}
#: Running jobs the preemption of a newcomer looks at (``victims``' candidates), largest first.
CANDIDATES = 32


class RigidReplay:
    """One replay of ``trace`` on ``spec`` under ``policy``: ``run()`` returns its ``RunLog``."""

    def __init__(self, trace: Trace, spec: ClusterSpec, policy: QueuePolicy, restart_cost: float = 30.0):
        self.jobs = jobs = trace.jobs
        n = len(jobs)
        empty = FreeGPUs(spec)
        unplaceable = {g for g in {j.gpus for j in jobs} if empty.place(g) is None}
        for j in jobs:
            if j.gpus in unplaceable:
                raise ValueError(f"{trace.job_label(j)} asks for {j.gpus} GPUs; a cluster of "
                                 f"{spec.num_gpus} GPUs ({spec.gpus_per_node} per node) can never place it")
        policy.reset(trace.t0)
        self.policy, self.restart_cost = policy, restart_cost
        self.free = FreeGPUs(spec)
        self.queue = PendingQueue()
        self.remaining = [j.duration for j in jobs]
        self.first_start = [math.nan] * n
        self.finish = [math.nan] * n
        self.restarts = [0] * n
        self.version = [0] * n
        self.running: dict[int, tuple] = {}            # jid -> (placement, end, seg_start)
        self.fin_heap: list = []                       # (end, jid, version)
        self.run_by_demand: dict[int, list] = {}       # gpus -> heap of (-end, jid, version)
        self.util_t, self.util_b = array("d"), array("d")
        self.busy = 0
        self.layers = [LAYERS[name](trace, policy, self.free) for name in policy.layers]
        self.ai = 0                                    # next arrival
        self.instant = Instant(0.0, self.queue)        # the instant being decided (each `_instant` renews it)
        self.ranked = policy.ranks_running
        self.worst: list = []                          # ranked policies: (-priority, jid, rank version)
        self.changes: list = []                        # ranked policies: (time, jid, rank version)
        self.rver = [0] * n

    def run(self) -> RunLog:
        while self.ai < len(self.jobs) or self.fin_heap or any(layer.pending(self.queue) for layer in self.layers):
            now, wake = self._next_time()
            if now == INF:
                break
            self._instant(now, wake)
        log = RunLog(first_start=self.first_start, finish=self.finish, restarts=self.restarts,
                     util_t=self.util_t, util_busy=self.util_b, extra={"preemptions": sum(self.restarts)})
        for layer in self.layers:
            layer.report(log)
        return log

    def _next_time(self) -> tuple[float, float]:
        """(the next instant, when the ranking policy next wakes the queue)."""
        fin_heap, changes = self.fin_heap, self.changes
        while fin_heap and fin_heap[0][2] != self.version[fin_heap[0][1]]:
            heapq.heappop(fin_heap)
        while changes and (changes[0][1] not in self.running or changes[0][2] != self.rver[changes[0][1]]):
            heapq.heappop(changes)
        wake = self.policy.wake_at() if self.ranked else INF
        now = min(self.jobs[self.ai].submit if self.ai < len(self.jobs) else INF,
                  fin_heap[0][0] if fin_heap else INF, changes[0][0] if changes else INF,
                  wake if len(self.queue) else INF, *(layer.next_time() for layer in self.layers))
        return now, wake

    def _instant(self, now: float, wake: float) -> None:
        for layer in self.layers:
            layer.begin(now)
        self.instant = Instant(now, self.queue)
        reprioritise = self._complete(now)
        arrived = self._arrive(now)
        self._rerank_running(now)
        if (reprioritise or wake <= now) and len(self.queue):
            ids = self.queue.job_ids()
            prios = self.policy.priorities([(self.jobs[i], self.remaining[i]) for i in ids], now)
            self.queue.reprioritise(dict(zip(ids, prios)))
        self._decide(now, arrived)
        self.instant.busy = self.busy
        for layer in self.layers:
            layer.end(self.instant)
        self.util_t.append(now)
        self.util_b.append(self.busy)

    # ---- the jobs' events ----------------------------------------------------------------
    def _complete(self, now: float) -> bool:
        """Jobs whose work is done finish; True if the policy asks to re-rank the queue."""
        reprioritise = False
        while self.fin_heap and self.fin_heap[0][0] <= now:
            end, jid, ver = heapq.heappop(self.fin_heap)
            if ver != self.version[jid]:
                continue
            placement, _, _ = self.running.pop(jid)
            self.finish[jid] = end
            self.version[jid] += 1
            self.free.give(placement)
            self.busy -= self.jobs[jid].gpus
            self.instant.ended.append(jid)
            reprioritise |= self.policy.observe(self.jobs[jid], now)
        return reprioritise

    def _arrive(self, now: float) -> list[int]:
        """Jobs submitted by ``now`` enter the queue."""
        arrived = []
        while self.ai < len(self.jobs) and self.jobs[self.ai].submit <= now:
            j = self.jobs[self.ai]
            self.queue.push(j.job_id, j.gpus, self.policy.priority(j, j.duration, now))
            arrived.append(j.job_id)
            self.ai += 1
        return arrived

    def _rerank_running(self, now: float) -> None:
        """Running jobs whose rank changes now (Tiresias' demotions) are ranked again."""
        while self.changes and self.changes[0][0] <= now:
            _, jid, rv = heapq.heappop(self.changes)
            if jid in self.running and rv == self.rver[jid]:
                self._rank(jid, now)

    def _decide(self, now: float, arrived: list[int]) -> None:
        """Start what fits, preempting where the policy says so. A ranking policy decides until
        nothing changes: a job backfilled now is a running job a queued one may outrank, so one
        pass would leave a decision that a later instant, with nothing else changed, takes
        (and the tuning layer's instants must change nothing for the ordinary jobs)."""
        starts = select_starts(self.queue, self.free, self.policy.backfill)
        if self.ranked:
            changed = True
            while changed:
                for jid, p in starts:
                    self._start(jid, p, now)
                changed = bool(starts)
                for jid, p in self._preempt_outranked(now):
                    self._start(jid, p, now)
                    changed = True
                starts = select_starts(self.queue, self.free, self.policy.backfill)
                changed = changed or bool(starts)
        elif self.policy.preemptive:
            starts += self._preempt_for(now, arrived)
        for jid, p in starts:
            self._start(jid, p, now)

    def _start(self, jid: int, placement: Placement, now: float) -> None:
        cost = self.restart_cost if not math.isnan(self.first_start[jid]) else 0.0
        if math.isnan(self.first_start[jid]):
            self.first_start[jid] = now
        end = now + cost + self.remaining[jid]
        self.version[jid] += 1
        self.running[jid] = (placement, end, now)
        job = self.jobs[jid]
        heapq.heappush(self.fin_heap, (end, jid, self.version[jid]))
        heapq.heappush(self.run_by_demand.setdefault(job.gpus, []), (-end, jid, self.version[jid]))
        self.busy += job.gpus
        self.policy.on_start(job, now)
        if self.ranked:
            self._rank(jid, now)
        self.instant.started.append((jid, job.gpus, job.bubble_fraction))
        self.instant.touched.update(node for node, _ in placement)

    def _preempt(self, jid: int, now: float) -> None:
        placement, end, _ = self.running.pop(jid)
        self.remaining[jid] = min(self.remaining[jid], end - now)
        self.version[jid] += 1
        self.restarts[jid] += 1
        self.free.give(placement)
        self.busy -= self.jobs[jid].gpus
        self.instant.ended.append(jid)  # for the tuning layer: its bubbles are gone
        self.queue.push(jid, self.jobs[jid].gpus, self.policy.priority(self.jobs[jid], self.remaining[jid], now))

    # ---- preemption by newcomers (SRTF) ---------------------------------------------------
    def _preempt_for(self, now: float, arrived: list[int]) -> list[tuple[int, Placement]]:
        """For each arrival still queued, preempt the victims the policy picks if they make room
        for it, then take what now fits; returns those starts."""
        starts = []
        for jid in arrived:
            if jid not in self.queue:
                continue
            job = self.jobs[jid]
            cands = [(self.jobs[c], self.running[c][1] - now) for c in self._candidates(now)]
            victims = self.policy.victims((job, self.remaining[jid]), cands, now)
            trial, chosen = self.free.copy(), []
            for v in victims:
                trial.give(self.running[v][0])
                chosen.append(v)
                if trial.place(job.gpus) is not None:
                    break
            else:
                chosen = []
            for v in chosen:
                self._preempt(v, now)
            if chosen:
                starts += select_starts(self.queue, self.free, self.policy.backfill)
        return starts

    def _candidates(self, now: float) -> list[int]:
        """Running jobs with the largest remaining GPU time ((end - now) x GPUs), merged
        over the per-demand heaps (within one demand, later end = more remaining)."""
        out, popped = [], []
        heads = []
        for g, h in self.run_by_demand.items():
            self._drop_stale(h)
            if h:
                heads.append(((h[0][0] + now) * g, g))
        heapq.heapify(heads)
        while heads and len(out) < CANDIDATES:
            _, g = heapq.heappop(heads)
            e = heapq.heappop(self.run_by_demand[g])
            popped.append((g, e))
            out.append(e[1])
            h = self.run_by_demand[g]
            self._drop_stale(h)
            if h:
                heapq.heappush(heads, ((h[0][0] + now) * g, g))
        for g, e in popped:
            heapq.heappush(self.run_by_demand[g], e)
        return out

    def _drop_stale(self, heap: list) -> None:
        while heap and (heap[0][1] not in self.running or heap[0][2] != self.version[heap[0][1]]):
            heapq.heappop(heap)

    # ---- ranking policies (Tiresias): running jobs hold a rank too ---------------------------
    def _left(self, jid: int, now: float) -> float:
        """Work left of a running job at ``now`` (none is done during a restart)."""
        return min(self.remaining[jid], self.running[jid][1] - now)

    def _rank(self, jid: int, now: float) -> None:
        self.rver[jid] += 1
        job, rem = self.jobs[jid], self._left(jid, now)
        heapq.heappush(self.worst, (-self.policy.running_priority(job, rem, now), jid, self.rver[jid]))
        t = self.policy.next_change(job, rem, now)
        if t < INF:
            # service grows only once the restart is over
            t += max(0.0, self.running[jid][1] - self.remaining[jid] - now)
            heapq.heappush(self.changes, (t, jid, self.rver[jid]))

    def _preempt_outranked(self, now: float) -> Iterator[tuple[int, Placement]]:
        """Preempt running jobs outranked by queued ones, best queued job first."""
        worst = self.worst
        for prio, _seq, hid, g in self.queue.heads():
            while worst and (worst[0][1] not in self.running or worst[0][2] != self.rver[worst[0][1]]):
                heapq.heappop(worst)
            if not worst or -worst[0][0] <= prio:
                break  # no running job ranks below this one, nor below any later head
            trial, popped, cands, p = self.free.copy(), [], [], None
            while worst and -worst[0][0] > prio:
                e = heapq.heappop(worst)
                if e[1] not in self.running or e[2] != self.rver[e[1]]:
                    continue
                popped.append(e)
                cands.append(e[1])
                trial.give(self.running[e[1]][0])
                p = trial.place(g)
                if p is not None:
                    break
            for e in popped:
                heapq.heappush(worst, e)
            if p is None:
                continue
            chosen = self.policy.victims((self.jobs[hid], self.remaining[hid]),
                                         [(self.jobs[c], self._left(c, now)) for c in cands], now)
            if sorted(chosen) != sorted(cands):
                raise RuntimeError(f"{self.policy.name}: victims {chosen} differ from the ranking {cands}")
            for v in chosen:
                self._preempt(v, now)
            self.free.take(p)
            yield self.queue.pop(g), p  # the head, or a victim of its size that outranks it
