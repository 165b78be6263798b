"""What the sweep's controller (`hpo:sweep:<name>`, the dashboard's and Prometheus' view) hears
from Tune, checked on the callback alone: no Ray."""

from __future__ import annotations

from types import SimpleNamespace

from hpo.reporting.dashboard_actor import ControllerCallback


class Recorder:
    """Stands for the controller actor: keeps what the callback sends."""

    def __init__(self):
        self.updates: list[tuple[dict, list]] = []
        self.update = SimpleNamespace(remote=lambda statuses, values=(): self.updates.append((dict(statuses), list(values))))
        self.end = SimpleNamespace(remote=lambda: None)


def trial(trial_id: str, status: str, loss: float | None = None) -> SimpleNamespace:
    return SimpleNamespace(trial_id=trial_id, status=status, last_result={} if loss is None else {"loss": loss})


def test_a_resumed_sweep_counts_the_trials_that_finished_before_and_their_best():
    """Tune restores a run's finished trials without a word to its callbacks: the resumed sweep's
    new controller counted only the trials that ended after the resume, and its best (the
    `hpo_best_metric` gauge) jumped to the best of those."""
    callback = ControllerCallback("resumed", "loss", "min")
    callback.actor = Recorder()
    trials = [trial("a", "TERMINATED", 1.0), trial("b", "ERROR"), trial("c", "PENDING")]
    callback.on_step_begin(0, trials)
    callback.on_trial_start(0, trials, trials[2])
    callback.on_trial_result(0, trials, trials[2], {"loss": 3.0})
    callback.on_experiment_end(trials)
    statuses, values = {}, []
    for sent, reported in callback.actor.updates:
        statuses.update(sent)
        values += reported
    assert statuses == {"a": "TERMINATED", "b": "ERROR", "c": "RUNNING"}
    assert sorted(values) == [(1.0, "a"), (3.0, "c")]
