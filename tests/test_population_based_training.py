"""Population-based training through `hpo.run`: its exploit step hands a trial another trial's
newest checkpoint, restored only when that trial runs again, so no checkpoint a trial wrote may
be deleted before the sweep ends."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pandas as pd
import pytest
from ray import tune
from ray.tune.schedulers import PopulationBasedTraining

import hpo

ITERATIONS = 8


def checkpointing(config):
    start = 0
    if checkpoint := tune.get_checkpoint():
        with checkpoint.as_directory() as folder:
            start = json.loads(Path(folder, "state.json").read_text())["iteration"]
    for iteration in range(start, ITERATIONS):
        with tempfile.TemporaryDirectory() as folder:
            Path(folder, "state.json").write_text(json.dumps({"iteration": iteration + 1}))
            tune.report({"loss": (config["lr"] - 0.01) ** 2 + 1 / (iteration + 1)},
                        checkpoint=tune.Checkpoint.from_directory(folder))


@pytest.mark.slow
@pytest.mark.usefixtures("ray_local")
def test_a_pbt_sweep_keeps_every_checkpoint_its_exploits_may_restore(tmp_path):
    scheduler = PopulationBasedTraining(time_attr="training_iteration", perturbation_interval=1,
                                        hyperparam_mutations={"lr": tune.loguniform(1e-4, 1e-1)})
    result = hpo.run(checkpointing, config={"lr": tune.loguniform(1e-4, 1e-1)}, metric="loss", mode="min",
                     num_samples=4, scheduler=scheduler, storage_path=str(tmp_path), name="pbt", verbose=0)
    rows = pd.read_csv(result.paths["results"])
    assert result.num_errors == 0 and (rows["status"] == "completed").all(), rows[["status", "iterations", "error"]]
    assert (rows["iterations"] == ITERATIONS).all()
    trials = list((tmp_path / "pbt").glob("checkpointing_*"))
    assert len(trials) == 4
    for trial in trials:  # a checkpoint per report, none deleted: numbered 0, 1, ... to the newest
        kept = sorted(p.name for p in trial.glob("checkpoint_*"))
        assert len(kept) >= 2 and kept == [f"checkpoint_{n:06d}" for n in range(len(kept))], kept
