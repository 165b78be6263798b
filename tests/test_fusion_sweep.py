"""Fused groups inside a real Tune sweep: Tune runs the groups; each member keeps its own row,
results and checkpoints, is judged by the user's searcher and scheduler, and trains exactly as unfused."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import optuna
import pandas as pd
import pytest
from ray import tune
from ray.tune.search import Searcher
from ray.tune.search.optuna import OptunaSearch

from patience import patience

import hpo
from examples.mlp_digits import workload as digits
from hpo.tuner.sweep import build_tuner, load_sweep

pytestmark = [pytest.mark.usefixtures("ray_local"), pytest.mark.slow]

LRS = [1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1]
#: The best of LRS after one iteration (seed 0, width 16, the digits MLP).
BEST_LR = 3e-2


def sweep(tmp_path, name, fusion, lrs):
    return hpo.run(
        digits,
        config={"lr": tune.grid_search(lrs), "width": 16, "seed": 3},
        metric="val_loss",
        mode="min",
        stop={"training_iteration": 3},
        storage_path=str(tmp_path),
        name=name,
        fusion=fusion,
    )


def test_fused_members_are_trials_that_train_exactly_like_unfused_ones(tmp_path):
    lrs = LRS[1::2]
    fused = sweep(tmp_path, "fused", hpo.FusionConfig(max_members=2), lrs)
    plain = sweep(tmp_path, "plain", None, lrs)

    groups = fused.extras["fused_groups"]
    assert len(groups) >= 2 and all(len(g) <= 2 for g in groups), f"three configs in groups of at most two: {groups}"
    fused_frame = fused.get_dataframe().set_index("config/lr").sort_index()
    plain_frame = plain.get_dataframe().set_index("config/lr").sort_index()
    assert list(fused_frame.index) == lrs and (fused_frame["iterations"] == 3).all()
    relative = (fused_frame["val_loss"] - plain_frame["val_loss"]).abs() / plain_frame["val_loss"]
    assert relative.max() < 1e-4, relative
    assert fused.best_config["lr"] == plain.best_config["lr"]
    assert all(r.checkpoint is not None for r in fused), "each member has its own checkpoint"
    assert len(fused.result_grid) == len(groups), "Tune ran the groups, one trial each"


def yaml_fused_sweep(tmp_path, scheduler: str):
    path = tmp_path / "fused.yaml"
    path.write_text(textwrap.dedent(f"""
        name: fused_{scheduler}
        trainable: mlp_digits
        method: grid
        metric: {{name: val_loss, goal: minimize}}
        parameters:
          lr: {{values: {LRS}}}
          width: {{value: 16}}
        early_terminate: {{type: {scheduler}, min_iter: 1, eta: 3}}
        max_iterations: 3
        storage_path: {tmp_path / "runs"}
        fusion: {{enabled: true, max_members: 6}}
    """))
    return build_tuner(load_sweep(path)).fit()


def test_yaml_fused_sweep_with_asha_gives_one_row_per_configuration_and_repacks_stopped_members(tmp_path):
    """Which members ASHA stops depends on the order their results reach Tune (it never stops the
    first result at a rung), so this checks what holds in every order."""
    result = yaml_fused_sweep(tmp_path, "asha")
    assert sorted(map(len, result.extras["fused_groups"])) == [3, 3], "six configurations, two group slots"
    frame = result.get_dataframe().set_index("config/lr")
    assert len(frame) == 6 and set(frame["status"]) <= {"completed", "early_stopped"}
    stopped = frame[frame["status"] == "early_stopped"]
    assert (stopped["iterations"] == 1).all(), "the only rung below max_iterations is iteration 1"
    assert frame.loc[BEST_LR, "status"] == "completed", "ASHA never stops the best result at a rung"
    last = {r.metrics["trial_id"]: r.metrics for r in result}
    for group in result.extras["fused_groups"]:
        survivors = [last[t] for t in group if last[t]["training_iteration"] == 3]
        assert all(m["fused_members"] == len(survivors) for m in survivors), "the last iteration trains survivors only"
    assert len(pd.read_csv(result.write()["results"])) == 6


def test_yaml_fused_sweep_with_hyperband_stops_members_individually(tmp_path):
    """HyperBand decides once a whole bracket reached its milestone, so its stops, unlike ASHA's,
    don't depend on the order members report (a member it pauses leaves its group, and joins a new
    one if resumed)."""
    result = yaml_fused_sweep(tmp_path, "hyperband")
    frame = result.get_dataframe().set_index("config/lr")
    assert len(frame) == 6 and set(frame["status"]) <= {"completed", "early_stopped"}
    stopped = frame[frame["status"] == "early_stopped"]
    assert len(stopped) >= 1 and (stopped["iterations"] == 1).all(), frame
    assert (frame.loc[frame["status"] == "completed", "iterations"] == 3).all()
    assert frame.loc[BEST_LR, "status"] == "completed"


class RecordingSearcher(Searcher):
    """Optuna's TPE, with a record of what Tune's searcher interface told it."""

    def __init__(self, inner: Searcher):
        super().__init__(metric=inner.metric, mode=inner.mode)
        self.inner = inner
        self.results: list[tuple[str, int]] = []
        self.completed: dict[str, dict] = {}

    def set_search_properties(self, metric, mode, config, **spec):
        return self.inner.set_search_properties(metric, mode, config, **spec)

    def suggest(self, trial_id):
        return self.inner.suggest(trial_id)

    def on_trial_result(self, trial_id, result):
        self.results.append((trial_id, result["training_iteration"]))
        self.inner.on_trial_result(trial_id, result)

    def on_trial_complete(self, trial_id, result=None, error=False):
        self.completed[trial_id] = result
        self.inner.on_trial_complete(trial_id, result, error)


def test_tpe_proposes_and_hears_of_every_member_of_a_fused_sweep(tmp_path):
    searcher = RecordingSearcher(OptunaSearch(sampler=optuna.samplers.TPESampler(seed=0, n_startup_trials=3)))
    result = hpo.run(
        digits,
        config={"lr": tune.loguniform(1e-3, 1e-1), "width": 16, "seed": 0},
        metric="val_loss",
        mode="min",
        num_samples=6,
        search_alg=searcher,
        stop={"training_iteration": 2},
        storage_path=str(tmp_path),
        name="tpe",
        fusion=hpo.FusionConfig(max_members=3),
    )
    frame = result.get_dataframe()
    assert len(frame) == 6 and len(result.result_grid) == 2, "six configurations in two groups of three"
    assert len(searcher.completed) == 6 and sorted(it for _, it in searcher.results) == [1] * 6
    final = sorted(r["val_loss"] for r in searcher.completed.values())
    assert final == sorted(frame["val_loss"]), "TPE learnt each member's own final value"
    assert sorted(frame["config/lr"]) == sorted(r["config"]["lr"] for r in searcher.completed.values())


SLOW_WORKLOAD = '''
import time
from examples.mlp_digits import DigitsMLP


class SlowDigits(DigitsMLP):
    def train_batches(self, config, seed):
        for batch in super().train_batches(config, seed):
            time.sleep(0.025)  # slow enough that the driver can be killed mid-sweep
            yield batch


workload = SlowDigits()
'''


def test_a_resumed_fused_sweep_keeps_what_finished_and_trains_the_rest(ray_local, tmp_path):
    (tmp_path / "slow_workload.py").write_text(SLOW_WORKLOAD)
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(textwrap.dedent(f"""
        name: killed_fused
        trainable: slow_workload:workload
        method: grid
        metric: {{name: val_loss, goal: minimize}}
        parameters:
          lr: {{values: [0.001, 0.003, 0.01, 0.03, 0.1, 0.3]}}
          width: {{value: 16}}
        max_iterations: 3
        storage_path: {tmp_path / "runs"}
        fusion: {{max_members: 2}}
        resources: {{cpu: 2}}
        logging: {{mlflow: {{tracking_uri: "file://{tmp_path / 'mlruns'}"}}}}
    """))
    address = ray_local.get_runtime_context().gcs_address
    # MLflow's logger is told of each member's start and end, and of no end of a member it never
    # saw start (one that finished before the kill): it would fail the resumed sweep.
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}:{Path(__file__).resolve().parents[1]}", "MLFLOW_ALLOW_FILE_STORE": "true"}
    members = tmp_path / "runs" / "killed_fused" / "members"
    command = [sys.executable, "-m", "hpo.cli", "run", str(sweep), "--address", address]

    driver = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + patience(180)
    while len(ended := list(members.glob("*/status.json"))) < 2 and time.time() < deadline:
        assert driver.poll() is None, "the sweep ended before it could be killed"
        time.sleep(0.05)
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    ended_by_kill = {path.parent.name for path in members.glob("*/status.json")}
    finished = {path.parent.name: (path.parent / "result.json").read_text() for path in ended}
    assert 2 <= len(finished) < 6, f"expected a half-finished sweep, finished: {sorted(finished)}"

    resumed = subprocess.run(command + ["--resume"], env=env, capture_output=True, text=True, timeout=patience(300))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    for member, history in finished.items():
        assert (members / member / "result.json").read_text() == history, f"{member} finished, and was trained again"
    rows = pd.read_csv(tmp_path / "runs" / "killed_fused" / "results.csv")
    assert sorted(rows["config/lr"]) == [0.001, 0.003, 0.01, 0.03, 0.1, 0.3], "every configuration has its row"
    assert (rows["status"] == "completed").all() and (rows["iterations"] == 3).all(), rows
    assert "fused_groups: 3 of 2 members each" in resumed.stdout.splitlines(), resumed.stdout
    lines = re.findall(r"^\[\s*(\d+)/6\] trial (\w+) finished", resumed.stdout, re.M)
    assert [int(n) for n, _ in lines] == list(range(len(ended_by_kill) + 1, 7)), f"the count goes on: {resumed.stdout}"
    assert not {member for _, member in lines} & ended_by_kill, "a member that ended before the kill is not printed again"
