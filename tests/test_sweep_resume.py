"""A sweep whose driver is SIGKILLed, or stopped with Ctrl-C, resumes with `hpo run --resume` without
re-running finished trials; a stopped sweep says so and exits non-zero (one whose time budget ran
out is not stopped: it ended as asked)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pandas as pd
import pytest
from ray import tune

import hpo

from patience import patience

pytestmark = pytest.mark.slow

WORKLOAD = '''
import time
from ray import tune
from examples.mlp_digits import DigitsMLP


class LoggedDigits(DigitsMLP):
    """Records every (re)start of a trial, so the test can count re-runs."""

    def build_model(self, config):
        with open(config["log_path"], "a") as log:
            log.write(f"{tune.get_context().get_trial_id()}\\n")  # None in a fused group's process
        return super().build_model(config)

    def train_batches(self, config, seed):
        for batch in super().train_batches(config, seed):
            time.sleep(0.06)  # slow enough that the driver can be killed mid-sweep (trial processes are reused: sweeps are fast)
            yield batch


workload = LoggedDigits()
'''

SWEEP = """
name: killed
trainable: logged_workload:workload
method: grid
metric: {{name: val_loss, goal: minimize}}
parameters:
  lr: {{values: [0.001, 0.003, 0.01, 0.03, 0.1, 0.3]}}
  width: {{value: 16}}
  log_path: {{value: {log}}}
max_iterations: 3
max_failures: 0
storage_path: {storage}
"""


def hpo_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "hpo.cli", "run", *args]


def finished_trials(experiment: Path) -> set[str]:
    if not any(experiment.glob("experiment_state-*.json")):
        return set()
    try:
        analysis = tune.ExperimentAnalysis(str(experiment))
    except Exception:  # the state file is being rewritten
        return set()
    return {trial.trial_id for trial in analysis.trials if trial.status == "TERMINATED"}


def test_resume_after_sigkill_does_not_rerun_finished_trials(ray_local, tmp_path):
    (tmp_path / "logged_workload.py").write_text(WORKLOAD)
    log = tmp_path / "starts.log"
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(textwrap.dedent(SWEEP.format(log=log, storage=tmp_path / "runs")))
    address = ray_local.get_runtime_context().gcs_address
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    experiment = tmp_path / "runs" / "killed"

    driver = subprocess.Popen(hpo_command(str(sweep), "--address", address), env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + patience(180)
    while len(done_before := finished_trials(experiment)) < 2 and time.time() < deadline:
        assert driver.poll() is None, "the sweep ended before it could be killed"
        time.sleep(0.5)
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    assert 2 <= len(done_before) < 6, f"expected a half-finished sweep, finished: {done_before}"

    resumed = subprocess.run(hpo_command(str(sweep), "--resume", "--address", address), env=env,
                             capture_output=True, text=True, timeout=patience(300))
    assert resumed.returncode == 0, resumed.stderr[-3000:]

    starts = log.read_text().split()
    for trial_id in done_before:
        assert starts.count(trial_id) == 1, f"finished trial {trial_id} was started again after resume"
    results = pd.read_csv(experiment / "results.csv")
    assert len(results) == 6
    assert (results["status"] == "completed").all(), results[["trial_id", "status"]]
    assert "Best configuration" in resumed.stdout


def test_a_sweep_stopped_with_ctrl_c_exits_130_keeps_what_finished_and_resumes(ray_local, tmp_path):
    (tmp_path / "logged_workload.py").write_text(WORKLOAD)
    log = tmp_path / "starts.log"
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(textwrap.dedent(SWEEP.format(log=log, storage=tmp_path / "runs")))
    address = ray_local.get_runtime_context().gcs_address
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    experiment = tmp_path / "runs" / "killed"

    driver = subprocess.Popen(hpo_command(str(sweep), "--address", address), env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + patience(180)
    while len(finished_trials(experiment)) < 2 and time.time() < deadline:
        assert driver.poll() is None, "the sweep ended before it could be stopped"
        time.sleep(0.5)
    driver.send_signal(signal.SIGINT)  # Ctrl-C: Tune ends the run and returns as if it were done
    out, err = driver.communicate(timeout=patience(120))
    assert driver.returncode == 130, err[-3000:]
    assert "interrupted before every trial ended" in err and f"hpo run {sweep} --resume" in err
    stopped = pd.read_csv(experiment / "results.csv").set_index("trial_id")
    finished = stopped[stopped["status"] == "completed"]
    assert len(finished) >= 2 and "early_stopped" not in set(stopped["status"]), stopped[["status", "iterations"]]

    resumed = subprocess.run(hpo_command(str(sweep), "--resume", "--address", address), env=env,
                             capture_output=True, text=True, timeout=patience(300))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    results = pd.read_csv(experiment / "results.csv").set_index("trial_id")
    assert len(results) == 6 and (results["status"] == "completed").all(), results[["status"]]
    pd.testing.assert_frame_equal(results.loc[finished.index, finished.columns], finished, check_dtype=False)
    starts = log.read_text().split()
    assert all(starts.count(trial) == 1 for trial in finished.index), "a finished trial ran again"


def test_a_fused_sweep_stopped_with_ctrl_c_says_its_unfinished_members_are_running_and_resumes_them(
        ray_local, tmp_path):
    """A fused sweep's rows are its members, not Tune's trials (the groups): a member cut short by
    Ctrl-C is `running`, not `early_stopped`, and `--resume` trains it to the end."""
    (tmp_path / "logged_workload.py").write_text(WORKLOAD)
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(textwrap.dedent(SWEEP.format(log=tmp_path / "starts.log", storage=tmp_path / "runs"))
                     + "fusion: {max_members: 2}\nmax_concurrent_trials: 1\n")
    address = ray_local.get_runtime_context().gcs_address
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    experiment = tmp_path / "runs" / "killed"

    driver = subprocess.Popen(hpo_command(str(sweep), "--address", address), env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + patience(180)
    while not finished_trials(experiment) and time.time() < deadline:  # the first group of two ended
        assert driver.poll() is None, "the sweep ended before it could be stopped"
        time.sleep(0.5)
    driver.send_signal(signal.SIGINT)
    out, err = driver.communicate(timeout=patience(120))
    assert driver.returncode == 130, err[-3000:]
    stopped = pd.read_csv(experiment / "results.csv").set_index("trial_id")
    finished = stopped[stopped["status"] == "completed"]
    assert len(finished) >= 2 and set(stopped["status"]) <= {"completed", "running"}, stopped[["status", "iterations"]]

    resumed = subprocess.run(hpo_command(str(sweep), "--resume", "--address", address), env=env,
                             capture_output=True, text=True, timeout=patience(300))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    results = pd.read_csv(experiment / "results.csv").set_index("trial_id")
    assert len(results) == 6 and (results["status"] == "completed").all() and (results["iterations"] == 3).all(), \
        results[["status", "iterations"]]
    pd.testing.assert_frame_equal(results.loc[finished.index, finished.columns], finished, check_dtype=False)

def slow_trial(config):
    for iteration in range(1, 100):
        time.sleep(0.3)
        tune.report({"loss": config["x"] / iteration})


def test_a_sweep_whose_time_budget_ran_out_is_not_interrupted(ray_local, tmp_path):
    result = hpo.run(slow_trial, config={"x": tune.grid_search([1.0, 2.0, 3.0, 4.0])}, metric="loss", mode="min",
                     storage_path=str(tmp_path), name="budget", time_budget_s=4)
    assert not result.interrupted
    assert "running" not in set(pd.read_csv(tmp_path / "budget" / "results.csv")["status"])
