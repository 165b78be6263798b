"""How many configurations a fused group holds (B), and how many groups the cluster trains at
once: what both fused placements, on the sweep's devices and in pipeline bubbles, decide first."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import ray

from hpo.base.workload import Workload
from hpo.config.spec import FusionConfig

logger = logging.getLogger(__name__)

#: `max_members: auto` never fuses more than this, however much memory is free.
AUTO_MAX_MEMBERS = 128


def largest_config(workload: Workload, param_space: Mapping[str, Any]) -> dict[str, Any]:
    """A config as large as any the space can produce: constants, and the largest value of each
    numeric categorical (widths); sampled hyperparameters don't change memory and keep defaults."""
    config: dict[str, Any] = {}
    for key, value in param_space.items():
        if isinstance(value, dict) and "grid_search" in value:
            value = value["grid_search"]
        elif hasattr(value, "categories"):
            value = list(value.categories)
        elif hasattr(value, "sampler"):
            continue
        if isinstance(value, list):
            numeric = [v for v in value if isinstance(v, (int, float)) and not isinstance(v, bool)]
            value = max(numeric) if len(numeric) == len(value) else value[0]
        config[key] = value
    return workload.resolve(config)


def group_size(
    workload: Workload, fusion: FusionConfig, group_resources: Mapping[str, float], param_space: Mapping[str, Any]
) -> int:
    """B: the configured number, or one measured where the groups will run (`max_members: auto`)."""
    if fusion.max_members != "auto":
        return int(fusion.max_members)
    from fusion.sizing import choose_num_members

    device = "cuda" if group_resources.get("gpu", 0) > 0 else "cpu"
    measure = ray.remote(choose_num_members).options(
        num_cpus=group_resources.get("cpu", 1), num_gpus=group_resources.get("gpu", 0)
    )
    decision = ray.get(
        measure.remote(workload, largest_config(workload, param_space), device=device, max_members=AUTO_MAX_MEMBERS)
    )
    logger.info("%s", decision)
    print(decision, flush=True)
    return decision.num_members


def group_slots(group_resources: Mapping[str, float]) -> int:
    """How many fused groups the cluster can train at once."""
    total = ray.cluster_resources()
    gpus = group_resources.get("gpu", 0)
    if gpus > 0:
        return max(1, int(total.get("GPU", 0) // gpus))
    return max(1, int(total.get("CPU", 1) // max(group_resources.get("cpu", 1), 1e-3)))
