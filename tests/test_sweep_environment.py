"""A sweep has no process-wide side effects on the environment: what `hpo.run` sets for Tune (its
save period, pyarrow's IO pool) or W&B (offline mode) holds while the sweep runs and is put back
when it returns, so a plain Tune run later in the same process sees the user's environment."""

from __future__ import annotations

import os

import pyarrow
import pytest
from ray import tune

import hpo
from hpo.tuner.tuner import PROMPT_SAVE_MAX_TRIALS, SAVE_PERIOD_ENV, expected_trials
from hpo.config.logging_spec import as_logging_spec
from hpo.reporting.logging_callbacks import logger_callbacks
from hpo.base.scoped_environ import scoped_environ


class SeesThePeriod(tune.Callback):
    """Records the save period Tune's controller reads when the sweep starts."""

    def __init__(self) -> None:
        self.period: str | None = "not called"
        self.io_threads = 0

    def setup(self, **info) -> None:
        self.period = os.environ.get(SAVE_PERIOD_ENV)
        self.io_threads = pyarrow.io_thread_count()


def one_report(config):
    tune.report({"score": config["x"]})


def plain_tune_period(storage) -> str | None:
    """The save period a plain Tune run in this process reads."""
    seen = SeesThePeriod()
    tune.Tuner(one_report, param_space={"x": 1},
               run_config=tune.RunConfig(storage_path=str(storage), callbacks=[seen], verbose=0)).fit()
    return seen.period


@pytest.mark.slow
def test_hpo_run_sets_the_save_period_for_its_sweep_only(ray_local, tmp_path, monkeypatch):
    monkeypatch.delenv(SAVE_PERIOD_ENV, raising=False)
    assert plain_tune_period(tmp_path / "plain") is None  # also imports what a first Tune run imports
    before = dict(os.environ), pyarrow.io_thread_count()
    seen = SeesThePeriod()
    hpo.run(one_report, config={"x": tune.grid_search([1, 2])}, metric="score", mode="min",
            storage_path=str(tmp_path), name="small", callbacks=[seen])
    assert seen.period == "1", "a small sweep saves its state every second while it runs"
    assert seen.io_threads == 1, "its saves copy to the atomic filesystem from one IO thread"
    assert (dict(os.environ), pyarrow.io_thread_count()) == before
    assert plain_tune_period(tmp_path / "plain") is None, "a plain Tune run afterwards keeps Tune's own period"


def test_an_offline_wandb_sweep_needs_no_api_key_and_leaves_the_environment_alone(tmp_path, monkeypatch):
    for name in ("WANDB_MODE", "WANDB_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc key either
    before = dict(os.environ)
    (callback,) = logger_callbacks(as_logging_spec({"wandb": {"project": "p", "mode": "offline"}}), "s", tmp_path)
    callback.setup()
    assert dict(os.environ) == before


def test_scoped_environ_puts_back_what_was_set_and_unsets_what_was_not(monkeypatch):
    monkeypatch.setenv("HPO_TEST_SET", "user")
    monkeypatch.delenv("HPO_TEST_UNSET", raising=False)
    with pytest.raises(RuntimeError), scoped_environ({"HPO_TEST_SET": "sweep", "HPO_TEST_UNSET": "sweep"}):
        assert os.environ["HPO_TEST_SET"] == os.environ["HPO_TEST_UNSET"] == "sweep"
        raise RuntimeError("the sweep failed")
    assert os.environ["HPO_TEST_SET"] == "user" and "HPO_TEST_UNSET" not in os.environ


@pytest.mark.parametrize("space, samples, trials", [
    ({"x": tune.uniform(0, 1)}, 1000, 1000),
    ({"x": tune.grid_search([1, 2, 3]), "y": {"z": tune.grid_search([1, 2])}, "w": [1, 2]}, 2, 12),
    ({"x": tune.grid_search([1, 2])}, -1, float("inf")),
])
def test_expected_trials_counts_every_grid_combination_per_sample(space, samples, trials):
    assert expected_trials(space, samples) == trials


def test_only_small_sweeps_save_every_second(monkeypatch):
    """A save writes every trial's state; beyond PROMPT_SAVE_MAX_TRIALS Tune's own cost rule decides."""
    monkeypatch.delenv(SAVE_PERIOD_ENV, raising=False)
    small = hpo.Tuner(one_report, param_space={"x": tune.grid_search(list(range(PROMPT_SAVE_MAX_TRIALS)))})
    large = hpo.Tuner(one_report, param_space={"x": tune.uniform(0, 1)},
                      tune_config=tune.TuneConfig(num_samples=PROMPT_SAVE_MAX_TRIALS + 1))
    assert small._save_period() == {SAVE_PERIOD_ENV: "1"} and large._save_period() == {}
    monkeypatch.setenv(SAVE_PERIOD_ENV, "7")
    assert small._save_period() == {}, "the user's own period wins"
