"""Run one policy on one trace: ``simulate(trace, policy, cluster)``.

>>> from scheduler_bridge import ClusterSpec, Job, make_trace, make_policy, simulate
>>> trace = make_trace([Job(0, 0.0, 1, 10.0), Job(1, 0.0, 1, 5.0)])
>>> simulate(trace, make_policy("sjf"), ClusterSpec(1, 1)).summary()["avg_jct"]
10.0
"""

from __future__ import annotations

import time

from ..cluster import ClusterSpec
from ..jobs import Trace
from .metrics import SimResult
from ..policies.elastic import ElasticPolicy
from ..policies.lucid import Lucid
from ..policies.queue import QueuePolicy
from .elastic_replay import run_elastic
from .lucid_replay import run_lucid
from .rigid_replay import run_rigid


def simulate(trace: Trace, policy, cluster: ClusterSpec, *, restart_cost: float = 30.0,
             profiles=None, deadline: float | None = None) -> SimResult:
    """Replay ``trace`` on ``cluster`` under ``policy`` (from ``make_policy``).
    Elastic policies need ``profiles`` (``load_profiles()``; default: the shipped ones)."""
    t = time.perf_counter()
    if isinstance(policy, ElasticPolicy):
        if profiles is None:
            from ..app_profiles import load_profiles
            profiles = load_profiles()
        log = run_elastic(trace, cluster, policy, profiles, restart_cost)
    elif isinstance(policy, Lucid):
        log = run_lucid(trace, cluster, policy)
    elif isinstance(policy, QueuePolicy):
        log = run_rigid(trace, cluster, policy, restart_cost)
    else:
        raise TypeError(f"not a scheduling policy: {policy!r}")
    params = {"backfill": getattr(policy, "backfill", None),
              "gpus_per_node": cluster.gpus_per_node, "restart_cost": restart_cost}
    return SimResult(policy=policy.name, trace=trace, num_gpus=cluster.num_gpus, log=log,
                     wall_s=time.perf_counter() - t, deadline=deadline, params=params)
