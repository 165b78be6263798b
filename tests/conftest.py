"""Shared fixtures: one real local Ray for the modules that use it, and where the shipped traces live."""

from __future__ import annotations

import fcntl
import gc
import importlib.util
import os
import sys
import time
import warnings
from collections import Counter
from pathlib import Path

import pytest

from hpo.base.ray_runtime import RAY_TOKEN_FILE, start_local_ray  # before anything imports ray: loopback only

# Token authentication on, whatever the shell says: a test Ray is as reachable as any other, and
# subprocess clients given `--address` inherit the mode (an explicit address never auto-enables it);
# they read the token that the fixture's `ray.init` wrote to ~/.ray/auth_token if none was there.
os.environ["RAY_AUTH_MODE"] = "token"
os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")

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


class SharedRay:
    """One real Ray for every test module that asks for `ray_local` (fake GPUs schedule like real
    ones), started when the first such module runs and reused by the next, unless a module left
    something behind in it.

    A Ray start costs some 30 s on a loaded 2-core box, and Ray gives its raylet a fixed 30 s to
    register, so each start is also a chance of "node timed out during startup": one start for
    the whole suite instead of one per module removes both. Isolation is kept by checking, after
    each module, that its named actors are gone and every CPU and GPU is free again; a Ray that
    still holds either is shut down (with a warning naming what was left), and the next module
    starts a fresh one, as it would have with a Ray per module."""

    #: How long a module's actors get to release their resources after its last test.
    RELEASE_S = 30.0

    def get(self, start_lock: Path):
        """`start_lock`: a file that parallel workers share, held while this one's Ray starts, so
        that two never start at once: on 2 cores two starts together often ran past the 30 s Ray
        gives a raylet to register."""
        import ray

        if not ray.is_initialized():
            with start_lock.open("a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                start_local_ray(
                    num_cpus=2,
                    num_gpus=4,
                    object_store_memory=128 * 1024**2,
                    # Trainables defined in test modules must import on Ray's workers too.
                    runtime_env={"env_vars": {"PYTHONPATH": f"{REPO / 'tests'}:{REPO}"}},
                    # Ray's own metrics interval (10 s), not 1 s: at 1 s every Ray process spent 40-70 ms
                    # of each second recording metrics on a loaded 2-core box (4-7% of a core each).
                )
        return ray

    def release(self, module: str) -> None:
        import ray

        if not ray.is_initialized():
            return
        gc.collect()  # a sweep's result in a reference cycle still holds its controller's handle
        left = self.leftovers(ray)
        if left:
            warnings.warn(f"{module} left {left} in the shared test Ray: it is restarted for the next module")
            ray.shutdown()

    def leftovers(self, ray) -> str:
        """What a module still holds in this Ray once RELEASE_S has passed; empty if nothing."""
        deadline = time.monotonic() + self.RELEASE_S
        while True:
            named = ray.util.list_named_actors(all_namespaces=True)
            total, free = ray.cluster_resources(), ray.available_resources()
            held = {key: total[key] - free.get(key, 0.0) for key in ("CPU", "GPU")
                    if total.get(key, 0.0) - free.get(key, 0.0) > 1e-6}
            if not named and not held:
                return ""
            if time.monotonic() > deadline:
                return f"named actors {named}, held resources {held}"
            time.sleep(0.5)


_SHARED_RAY = SharedRay()


@pytest.fixture(scope="module")
def ray_local(request, tmp_path_factory):
    """The suite's shared real Ray (`SharedRay`), checked for leftovers after this module."""
    # Parallel workers' temporary folders share a parent (pytest-xdist's `popen-gw<N>`).
    yield _SHARED_RAY.get(tmp_path_factory.getbasetemp().parent / "ray-start.lock")
    _SHARED_RAY.release(request.module.__name__)


@pytest.fixture(autouse=True)
def logged_errors_let_go(request, caplog):
    """A test's logged exceptions are dropped once the test has run, for the shared Ray's check.

    pytest keeps a test's log records until its teardown ends, and a record logged with an
    exception keeps that exception and its frames: Tune's "Trial task failed" record holds the
    whole Tune controller, and with it the sweep's named actor, past the module's last test, so
    the check after the module found `hpo:sweep:<name>` and restarted Ray (30 s and a Ray start,
    three times a suite). The report already holds the records as text."""
    yield
    if "ray_local" in request.fixturenames:
        for record in caplog.get_records("call"):
            record.exc_info = None


