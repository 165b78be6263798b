"""Run one policy on one trace: ``simulate(trace, policy, cluster)``.

>>> from scheduler_bridge import ClusterSpec, Job, make_trace, make_policy, simulate
>>> trace = make_trace([Job(0, 0.0, 1, 10.0), Job(1, 0.0, 1, 5.0)])
>>> simulate(trace, make_policy("sjf"), ClusterSpec(1, 1)).summary()["avg_jct"]
10.0
"""

from __future__ import annotations

import time

from .cluster import ClusterSpec
from .jobs import Trace
from .metrics import SimResult
from .policy_ces import CES
from .policy_elastic import ElasticPolicy
from .policy_lucid import Lucid
from .policy_qssf import QSSF
from .policy_queue import FIFO, SJF, SRTF, QueuePolicy
from .policy_tiresias import Tiresias
from .policy_tuning import TuningAware
from .power_model import PowerModel
from .sim_elastic import run_elastic
from .sim_lucid import run_lucid
from .sim_rigid import run_rigid

POLICIES = ("fifo", "sjf", "srtf", "qssf", "tiresias", "lucid", "elastic", "elastic-fixed-batch",
            "tuning-aware", "ces:<base>")
QUEUE_BASES = ("fifo", "sjf", "srtf", "qssf", "tiresias")


def make_policy(name: str, *, backfill: bool | None = None, seed: int = 0,
                base: str = "fifo", checkpoint_interval: float = 60.0,
                power: PowerModel | None = None, interference=None):
    """A fresh policy by name. ``backfill`` (queue policies; None means on): a job
    may start when better-ranked ones do not fit the free GPUs.
    ``base``: the ordinary-job policy under ``tuning-aware``. ``ces:<name>``:
    CES energy saving over the queue policy ``<name>``, nodes priced by ``power``.
    ``interference``: the ``InterferenceTable`` of ``lucid`` (default: the shipped one)."""
    backfill = True if backfill is None else backfill
    if name.startswith("ces:"):
        inner = name[4:]
        if inner not in QUEUE_BASES:
            raise ValueError(f"ces base policy must be one of {', '.join(QUEUE_BASES)}; got {inner!r}")
        return CES(make_policy(inner, backfill=backfill, seed=seed), power=power)
    if name == "fifo":
        return FIFO(backfill)
    if name == "sjf":
        return SJF(backfill)
    if name == "srtf":
        return SRTF(backfill)
    if name == "qssf":
        return QSSF(backfill, seed=seed)
    if name == "tiresias":
        return Tiresias(backfill)
    if name == "lucid":
        return Lucid(interference, backfill, seed=seed)
    if name == "elastic":
        return ElasticPolicy()
    if name == "elastic-fixed-batch":
        return ElasticPolicy(fixed_batch=True)
    if name == "tuning-aware":
        if base == "tuning-aware" or base not in POLICIES or base.startswith("elastic"):
            raise ValueError(f"tuning-aware base policy must be one of fifo, sjf, srtf, qssf; got {base!r}")
        return TuningAware(make_policy(base, backfill=backfill, seed=seed), checkpoint_interval)
    raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(POLICIES)}")


def check_policy_name(name: str) -> None:
    """Raise ValueError naming the choices unless ``make_policy`` knows ``name``."""
    if name.startswith("ces:") and name[4:] in QUEUE_BASES:
        return
    if name not in POLICIES or name == "ces:<base>":
        raise ValueError(f"unknown policy {name!r}; choose from {', '.join(POLICIES)} "
                         f"(<base>: {', '.join(QUEUE_BASES)})")


def simulate(trace: Trace, policy, cluster: ClusterSpec, *, restart_cost: float = 30.0,
             profiles=None, deadline: float | None = None) -> SimResult:
    """Replay ``trace`` on ``cluster`` under ``policy`` (from ``make_policy``).
    Elastic policies need ``profiles`` (``load_profiles()``; default: the shipped ones)."""
    t = time.perf_counter()
    if isinstance(policy, ElasticPolicy):
        if profiles is None:
            from .app_profiles import load_profiles
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
