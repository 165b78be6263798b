"""Transfer: the target config carries the proxy's muP-transferable values and flags the rest."""

import json
import math
from pathlib import Path

import pytest

from examples.mlp_digits import workload as mlp_digits
from hpo.scaling import NON_TRANSFERABLE, ScalingConfig, complete_transfer, target_workload, transfer_config

SCALING = ScalingConfig(target_width=256, ratio=4)
BEST_PROXY = {
    "width": 64,
    "lr": 0.0123,
    "beta1": 0.85,
    "init_std": 0.02,
    "output_mult": 2.0,
    "lr_schedule": "cosine",
    "weight_decay": 0.1,
    "dropout": 0.2,
    "batch_size": 64,
    "depth": 2,
    "my_knob": 3,
}


def test_transferred_config_has_the_proxys_transferable_values_at_the_target_width():
    result = transfer_config(BEST_PROXY, SCALING)
    assert result.target_config["width"] == 256
    for key in ("lr", "beta1", "init_std", "output_mult", "lr_schedule"):
        assert result.target_config[key] == BEST_PROXY[key], f"{key} should transfer unchanged"
        assert key in result.transferred


def test_non_transferable_keys_are_flagged_with_a_reason():
    result = transfer_config(BEST_PROXY, SCALING)
    assert set(result.flagged) == {"weight_decay", "dropout", "batch_size"}
    assert result.flagged["weight_decay"] == NON_TRANSFERABLE["weight_decay"]
    assert result.kept == ["depth"]
    assert set(result.unknown) == {"my_knob"}


def test_a_config_from_another_width_is_refused():
    with pytest.raises(ValueError, match="width 128, but scaling.proxy is 64"):
        transfer_config({**BEST_PROXY, "width": 128}, SCALING)


def test_transfer_json_holds_both_configs_and_the_flags(tmp_path):
    path = transfer_config(BEST_PROXY, SCALING, metric="val_loss", proxy_metric=0.5).write_json(tmp_path)
    written = json.loads(path.read_text())
    assert path.name == "transfer.json"
    assert written["proxy_config"]["width"] == 64 and written["target_config"]["width"] == 256
    assert "dropout" in written["flagged"] and written["proxy_metric"] == 0.5


def test_final_training_trains_the_target_with_the_transferred_config_and_reports_its_metric(tmp_path):
    scaling = ScalingConfig(target_width=32, ratio=2, final_training=True)
    best = {"width": 16, "lr": 0.01, "steps_per_iteration": 3}
    result = complete_transfer(mlp_digits, scaling, best, tmp_path, max_iterations=2, metric="val_loss")
    run = result.target_run
    assert run.iterations == 2 and run.config["width"] == 32 and run.config["lr"] == 0.01
    assert math.isfinite(run.value) and run.metric == "val_loss"
    assert json.loads((tmp_path / "transfer.json").read_text())["target_run"]["value"] == run.value


def test_the_trained_target_is_saved_and_loads_back_with_the_same_metric(tmp_path):
    import torch

    from hpo.base.checkpointing import CHECKPOINT_FILE
    from hpo.base.training import TrialTrainer

    scaling = ScalingConfig(target_width=32, ratio=2, final_training=True)
    best = {"width": 16, "lr": 0.01, "steps_per_iteration": 3}
    run = complete_transfer(mlp_digits, scaling, best, tmp_path, max_iterations=2, metric="val_loss").target_run
    assert run.checkpoint == str(tmp_path / "target_checkpoint")
    assert json.loads((tmp_path / "transfer.json").read_text())["target_run"]["checkpoint"] == run.checkpoint
    torch.load(Path(run.checkpoint) / CHECKPOINT_FILE, weights_only=True)  # plain tensors and values only
    restored = TrialTrainer(target_workload(mlp_digits, scaling), run.config)
    restored.restore(run.checkpoint)
    assert restored.iteration == 2
    assert restored.evaluate()["val_loss"] == pytest.approx(run.value)


def test_depth_transfer_sets_the_targets_depth_and_says_how_each_dimension_scaled():
    scaling = ScalingConfig(target_width=256, ratio=4, target_depth=8, proxy_depth=2)
    result = transfer_config({"lr": 0.01, "residual_mult": 0.5, "n_layer": 2}, scaling, depth_key="n_layer")
    assert result.proxy_config == {"lr": 0.01, "residual_mult": 0.5, "n_layer": 2, "width": 64}
    assert result.target_config == {"lr": 0.01, "residual_mult": 0.5, "n_layer": 8, "width": 256}
    assert result.transferred == ["lr", "residual_mult"], "the user's branch multiplier transfers; hpo scales it"
    assert (result.proxy_depth, result.target_depth, result.base_depth) == (2, 8, 2)
    depth = result.scaled["depth"]
    assert (depth["key"], depth["alpha"], depth["parametrization"]) == ("n_layer", 1.0, "CompleteP (Dey et al. 2025)")
    assert depth["proxy_factors"] == {**depth["proxy_factors"], "residual_mult": 1.0, "hidden_adam_eps_factor": 1.0}
    assert depth["target_factors"] == {
        **depth["target_factors"], "residual_mult": 0.25, "hidden_adam_lr_factor": 1.0, "hidden_adam_eps_factor": 0.25,
    }
    assert result.scaled["width"]["proxy_width_mult"] == 0.25


def test_a_depth_only_transfer_keeps_the_width_and_needs_the_depth_key():
    scaling = ScalingConfig(target_depth=12, depth_ratio=3)
    result = transfer_config({"lr": 0.01, "width": 96}, scaling, depth_key="depth")
    assert result.target_config == {"lr": 0.01, "width": 96, "depth": 12}
    assert set(result.scaled) == {"depth"} and result.kept == ["width"]
    with pytest.raises(ValueError, match="needs the workload's depth_key"):
        transfer_config({"lr": 0.01}, scaling)
