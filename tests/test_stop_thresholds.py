"""`stop` thresholds end a trial by its own values, in the direction of the sweep's goal: a loss
threshold is reached from above, anything else as Tune reads it (at or above the value), and a
fused sweep stops each configuration exactly where the same sweep unfused stops it."""

from __future__ import annotations

import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st
from ray import tune

from examples.mlp_digits import workload as mlp_digits
from hpo.engines.stop_thresholds import Thresholds, ThresholdStopper, directed_stop, split_stop
from hpo.tuner.tuner import Tuner

values = st.floats(-1e6, 1e6, allow_nan=False)


def reached(stop, result, metric, mode):
    return Thresholds(stop, metric, mode).reached(result)


@given(value=values, threshold=values)
def test_a_threshold_on_a_minimised_metric_is_reached_from_above_and_any_other_from_below(value, threshold):
    assert reached({"loss": threshold}, {"loss": value}, "loss", "min") == (value <= threshold)
    assert reached({"loss": threshold}, {"loss": value}, "loss", "max") == (value >= threshold)
    assert reached({"acc": threshold}, {"acc": value, "loss": 0.0}, "loss", "min") == (value >= threshold)
    assert reached({"val/loss": threshold}, {"val": {"loss": value}}, "val/loss", "min") == (value <= threshold)


def test_a_key_the_result_lacks_reaches_nothing_and_is_said_once(caplog):
    thresholds = Thresholds({"los": 1.0, "acc": 0.5}, "loss", "min")
    for _ in range(3):
        assert not thresholds.reached({"loss": 0.1, "acc": "high", "training_iteration": 1})
    said = [r.getMessage() for r in caplog.records if "stop:" in r.getMessage()]
    assert said == ["warning: stop: 'los' is not in a trial's result (it reported: loss, acc); that threshold stops "
                    "no trial unless a later result has it"]
    assert not reached({"loss": 1.0}, {"loss": True}, "loss", "max")  # a bool is no number


def test_tune_is_given_every_dict_as_a_stopper_and_anything_else_as_it_is():
    stopper = directed_stop({"training_iteration": 4, "val_loss": 0.2}, "val_loss", "min")
    assert isinstance(stopper, ThresholdStopper) and not stopper.stop_all()
    assert stopper("t", {"training_iteration": 1, "val_loss": 0.1}) and stopper("t", {"training_iteration": 4, "val_loss": 3.0})
    assert not stopper("t", {"training_iteration": 2, "val_loss": 0.3})
    assert directed_stop({"val_acc": 0.9}, "val_acc", "max")("t", {"val_acc": 0.95})
    assert directed_stop(None, "val_loss", "min") is None
    own = ThresholdStopper({}, None, "min")
    assert directed_stop(own, "val_loss", "min") is own


def test_a_fused_group_stops_by_tunes_counters_and_its_members_by_what_they_report():
    stop = {"training_iteration": 8, "time_total_s": 60, "val_loss": 0.2, "val/acc": 0.9}
    assert split_stop(stop) == ({"training_iteration": 8, "time_total_s": 60}, {"val_loss": 0.2, "val/acc": 0.9}, None)
    assert split_stop({"val_loss": 0.2}) == (None, {"val_loss": 0.2}, None)  # the group trains to max_iterations
    assert split_stop(None) == (None, {}, None)


def _sweep(tmp_path, name: str, fusion) -> dict:
    """Each configuration's (iterations, status, final val_loss) in a 4-configuration grid."""
    result = Tuner(
        mlp_digits,
        param_space={"lr": tune.grid_search([3e-4, 3e-3, 3e-2, 1e-1]), "width": 16, "seed": 0},
        tune_config=tune.TuneConfig(metric="val_loss", mode="min"),
        run_config=tune.RunConfig(name=name, storage_path=str(tmp_path), stop={"training_iteration": 5, "val_loss": 0.6}),
        fusion=fusion,
    ).fit()
    rows = pd.read_csv(result.paths["results"])
    return {row["config/lr"]: (row["training_iteration"], row["status"], row["val_loss"]) for _, row in rows.iterrows()}


@pytest.mark.slow
@pytest.mark.usefixtures("ray_local")
def test_a_loss_threshold_stops_each_configuration_where_it_reaches_it_fused_or_not(tmp_path):
    plain = _sweep(tmp_path, "plain", None)
    fused = _sweep(tmp_path, "fused", {"max_members": 4})
    assert set(plain) == set(fused) and len(plain) == 4
    for lr, (iterations, status, loss) in plain.items():
        # stopped at the first report at or under the threshold, else trained to the end
        assert (iterations, status) == (5, "completed") if loss > 0.6 else iterations == 5 or status == "early_stopped"
        assert fused[lr][:2] == (iterations, status) and fused[lr][2] == pytest.approx(loss, rel=1e-4), (lr, fused[lr])
    assert any(iterations < 5 for iterations, _, _ in plain.values()), "no configuration reached the threshold early"
    assert any(loss > 0.6 for _, _, loss in plain.values()), "every configuration reached the threshold"
