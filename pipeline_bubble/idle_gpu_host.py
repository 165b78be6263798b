"""A bubble-pool host that is a whole idle GPU: the allocator's tuning guests outside any bubble.

The tuning-aware allocator places a sweep's fused groups on GPUs its queue leaves idle, before
the bubbles of pipeline jobs (Hydro). For each such placement it starts one `IdleGpuHost` actor
that holds that GPU, takes a group of the sweep from the pool and trains it flat out; each
iteration still waits until the member trials have its results, as in bubbles. When an ordinary
job needs the GPU, the allocator unregisters the host (the pool puts its group back in line, to
resume from its last published iteration) and kills it.
"""

from __future__ import annotations

import time
from typing import Any

import ray
import torch

from pipeline_bubble.bubble_pool import bubble_pool
from pipeline_bubble.sweep_guest import SweepGroupGuest


def idle_gpu_host_id(tuning_job: int, group: int | str) -> str:
    """The pool host id (and owner) of a tuning job's group placed on an idle GPU."""
    return f"gpu:{tuning_job}:{group}"


@ray.remote(num_cpus=0, max_concurrency=2)
class IdleGpuHost:
    def __init__(self, host_id: str, poll_interval_s: float = 0.2):
        self.pool = bubble_pool()
        self.host_id = host_id
        ray.get(self.pool.register.remote(host_id, host_id))
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.poll_interval_s = poll_interval_s

    def run(self) -> None:
        """Train the groups the pool hands this host, one after another, until it is killed."""
        while True:
            group = ray.get(self.pool.take.remote(self.host_id))
            if group is None:
                time.sleep(self.poll_interval_s)
                continue
            guest = SweepGroupGuest(group, ray.get(group.assignment.remote()), self.device, self._closed)
            try:
                while not guest.finished:
                    if guest.ready():
                        guest.step()
                    else:
                        time.sleep(0.005)  # the member trials have not taken the last iteration yet
            except Exception as error:  # the group's trials fail and Tune retries them; the host goes on
                guest.close(f"{type(error).__name__}: {error}")
            else:
                guest.close(None)

    def node_id(self) -> str:
        """Where the host holds its GPU (the allocator pins it to the node the policy chose)."""
        return ray.get_runtime_context().get_node_id()

    def _closed(self, group: Any, unfinished: bool) -> None:
        if unfinished:
            self.pool.give_back.remote(self.host_id, group)
        else:
            self.pool.done.remote(self.host_id)
