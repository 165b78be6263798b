"""Faults during a sweep: nothing finished is lost, a crash costs at most the checkpoint interval,
and a sweep with errored trials never exits 0 or names an errored trial as its best."""

from __future__ import annotations

import os
import signal
import textwrap
from pathlib import Path

import pandas as pd
import pytest
from ray import tune

import hpo
from examples.mlp_digits import DigitsMLP
from hpo.cli import EXIT_TRIALS_ERRORED, main

pytestmark = [pytest.mark.usefixtures("ray_local"), pytest.mark.slow]

ITERATIONS = 6
EVERY = 2


class KilledOnceDigits(DigitsMLP):
    """The digits MLP whose training process SIGKILLs itself once, in the middle of iteration 4
    (after the iteration-2 checkpoint and the iteration-3 report), as a crashed group actor would."""

    name = "killed_once_digits"

    def __init__(self, marker: str):
        self.marker = marker

    def train_batches(self, config, seed):
        for index, batch in enumerate(super().train_batches(config, seed)):
            if index == 3 * self.steps_per_iteration + 5 and not os.path.exists(self.marker):
                Path(self.marker).touch()
                os.kill(os.getpid(), signal.SIGKILL)
            yield batch


def test_a_killed_group_actor_costs_each_member_at_most_the_checkpoint_interval(tmp_path):
    lrs = [1e-3, 3e-3, 1e-2, 3e-2]
    result = hpo.run(
        KilledOnceDigits(str(tmp_path / "killed")),
        config={"lr": tune.grid_search(lrs), "width": 16, "seed": 0},
        metric="val_loss",
        mode="min",
        stop={"training_iteration": ITERATIONS},
        storage_path=str(tmp_path),
        name="killed_group",
        max_failures=1,
        fusion=hpo.FusionConfig(max_members=len(lrs)),
        resources_per_trial={"cpu": 2},  # one group slot: all four members in one group
        checkpoint={"every": EVERY},
    )
    assert (tmp_path / "killed").exists(), "the group actor was killed during the sweep"
    (group,) = result.result_grid  # Tune ran one trial: the group of all four members
    reported = list(group.metrics_dataframe["training_iteration"])
    redone = len(reported) - len(set(reported))
    assert 1 <= redone <= EVERY, f"the group resumed from its last checkpoint, trained again: {reported}"
    for member in result:
        assert list(member.metrics_dataframe["training_iteration"]) == list(range(1, ITERATIONS + 1))
    rows = pd.read_csv(tmp_path / "killed_group" / "results.csv")
    assert sorted(rows["config/lr"]) == lrs, "every configuration has its row"
    assert (rows["status"] == "completed").all(), rows[["config/lr", "status"]]


def always_fails_for_zero(config):
    if config["x"] == 0:
        raise ValueError("x must not be zero")
    tune.report({"score": float(config["x"])})


def test_a_sweep_with_an_errored_trial_exits_non_zero_and_its_best_is_a_finished_trial(tmp_path, capsys):
    sweep = tmp_path / "errors.yaml"
    sweep.write_text(textwrap.dedent(f"""
        name: errors
        trainable: test_sweep_faults:always_fails_for_zero
        method: grid
        metric: {{name: score, goal: minimize}}
        parameters:
          x: {{values: [0, 1, 2]}}
        max_failures: 0
        max_iterations: 1
        storage_path: {tmp_path / "runs"}
    """))
    status = main(["run", str(sweep)])
    out, err = capsys.readouterr()
    assert status == EXIT_TRIALS_ERRORED
    assert "1 of 3 trials errored" in err and "x must not be zero" in err and "error.txt" in err
    assert '"x": 1' in out, "the best is the best finished trial (x=1), never the errored x=0"
    rows = pd.read_csv(tmp_path / "runs" / "errors" / "results.csv").set_index("config/x")
    assert rows.loc[0, "status"] == "error" and rows.loc[1, "status"] == "completed"
