"""How a scaled sweep ends, by how its proxy sweep and its target ended: the transfer and the target
run happen once the proxy sweep is complete, and the report, `summary.json`, `hpo results` and the
exit status say what became of the target. Tune's grid is given by hand (no Ray): these specify
what the `Tuner` makes of it."""

from __future__ import annotations

import json
import math
import pickle
import re
import signal
import time
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
from ray import tune
from ray.tune import Result

from examples.mlp_digits import DigitsMLP
from examples.mlp_digits import workload as mlp_digits
from hpo.cli import main
from hpo.reporting import console
from hpo.reporting.results_files import SUMMARY_FILE
from hpo.scaling._transfer import TARGET_CHECKPOINT_DIR
from hpo.tuner.stop_signal import StopRequest
from hpo.tuner.tuner import Tuner

NAME = "scaled"
PROXY_WIDTH, TARGET_WIDTH = 16, 32


class Grid(list):
    """Tune's `ResultGrid` as the `Tuner` reads it: the results, and where the run is."""

    def __init__(self, results, experiment_path):
        super().__init__(results)
        self.experiment_path = str(experiment_path)


def proxy_result(run: Path, index: int, config: dict, value: float, *, done: bool = True) -> Result:
    folder = run / f"proxy_{index}"
    folder.mkdir(parents=True)
    metrics = {"val_loss": value, "training_iteration": 2 if done else 1, "done": done, "diverged": not math.isfinite(value),
               "trial_id": f"t{index}", "config": config}
    history = pd.DataFrame([{"training_iteration": 1, "val_loss": value}])
    return Result(metrics=metrics, checkpoint=None, error=None, path=str(folder), metrics_dataframe=history)


def scaled_tuner(tmp_path, workload=mlp_digits, **scaling) -> Tuner:
    return Tuner(
        workload,
        param_space={"lr": tune.grid_search([1e-2, 3e-2]), "steps_per_iteration": 2},
        tune_config=tune.TuneConfig(metric="val_loss", mode="min"),
        run_config=tune.RunConfig(name=NAME, storage_path=str(tmp_path), stop={"training_iteration": 2}),
        scaling={"target_width": TARGET_WIDTH, "proxy_width": PROXY_WIDTH, "final_training": True, **scaling},
    )


def end(tuner: Tuner, tmp_path, outcomes, *, stopped: bool = False):
    """The sweep's result once Tune returned `outcomes` ((config, value, done) per proxy trial)."""
    run = tmp_path / NAME
    grid = Grid([proxy_result(run, i, {"steps_per_iteration": 2, **config}, value, done=done)
                 for i, (config, value, done) in enumerate(outcomes)], run)
    stop = StopRequest()  # as the CLI's fit leaves it: watched, and Ctrl-C pressed where `stopped`
    stop.watched, stop.signum = True, signal.SIGINT if stopped else None
    return tuner._wrap(grid, [None], time.monotonic(), stop)


def report(result, capsys) -> tuple[str, str, str]:
    verdict = console.report(result, "hpo run sweep.yaml --resume")
    out, err = capsys.readouterr()
    return verdict, out, err


def test_a_proxy_sweep_stopped_before_its_end_transfers_nothing_and_trains_no_target(tmp_path, capsys):
    """Ctrl-C during the proxy trials: the target was trained with the best of the trials so far
    (hours, for a real target, after the user asked to stop), and `--resume` trained it again."""
    result = end(scaled_tuner(tmp_path), tmp_path, [({"lr": 1e-2}, 1.0, True), ({"lr": 3e-2}, 2.0, False)], stopped=True)
    assert not (tmp_path / NAME / TARGET_CHECKPOINT_DIR).exists() and result.target_checkpoint is None
    assert not (tmp_path / NAME / "transfer.json").exists(), "transfer.json is the complete sweep's"
    verdict, out, err = report(result, capsys)
    assert verdict == console.INTERRUPTED
    assert f"target: not trained: the proxy sweep was stopped before its end; --resume trains it" in out


def test_a_proxy_sweep_without_a_finished_trial_reports_it_in_one_line_and_writes_its_files(tmp_path, capsys):
    """Every proxy trial diverged: `hpo run` ended in a RuntimeError traceback, before results.csv and
    summary.json were written."""
    result = end(scaled_tuner(tmp_path), tmp_path, [({"lr": 1e-2}, math.nan, True), ({"lr": 3e-2}, math.nan, True)])
    assert (tmp_path / NAME / SUMMARY_FILE).is_file()
    assert not (tmp_path / NAME / "transfer.json").exists() and result.target_checkpoint is None
    verdict, out, err = report(result, capsys)
    assert verdict == console.NO_RESULT
    assert "target: not trained: no proxy trial finished with val_loss" in out


