"""Every named actor of the project, and the one Ray namespace they all live in.

A name is how a peer finds an actor again after a restart (a resumed sweep its controller, a job's
rank the allocator that Ray restarted, a stage the bubble pool), so the names are one interface,
kept in one place below every engine. A sweep's actors live under `hpo:sweep:`, apart from the
cluster's, so that no sweep name can take one of theirs.
"""

from __future__ import annotations

#: The Ray namespace of every named actor, and of the drivers that look them up.
NAMESPACE = "hpo"

#: The live allocator (`scheduler_bridge.live`), one per cluster.
ALLOCATOR_NAME = "hpo:allocator"
#: The pool where fused groups wait for pipeline bubbles (`pipeline_bubble.bubble_pool`), one per cluster.
POOL_NAME = "hpo:bubbles"

__all__ = ["ALLOCATOR_NAME", "NAMESPACE", "POOL_NAME", "broker_name", "controller_name", "idle_gpu_host_name"]


def controller_name(sweep: str) -> str:
    """The sweep's controller: its face in the Ray dashboard (`hpo.reporting.dashboard_actor`)."""
    return f"hpo:sweep:{sweep}"


def broker_name(sweep: str) -> str:
    """The broker that gathers a bubble-fused sweep's member trials into groups (`fusion.broker`)."""
    return f"{controller_name(sweep)}:fusion"


def idle_gpu_host_name(host: str) -> str:
    """The actor that trains fused groups on one idle GPU the allocator lent (`pipeline_bubble.idle_gpu_host`)."""
    return f"hpo:{host}"
