"""A local Ray whose start times out is started once more, after what the first start left running
is ended; one that fails again leaves nothing running once its driver is gone.

Ray's `Node` gives its raylet a fixed 30 s to register; on a loaded machine that runs out, and
`ray.init` raises with Ray's agents already running. This stands in for such a start: `ray.init`
starts a process that starts another, as the raylet starts its agents, then raises as Ray does.
"""

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from patience import patience

DRIVER = r"""
import subprocess, sys
import ray
from hpo.base import ray_runtime

AGENT = "import time; time.sleep(300)"
RAYLET = (f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {AGENT!r}, 'fake-ray-agent']); "
          "print('agent started', flush=True); time.sleep(300)")

FAIL_FIRST_ONLY = sys.argv[1:] == ["once"]
calls = []

def init_that_times_out(**kwargs):
    calls.append(kwargs)
    if FAIL_FIRST_ONLY and len(calls) == 2:
        from test_failed_ray_start import _fakes
        print("second start; left by the first:", [p.cmdline()[-1] for p in _fakes()], flush=True)
        return
    raylet = subprocess.Popen([sys.executable, "-c", RAYLET, "fake-raylet"], stdout=subprocess.PIPE, text=True)
    assert raylet.stdout.readline() == "agent started\n"  # what the raylet started is running
    raise Exception("The current node timed out during startup.")

ray.init = init_that_times_out
try:
    ray_runtime.start_local_ray(num_cpus=1)
    print("started after", len(calls), "starts", flush=True)
except Exception as exc:
    print("ray.init raised after", len(calls), "starts:", exc, flush=True)
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
    driver = subprocess.run([sys.executable, "-c", DRIVER], capture_output=True, text=True, timeout=patience(120))
    assert "ray.init raised after 2 starts: The current node timed out" in driver.stdout, driver.stderr
    deadline = time.monotonic() + 30
    while (left := _fakes()) and time.monotonic() < deadline:
        time.sleep(0.5)
    for process in left:
        process.kill()
    assert left == [], f"still running after the driver exited: {[p.cmdline() for p in left]}"


@pytest.mark.slow
def test_a_start_that_timed_out_is_tried_again_once_what_it_started_is_ended():
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent)}  # the driver looks with `_fakes`
    driver = subprocess.run([sys.executable, "-c", DRIVER, "once"], capture_output=True, text=True, timeout=patience(120), env=env)
    assert "second start; left by the first: []" in driver.stdout, driver.stdout + driver.stderr
    assert "started after 2 starts" in driver.stdout
    assert "did not come up in time" in driver.stderr
