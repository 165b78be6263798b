"""CES in the live allocator: the capacity to keep, asked of Ray's autoscaler.

The simulator powers nodes down itself; a real cluster's nodes belong to Ray's
autoscaler, which adds nodes for what is requested and removes nodes that stay
idle. So the live allocator turns the ``policies.ces.CES`` decision into a
standing request (``ray.autoscaler.sdk.request_resources``, Ray's public API):
one ``{"GPU": gpus_per_node}`` bundle per node to keep on. The autoscaler then
keeps that many GPU nodes and lets the rest scale down.

``CapacityPlan.wanted`` is the decision, without Ray: the forecast target
(``CES.target_nodes``), but never fewer nodes than running plus waiting jobs
need now, so a waiting job is booted for at once and waits at most the boot
delay. More capacity is asked for at once; less only after ``CES.interval``
seconds without a change, so a short lull does not power nodes down.

The plan's state is the forecaster's demand history and the last request (what
was asked, and when). Both change only through ``record`` and ``asked``, which
the live driver calls for the journaled ``demand`` and ``capacity`` events, so an
allocator that restarts from its journal forecasts from the same history and
keeps the same quiet interval instead of starting blind.

>>> from scheduler_bridge.policies.ces import CES
>>> from scheduler_bridge.policies.queue import FIFO
>>> plan = CapacityPlan(CES(FIFO(), spare_nodes=1))
>>> plan.wanted(now=0.0, gpus_per_node=4, max_nodes=3, busy_gpus=0, queued_gpus=[])
[{'GPU': 4.0}]
>>> plan.asked(0.0, nodes=1, gpus_per_node=4)
>>> plan.record(1.0, demand=4 + 8)
>>> plan.wanted(now=1.0, gpus_per_node=4, max_nodes=3, busy_gpus=4, queued_gpus=[8])
[{'GPU': 4.0}, {'GPU': 4.0}, {'GPU': 4.0}]
"""

from __future__ import annotations

import math

from ..policies.ces import CES


def bundles(nodes: int, gpus_per_node: int) -> list[dict]:
    """The autoscaler request that keeps ``nodes`` GPU nodes on."""
    return [{"GPU": float(gpus_per_node)} for _ in range(nodes)]


class CapacityPlan:
    """The node count CES keeps on, as autoscaler bundles; ``requested`` is the last one asked."""

    def __init__(self, ces: CES):
        self.ces = ces
        self.requested: list[dict] | None = None
        self._changed_at = -math.inf

    def demand(self, now: float, busy_gpus: int, queued_gpus: list[int]) -> float | None:
        """Demand now (busy GPUs plus what waiting jobs ask for) if it adds to the history, else None."""
        total = float(busy_gpus + sum(queued_gpus))
        return total if self.ces.forecaster.raises(now, total) else None

    def record(self, now: float, demand: float) -> None:
        self.ces.record(now, demand)

    def wanted(self, now: float, gpus_per_node: int, max_nodes: int, busy_gpus: int,
               queued_gpus: list[int]) -> list[dict] | None:
        """The bundles to request now, or None when the standing request stays as it is."""
        gpn = max(1, gpus_per_node)
        target = self.ces.target_nodes(now, gpn, max_nodes)
        needed = math.ceil((busy_gpus + sum(queued_gpus)) / gpn)
        want = bundles(min(max(target, needed), max(max_nodes, needed)), gpn)
        if want == self.requested:
            return None
        if self.requested is not None and len(want) < len(self.requested) \
                and now - self._changed_at < self.ces.interval:
            return None   # scale down only after a quiet interval
        return want

    def asked(self, now: float, nodes: int, gpus_per_node: int) -> None:
        """The autoscaler was asked to keep ``nodes`` nodes of ``gpus_per_node`` GPUs at ``now``."""
        self.requested, self._changed_at = bundles(nodes, gpus_per_node), now
