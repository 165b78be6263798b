"""`ray job submit -- hpo run sweep.yaml` against a running local cluster with token authentication:
the way a sweep runs on a shared cluster, its trainable shipped in the job's working directory."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from patience import patience

from hpo.base.ray_runtime import START_ATTEMPTS

REPO = Path(__file__).resolve().parents[1]
RAY = str(Path(sys.executable).with_name("ray"))


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Head:
    """A head node on 127.0.0.1 in its own temp dir and process group (`ray start --head --block`).

    Its raylet gives the node's dashboard agent a fixed 15 s to come up and exits if it is late
    (ray-project/ray#65983), and `ray start --block` then ends the whole node; on a loaded 2-core
    box that happens now and then. `restart` starts a fresh head after such an exit, as many times
    as hpo's own local Ray start tries (`START_ATTEMPTS`), and then fails naming the raylet's error.
    The test neither reads nor writes the user's ~/.ray token (the token goes to the cluster and
    the client through RAY_AUTH_TOKEN), and ends by signalling its own process group (`ray stop`
    would stop every Ray on the machine)."""

    def __init__(self, env: dict[str, str]):
        self.env = env
        self.attempts = 0
        self._start()

    def _start(self) -> None:
        self.attempts += 1
        self.temp_dir = tempfile.mkdtemp(prefix="rayjob", dir="/tmp")  # short: Ray's socket paths have a length limit
        dashboard = free_port()
        self.address = f"http://127.0.0.1:{dashboard}"
        self.process = subprocess.Popen(
            [RAY, "start", "--head", "--block", "--node-ip-address", "127.0.0.1", "--port", str(free_port()),
             "--dashboard-host", "127.0.0.1", "--dashboard-port", str(dashboard), "--num-cpus", "2",
             # Ports with fixed defaults, taken when other Rays run on this machine.
             "--dashboard-agent-listen-port", str(free_port()), "--ray-client-server-port", str(free_port()),
             "--temp-dir", self.temp_dir, "--disable-usage-stats"],
            env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )

    def alive(self) -> bool:
        return self.process.poll() is None

    def raylet_error(self) -> str:
        """The raylet's fatal line ("Check failed: ..."), if it wrote one."""
        for log in Path(self.temp_dir).glob("session_*/logs/raylet.out"):
            for line in log.read_text(errors="replace").splitlines():
                if "Check failed" in line:
                    return line
        return "no fatal line in raylet.out"

    def restart(self) -> None:
        reason = self.raylet_error()
        self.stop()
        assert self.attempts < START_ATTEMPTS, f"the head node exited while starting, {self.attempts} times: {reason}"
        self._start()

    def stop(self) -> None:
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
        except ProcessLookupError:  # the node had ended by itself, every process of its group with it
            pass
        try:
            self.process.wait(timeout=10)  # the test's cluster holds nothing worth a longer grace
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        deadline = time.monotonic() + 2  # the raylet's workers leave after their parent
        try:
            while time.monotonic() < deadline:
                os.killpg(self.process.pid, 0)  # raises once the whole group is gone
                time.sleep(0.1)
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        shutil.rmtree(self.temp_dir, ignore_errors=True)


@pytest.fixture()
def cluster():
    """A head node with a fresh token (`Head`)."""
    token = secrets.token_hex(32)
    head = Head({**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token})
    try:
        yield head
    finally:
        head.stop()


def ray_job(address: str, env: dict[str, str], *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [RAY, "job", args[0], "--address", address, *args[1:]],
        env=env, capture_output=True, text=True, timeout=patience(timeout),
    )


def job_status(address: str, env: dict[str, str], submission_id: str) -> subprocess.CompletedProcess:
    """Ask Ray's job SDK for the job's status, with the cluster's token like any client; the
    status is the last line printed, and a refusal (or a job Ray never registered) a non-zero
    exit whose stderr says why."""
    return subprocess.run(
        [sys.executable, "-c", "import sys; from ray.job_submission import JobSubmissionClient; "
         "print(JobSubmissionClient(sys.argv[1]).get_job_status(sys.argv[2]).value)", address, submission_id],
        env=env, capture_output=True, text=True, timeout=patience(120),
    )


