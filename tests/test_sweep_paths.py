"""Where a sweep file's runs live: a relative `storage_path` is relative to the sweep file, so
`hpo run --resume` and `hpo results` find the run from any folder (issue 34, item 9)."""

from __future__ import annotations


import pytest

from hpo.cli import EXIT_BAD_INPUT, main
from hpo.reporting.results_files import TrialRecord, write_run_files
from hpo.config.sweep_file import load_sweep

SWEEP = """\
name: cnn
trainable: paths_trainable:train
method: grid
metric: {name: loss, goal: minimize}
parameters:
  lr: {values: [0.1, 0.2]}
storage_path: runs
"""


@pytest.fixture
def sweep(tmp_path, monkeypatch):
    """A sweep file in `sweeps/`, its trainable beside it, and the current folder somewhere else."""
    folder = tmp_path / "sweeps"
    folder.mkdir()
    (folder / "paths_trainable.py").write_text("def train(config):\n    pass\ntrain.reported_metrics = ('loss',)\n")
    path = folder / "cnn.yaml"
    path.write_text(SWEEP)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    return path


def stored_run(folder, loss: float) -> None:
    write_run_files(folder, [TrialRecord("t1", {"lr": 0.1}, {"loss": loss, "training_iteration": 1})], "loss", "min", None)


def test_a_relative_storage_path_is_beside_the_sweep_file_not_the_current_folder(sweep, capsys):
    assert load_sweep(sweep, execute=False).experiment_path == sweep.parent / "runs" / "cnn"
    assert main(["run", "--dry-run", str(sweep)]) == 0
    assert f"storage: {sweep.parent / 'runs' / 'cnn'}" in capsys.readouterr().out


def test_resume_from_another_folder_finds_the_run_beside_the_sweep_file(sweep, capsys):
    (sweep.parent / "runs" / "cnn" / "trial_0").mkdir(parents=True)
    (sweep.parent / "runs" / "cnn" / "trial_0" / "params.json").write_text("{}")
    assert main(["run", str(sweep), "--resume"]) == EXIT_BAD_INPUT  # found, and refused before Ray: no saved state
    err = capsys.readouterr().err
    assert f"error: {sweep.parent / 'runs' / 'cnn'}: no experiment_state-*.json" in err, err


def test_hpo_results_takes_the_sweep_file_and_shows_its_newest_run(sweep, capsys):
    stored_run(sweep.parent / "runs" / "cnn", 0.5)
    stored_run(sweep.parent / "runs" / "cnn-2", 0.25)
    assert main(["results", str(sweep)]) == 0
    out = capsys.readouterr().out
    assert "Best configuration (loss = 0.25)" in out
    assert f"results: {sweep.parent / 'runs' / 'cnn-2' / 'results.csv'}" in out


def test_hpo_results_of_a_sweep_file_that_never_ran_says_how_to_run_it(sweep, capsys):
    assert main(["results", str(sweep)]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert f"no run of sweep 'cnn' in {sweep.parent / 'runs'}; run it with: hpo run {sweep}" in err, err


def test_an_absolute_storage_path_is_taken_as_it_is(sweep, tmp_path):
    sweep.write_text(SWEEP.replace("storage_path: runs", f"storage_path: {tmp_path / 'store'}"))
    assert load_sweep(sweep, execute=False).experiment_path == tmp_path / "store" / "cnn"
