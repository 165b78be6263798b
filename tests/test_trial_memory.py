"""A finished trial costs the driver its results, not the windows its running means were kept in."""

from __future__ import annotations

from ray.tune.experiment import Trial

from hpo.tuner.trial_memory import ReleaseFinishedWindows


def reported(trial_id: str, scores: list[float]) -> Trial:
    trial = Trial("trainable", stub=True, config={"x": 1}, trial_id=trial_id)
    for step, score in enumerate(scores, start=1):
        trial.update_last_result({"score": score, "training_iteration": step})
    return trial


def test_a_finished_trial_keeps_its_analysis_and_saved_state_but_not_its_windows():
    trial = reported("done", [3.0, 1.0, 2.0])
    analysis = {metric: dict(values) for metric, values in trial.metric_analysis.items()}
    saved = trial.get_json_state()

    ReleaseFinishedWindows().on_trial_complete(0, [trial], trial)

    assert trial.metric_n_steps == {}
    assert trial.metric_analysis == analysis  # what the best result is ranked by, every scope
    assert trial.metric_analysis["score"]["last-5-avg"] == 2.0
    assert trial.get_json_state() == saved  # a resumed sweep reads the same state


def test_an_errored_trial_keeps_its_windows_for_the_results_of_its_retry():
    trial = reported("failed", [3.0, 1.0])
    callback = ReleaseFinishedWindows()

    callback.on_trial_error(0, [trial], trial)
    trial.update_last_result({"score": 0.5, "training_iteration": 3})

    assert list(trial.metric_n_steps["score"]["5"]) == [3.0, 1.0, 0.5]
    assert trial.metric_analysis["score"]["last-5-avg"] == 1.5
