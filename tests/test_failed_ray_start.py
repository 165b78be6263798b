"""A local Ray whose start fails leaves nothing running once its driver is gone.

Ray's `Node` gives its raylet a fixed 30 s to register; on a loaded machine that runs out, and
`ray.init` raises with Ray's agents already running. This stands in for such a start: `ray.init`
starts a process that starts another, as the raylet starts its agents, then raises as Ray does.
"""

import subprocess
import sys
import time

import psutil
import pytest

DRIVER = r"""
import subprocess, sys, time
import ray
from hpo.base import ray_runtime

AGENT = "import time; time.sleep(300)"
RAYLET = f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {AGENT!r}, 'fake-ray-agent']); time.sleep(300)"

def init_that_times_out(**kwargs):
    subprocess.Popen([sys.executable, "-c", RAYLET, "fake-raylet"])
    time.sleep(3)  # the raylet has started its agent
    raise Exception("The current node timed out during startup.")

ray.init = init_that_times_out
try:
    ray_runtime.start_local_ray(num_cpus=1)
except Exception as exc:
    print("ray.init raised:", exc, flush=True)
"""


def _fakes() -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter():
        try:
            if any(part in ("fake-raylet", "fake-ray-agent") for part in process.cmdline()):
                found.append(process)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return found


@pytest.mark.slow
def test_what_a_failed_start_left_running_ends_with_its_driver():
    assert _fakes() == []
    driver = subprocess.run([sys.executable, "-c", DRIVER], capture_output=True, text=True, timeout=120)
    assert "ray.init raised: The current node timed out" in driver.stdout, driver.stderr
    deadline = time.monotonic() + 30
    while (left := _fakes()) and time.monotonic() < deadline:
        time.sleep(0.5)
    for process in left:
        process.kill()
    assert left == [], f"still running after the driver exited: {[p.cmdline() for p in left]}"
