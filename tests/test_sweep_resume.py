"""A sweep whose driver is SIGKILLed, or stopped with Ctrl-C, resumes with `hpo run --resume` without
re-running finished trials; a stopped sweep says so and exits non-zero (one whose time budget ran
out is not stopped: it ended as asked)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pandas as pd
import pytest
from ray import tune

import hpo
from hpo.reporting.tune_state import DAMAGED, newest_state, trial_states

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
            time.sleep(0.03)  # slow enough that the driver can be killed mid-sweep (trial processes are reused: sweeps are fast)
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
    """The trials Tune's newest saved state holds as finished: those a resume must not run again.

    Read from the state file alone (`tune_state`, as `--resume` reads it), so polling it ten times
    a second costs next to nothing; `tune.ExperimentAnalysis` also loads every trial's results, and
    logs a warning for each trial that has none yet."""
    state = newest_state(experiment)
    try:
        return {trial["trial_id"] for trial in trial_states(state) if trial["status"] == "TERMINATED"} if state else set()
    except DAMAGED:  # the state file is being replaced
        return set()


class StoppedSweep:
    """The six-configuration sweep these tests stop part-way: `hpo run --address` on the module's
    Ray, its workload logging every (re)start of a trial."""

    def __init__(self, ray_local, tmp_path: Path, extra: str = ""):
        (tmp_path / "logged_workload.py").write_text(WORKLOAD)
        self.log = tmp_path / "starts.log"
        self.file = tmp_path / "sweep.yaml"
        self.file.write_text(textwrap.dedent(SWEEP.format(log=self.log, storage=tmp_path / "runs")) + extra)
        self.address = ray_local.get_runtime_context().gcs_address
        self.env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
        self.experiment = tmp_path / "runs" / "killed"

    def start(self, **output) -> subprocess.Popen:
        return subprocess.Popen(hpo_command(str(self.file), "--address", self.address), env=self.env, **output)

    def signal_after(self, driver: subprocess.Popen, trials: int, signum: int) -> set[str]:
        """Send `signum` once `trials` of Tune's trials have ended; those trials."""
        deadline = time.time() + patience(180)
        while len(ended := finished_trials(self.experiment)) < trials and time.time() < deadline:
            assert driver.poll() is None, "the sweep ended before it could be stopped"
            time.sleep(0.1)
        driver.send_signal(signum)
        return ended

    def signal_after_starts(self, driver: subprocess.Popen, starts: int, signum: int) -> None:
        """Send `signum` once the workload has logged more than `starts` model builds.

        Read from the workload's own log, written the moment a model is built, not from Tune's
        state, which is saved about once a second: by then a fast sweep may have ended."""
        deadline = time.time() + patience(180)
        while (not self.log.exists() or len(self.log.read_text().split()) <= starts) and time.time() < deadline:
            assert driver.poll() is None, "the sweep ended before it could be stopped"
            time.sleep(0.05)
        driver.send_signal(signum)

    def resume(self) -> subprocess.CompletedProcess:
        return subprocess.run(hpo_command(str(self.file), "--resume", "--address", self.address), env=self.env,
                              capture_output=True, text=True, timeout=patience(300))

    def results(self) -> pd.DataFrame:
        return pd.read_csv(self.experiment / "results.csv").set_index("trial_id")


