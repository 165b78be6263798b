"""A sweep with `scaling:` tunes the muP proxy and writes the transferred target config."""

from __future__ import annotations

import json
import textwrap

import pytest

from hpo.cli import main
from hpo.sweep import build_tuner, load_sweep

pytestmark = [pytest.mark.usefixtures("ray_local"), pytest.mark.slow]

SWEEP = """
name: {name}
trainable: mlp_digits
method: grid
metric: {{name: val_loss, goal: minimize}}
parameters:
  lr: {{values: [0.003, 0.03]}}
  depth: {{value: 2}}
max_iterations: 2
storage_path: {storage}
scaling: {scaling}
"""


def write(tmp_path, name, scaling):
    path = tmp_path / f"{name}.yaml"
    path.write_text(textwrap.dedent(SWEEP.format(name=name, storage=tmp_path / "runs", scaling=scaling)))
    return path


def test_proxy_sweep_transfers_its_best_config_and_trains_the_target(tmp_path):
    path = write(tmp_path, "scaled", "{target_width: 128, ratio: 4, final_training: true}")
    result = build_tuner(load_sweep(path)).fit()
    assert set(result.get_dataframe()["config/lr"]) == {0.003, 0.03}
    transfer = json.loads((tmp_path / "runs" / "scaled" / "transfer.json").read_text())
    assert transfer["proxy_config"]["width"] == 32 and transfer["target_config"]["width"] == 128
    assert transfer["target_config"]["lr"] == result.best_config["lr"]
    assert "lr" in transfer["transferred"]
    assert transfer["target_run"]["iterations"] == 2
    assert transfer["target_run"]["value"] < 2.3, "the transferred config trains the target"


def test_eager_transfer_reports_time_to_first_target_result(tmp_path):
    path = write(tmp_path, "eager", "{target_width: 64, proxy_width: 16, eager_transfer: 0.5}")
    result = build_tuner(load_sweep(path)).fit()
    eager = result.extras["eager transfer"]
    assert eager["time_to_first_target_result_s"] is not None and eager["time_to_first_target_result_s"] > 0
    assert "target (eager)" in result.extras


def test_scaling_block_errors_name_the_key(tmp_path, capsys):
    path = write(tmp_path, "bad", "{target_width: 128, ratio: 4, proxy_widht: 32}")
    assert main(["validate", str(path)]) == 2
    assert "scaling.proxy_widht" in capsys.readouterr().err
