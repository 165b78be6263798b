"""What `hpo run` and `hpo.run` print around a sweep (issue 34, items 3-5): the report, and none of
Tune's, Ray's or Optuna's noise."""

from __future__ import annotations

import io
import logging
import math
import warnings

import pandas as pd
from ray import tune

from hpo.reporting import console
from hpo.reporting.sweep_result import SweepResult


def sweep_result(folder, histories: dict[str, list[float]]) -> SweepResult:
    """A finished sweep of trials that reported `histories` (an empty one reported nothing)."""
    results = []
    for trial_id, values in histories.items():
        frame = pd.DataFrame({"loss": values, "training_iteration": range(1, len(values) + 1)}) if values else None
        metrics = {"trial_id": trial_id, "config": {"lr": len(values)}, "done": True}
        if values:
            metrics.update(loss=values[-1], training_iteration=len(values))
        results.append(tune.Result(metrics=metrics, checkpoint=None, error=None if values else RuntimeError("KeyError: 'x'"),
                                   path=str(folder / trial_id), metrics_dataframe=frame))
    result = SweepResult(None, "loss", "min", None, results=results)
    result.paths = result.write(folder)
    return result


def test_a_run_without_results_draws_no_empty_plot_and_says_so(tmp_path):
    result = sweep_result(tmp_path, {"t1": [], "t2": []})
    out, err = io.StringIO(), io.StringIO()
    assert console.report(result, "hpo run sweep.yaml --resume", out, err) == console.ERRORED
    assert not (tmp_path / "curves.png").exists()
    assert "plot:    none: no trial reported 'loss'" in out.getvalue()
    assert err.getvalue().startswith("error: 2 of 2 trials errored; first: KeyError: 'x'")


def test_the_tensorboard_hint_names_the_sweeps_folder(tmp_path):
    result = sweep_result(tmp_path, {"t1": [0.5, 0.4]})
    (tmp_path / "t1").mkdir()
    (tmp_path / "t1" / "events.out.tfevents.1.host").write_bytes(b"")  # Tune's TensorBoard logger writes these
    out = io.StringIO()
    assert console.report(result, "", out, io.StringIO()) == console.OK
    assert f"plot:    {tmp_path / 'curves.png'} (or: tensorboard --logdir {tmp_path})" in out.getvalue()


def test_quiet_tune_keeps_optunas_repeated_step_warning_and_tunes_failure_records_off_then_puts_them_back():
    import optuna

    trial = optuna.create_study().ask()
    trial.report(1.0, 4)

    def reported_again() -> list:  # a resumed trial reports an iteration again: Optuna keeps the first value
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", append=True)  # below the filters in force
            trial.report(1.0, 4)
        return [str(w.message) for w in caught]

    controller = logging.getLogger("ray.tune.execution.tune_controller")
    failure = logging.LogRecord(controller.name, logging.ERROR, "", 0, "Trial task failed for trial %s", ("t",), None)
    before = (reported_again(), controller.filter(failure))  # as this process had them (`hpo.cli.main` quiets for good)
    restore = console.quiet_tune()
    try:
        assert reported_again() == []
        assert not controller.filter(failure), "TrialErrorCallback says it shorter"
    finally:
        restore()
    assert (reported_again(), controller.filter(failure)) == before


# -- SweepResult takes ResultGrid's arguments (issue 34, item 3) ------------------------------------


def test_get_best_result_takes_tunes_scope(tmp_path):
    result = sweep_result(tmp_path, {"steady": [0.5, 0.5, 0.5], "spiky": [0.9, 0.1, 0.8], "late": [0.9, 0.9, 0.4]})
    assert result.get_best_result().metrics["trial_id"] == "late"  # by the last value, Tune's default
    assert result.get_best_result(scope="last").metrics["trial_id"] == "late"
    assert result.get_best_result(scope="all").metrics["trial_id"] == "spiky"  # its best value, 0.1
    assert result.get_best_result(scope="avg").metrics["trial_id"] == "steady"  # 0.5 against 0.6 and 0.73
    assert result.get_best_result("loss", "max", scope="last-5-avg").metrics["trial_id"] == "late"


def test_get_best_result_ranks_an_infinite_value_only_when_tunes_filter_nan_and_inf_is_off(tmp_path):
    result = sweep_result(tmp_path, {"fine": [0.5, 0.3], "diverged": [0.4, -math.inf], "nan": [0.2, math.nan]})
    assert result.get_best_result().metrics["trial_id"] == "fine"
    assert result.get_best_result(filter_nan_and_inf=True).metrics["trial_id"] == "fine"
    assert result.get_best_result(filter_nan_and_inf=False).metrics["trial_id"] == "diverged"
    assert result.get_best_result(mode="max", filter_nan_and_inf=False).metrics["trial_id"] == "fine"
    assert result.get_best_result(scope="all", filter_nan_and_inf=False).metrics["trial_id"] == "diverged"


def test_get_dataframe_filters_each_trial_to_its_best_result_as_result_grid_does(tmp_path):
    result = sweep_result(tmp_path, {"spiky": [0.9, 0.1, 0.8], "late": [0.9, 0.9, 0.4]})
    last = result.get_dataframe().set_index("trial_id")
    best = result.get_dataframe(filter_metric="loss", filter_mode="min").set_index("trial_id")
    assert (last.loc["spiky", "loss"], best.loc["spiky", "loss"]) == (0.8, 0.1)
    assert best.loc["spiky", "iterations"] == 2 and best.loc["spiky", "status"] == last.loc["spiky", "status"]
    assert result.get_dataframe(filter_metric="loss", filter_mode="max").set_index("trial_id").loc["late", "loss"] == 0.9


def test_writing_the_plot_leaves_the_processes_matplotlib_as_it_was(tmp_path):
    """`hpo.run` in a notebook draws its plot without choosing pyplot's backend for the whole
    process or leaving a figure open in it."""
    import matplotlib
    import matplotlib.pyplot as plt

    before = matplotlib.get_backend()
    matplotlib.use("svg")  # a backend of the user's that is not the one a PNG is drawn with
    try:
        figures = plt.get_fignums()
        sweep_result(tmp_path, {"t1": [0.5, 0.4], "t2": [0.6, 0.7]})
        assert (tmp_path / "curves.png").read_bytes().startswith(b"\x89PNG")
        assert matplotlib.get_backend() == "svg"
        assert plt.get_fignums() == figures
    finally:
        matplotlib.use(before)


def test_the_best_configuration_reads_as_the_user_wrote_its_names():
    assert console.config_text({"ß": 1, "名前": "ünï"}) == '{"ß": 1, "名前": "ünï"}'