def dashboard_listens(address: str) -> bool:
    """Whether the head's dashboard takes HTTP requests yet (any answer, a refusal included)."""
    try:
        urllib.request.urlopen(address, timeout=5).close()
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False
    return True


def dashboard_answers(head: Head, deadline_s: float = 120) -> bool:
    """True once the head's job server answers; False if the head exited first.

    `ray job list` is asked only once the dashboard listens: each call is a new process that
    imports Ray (some 1.5 CPU seconds), and asking in a loop took that CPU from the starting head."""
    deadline = time.monotonic() + patience(deadline_s)
    while head.alive():
        if not dashboard_listens(head.address):
            assert time.monotonic() < deadline, "the cluster's dashboard never listened"
            time.sleep(0.2)
            continue
        listed = ray_job(head.address, head.env, "list", timeout=60)
        if listed.returncode == 0:
            return True
        assert time.monotonic() < deadline, f"the cluster's job server never answered: {listed.stderr[-2000:]}"
        time.sleep(0.5)
    return False


@pytest.mark.slow
def test_a_sweep_submitted_as_a_ray_job_succeeds_and_writes_its_results(cluster, tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    (project / "trainable.py").write_text(textwrap.dedent("""\
        from ray import tune

        def quadratic(config):
            for iteration in range(1, 3):
                tune.report({"score": (config["x"] - 1.0) ** 2 + 1.0 / iteration})
        """))
    runs = tmp_path / "runs"
    (project / "sweep.yaml").write_text(textwrap.dedent(f"""\
        name: submitted
        trainable: trainable:quadratic
        method: grid
        metric: {{name: score, goal: minimize}}
        parameters:
          x: {{values: [0.0, 2.5]}}
        max_iterations: 2
        storage_path: {runs}
        """))
    # Where hydro-hpo is installed on the cluster the entrypoint is `hpo run sweep.yaml`; here the
    # checkout under test runs, with the interpreter of this environment.
    runtime_env = json.dumps({"env_vars": {"PYTHONPATH": str(REPO)}})
    deadline = time.monotonic() + patience(120)
    while True:
        if not dashboard_answers(cluster):
            cluster.restart()
            continue
        submitted = ray_job(
            cluster.address, cluster.env, "submit", "--submission-id", "hpo-sweep", "--working-dir", str(project),
            "--runtime-env-json", runtime_env, "--", sys.executable, "-m", "hpo.cli", "run", "sweep.yaml",
            timeout=480,
        )
        if not cluster.alive():  # its raylet exited while the node started (see `Head`)
            cluster.restart()
            continue
        # The job server answers before the node's agent that starts jobs is up (Ray asks to retry).
        if "No available agent to submit job" not in submitted.stderr or time.monotonic() > deadline:
            break
        time.sleep(2)
    asked = job_status(cluster.address, cluster.env, "hpo-sweep")
    assert asked.returncode == 0 and asked.stdout.split()[-1:] == ["SUCCEEDED"], (
        f"status asked: {asked.stdout[-500:]}{asked.stderr[-2000:]}\n"
        f"submit said: {submitted.stdout[-3000:]}\n{submitted.stderr[-3000:]}")
    assert "Best configuration (score = 1.5)" in submitted.stdout, "the job's output is the CLI's"
    tokenless = {k: v for k, v in cluster.env.items() if k != "RAY_AUTH_TOKEN"}
    refused = job_status(cluster.address, tokenless, "hpo-sweep")  # token authentication was on: a client without it is refused
    assert refused.returncode != 0 and "SUCCEEDED" not in refused.stdout, refused.stdout
    results = (runs / "submitted" / "results.csv").read_text().splitlines()
    assert len(results) == 3, results