def uses_shared_ray(item: pytest.Item) -> bool:
    return "ray_local" in getattr(item, "fixturenames", ())


#: Modules that must not run beside each other on parallel workers (`make test` runs two): each
#: set runs on one worker, one module after another. Multi-node clusters: two at once on 2 cores
#: starve each other's raylets past Ray's fixed 30 s registration. Fake Ray processes: each module
#: asserts that none of its fakes is left, which the other's would break.
RUN_ALONE = {
    "clusters": ("test_node_loss", "test_allocator_live"),
    "fake_ray_processes": ("test_failed_ray_start", "test_ray_watchdog"),
}
_GROUP_OF = {module: group for group, modules in RUN_ALONE.items() for module in modules}

#: Work units far longer than their count of slow tests says: one kill loop each, 90-100 s on a
#: fresh clone, where most units with more slow tests take less. Ordered by slow tests they came
#: 8th and 13th of the 21 units in the shared Ray's part, beside one-test units (a worker that takes
#: a one-test unit takes the next one too: it runs a test only once it knows the one after it), so
#: one could start with little left for the other worker, which then idled until it ended. They
#: start first in their part, in this order.
LONGEST_FIRST = ("test_fault_driver_kills", "test_sweep_faults")


def work_unit(module: str) -> str:
    """What runs whole on one parallel worker: the module (its module-scoped fixtures, the shared
    Ray among them, start once per module), or its `RUN_ALONE` set."""
    return _GROUP_OF.get(module, module)


def pytest_collection_modifyitems(session, config, items):
    """Modules that use the shared Ray run after all others, one after another, so that it starts
    once, and modules that start their own Ray, or check that none is running, never meet it.
    Tests keep their order within a module, and modules within each part.

    Parallel workers are handed their work units in this order (`pytest_xdist_make_scheduler`),
    so on each worker the modules with the shared Ray still come last. Within each part the units
    with the most slow tests go first, so that a long one does not start last and leave the other
    worker idle until it ends; the `LONGEST_FIRST` units go before them."""
    shared = {item.module.__name__ for item in items if uses_shared_ray(item)}
    slow = Counter(work_unit(item.module.__name__) for item in items if item.get_closest_marker("slow"))

    def order(item: pytest.Item) -> tuple:
        unit = work_unit(item.module.__name__)
        longest = LONGEST_FIRST.index(unit) if unit in LONGEST_FIRST else len(LONGEST_FIRST)
        return item.module.__name__ in shared, longest, -slow[unit]

    items.sort(key=order)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """pytest-xdist's scheduler, handing out `work_unit`s whole in collection order.

    Not `--dist loadgroup`: with pytest 9 its `xdist_group` marks are lost (xdist 3.8 renames a
    test through `Item._nodeid`, which pytest no longer reads), so it splits modules test by test.
    Not xdist's reordering of units by size either: the order is what keeps the shared Ray last."""
    from xdist.scheduler import LoadScopeScheduling

    class WorkUnits(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return work_unit(Path(path).stem)

    config.option.loadscopereorder = False
    return WorkUnits(config, log)


def pytest_configure(config):
    """One cluster token for the whole run, made before parallel workers start their Rays: a Ray
    that starts where this user has no token yet writes a new one, and two workers doing so at
    once (on a fresh CI machine) would each hand their clients the other's."""
    if not hasattr(config, "workerinput") and not RAY_TOKEN_FILE.exists() and importlib.util.find_spec("ray"):
        from ray_cluster import ensure_ray_token

        ensure_ray_token()


@pytest.fixture(scope="session", autouse=True)
def shared_ray_ends_with_the_session():
    yield
    ray = sys.modules.get("ray")  # a run that never imported Ray (the GPU machine has none) has none to end
    if ray is not None and ray.is_initialized():
        ray.shutdown()
