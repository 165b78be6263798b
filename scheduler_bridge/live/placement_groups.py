"""A policy's placement -> a Ray placement group, and the job's actors launched into it.

A placement ``((node, gpus), ...)`` on one node becomes one ``STRICT_PACK`` group
of one bundle; on several nodes, one bundle per node under ``STRICT_SPREAD``.
Every bundle carries a label selector on Ray's built-in ``ray.io/node-id`` label,
so Ray puts it on exactly the node the policy chose (Ray only checks that it
fits; the allocator created the group because its own accounting said so).
Groups and actors are detached and named after the job and attempt
(``hpo-job-<id>-a<attempt>``, ranks ``...-r<i>``), so a restarted allocator
finds them again by name. A job that may be packed (``packing``) holds its
whole GPU in its group, and its rank takes half of it (``share``); a packed
partner's rank takes the other half inside the same bundle, so Ray gives both
the bundle's one GPU. The group lives as long as either job runs in it.

>>> group_shape((("n1", 2),))
([{'GPU': 2.0}], 'STRICT_PACK', [{'ray.io/node-id': 'n1'}])
>>> group_shape((("n1", 4), ("n2", 2)))[1]
'STRICT_SPREAD'
"""

from __future__ import annotations

import ray
from ray.util.placement_group import (get_placement_group, placement_group,
                                      remove_placement_group)
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from hpo.base.actor_names import NAMESPACE
from .job_runner import JobRunner
from .job_state import Where

NODE_LABEL = "ray.io/node-id"   # Ray's default per-node label: the node's hex id


GROUP_PREFIX = "hpo-job-"


def group_name(job_id: int, attempt: int) -> str:
    return f"{GROUP_PREFIX}{job_id}-a{attempt}"


def rank_name(group: str, rank: int) -> str:
    return f"{group}-r{rank}"


def group_shape(where: Where, cpus_per_bundle: float = 0.0):
    """(bundles, strategy, bundle_label_selector) for a placement on real nodes."""
    bundles = []
    for _, k in where:
        b = {"GPU": float(k)}
        if cpus_per_bundle:
            b["CPU"] = float(cpus_per_bundle)
        bundles.append(b)
    nodes = [node for node, _ in where]
    # one GPU per bundle (a job that may be packed) can put several bundles on a node; the
    # label selectors pin every bundle to its node whatever the strategy
    strategy = "STRICT_PACK" if len(set(nodes)) == 1 else "STRICT_SPREAD" if len(set(nodes)) == len(nodes) else "PACK"
    return bundles, strategy, [{NODE_LABEL: node} for node, _ in where]


def create_group(name: str, where: Where, cpus_per_bundle: float = 0.0):
    bundles, strategy, selectors = group_shape(where, cpus_per_bundle)
    return placement_group(bundles, strategy=strategy, name=name, lifetime="detached",
                           bundle_label_selector=selectors)


def find_group(name: str):
    """The live placement group called ``name``, or None."""
    try:
        return get_placement_group(name)
    except ValueError:
        return None


def launch_ranks(pg, name: str, where: Where, entrypoint: str, contexts: list[dict],
                 runtime_env: dict | None = None, share: float = 1.0) -> list:
    """One detached ``JobRunner`` per bundle, rank i in bundle i, holding ``share`` of the
    bundle's GPUs (0.5: a packed pair's half); returns their handles."""
    runner = ray.remote(JobRunner)
    handles = []
    for rank, ((_, k), ctx) in enumerate(zip(where, contexts)):
        opts = dict(name=rank_name(name, rank), namespace=NAMESPACE, lifetime="detached",
                    num_cpus=0, num_gpus=k * share, max_restarts=0, max_concurrency=4,
                    scheduling_strategy=PlacementGroupSchedulingStrategy(
                        pg, placement_group_bundle_index=rank))
        if runtime_env:
            opts["runtime_env"] = runtime_env
        handles.append(runner.options(**opts).remote(entrypoint, ctx))
    return handles


def find_ranks(name: str, n: int) -> list:
    """The live rank actors of group ``name`` (missing ones left out)."""
    out = []
    for rank in range(n):
        try:
            out.append(ray.get_actor(rank_name(name, rank), namespace=NAMESPACE))
        except ValueError:
            pass
    return out


def groups_named_like_ours() -> dict[str, int]:
    """Every placement group on the cluster named as this module names a job's, and not removed:
    name -> its bundle count (the most ranks it can hold)."""
    from ray.util.placement_group import placement_group_table

    return {row["name"]: len(row["bundles"]) for row in placement_group_table().values()
            if row["name"].startswith(GROUP_PREFIX) and row["state"] != "REMOVED"}


def release(name: str, n: int, handles=None, group: str | None = None) -> None:
    """Kill the job's rank actors and remove ``group`` (default: its own; "" keeps every group,
    as for a packed pair's shared one while the other job runs in it); whatever is already gone
    is skipped."""
    for h in handles if handles is not None else find_ranks(name, n):
        try:
            ray.kill(h, no_restart=True)
        except Exception:  # noqa: BLE001  -- already dead
            pass
    if group == "":
        return
    try:
        remove_placement_group(get_placement_group(name if group is None else group))
    except Exception:  # noqa: BLE001  -- never created, or already removed
        pass
