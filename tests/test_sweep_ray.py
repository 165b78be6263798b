"""Sweeps on a real local Ray: results, failures and retries, dashboard visibility."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from ray import tune

from patience import patience

import hpo
from examples.mlp_digits import workload as digits

pytestmark = [pytest.mark.usefixtures("ray_local"), pytest.mark.slow]


def test_run_returns_best_config_and_one_row_per_configuration(tmp_path):
    result = hpo.run(
        digits,
        config={"lr": tune.grid_search([1e-4, 3e-2]), "width": 16},
        metric="val_loss",
        mode="min",
        stop={"training_iteration": 2},
        storage_path=str(tmp_path),
        name="basic",
    )
    frame = result.get_dataframe()
    assert len(frame) == 2
    assert set(frame.columns) >= {"trial_id", "config/lr", "config/width", "val_loss", "iterations", "status"}
    assert (frame["iterations"] == 2).all() and (frame["status"] == "completed").all()
    assert result.best_config["lr"] == pytest.approx(3e-2), "the larger lr learns far faster in two iterations"
    assert result.best_result.metrics["val_loss"] == frame["val_loss"].min()
    assert result.best_result.checkpoint is not None
    paths = result.write()
    assert paths["results"].read_text().count("\n") == 3
    assert paths["plot"].stat().st_size > 10_000


def two_reports(config):
    for _ in range(2):
        tune.report({"loss": config["x"]})


def test_a_function_that_ends_its_own_loop_early_has_completed_unless_something_could_stop_it(tmp_path):
    """Two reports under a 5-iteration stop: with no scheduler, the function ended itself; under
    ASHA, which stops trials, fewer iterations than the stop mean it was stopped early."""
    from ray.tune.schedulers import ASHAScheduler

    alone = hpo.run(two_reports, config={"x": tune.grid_search([1.0, 2.0])}, metric="loss", mode="min",
                    stop={"training_iteration": 5}, storage_path=str(tmp_path), name="alone")
    assert list(alone.get_dataframe()["status"]) == ["completed", "completed"]
    asha = hpo.run(two_reports, config={"x": tune.grid_search([1.0, 2.0])}, metric="loss", mode="min",
                   stop={"training_iteration": 5}, scheduler=ASHAScheduler(max_t=5, grace_period=1),
                   storage_path=str(tmp_path), name="asha")
    assert set(asha.get_dataframe()["status"]) == {"early_stopped"}

@pytest.mark.parametrize("configurations, iterations, seconds", [(6, 3, 0.0), (10, 4, 0.3)])
def test_trials_hyperband_stopped_while_paused_have_ended_and_the_sweep_was_not_interrupted(
        tmp_path, configurations, iterations, seconds):
    """HyperBand pauses a trial at its bracket's milestone and later stops it without resuming it,
    so the trial's last result lacks Tune's `done`, and Tune's saved state may still say PAUSED
    (it saves a trial it stops only if the trial has an actor; slower trials made it so): its row is
    `early_stopped`, not `running`, and the sweep that ran to its end is not reported as
    interrupted (which made `hpo run` exit 130)."""
    from ray.tune.schedulers import HyperBandScheduler

    result = hpo.run(
        slow_reports, config={"x": tune.grid_search([float(x) for x in range(1, configurations + 1)]),
                              "iterations": iterations, "seconds": seconds},
        metric="loss", mode="min", stop={"training_iteration": iterations},
        scheduler=HyperBandScheduler(max_t=iterations, reduction_factor=2),
        storage_path=str(tmp_path), name="hyperband", verbose=0,
    )
    frame = result.get_dataframe()
    assert not result.interrupted
    assert set(frame["status"]) <= {"completed", "early_stopped"}, frame
    assert (frame["iterations"] < iterations).any(), "HyperBand stopped some trials before the end"
    assert result.best_config["x"] == 1.0


def slow_reports(config):
    for step in range(config["iterations"]):
        time.sleep(config["seconds"])
        tune.report({"loss": config["x"] + 1.0 / (step + 1)})


def three_reports(config):
    for step in range(3):
        tune.report({"loss": config["x"] + 1.0 / (step + 1)})


def test_stop_takes_a_function_or_a_stopper_as_tune_run_does(tmp_path):
    """`stop=` is a dict, a function `(trial_id, result) -> bool` or a `tune.Stopper`, as in `tune.run`."""
    from ray.tune.stopper import MaximumIterationStopper

    by_function = hpo.run(three_reports, config={"x": tune.grid_search([1.0, 5.0])}, metric="loss", mode="min",
                          stop=lambda trial_id, result: result["loss"] < 5.0, storage_path=str(tmp_path),
                          name="function", verbose=0)
    assert sorted(by_function.get_dataframe()["iterations"]) == [1, 3], "x=1 stops at its first report"
    by_stopper = hpo.run(three_reports, config={"x": tune.grid_search([1.0, 5.0])}, metric="loss", mode="min",
                         stop=MaximumIterationStopper(2), storage_path=str(tmp_path), name="stopper", verbose=0)
    assert list(by_stopper.get_dataframe()["iterations"]) == [2, 2]


@pytest.mark.parametrize("resources, words", [({"cpu": 64}, "64 CPUs"), ({"cpu": 1, "gpu": 64}, "64 GPUs")])
def test_a_trial_larger_than_any_node_is_refused_instead_of_waiting_forever(tmp_path, resources, words):
    """Tune only warns (and hpo keeps its warnings off the console) while such a trial waits forever."""
    with pytest.raises(ValueError, match=f"a trial asks for {words} but the largest node of this Ray has"):
        hpo.run(three_reports, config={"x": 1.0}, metric="loss", mode="min", resources_per_trial=resources,
                storage_path=str(tmp_path), name="too_big", verbose=0)
    assert not (tmp_path / "too_big").exists(), "nothing ran"


class Quadratic(tune.Trainable):
    """A Tune user's class trainable as Tune's docs write one: no `reset_config` (Tune itself saves
    a class trainable that a stop condition ends, so it saves and loads)."""

    def setup(self, config):
        self.x, self.steps = config["x"], 0

    def step(self):
        self.steps += 1
        return {"score": (self.x - 1.0) ** 2 + 1.0 / self.steps}

    def save_checkpoint(self, checkpoint_dir):
        Path(checkpoint_dir, "steps").write_text(str(self.steps))

    def load_checkpoint(self, checkpoint_dir):
        self.steps = int(Path(checkpoint_dir, "steps").read_text())


def test_a_class_trainable_without_reset_config_runs_every_configuration(tmp_path):
    # hpo.run reused trial processes unconditionally: Tune then failed every trial handed a used
    # process ("Trainable runner reuse requires reset_config() to be implemented")
    result = hpo.run(Quadratic, config={"x": tune.grid_search([0.0, 1.0, 2.5])}, metric="score", mode="min",
                     stop={"training_iteration": 2}, storage_path=str(tmp_path), name="class", verbose=0)
    assert sorted(r.metrics["score"] for r in result) == pytest.approx([0.5, 1.5, 2.75])
    assert result.best_config == {"x": 1.0}


def test_tuner_mirrors_ray_tuner(tmp_path):
    tuner = hpo.Tuner(
        "mlp_digits",
        param_space={"lr": tune.loguniform(1e-3, 1e-1), "width": 16},
        tune_config=tune.TuneConfig(metric="val_accuracy", mode="max", num_samples=2),
        run_config=tune.RunConfig(name="tuner", storage_path=str(tmp_path), stop={"training_iteration": 1}),
    )
    result = tuner.fit()
    assert len(result.result_grid) == 2
    assert 0.0 <= result.best_result.metrics["val_accuracy"] <= 1.0


def flaky_trainable(config):
    """Raises on every attempt for bad=True; fails only the first attempt otherwise."""
    marker = Path(config["marker_dir"]) / f"attempt-{config['bad']}-{config['id']}"
    first_attempt = not marker.exists()
    marker.touch()
    if config["bad"]:
        raise ValueError("this configuration always fails")
    if first_attempt:
        raise RuntimeError("transient failure")
    tune.report({"score": float(config["id"])})


def test_a_failing_trial_is_reported_and_the_sweep_goes_on_with_retries(tmp_path):
    result = hpo.run(
        flaky_trainable,
        config={"bad": tune.grid_search([True, False]), "id": 1, "marker_dir": str(tmp_path)},
        metric="score",
        mode="max",
        max_failures=1,
        storage_path=str(tmp_path),
        name="flaky",
    )
    frame = result.get_dataframe().set_index("config/bad")
    assert frame.loc[True, "status"] == "error"
    assert "always fails" in frame.loc[True, "error"]
    assert frame.loc[False, "status"] == "completed", "one retry recovers the transient failure"
    assert result.best_config["bad"] is False


def prometheus_lines(port: int, name: str) -> list[str]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return [line for line in text.splitlines() if line.startswith(name) and 'sweep="visible"' in line]


def test_sweep_has_a_named_controller_and_exports_metrics_to_prometheus(ray_local, tmp_path):
    result = hpo.run(
        digits,
        config={"lr": tune.grid_search([1e-3, 1e-2]), "width": 16},
        metric="val_loss",
        mode="min",
        stop={"training_iteration": 1},
        storage_path=str(tmp_path),
        name="visible",
    )
    controller = ray_local.get_actor("hpo:sweep:visible", namespace="hpo")
    assert controller == result.controller
    summary = ray_local.get(controller.summary.remote())
    assert summary["finished"] == 2 and summary["running"] == 0
    assert summary["best"] == pytest.approx(result.best_result.metrics["val_loss"])

    port = ray_local.nodes()[0]["MetricsExportPort"]
    deadline = time.time() + patience(60)  # Ray exports metrics every 10 s
    finished: list[float] = []
    while 2.0 not in finished and time.time() < deadline:
        time.sleep(1)
        finished = [float(line.rsplit(" ", 1)[1]) for line in prometheus_lines(port, "ray_hpo_trials_finished")]
    assert 2.0 in finished, f"the node's Prometheus endpoint never showed 2 finished trials: {finished}"
    assert prometheus_lines(port, "ray_hpo_best_metric")


def report_then_wait(config):
    tune.report({"score": config["x"]})
    time.sleep(600)  # until the sweep is stopped


class StopOnceEveryTrialReported(tune.Stopper):
    """Ends the whole sweep (Tune then stops its running trials without completing them) once
    `trials` trials have reported."""

    def __init__(self, trials: int):
        self.trials, self.reported = trials, set()

    def __call__(self, trial_id, result):
        self.reported.add(trial_id)
        return False

    def stop_all(self):
        return len(self.reported) >= self.trials


def test_a_sweep_stopped_with_trials_running_shows_none_running_once_it_has_ended(ray_local, tmp_path):
    """A time budget, Ctrl-C or a stopper ends the sweep with trials running, and Tune stops them
    without `on_trial_complete`: the controller, kept while the result lives (a notebook), went on
    showing them running, in the dashboard and as `hpo_trials_running`, long after the sweep had ended."""
    result = hpo.run(report_then_wait, config={"x": tune.grid_search([1.0, 2.0])}, metric="score", mode="max",
                     stop=StopOnceEveryTrialReported(2), storage_path=str(tmp_path), name="stopped", verbose=0)
    summary = ray_local.get(result.controller.summary.remote())
    assert (summary["running"], summary["finished"], summary["best"]) == (0, 2, 2.0), summary


def test_a_second_sweep_of_the_same_name_counts_only_its_own_trials(ray_local, tmp_path):
    """Elsewhere on disk, under the same name, while the first sweep's result (and controller) lives:
    the second sweep took over the first's controller, so the dashboard and Prometheus showed the
    first's trials among its own and the first's best (3.0, though the second minimises)."""
    first = hpo.run(two_reports, config={"x": tune.grid_search([1.0, 3.0])}, metric="loss", mode="max",
                    storage_path=str(tmp_path / "a"), name="twin", verbose=0)
    second = hpo.run(two_reports, config={"x": 0.5}, metric="loss", mode="min",
                     storage_path=str(tmp_path / "b"), name="twin", verbose=0)
    summary = ray_local.get(second.controller.summary.remote())
    assert (summary["finished"], summary["best"]) == (1, 0.5), summary
    assert ray_local.get_actor("hpo:sweep:twin", namespace="hpo") == second.controller
    del first


def test_a_sweep_whose_name_a_running_sweep_holds_on_the_cluster_is_refused_naming_the_name(
        ray_local, tmp_path, capsys):
    """Two terminals, one cluster, one name: both sweeps fed one controller, and the first to end
    took it (and the second's dashboard) with it."""
    from hpo.cli import main
    from hpo.reporting.dashboard_actor import start_controller

    running = start_controller("taken", "loss", "min")  # another driver's sweep, still running
    try:
        with pytest.raises(ValueError, match="name: a sweep named 'taken' is running on this Ray cluster"):
            hpo.run(two_reports, config={"x": 1.0}, metric="loss", mode="min", storage_path=str(tmp_path),
                    name="taken", verbose=0)
        sweep = tmp_path / "sweep.yaml"
        sweep.write_text("name: taken\ntrainable: mlp_digits\nmetric: {name: val_loss, goal: minimize}\n"
                         "parameters:\n  lr: {value: 0.01}\nmax_iterations: 1\n")
        assert main(["run", str(sweep)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: {sweep}:1: name: a sweep named 'taken' is running") and err.count("\n") == 1, err
        assert ray_local.get(running.summary.remote())["finished"] == 0, "the running sweep's controller is untouched"
    finally:
        ray_local.kill(running)


QUICK_SWEEP = """\
name: joined
trainable: quick:train
metric: {name: loss, goal: minimize}
parameters:
  x: {value: 1.0}
max_iterations: 1
"""


def run_joining(ray_local, tmp_path, **env_changes) -> subprocess.CompletedProcess:
    """`hpo run --address` of a one-trial sweep in a new process (a second terminal), against the
    suite's Ray, with the environment changed as given (a value of None unsets the variable)."""
    (tmp_path / "quick.py").write_text("from ray import tune\n\n\ndef train(config):\n    tune.report({'loss': config['x']})\n")
    (tmp_path / "sweep.yaml").write_text(QUICK_SWEEP)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    for key, value in env_changes.items():
        env.pop(key, None) if value is None else env.__setitem__(key, value)
    address = ray_local.get_runtime_context().gcs_address
    return subprocess.run([sys.executable, "-m", "hpo.cli", "run", "sweep.yaml", "--address", address],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=patience(180))


def test_run_with_an_explicit_address_uses_the_clusters_token_without_ray_auth_mode(ray_local, tmp_path):
    """The README's client: the cluster's token in ~/.ray/auth_token, RAY_AUTH_MODE unset. Ray turns
    token authentication on by itself only for address=auto: the sweep was refused (15 s of
    'Authentication token is missing or incorrect' warnings, then a traceback and exit 1), while
    `hpo job --address` used the token."""
    done = run_joining(ray_local, tmp_path, RAY_AUTH_MODE=None)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Best configuration (loss = 1)" in done.stdout


def test_a_token_the_cluster_refuses_is_one_line_naming_the_address_and_exit_2(ray_local, tmp_path):
    done = run_joining(ray_local, tmp_path, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN="0" * 32)
    assert done.returncode == 2, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("error: --address ") and "refused this client's token" in last, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
