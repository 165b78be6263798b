"""Run one policy on one trace: ``simulate(trace, policy, cluster)``.

Every policy names its replay (``policy.replay``, ``policies._base``); ``REPLAYS`` runs it.

>>> from scheduler_bridge import ClusterSpec, Job, make_trace, make_policy, simulate
>>> trace = make_trace([Job(0, 0.0, 1, 10.0), Job(1, 0.0, 1, 5.0)])
>>> simulate(trace, make_policy("sjf"), ClusterSpec(1, 1)).summary()["avg_jct"]
10.0
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ..app_profiles import AppProfile, load_profiles
from ..cluster import ClusterSpec
from ..jobs import Trace
from ..policies._base import Replay
from .elastic_replay import run_elastic
from .lucid_replay import LucidReplay
from .metrics import SimResult
from .rigid_replay import RigidReplay
from .run_log import RunLog


def _rigid(trace: Trace, cluster: ClusterSpec, policy, restart_cost: float, profiles) -> RunLog:
    return RigidReplay(trace, cluster, policy, restart_cost).run()


def _lucid(trace: Trace, cluster: ClusterSpec, policy, restart_cost: float, profiles) -> RunLog:
    return LucidReplay(trace, cluster, policy).run()   # never preempts; its jobs are rigid


def _elastic(trace: Trace, cluster: ClusterSpec, policy, restart_cost: float,
             profiles: dict[str, AppProfile] | None) -> RunLog:
    return run_elastic(trace, cluster, policy, load_profiles() if profiles is None else profiles, restart_cost)


#: The replay each ``policy.replay`` names: (trace, cluster, policy, restart_cost, profiles) -> log.
REPLAYS: dict[Replay, Callable[..., RunLog]] = {"rigid": _rigid, "lucid": _lucid, "elastic": _elastic}


def simulate(trace: Trace, policy, cluster: ClusterSpec, *, restart_cost: float = 30.0,
             profiles: dict[str, AppProfile] | None = None, deadline: float | None = None) -> SimResult:
    """Replay ``trace`` on ``cluster`` under ``policy`` (from ``make_policy``).
    Elastic policies need ``profiles`` (``load_profiles()``; default: the shipped ones)."""
    replay = REPLAYS.get(getattr(policy, "replay", None))
    if replay is None:
        raise TypeError(f"not a scheduling policy: {policy!r}")
    t = time.perf_counter()
    log = replay(trace, cluster, policy, restart_cost, profiles)
    params = {"backfill": getattr(policy, "backfill", None),
              "gpus_per_node": cluster.gpus_per_node, "restart_cost": restart_cost}
    return SimResult(policy=policy.name, trace=trace, num_gpus=cluster.num_gpus, log=log,
                     wall_s=time.perf_counter() - t, deadline=deadline, params=params)
