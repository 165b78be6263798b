"""Shared fixtures: a real local Ray per test module, and where the shipped traces live."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from hpo.base.ray_runtime import start_local_ray  # before anything imports ray: loopback only

# Token authentication on, whatever the shell says: a test Ray is as reachable as any other, and
# subprocess clients given `--address` inherit the mode (an explicit address never auto-enables it);
# they read the token that the fixture's `ray.init` wrote to ~/.ray/auth_token if none was there.
os.environ["RAY_AUTH_MODE"] = "token"
os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
# The sweeps that tests start (`hpo run` subprocesses among them) get Ray's cold workers: the fault
# tests start and kill sweeps dozens of times, and warming two workers with torch at each start cost
# the driver-kill test 23 s of its 130 s. tests/test_warm_workers.py checks the warm start itself.
os.environ.setdefault("RAY_preload_python_modules", "")

REPO = Path(__file__).resolve().parents[1]


def has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """One intra-op thread: no oversubscription on CI's 2 cores, and the same kernels for every
    run a test compares (fused vs alone)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def ray_local():
    """One real Ray per test module (fake GPUs schedule like real ones)."""
    import ray

    start_local_ray(
        num_cpus=2,
        num_gpus=4,
        object_store_memory=128 * 1024**2,
        # Trainables defined in test modules must import on Ray's workers too.
        runtime_env={"env_vars": {"PYTHONPATH": f"{REPO / 'tests'}:{REPO}"}},
        _system_config={"metrics_report_interval_ms": 1000},
    )
    yield ray
    ray.shutdown()


_SESSION: dict[str, int] = {}


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    _SESSION["exitstatus"] = int(exitstatus)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    """End the test process once pytest has reported, with pytest's own exit status, without
    Python's interpreter teardown. After the whole suite (some 40 Ray sessions, DeepSpeed, torch,
    MLflow, W&B and pyarrow filesystems in one process), that teardown segfaulted in two of three
    full runs, after every test had passed; each module, and each group of modules tried, exits
    cleanly on its own. The cause is not found yet (see the closing note of this change)."""
    if "exitstatus" in _SESSION:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_SESSION["exitstatus"])
