"""Event-driven replay of elastic jobs under ``ElasticPolicy``.

Events: arrivals, departures (re-solve the allocation) and epoch boundaries
(goodput changes with the epoch's gradient statistics; the elastic policy also
re-picks its batch size then, which needs no restart). A job whose GPU count or
placement changes pays ``restart_cost`` seconds of checkpoint-restart.
"""

from __future__ import annotations

import math
from array import array

from ..cluster import ClusterSpec
from ..jobs import Trace
from ..policies.elastic import ElasticJobState, ElasticPolicy
from ..app_profiles import AppProfile
from .run_log import RunLog

INF = math.inf


def run_elastic(trace: Trace, spec: ClusterSpec, policy: ElasticPolicy,
                apps: dict[str, AppProfile], restart_cost: float = 30.0) -> RunLog:
    jobs = trace.jobs
    n = len(jobs)
    for j in jobs:
        if j.elastic is None or j.elastic.application not in apps:
            raise ValueError(f"{trace.job_label(j)}: elastic policies need elastic jobs with a profile "
                             "(use --format pollux)")
    gpn = spec.gpus_per_node
    app = [apps[j.elastic.application] for j in jobs]
    progress = [0.0] * n
    epoch = [0] * n
    gpus = [0] * n
    batch = [0] * n
    rate = [0.0] * n
    ready = [0.0] * n          # time the current (re)start finishes
    placement = [()] * n
    first_start = [math.nan] * n
    finish = [math.nan] * n
    restarts = [0] * n
    active: list[int] = []     # arrival order
    util_t, util_b = array("d"), array("d")
    policy.reset(trace.t0)
    last = 0.0
    ai = 0

    def next_boundary(i):
        if gpus[i] == 0 or rate[i] <= 0:
            return INF
        return max(last, ready[i]) + (app[i].epoch_progress[epoch[i] + 1] - progress[i]) / rate[i]

    def rate_for(i):
        if policy.fixed_batch:
            return jobs[i].elastic.batch_size, app[i].goodput(gpus[i], gpn, jobs[i].elastic.batch_size, epoch[i])
        return app[i].best_batch(gpus[i], gpn, epoch[i])

    while ai < n or active:
        t_next = min((next_boundary(i) for i in active), default=INF)
        now = min(jobs[ai].submit if ai < n else INF, t_next)
        if now == INF:
            raise RuntimeError("elastic simulation stalled: active jobs but none can run")
        changed = False
        for i in active:       # advance progress to `now`
            if gpus[i] and now > ready[i]:
                progress[i] += rate[i] * (now - max(last, ready[i]))
        last = now
        for i in list(active):
            while gpus[i] and next_boundary(i) <= now + 1e-6:
                progress[i] = app[i].epoch_progress[epoch[i] + 1]
                epoch[i] += 1
                if epoch[i] >= app[i].max_epochs:
                    finish[i] = now
                    active.remove(i)
                    gpus[i] = 0
                    changed = True
                    break
                batch[i], rate[i] = rate_for(i)
        while ai < n and jobs[ai].submit <= now:
            active.append(ai)
            ai += 1
            changed = True
        if changed and active:
            states = [ElasticJobState(i, app[i], epoch[i], jobs[i].elastic.batch_size,
                                      jobs[i].elastic.max_gpus, gpus[i], placement[i])
                      for i in active]
            decisions = policy.allocate(states, spec)
            for i in active:
                d = decisions.get(i)
                new_p = d.placement if d else ()
                if new_p != placement[i]:
                    if new_p:
                        if math.isnan(first_start[i]):
                            first_start[i] = now
                            ready[i] = now
                        else:
                            ready[i] = now + restart_cost
                            restarts[i] += 1
                    gpus[i] = d.gpus if d else 0
                    placement[i] = new_p
                if d:
                    batch[i], rate[i] = d.batch_size, d.goodput
                else:
                    rate[i] = 0.0
        util_t.append(now)
        util_b.append(sum(gpus[i] for i in active))
    return RunLog(first_start=first_start, finish=finish, restarts=restarts,
                  util_t=util_t, util_busy=util_b,
                  extra={"resizes": sum(restarts)})
