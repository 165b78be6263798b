"""Fused groups inside a real Tune sweep: members stay trials, and train exactly as unfused."""

from __future__ import annotations

import textwrap

import pandas as pd
import pytest
import ray
from ray import tune

import hpo
from examples.mlp_digits import workload as digits
from hpo.sweep import build_tuner, load_sweep

pytestmark = pytest.mark.usefixtures("ray_local")

LRS = [1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1]
#: LRS from best to worst val_loss after one iteration. ASHA never stops the first result at a
#: rung, so results arriving worst-first (the grid's own order, for LRS) would stop nobody;
#: grid order best-first makes every order members are likely to report in stop someone.
LRS_BEST_FIRST = [3e-2, 1e-1, 1e-2, 3e-1, 3e-3, 1e-3]


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

    groups = ray.get(fused.actors[1].groups.remote())
    assert len(groups) >= 2 and all(len(g) <= 2 for g in groups), f"three configs in groups of at most two: {groups}"
    fused_frame = fused.get_dataframe().set_index("config/lr").sort_index()
    plain_frame = plain.get_dataframe().set_index("config/lr").sort_index()
    assert list(fused_frame.index) == lrs and (fused_frame["iterations"] == 3).all()
    relative = (fused_frame["val_loss"] - plain_frame["val_loss"]).abs() / plain_frame["val_loss"]
    assert relative.max() < 1e-4, relative
    assert fused.best_config["lr"] == plain.best_config["lr"]
    assert all(r.checkpoint is not None for r in fused.result_grid)


def test_yaml_fused_sweep_with_asha_gives_one_row_per_configuration(tmp_path):
    path = tmp_path / "fused.yaml"
    path.write_text(textwrap.dedent(f"""
        name: fused_asha
        trainable: mlp_digits
        method: grid
        metric: {{name: val_loss, goal: minimize}}
        parameters:
          lr: {{values: {LRS_BEST_FIRST}}}
          width: {{value: 16}}
        early_terminate: {{type: asha, min_iter: 1, eta: 3}}
        max_iterations: 3
        storage_path: {tmp_path / "runs"}
        fusion: {{enabled: true, max_members: 6}}
    """))
    result = build_tuner(load_sweep(path)).fit()
    frame = result.get_dataframe()
    assert len(frame) == 6
    assert set(frame["status"]) <= {"completed", "early_stopped"}
    assert (frame["status"] == "early_stopped").any(), "ASHA stops individual members"
    assert (frame["status"] == "completed").any()
    written = pd.read_csv(result.write()["results"])
    assert len(written) == 6
