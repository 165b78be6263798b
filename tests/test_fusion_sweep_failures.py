"""A configuration whose own code fails fails alone, fused or not: the other members of its group
train on and end as they end unfused."""

from __future__ import annotations

import pandas as pd
import pytest
from ray import tune

import hpo
from examples.mlp_digits import DigitsMLP

pytestmark = [pytest.mark.usefixtures("ray_local"), pytest.mark.slow]


class RefusingDigits(DigitsMLP):
    """The digits MLP whose model factory refuses one learning rate, as a user's factory that
    validates its config does."""

    def build_model(self, config):
        if config["lr"] == 0.1:
            raise ValueError("lr 0.1 is refused by the model factory")
        return super().build_model(config)


def sweep(tmp_path, name: str, fusion) -> dict:
    result = hpo.run(
        RefusingDigits(), config={"lr": tune.grid_search([1e-3, 1e-2, 1e-1, 3e-2]), "width": 16, "seed": 3},
        metric="val_loss", mode="min", stop={"training_iteration": 2}, max_failures=1,
        storage_path=str(tmp_path), name=name, fusion=fusion, verbose=0,
    )
    rows = pd.read_csv(result.paths["results"]).fillna({"training_iteration": 0})
    return {row["config/lr"]: (row["training_iteration"], row["status"], row["error"]) for _, row in rows.iterrows()}


def test_a_factory_that_refuses_one_configuration_errors_that_member_alone(tmp_path):
    plain = sweep(tmp_path, "plain", None)
    fused = sweep(tmp_path, "fused", {"max_members": 4})
    assert {lr: row[:2] for lr, row in fused.items()} == {lr: row[:2] for lr, row in plain.items()}
    assert plain[0.1][1] == "error" and [lr for lr, row in plain.items() if row[1] == "error"] == [0.1]
    assert fused[0.1][2] == "ValueError: lr 0.1 is refused by the model factory"
