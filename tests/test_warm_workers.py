"""A local Ray started for a sweep has its workers import what every trial imports (torch, Ray Tune,
torch._dynamo) while they wait for work, so a trial's first step does not wait on 3.5 s of imports;
torch only where the sweep's code imported it in the driver; a `RAY_preload_python_modules` the
user set is left as it is."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from patience import patience

from hpo.base.ray_runtime import PRELOAD_ENV, TORCH_FREE_TRIAL_MODULES, TRIAL_MODULES

pytestmark = pytest.mark.slow

#: Starts hpo's local Ray and asks a worker which of the modules were imported before its task ran.
PROBE = f"""
import json
import sys
if sys.argv[1:] == ["torch"]:
    import torch  # as the sweep's code does in its driver
import ray
from hpo.base.ray_runtime import ensure_ray

ensure_ray()

@ray.remote(num_cpus=0)
def imported_before_task(names):
    import sys
    return [name for name in names if name in sys.modules]

print(json.dumps(ray.get(imported_before_task.remote({list(TRIAL_MODULES) + ['colorsys']!r}))))
ray.shutdown()
"""


def modules_in_worker(env: dict[str, str], *driver_imports: str) -> list[str]:
    out = subprocess.run([sys.executable, "-c", PROBE, *driver_imports], env=env, capture_output=True, text=True, timeout=patience(240), check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_workers_of_a_sweeps_local_ray_have_the_trial_modules_imported_before_their_first_task():
    env = {key: value for key, value in os.environ.items() if key != PRELOAD_ENV}
    assert set(modules_in_worker(env, "torch")) >= set(TRIAL_MODULES)


def test_workers_of_a_sweep_whose_driver_never_imported_torch_import_ray_tune_but_no_torch():
    env = {key: value for key, value in os.environ.items() if key != PRELOAD_ENV}
    found = modules_in_worker(env)
    assert set(found) >= set(TORCH_FREE_TRIAL_MODULES) and "torch" not in found


def test_a_preload_list_the_user_set_wins():
    env = {**os.environ, PRELOAD_ENV: "colorsys"}
    found = modules_in_worker(env)
    assert "colorsys" in found and "torch" not in found
