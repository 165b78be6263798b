"""Faults during a sweep: nothing finished is lost, a crash costs at most the checkpoint interval,
and a sweep with errored trials never exits 0 or names an errored trial as its best."""

from __future__ import annotations

import os
import random
import signal
import textwrap
from pathlib import Path

import pandas as pd
import pytest
from ray import tune

import failing_trainables
import hpo
from examples.mlp_digits import DigitsMLP
from hpo.cli import EXIT_TRIALS_ERRORED, main

pytestmark = [pytest.mark.usefixtures("ray_local"), pytest.mark.slow]

ITERATIONS = 6
EVERY = 2


KILLS = 10


class KilledDigits(DigitsMLP):
    """The digits MLP whose training process SIGKILLs itself at each of `kill_steps` (absolute
    training steps of the group's data stream), once each, as a crashed group actor would."""

    name = "killed_digits"
    #: Half the digits MLP's epoch per iteration: what is measured is where each kill lands within
    #: an iteration and how much a restart trains again, in iterations; a shorter one costs each of
    #: the eleven trainings (one per kill, and the first) half the time.
    steps_per_iteration = DigitsMLP.steps_per_iteration // 2

    def __init__(self, markers: str, kill_steps: list[int]):
        self.markers = markers
        self.kill_steps = set(kill_steps)

    def train_batches(self, config, seed):
        for index, batch in enumerate(super().train_batches(config, seed)):
            marker = Path(self.markers, f"killed_at_{index}")
            if index in self.kill_steps and not marker.exists():
                marker.touch()
                os.kill(os.getpid(), signal.SIGKILL)
            yield batch


def test_a_group_actor_killed_at_10_random_points_costs_each_member_at_most_the_checkpoint_interval(tmp_path):
    """Each kill lands anywhere in an iteration (seeded); Tune restarts the group from its last
    checkpoint, rebuilt from the members' own checkpoints."""
    lrs = [1e-3, 3e-3, 1e-2, 3e-2]
    steps = ITERATIONS * KilledDigits.steps_per_iteration
    kill_steps = sorted(random.Random(7).sample(range(1, steps), KILLS))
    result = hpo.run(
        KilledDigits(str(tmp_path), kill_steps),
        config={"lr": tune.grid_search(lrs), "width": 16, "seed": 0},
        metric="val_loss",
        mode="min",
        stop={"training_iteration": ITERATIONS},
        storage_path=str(tmp_path),
        name="killed_group",
        max_failures=KILLS,
        # Unverified: verification (`test_fusion_guard`) builds a torch optimizer, whose first one in
        # a process imports torch._dynamo, about 2.7 s of CPU in each of the eleven group processes.
        fusion=hpo.FusionConfig(max_members=len(lrs), verify=False),
        resources_per_trial={"cpu": 2},  # one group slot: all four members in one group
        checkpoint={"every": EVERY},
    )
    assert len(list(tmp_path.glob("killed_at_*"))) == KILLS, "every kill landed"
    (group,) = result.result_grid  # Tune ran one trial: the group of all four members
    reported = list(group.metrics_dataframe["training_iteration"])
    restarts = [(before, after) for before, after in zip(reported, reported[1:]) if after <= before]
    assert restarts, f"the group was restarted from checkpoints: {reported}"
    for before, after in restarts:
        assert before - (after - 1) <= EVERY, f"a restart trained {before - after + 1} iterations again: {reported}"
    for member in result:
        assert list(member.metrics_dataframe["training_iteration"]) == list(range(1, ITERATIONS + 1))
    rows = pd.read_csv(tmp_path / "killed_group" / "results.csv")
    assert sorted(rows["config/lr"]) == lrs, "every configuration has its row"
    assert (rows["status"] == "completed").all(), rows[["config/lr", "status"]]


