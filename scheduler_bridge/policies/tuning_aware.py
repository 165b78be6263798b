"""Tuning-aware policy (Hydro): ordinary jobs are scheduled by a base queue
policy exactly as if no tuning work existed; tuning jobs' fused groups take
only GPUs that policy leaves idle, and the bubbles of running pipeline jobs.

A group on an idle GPU runs at full speed; a group in a pipeline job's bubbles
runs at that job's ``bubble_fraction`` of full speed. When an ordinary job needs
a GPU, the group on it is evicted at once and keeps the progress of its last
checkpoint (every ``checkpoint_interval`` seconds), so ordinary jobs are never
delayed. The work groups finish this way is the tuning work done for free.

>>> from scheduler_bridge.policies.queue import FIFO
>>> TuningAware(FIFO()).name
'tuning-aware'
"""

from __future__ import annotations

from ._base import LayeredPolicy, QueuePolicy


class TuningAware(LayeredPolicy):
    """The ``"tuning"`` layer's hooks (``_base.TuningHooks``) over a base queue policy."""

    name = "tuning-aware"
    layers = ("tuning",)

    def __init__(self, base: QueuePolicy, checkpoint_interval: float = 60.0):
        super().__init__(base)
        self.checkpoint_interval = checkpoint_interval

    @staticmethod
    def evictions(groups_on_node: int, free_on_node: int) -> int:
        """How many groups must leave a node that now has ``free_on_node`` idle GPUs."""
        return max(0, groups_on_node - free_on_node)

    @staticmethod
    def fill(idle_by_node: dict[int, int], bubble_slots: dict[int, int], pending: int
             ) -> tuple[list[tuple[str, int]], int]:
        """Where to put up to ``pending`` groups: idle GPUs first (lowest node first),
        then pipeline jobs' bubble slots (by job id). Returns ([("gpu", node) |
        ("bubble", job_id), ...], how many stay pending)."""
        out = []
        for node in sorted(idle_by_node):
            k = min(idle_by_node[node], pending - len(out))
            out.extend([("gpu", node)] * k)
        for jid in sorted(bubble_slots):
            k = min(bubble_slots[jid], pending - len(out))
            out.extend([("bubble", jid)] * k)
        return out, pending - len(out)

    def __repr__(self):
        return f"TuningAware({self.base!r})"
