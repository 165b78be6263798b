"""The embedded Ray of `hpo run` listens on loopback only, and a killed driver leaves none of it behind.

One real `hpo run` of the quickstart sweep, started as a user would; its listeners are read while
trials run, then its driver is SIGKILLed.
"""

from __future__ import annotations

import ipaddress
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

from patience import patience

from hpo.base.ray_runtime import LOOPBACK_ONLY_ENV

REPO = Path(__file__).resolve().parents[1]
#: A killed driver's watchdog polls every 2 s and gives SIGTERM 2 s; Ray alone needs over a minute.
REAP_TIMEOUT_S = 20


def listeners(processes: list[psutil.Process]) -> list[tuple[str, int, str]]:
    """(address, port, process) of every listening TCP socket of `processes`."""
    found = []
    for process in processes:
        try:
            name = " ".join(process.cmdline())[:120]
            for connection in process.net_connections(kind="tcp"):
                if connection.status == psutil.CONN_LISTEN:
                    found.append((connection.laddr.ip, connection.laddr.port, name))
        except psutil.NoSuchProcess:
            pass
    return found


def is_loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%")[0])
    mapped = getattr(ip, "ipv4_mapped", None)  # ::ffff:127.0.0.1 is IPv4's loopback on a dual-stack socket
    return (mapped or ip).is_loopback


def alive(processes: list[psutil.Process]) -> list[psutil.Process]:
    living = []
    for process in processes:
        try:
            if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                living.append(process)
        except psutil.NoSuchProcess:
            pass
    return living


@pytest.fixture(scope="module")
def running_sweep(tmp_path_factory):
    """An `hpo run` whose trials are running: its driver and listeners."""
    tmp = tmp_path_factory.mktemp("exposure")
    sweep = yaml.safe_load((REPO / "configs" / "quickstart.yaml").read_text())
    sweep["storage_path"] = str(tmp / "runs")
    (tmp / "sweep.yaml").write_text(yaml.safe_dump(sweep))
    # As from a user's shell: not the loopback switch that importing hpo set in this process.
    env = {key: value for key, value in os.environ.items() if key not in ("RAY_ADDRESS", LOOPBACK_ONLY_ENV)}
    env["PYTHONPATH"] = str(REPO)
    driver = subprocess.Popen([sys.executable, "-m", "hpo.cli", "run", str(tmp / "sweep.yaml")], env=env,
                              cwd=tmp, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    process = psutil.Process(driver.pid)
    deadline = time.time() + patience(180)
    while not any((tmp / "runs").glob("quickstart/*/result.json")) and driver.poll() is None:
        assert time.time() < deadline, "no trial reported a result within 180 s"
        time.sleep(0.5)
    assert driver.poll() is None, "hpo run exited before its trials ran"
    yield driver, process, listeners([process, *process.children(recursive=True)])
    if driver.poll() is None:
        for leftover in alive([process, *process.children(recursive=True)]):
            leftover.kill()
    driver.wait()


@pytest.mark.slow
def test_embedded_ray_listens_on_loopback_only(running_sweep):
    _, _, found = running_sweep
    ray_servers = {name.split()[0] for _, _, name in found}
    assert any("gcs_server" in name for name in ray_servers), f"no GCS among listeners: {found}"
    exposed = [listener for listener in found if not is_loopback(listener[0])]
    assert not exposed, f"listening beyond loopback: {exposed}"


@pytest.mark.slow
def test_killed_driver_leaves_no_ray_process_behind(running_sweep):
    driver, process, _ = running_sweep
    ray_processes = process.children(recursive=True)  # Ray's, and the watchdog that cleans up after it
    assert any("DashboardAgent" in " ".join(p.cmdline()) for p in alive(ray_processes))
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    deadline = time.time() + REAP_TIMEOUT_S
    while (left := alive(ray_processes)) and time.time() < deadline:
        time.sleep(0.5)
    assert not left, f"{len(left)} processes outlived the driver: {[' '.join(p.cmdline())[:80] for p in left]}"


def test_the_generated_ray_token_is_readable_by_its_owner_only(running_sweep):
    from hpo.base.ray_runtime import RAY_TOKEN_FILE

    assert RAY_TOKEN_FILE.exists() and RAY_TOKEN_FILE.stat().st_mode & 0o077 == 0, oct(RAY_TOKEN_FILE.stat().st_mode)


WATCHDOGS_AFTER_TWO_RAYS = """
import json, time
from hpo.base.ray_runtime import start_local_ray   # before ray: loopback only
import psutil
import ray

me = psutil.Process()


def watchdogs():
    found = []
    for child in me.children():
        try:
            if child.status() != psutil.STATUS_ZOMBIE and "--reap" in child.cmdline():
                found.append(child)
        except psutil.NoSuchProcess:
            pass
    return found


def settled(most, timeout=60.0):
    deadline = time.time() + timeout
    while len(watchdogs()) > most and time.time() < deadline:
        time.sleep(0.2)
    return len(watchdogs())


start_local_ray(num_cpus=1)
ray.shutdown()
start_local_ray(num_cpus=1)   # at once, as the next test module's Ray starts
while_second_runs = settled(1)
ray.shutdown()
print(json.dumps([while_second_runs, settled(0)]))
"""


@pytest.mark.slow
def test_a_driver_that_starts_ray_again_keeps_one_watchdog_for_the_running_ray_and_none_after(tmp_path):
    """A test process starts a Ray per module: the watchdogs of the Rays it shut down must end,
    not follow the next Ray (each polls the process table: dozens of them slowed the suite)."""
    (tmp_path / "two_rays.py").write_text(WATCHDOGS_AFTER_TWO_RAYS)
    done = subprocess.run([sys.executable, str(tmp_path / "two_rays.py")], env={**os.environ, "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True, timeout=patience(300))
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.splitlines()[-1]) == [1, 0], "watchdogs (while the second Ray runs, after it)"


RAY_IMPORTED_FIRST = """
import json
import hpo            # as the README's examples begin; importing hpo sets nothing
import ray            # so Ray reads its loopback switch before hpo.base.ray_runtime sets it
import psutil
from hpo.base.ray_runtime import start_local_ray

start_local_ray(num_cpus=1)
me = psutil.Process()
found = []
for process in [me, *me.children(recursive=True)]:
    try:
        found += [c.laddr.ip for c in process.net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN]
    except psutil.NoSuchProcess:
        pass
ray.shutdown()
print(json.dumps(found))
"""


@pytest.mark.slow
def test_a_script_that_imports_ray_before_hpo_still_gets_a_loopback_only_ray(tmp_path):
    """`import hpo; from ray import tune; hpo.run(...)` is the README's own order: Ray read its switch
    before hpo set it, and its servers listened on every interface."""
    (tmp_path / "ray_first.py").write_text(RAY_IMPORTED_FIRST)
    env = {key: value for key, value in os.environ.items() if key not in ("RAY_ADDRESS", LOOPBACK_ONLY_ENV)}
    done = subprocess.run([sys.executable, str(tmp_path / "ray_first.py")], env={**env, "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True, timeout=patience(300))
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.splitlines()[-1])
    assert found, "the local Ray has listeners"
    assert [address for address in found if not is_loopback(address)] == []
    assert "all interfaces" not in done.stderr
