"""Starting Ray for a sweep: an embedded local Ray sized to the machine, or an existing cluster."""

from __future__ import annotations

import os

import ray

NAMESPACE = "hpo"
#: The object store only carries checkpoints and small results; a small one starts fast.
LOCAL_OBJECT_STORE_BYTES = 256 * 1024**2


def ensure_ray(address: str | None = None, dashboard: bool = False, num_gpus: int | None = None) -> None:
    """Connect to `address` (or `RAY_ADDRESS`), else start a local Ray using every core here.

    A Ray that is already up (a test fixture, a notebook) is used as it is.
    """
    if ray.is_initialized():
        return
    address = address or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, namespace=NAMESPACE, log_to_driver=False)
        return
    ray.init(
        address="local",  # a new Ray even when `ray start` runs a cluster on this machine
        num_cpus=os.cpu_count() or 1,
        num_gpus=num_gpus,
        include_dashboard=dashboard,
        object_store_memory=LOCAL_OBJECT_STORE_BYTES,
        namespace=NAMESPACE,
        log_to_driver=False,
    )
