"""Fault tier: an unfused sweep whose driver is SIGKILLed at 10 seeded-random moments, and resumed
with `hpo run --resume` after each, ends with every configuration in results.csv exactly once, and
exit status 0. What a driver printed or wrote as finished before a kill is final: no finished trial
runs again, and its row is the same after every later resume, retried trials included."""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pandas as pd
import pytest

from patience import patience

pytestmark = pytest.mark.slow

KILLS = 10
CONFIGS = list(range(12))
#: Configurations whose first attempt raises once (the sweep retries them: max_failures 1).
FLAKY = {0, 5, 9}

TRAINABLE = '''
import os
import time

from ray import tune


def train(config):
    """Reports a score that depends on the configuration only; logs each (re)start; the
    configurations in `flaky` raise in their second iteration the first time they run."""
    folder = os.path.dirname(config["log_path"])
    with open(config["log_path"], "a") as log:
        log.write(tune.get_context().get_trial_id() + "\\n")
    for step in range(1, 5):
        time.sleep(0.25)
        marker = os.path.join(folder, f"failed-{config['x']}")
        if config["x"] in config["flaky"] and step == 2 and not os.path.exists(marker):
            open(marker, "w").close()
            raise RuntimeError(f"x={config['x']} fails once")
        tune.report({"score": (config["x"] - 6.5) ** 2 + 1.0 / step})
'''

SWEEP = """
name: killed
trainable: flaky_trainable:train
method: grid
metric: {{name: score, goal: minimize}}
parameters:
  x: {{values: {configs}}}
  flaky: {{value: {flaky}}}
  log_path: {{value: {log}}}
max_iterations: 4
max_failures: 1
storage_path: {storage}
"""

FINISHED_LINE = re.compile(r"trial (\S+) finished after (\d+) it: score=(\S+)")


def finished_rows(experiment: Path) -> pd.DataFrame:
    """The rows results.csv holds as finished (indexed by trial id); empty before the first."""
    path = experiment / "results.csv"
    if not path.exists():
        return pd.DataFrame()
    rows = pd.read_csv(path)
    return rows[rows["status"] == "completed"].set_index("trial_id").sort_index()


def starts(log: Path) -> list[str]:
    return log.read_text().split() if log.exists() else []


def test_a_driver_killed_at_10_random_moments_loses_and_reruns_no_finished_trial(ray_local, tmp_path):
    rng = random.Random(1410)
    (tmp_path / "flaky_trainable.py").write_text(TRAINABLE)
    log = tmp_path / "starts.log"
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(textwrap.dedent(SWEEP.format(configs=CONFIGS, flaky=sorted(FLAKY), log=log,
                                                  storage=tmp_path / "runs")))
    experiment = tmp_path / "runs" / "killed"
    address = ray_local.get_runtime_context().gcs_address
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}

    def driver(*extra: str, output: Path) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "hpo.cli", "run", str(sweep), "--address", address, *extra],
                                env=env, stdout=output.open("w"), stderr=subprocess.STDOUT)

    # (kill, rows finished before it, what the driver printed as finished, trial starts so far)
    kept: list[tuple[int, pd.DataFrame, dict[str, tuple[int, str]], int]] = []
    for kill in range(KILLS):
        output = tmp_path / f"driver-{kill}.out"
        process = driver(*(["--resume"] if kill else []), output=output)
        started = len(starts(log))
        while process.poll() is None and (len(starts(log)) == started  # the kill lands while trials train,
                                          or not list(experiment.glob("experiment_state-*.json"))):  # resumably
            time.sleep(0.05)
        time.sleep(rng.uniform(0.0, 2.0))
        if process.poll() is not None:  # the sweep finished before this kill: nothing left to kill
            assert process.returncode == 0, output.read_text()[-3000:]
            break
        process.send_signal(signal.SIGKILL)
        process.wait()
        printed = {m.group(1): (int(m.group(2)), m.group(3)) for m in FINISHED_LINE.finditer(output.read_text())}
        kept.append((kill, finished_rows(experiment), printed, len(starts(log))))

    final_output = tmp_path / "driver-final.out"
    final = driver("--resume", output=final_output)
    assert final.wait(timeout=patience(300)) == 0, final_output.read_text()[-3000:]

    rows = pd.read_csv(experiment / "results.csv")
    assert sorted(rows["config/x"]) == CONFIGS, "every configuration has exactly one row"
    assert rows["trial_id"].is_unique
    assert (rows["status"] == "completed").all(), rows[["config/x", "status", "error"]]
    after = rows.set_index("trial_id").sort_index()
    started_ids = starts(log)
    interrupted_ids: set[str] = set()  # trials that had started but not finished when a kill came
    for kill, before, printed, n_started in kept:
        if len(before):
            pd.testing.assert_frame_equal(after.loc[before.index, before.columns], before, check_dtype=False,
                                          obj=f"rows finished before kill {kill}")
        for trial, (iterations, score) in printed.items():
            assert (after.loc[trial, "iterations"], f"{after.loc[trial, 'score']:.4g}") == (iterations, score), \
                f"kill {kill}: trial {trial} printed as finished changed after resume"
        rerun = (set(before.index) | set(printed)) & set(started_ids[n_started:])
        assert not rerun, f"kill {kill}: finished trials {rerun} were started again"
        interrupted_ids |= set(started_ids[:n_started]) - set(before.index)
    assert set(started_ids) == set(after.index)
    restarted = {trial for trial in started_ids if started_ids.count(trial) > 1}
    flaky_ids = set(rows.loc[rows["config/x"].isin(FLAKY), "trial_id"])
    assert restarted <= flaky_ids | interrupted_ids, "a trial ran again that neither failed nor was interrupted"