def test_resume_after_sigkill_does_not_rerun_finished_trials(ray_local, tmp_path):
    sweep = StoppedSweep(ray_local, tmp_path)
    driver = sweep.start(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    done_before = sweep.signal_after(driver, 2, signal.SIGKILL)
    driver.wait()
    assert 2 <= len(done_before) < 6, f"expected a half-finished sweep, finished: {done_before}"

    resumed = sweep.resume()
    assert resumed.returncode == 0, resumed.stderr[-3000:]

    starts = sweep.log.read_text().split()
    for trial_id in done_before:
        assert starts.count(trial_id) == 1, f"finished trial {trial_id} was started again after resume"
    results = sweep.results()
    assert len(results) == 6
    assert (results["status"] == "completed").all(), results[["status"]]
    assert "Best configuration" in resumed.stdout


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_sweep_stopped_with_ctrl_c_exits_130_keeps_what_finished_and_resumes(ray_local, tmp_path, signum):
    # SIGTERM, as a batch system sends it, stops the sweep as Ctrl-C does (Ray's own handler
    # aborted the driver with raw stack addresses, exit 134)
    sweep = StoppedSweep(ray_local, tmp_path)
    driver = sweep.start(stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    sweep.signal_after(driver, 2, signum)  # Tune ends the run and returns as if it were done
    out, err = driver.communicate(timeout=patience(120))
    assert driver.returncode == 130, err[-3000:]
    assert "interrupted before every trial ended" in err and f"hpo run {sweep.file} --resume" in err
    stopped = sweep.results()
    finished = stopped[stopped["status"] == "completed"]
    assert len(finished) >= 2 and "early_stopped" not in set(stopped["status"]), stopped[["status", "iterations"]]
    assert stopped["config/lr"].notna().all(), "a trial Tune had not started yet keeps its configuration"

    resumed = sweep.resume()
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    results = sweep.results()
    assert len(results) == 6 and (results["status"] == "completed").all(), results[["status"]]
    pd.testing.assert_frame_equal(results.loc[finished.index, finished.columns], finished, check_dtype=False)
    counted = [int(n) for n in re.findall(r"^\[\s*(\d+)/6\] trial", resumed.stdout, re.M)]
    assert counted == list(range(len(finished) + 1, 7)), f"the count goes on from the earlier run: {resumed.stdout}"
    assert "Restored on" not in resumed.stdout + resumed.stderr, "Tune's INFO line as a trial restores its checkpoint"
    assert resumed.stdout.rstrip().splitlines()[-1].startswith("time:    sweep "), "nothing after the time: line"
    starts = sweep.log.read_text().split()
    assert all(starts.count(trial) == 1 for trial in finished.index), "a finished trial ran again"


def test_a_second_ctrl_c_while_the_sweep_stops_exits_130_in_one_line_and_loses_nothing(ray_local, tmp_path):
    # Tune handles the first Ctrl-C; the second raises wherever the driver is while it saves and stops.
    sweep = StoppedSweep(ray_local, tmp_path)
    driver = sweep.start(stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    sweep.signal_after(driver, 2, signal.SIGINT)
    time.sleep(0.2)
    driver.send_signal(signal.SIGINT)
    out, err = driver.communicate(timeout=patience(120))
    assert driver.returncode == 130, err[-3000:]
    assert "Traceback" not in err and f"hpo run {sweep.file} --resume" in err, err[-3000:]
    done = finished_trials(sweep.experiment)

    resumed = sweep.resume()
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    results = sweep.results()
    assert len(results) == 6 and (results["status"] == "completed").all(), results[["status"]]
    starts = sweep.log.read_text().split()
    assert all(starts.count(trial) == 1 for trial in done), "a finished trial ran again"


def test_a_fused_sweep_stopped_with_ctrl_c_says_its_unfinished_members_are_running_and_resumes_them(
        ray_local, tmp_path):
    """A fused sweep's rows are its members, not Tune's trials (the groups): a member cut short by
    Ctrl-C is `running`, not `early_stopped`, and `--resume` trains it to the end."""
    sweep = StoppedSweep(ray_local, tmp_path, "fusion: {max_members: 2}\nmax_concurrent_trials: 1\n")
    driver = sweep.start(stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # one group at a time, each building its two members' models and the guard's: once a fourth
    # build is logged, the first group has ended and the last has not begun
    sweep.signal_after_starts(driver, 3, signal.SIGINT)
    out, err = driver.communicate(timeout=patience(120))
    assert driver.returncode == 130, err[-3000:]
    stopped = sweep.results()
    finished = stopped[stopped["status"] == "completed"]
    assert len(finished) >= 2 and set(stopped["status"]) <= {"completed", "running"}, stopped[["status", "iterations"]]

    resumed = sweep.resume()
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    results = sweep.results()
    assert len(results) == 6 and (results["status"] == "completed").all() and (results["iterations"] == 3).all(), \
        results[["status", "iterations"]]
    pd.testing.assert_frame_equal(results.loc[finished.index, finished.columns], finished, check_dtype=False)


def slow_trial(config):
    for iteration in range(1, 9):
        time.sleep(0.3)
        tune.report({"loss": config["x"] / iteration})


def test_a_sweep_whose_time_budget_ran_out_is_not_interrupted_and_says_what_it_left_untrained(ray_local, tmp_path):
    # two at a time, each far longer than the budget: most of the grid never starts, and that is
    # the budget's doing, not an error (the sweep exits 0 and summary.json counts no error)
    result = hpo.run(slow_trial, config={"x": tune.grid_search([float(x) for x in range(1, 9)])}, metric="loss",
                     mode="min", storage_path=str(tmp_path), name="budget", time_budget_s=4, max_concurrent_trials=2)
    assert not result.interrupted and result.error_records() == []
    rows = pd.read_csv(tmp_path / "budget" / "results.csv")
    assert "error" not in set(rows["status"]) and len(rows) <= 8, rows[["status", "iterations"]]
    assert (rows.loc[rows["iterations"] < 8, "status"] == "early_stopped").all(), rows[["status", "iterations"]]
    # cut: stopped after reporting, including one the budget caught between its 8th report and its
    # return (nothing says a function would have stopped there)
    cut = int(((rows["status"] == "early_stopped") & (rows["iterations"] > 0)).sum())
    unreported = 8 - int((rows["iterations"] > 0).sum())
    assert unreported >= 4 and result.extras["time_budget_s"] == (  # the limiter never made some: they have no row
        f"4 s ran out: of 8 trials, {cut} were cut short and {unreported} never reported "
        "(their rows, where Tune made one, say early_stopped)")


def interrupting_trial(config):
    """Records its start; the trial of `x == 1` stops the driver (Ctrl-C) once, at its first start,
    and waits there for Tune to end it."""
    with open(config["log"], "a") as log:
        log.write(f"{tune.get_context().get_trial_id()}\n")
    marker = Path(config["log"]).with_suffix(".interrupted")
    if config["x"] == 1 and not marker.exists():
        marker.touch()
        os.kill(config["driver"], signal.SIGINT)
        threading.Event().wait()
    tune.report({"loss": float(config["x"])})


def test_hpo_run_with_resume_continues_the_stored_run_as_tune_run_resume_does(ray_local, tmp_path):
    # tune.run(..., resume=True) continues the experiment of `name`; hpo.run refused the argument,
    # and a second hpo.run started a new run folder that trained every trial again
    log = tmp_path / "starts.log"
    sweep = dict(config={"x": tune.grid_search([0, 1, 2]), "log": str(log), "driver": os.getpid()}, metric="loss",
                 mode="min", storage_path=str(tmp_path), name="stopped", max_concurrent_trials=1, verbose=0)
    with pytest.raises(ValueError, match=rf"resume=True: nothing to resume at {re.escape(str(tmp_path / 'stopped'))}$"):
        hpo.run(interrupting_trial, resume=True, **sweep)
    stopped = hpo.run(interrupting_trial, **sweep)
    assert stopped.interrupted
    finished = {r.metrics["trial_id"] for r in stopped if r.metrics.get("done")}
    assert len(finished) == 1

    resumed = hpo.run(interrupting_trial, resume=True, **sweep)
    assert not resumed.interrupted and Path(resumed.experiment_path) == tmp_path / "stopped"
    rows = pd.read_csv(tmp_path / "stopped" / "results.csv")
    assert sorted(rows["config/x"]) == [0, 1, 2] and (rows["status"] == "completed").all(), rows
    starts = log.read_text().split()
    assert all(starts.count(trial) == 1 for trial in finished), "a finished trial ran again"
    assert not (tmp_path / "stopped-2").exists()
    with pytest.raises(ValueError, match="resume must be True, False or 'AUTO', got 'LOCAL'"):
        hpo.run(interrupting_trial, resume="LOCAL", **sweep)


def test_hpo_run_with_resume_auto_starts_the_sweep_where_none_is_stored(ray_local, tmp_path):
    sweep = dict(config={"x": tune.grid_search([0, 2]), "log": str(tmp_path / "starts.log"), "driver": os.getpid()},
                 metric="loss", mode="min", storage_path=str(tmp_path), name="auto", verbose=0, resume="AUTO")
    first = hpo.run(interrupting_trial, **sweep)
    assert Path(first.experiment_path) == tmp_path / "auto" and len(first) == 2
    again = hpo.run(interrupting_trial, **sweep)
    assert Path(again.experiment_path) == tmp_path / "auto" and len(again) == 2
    assert len((tmp_path / "starts.log").read_text().split()) == 2, "the finished run's trials ran again"