def test_a_target_that_diverges_is_an_error_of_the_sweep_in_hpo_run_and_hpo_results(tmp_path, capsys):
    """The target's val_loss was NaN: the report said `target: val_loss = nan after 1 iterations`
    among its notes and `hpo run` exited 0."""
    result = end(scaled_tuner(tmp_path), tmp_path, [({"lr": 1e-2, "optimizer": "sgd"}, 1.0, True),
                                                     ({"lr": 1e12, "optimizer": "sgd"}, 0.5, True)])
    verdict, out, err = report(result, capsys)
    assert verdict == console.ERRORED
    [line] = err.strip().splitlines()
    assert line.startswith(f"error: the target (width {TARGET_WIDTH}) diverged at iteration 1 (val_loss = nan)"), err
    summary = json.loads((tmp_path / NAME / SUMMARY_FILE).read_text())
    assert summary["target"]["status"] == "diverged" and summary["target"]["error"] in line
    assert main(["results", str(tmp_path / NAME)]) == 3
    out, err = capsys.readouterr()
    assert err.strip() == line, "hpo results exits and says as hpo run did"


class FailsAtTargetWidth(DigitsMLP):
    def train_batches(self, config, seed):
        if config["width"] == TARGET_WIDTH:
            raise MemoryError(f"no room for width {TARGET_WIDTH}")
        return super().train_batches(config, seed)


def test_a_target_whose_training_raises_is_one_line_and_keeps_the_transfer(tmp_path, capsys):
    """Training the target raised: the exception went out of `hpo run` as a traceback (exit 1, the
    code for 'no trial reported the metric'), and the report was never printed."""
    result = end(scaled_tuner(tmp_path, FailsAtTargetWidth()), tmp_path, [({"lr": 1e-2}, 1.0, True)])
    verdict, out, err = report(result, capsys)
    assert verdict == console.ERRORED
    [line] = err.strip().splitlines()
    assert line.startswith(f"error: the target (width {TARGET_WIDTH}) failed: MemoryError: no room for width {TARGET_WIDTH} ("), err
    assert (tmp_path / NAME / "transfer.json").is_file(), "the transfer survives a failed target"


def test_summary_json_and_hpo_results_say_what_the_target_is_and_how_it_trained(tmp_path, capsys):
    """summary.json held the proxy's best alone, and `hpo results` printed nothing of the target: its
    sizes, its config, what does not transfer, its metric and where it is saved."""
    result = end(scaled_tuner(tmp_path), tmp_path, [({"lr": 1e-2, "weight_decay": 0.01}, 1.0, True)])
    assert report(result, capsys)[0] == console.OK
    target = json.loads((tmp_path / NAME / SUMMARY_FILE).read_text())["target"]
    assert target["proxy"] == {"width": PROXY_WIDTH} and target["target"] == {"width": TARGET_WIDTH}
    assert target["config"]["width"] == TARGET_WIDTH and target["config"]["lr"] == 1e-2
    assert target["status"] == "completed" and target["iterations"] == 2 and math.isfinite(target["value"])
    assert target["flagged"] == ["weight_decay"]
    assert target["checkpoint"] == str(tmp_path / NAME / TARGET_CHECKPOINT_DIR)
    assert main(["results", str(tmp_path / NAME)]) == 0
    out = capsys.readouterr().out
    assert f"target: val_loss = {target['value']:.4g} after 2 iterations" in out.splitlines()
    assert f"target checkpoint: {target['checkpoint']}" in out.splitlines()
    assert "re-tune on the target (does not transfer): ['weight_decay']" in out.splitlines()


def test_a_resumed_eager_sweep_trains_its_target_once_after_the_proxy_sweep(tmp_path, capsys):
    """`--resume` of an `eager_transfer` sweep: Tune restores the callbacks it pickled in tuner.pkl, so
    the engine's own eager callback never heard of the sweep, and the resumed sweep ended in
    `RuntimeError: EagerTransferCallback.setup() has not run` (a traceback, no report), while the
    restored copy could start a second target beside the proxy trials."""
    tuner = scaled_tuner(tmp_path, final_training=False, eager_transfer=0.5)
    tuner.engine.start(tmp_path / NAME, tuner.tune_config, tuner.run_config)
    restored = pickle.loads(pickle.dumps(tuner.engine.eager))  # what Tune's restore runs instead
    result = end(tuner, tmp_path, [({"lr": 1e-2}, 1.0, True), ({"lr": 3e-2}, 2.0, True)])
    verdict, out, err = report(result, capsys)
    assert verdict == console.OK, err
    assert re.search(r"^target: val_loss = [\d.]+ after 2 iterations$", out, re.M), out
    assert (tmp_path / NAME / TARGET_CHECKPOINT_DIR).is_dir()
    restored.setup(total_num_samples=2)
    trial = SimpleNamespace(trial_id="t0", config={"lr": 1e-2}, last_result={"val_loss": 1.0}, status="TERMINATED")
    restored.on_trial_complete(0, [trial], trial)
    restored.on_step_end(1, [trial])
    assert restored._actor is None and not restored.starts, "the restored copy trains no second target"
