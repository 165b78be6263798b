"""Named actors of sweeps and of the cluster live in one Ray namespace: no sweep name may take
the allocator's or the bubble pool's name (a sweep called `allocator` once did)."""

from __future__ import annotations

import pytest

from hpo.base.actor_names import ALLOCATOR_NAME, POOL_NAME, broker_name, controller_name


@pytest.mark.parametrize("sweep", ["allocator", "bubbles", "allocator:fusion", "sweep"])
def test_no_sweep_name_takes_a_cluster_actors_name(sweep):
    assert {controller_name(sweep), broker_name(sweep)}.isdisjoint({ALLOCATOR_NAME, POOL_NAME})
