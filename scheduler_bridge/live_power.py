"""CES in the live allocator: the capacity to keep, asked of Ray's autoscaler.

The simulator powers nodes down itself; a real cluster's nodes belong to Ray's
autoscaler, which adds nodes for what is requested and removes nodes that stay
idle. So the live allocator turns the ``policy_ces.CES`` decision into a
standing request (``ray.autoscaler.sdk.request_resources``, Ray's public API):
one ``{"GPU": gpus_per_node}`` bundle per node to keep on. The autoscaler then
keeps that many GPU nodes and lets the rest scale down.

``CapacityPlan.update`` is the decision, without Ray: the forecast target
(``CES.target_nodes``), but never fewer nodes than running plus waiting jobs
need now, so a waiting job is booted for at once and waits at most the boot
delay. More capacity is asked for at once; less only after ``CES.interval``
seconds without a change, so a short lull does not power nodes down.

>>> from scheduler_bridge.policy_ces import CES
>>> from scheduler_bridge.policy_queue import FIFO
>>> plan = CapacityPlan(CES(FIFO(), spare_nodes=1))
>>> plan.update(now=0.0, gpus_per_node=4, max_nodes=3, busy_gpus=0, queued_gpus=[])
[{'GPU': 4.0}]
>>> plan.update(now=1.0, gpus_per_node=4, max_nodes=3, busy_gpus=4, queued_gpus=[8])
[{'GPU': 4.0}, {'GPU': 4.0}, {'GPU': 4.0}]
"""

from __future__ import annotations

import math

from .policy_ces import CES


class CapacityPlan:
    """The node count CES keeps on, as autoscaler bundles; ``requested`` is the last one asked."""

    def __init__(self, ces: CES):
        self.ces = ces
        self.requested: list[dict] | None = None
        self._changed_at = -math.inf

    def update(self, now: float, gpus_per_node: int, max_nodes: int, busy_gpus: int,
               queued_gpus: list[int]) -> list[dict] | None:
        """The bundles to request now, or None when the standing request stays as it is."""
        gpn = max(1, gpus_per_node)
        self.ces.record(now, busy_gpus + sum(queued_gpus))
        target = self.ces.target_nodes(now, gpn, max_nodes)
        needed = math.ceil((busy_gpus + sum(queued_gpus)) / gpn)
        nodes = min(max(target, needed), max(max_nodes, needed))
        bundles = [{"GPU": float(gpn)} for _ in range(nodes)]
        if bundles == self.requested:
            return None
        if self.requested is not None and len(bundles) < len(self.requested) \
                and now - self._changed_at < self.ces.interval:
            return None   # scale down only after a quiet interval
        self.requested, self._changed_at = bundles, now
        return bundles
