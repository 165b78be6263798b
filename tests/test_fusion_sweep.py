"""Fused groups inside a real Tune sweep: members stay trials, and train exactly as unfused."""

from __future__ import annotations

import textwrap

import pandas as pd
import pytest
from ray import tune

import hpo
from examples.mlp_digits import workload as digits
from hpo.sweep import build_tuner, load_sweep

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
