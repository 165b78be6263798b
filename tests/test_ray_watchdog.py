"""The local Ray's watchdog (`hpo/base/ray_runtime.py --reap`) ends what a dead driver's Ray left running,
and nothing of another Ray.

Here fake processes stand in for Ray's: a "raylet" root that the driver started, and a worker that
is no one's descendant any more, as when the raylet ended with its SIGKILLed driver moments after
starting it (the kernel reparents the worker to init). Only the session name in its command line
still ties such a worker to its Ray.
"""

from __future__ import annotations

import subprocess
import sys

import psutil

from hpo.base import ray_runtime

OURS = "session_2000-01-01_00-00-00_000001_1"
OTHERS = "session_2000-01-01_00-00-00_000002_2"


def sleeper(*tags: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", *tags])


def alive(process: subprocess.Popen) -> bool:
    try:
        return psutil.Process(process.pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_worker_orphaned_by_its_raylet_is_ended_by_its_session_and_another_rays_worker_is_not():
    driver = sleeper("fake-driver")
    raylet = sleeper("fake-raylet", f"--log_dir=/tmp/ray/{OURS}/logs")
    ours = sleeper("fake-ray-worker", f"--session-name={OURS}")
    others = sleeper("fake-ray-worker", f"--session-name={OTHERS}")
    watchdog = subprocess.Popen([sys.executable, "-P", ray_runtime.__file__, "--reap", str(driver.pid), str(raylet.pid)],
                                stdout=subprocess.PIPE, text=True)
    try:
        looked = watchdog.stdout.readline()  # the watchdog has looked once: it knows the raylet and its session
        assert looked.startswith(f"watching driver {driver.pid}") and f"session {OURS}" in looked, looked
        driver.kill()
        driver.wait()
        raylet.kill()  # Ray's raylet ends with its driver, leaving the worker it just started
        raylet.wait()
        watchdog.wait(timeout=60)
        ours.wait(timeout=10)  # reaped here: the test started it, as the kernel's init would
        assert not alive(ours), "the orphaned worker of the dead driver's Ray was ended"
        assert alive(others), "a worker of another Ray is not touched"
    finally:
        for process in (driver, raylet, ours, others, watchdog):
            process.kill()
            process.wait()