def run_grid_over_x(tmp_path, name: str, trainable: str, goal: str, max_failures: int, extra: str = "") -> int:
    """`hpo run` of a one-iteration grid over x in 0, 1, 2 (plus `extra` parameters) of a trainable
    of `failing_trainables`."""
    sweep = tmp_path / f"{name}.yaml"
    sweep.write_text(textwrap.dedent(f"""
        name: {name}
        trainable: failing_trainables:{trainable}
        method: grid
        metric: {{name: score, goal: {goal}}}
        parameters:
          x: {{values: [0, 1, 2]}}
          {extra}
        max_failures: {max_failures}
        max_iterations: 1
        storage_path: {tmp_path / "runs"}
    """))
    return main(["run", str(sweep)])


def test_a_sweep_with_an_errored_trial_exits_non_zero_and_its_best_is_a_finished_trial(tmp_path, capsys):
    status = run_grid_over_x(tmp_path, "errors", "always_fails_for_zero", "minimize", max_failures=0)
    out, err = capsys.readouterr()
    assert status == EXIT_TRIALS_ERRORED
    assert "1 of 3 trials errored" in err and "x must not be zero" in err and "error.txt" in err
    assert '"x": 1' in out, "the best is the best finished trial (x=1), never the errored x=0"
    rows = pd.read_csv(tmp_path / "runs" / "errors" / "results.csv").set_index("config/x")
    assert rows.loc[0, "status"] == "error" and rows.loc[1, "status"] == "completed"


def test_a_failure_repeated_before_the_first_report_is_not_retried_and_the_console_shows_the_users_frames(
        tmp_path, capsys):
    status = run_grid_over_x(tmp_path, "typo", "fails_before_reporting", "maximize", max_failures=3,
                             extra=f'markers: {{value: "{tmp_path}"}}')
    out, err = capsys.readouterr()
    assert status == EXIT_TRIALS_ERRORED
    rows = pd.read_csv(tmp_path / "runs" / "typo" / "results.csv").set_index("config/x")
    assert list(rows.loc[[0, 1, 2], "status"]) == ["error", "completed", "completed"], "x=1 was retried and reported"
    attempts = Path(rows.loc[0, "error_file"]).read_text().count("Failure # ")
    assert attempts == 2, f"the typo ran {attempts} times with max_failures 3: a repeat before any result ends it"
    assert f'File "{Path(failing_trainables.__file__)}", line ' in err and "KeyError: 'channels'" in err, err
    assert "site-packages/ray" not in err and "Trial task failed" not in err, "Ray's frames stay in error.txt"
    assert "failed again with the same error (attempt 2): KeyError: 'channels'; not retried" in err, err
    assert err.rstrip().splitlines()[-1].startswith("error: 1 of 3 trials errored; first: KeyError: 'channels'"), err


class CrashingCounter(tune.Trainable):
    """A Tune user's class trainable that saves its state: it crashes once, at its third iteration,
    and logs the iteration each restore goes on from."""

    def setup(self, config):
        self.steps, self.log = 0, Path(config["log"])

    def step(self):
        self.steps += 1
        marker = self.log.with_suffix(".crashed")
        if self.steps == 3 and not marker.exists():
            marker.touch()
            raise RuntimeError("crashed")
        return {"loss": 1.0 / self.steps}

    def save_checkpoint(self, checkpoint_dir):
        Path(checkpoint_dir, "iteration").write_text(str(self.steps))

    def load_checkpoint(self, checkpoint_dir):
        self.steps = int(Path(checkpoint_dir, "iteration").read_text())
        with self.log.open("a") as log:
            log.write(f"{self.steps}\n")


def test_a_class_trainables_crash_costs_at_most_the_checkpoint_interval_as_a_workloads_does(tmp_path):
    # the checkpoint policy reached only Workloads: a class trainable was never saved, and its
    # crashed trial began again from its first iteration
    log = tmp_path / "restores.log"
    result = hpo.run(CrashingCounter, config={"log": str(log)}, metric="loss", mode="min", stop={"training_iteration": 4},
                     max_failures=1, checkpoint={"every": EVERY}, storage_path=str(tmp_path), name="class", verbose=0)
    restores = log.read_text().split() if log.exists() else []
    assert restores == ["2"], "restored from its iteration-2 checkpoint, one iteration lost"
    (trial,) = result
    assert trial.metrics["training_iteration"] == 4 and trial.error is None
    assert Path(trial.checkpoint.path, "iteration").read_text() == "4", "and saved at its end"
