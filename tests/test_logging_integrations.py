"""The sweep file's `logging:` block: real TensorBoard event files, a real MLflow store and real W&B
offline runs from one tiny YAML sweep, read back with each tool's own reader."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from ray import tune

from patience import patience

import hpo

from hpo.cli import main
from hpo.config.errors import SweepConfigError
from hpo.config.spec import SweepSpec
from hpo.config.sweep_file import YamlSource

X_VALUES = (0.0, 2.5)
ITERATIONS = 2


def quadratic(config):
    """Score (x - 1)^2 + 1/iteration: two iterations whose values the loggers must carry."""
    for iteration in range(1, ITERATIONS + 1):
        tune.report({"score": (config["x"] - 1.0) ** 2 + 1.0 / iteration})


quadratic.reported_metrics = ("score",)  # lets `hpo` check the sweep's metric name up front


def top1(config):
    """Reports a metric named as many trainers name theirs, which MLflow's names may not hold."""
    tune.report({"score": config["x"], "acc@1": 0.5})


top1.reported_metrics = ("score", "acc@1")


def expected_scores(x: float) -> list[float]:
    return [(x - 1.0) ** 2 + 1.0 / iteration for iteration in range(1, ITERATIONS + 1)]


def sweep_file(folder: Path, logging_block: str) -> Path:
    path = folder / "logged.yaml"
    path.write_text(
        textwrap.dedent(
            f"""\
            name: logged
            trainable: test_logging_integrations:quadratic
            method: grid
            metric: {{name: score, goal: minimize}}
            parameters:
              x: {{values: {list(X_VALUES)}}}
            max_iterations: {ITERATIONS}
            storage_path: {folder / 'runs'}
            """
        )
        + textwrap.dedent(logging_block)
    )
    return path


@pytest.fixture(scope="module")
def logged_sweep(ray_local, tmp_path_factory):
    """One sweep with all three loggers on; each test below reads back one of them."""
    folder = tmp_path_factory.mktemp("logged")
    path = sweep_file(
        folder,
        f"""\
        logging:
          tensorboard: true
          mlflow: {{tracking_uri: "file://{folder / 'mlruns'}"}}
          wandb: {{project: hpo-tests, mode: offline}}
        """,
    )
    with pytest.MonkeyPatch.context() as env:
        # MLflow 3 keeps its file store behind an opt-in; a user of file:// stores sets the same.
        env.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
        env.setenv("WANDB_MODE", "offline")
        assert main(["run", str(path)]) == 0
    return folder


def assert_tensorboard_events_hold_every_score(experiment: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    trial_dirs = [p for p in experiment.iterdir() if p.is_dir() and (p / "params.json").exists()]
    assert len(trial_dirs) == len(X_VALUES)
    for trial in trial_dirs:
        events = EventAccumulator(str(trial)).Reload()
        x = json.loads((trial / "params.json").read_text())["x"]
        scores = [event.value for event in events.Scalars("ray/tune/score")]
        assert scores == pytest.approx(expected_scores(x)), f"TensorBoard events of trial x={x}"


def assert_one_mlflow_run_per_trial(store: Path, experiment_name: str) -> None:
    from mlflow.tracking import MlflowClient

    with pytest.MonkeyPatch.context() as env:
        env.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
        client = MlflowClient(tracking_uri=f"file://{store}")
        experiment = client.get_experiment_by_name(experiment_name)
        assert experiment is not None, "the experiment is named after the sweep"
        runs = client.search_runs([experiment.experiment_id])
        assert len(runs) == len(X_VALUES)
        for run in runs:
            x = float(run.data.params["x"])
            history = client.get_metric_history(run.info.run_id, "score")
            assert [m.value for m in sorted(history, key=lambda m: m.step)] == pytest.approx(expected_scores(x))
            assert run.info.status == "FINISHED"


@pytest.mark.slow
def test_tensorboard_true_writes_every_trials_metric_to_event_files(logged_sweep):
    assert_tensorboard_events_hold_every_score(logged_sweep / "runs" / "logged")


@pytest.mark.slow
def test_mlflow_block_logs_one_run_per_trial_with_its_metric_history(logged_sweep):
    assert_one_mlflow_run_per_trial(logged_sweep / "mlruns", "logged")


@pytest.mark.slow
def test_hpo_run_takes_the_sweep_files_logging_block_as_a_dict(ray_local, tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    hpo.run(
        quadratic, config={"x": tune.grid_search(list(X_VALUES))}, metric="score", mode="min",
        stop={"training_iteration": ITERATIONS}, storage_path=str(tmp_path / "runs"), name="api_logged",
        logging={"tensorboard": True, "mlflow": {"tracking_uri": f"file://{tmp_path / 'mlruns'}"}},
    )
    assert_tensorboard_events_hold_every_score(tmp_path / "runs" / "api_logged")
    assert_one_mlflow_run_per_trial(tmp_path / "mlruns", "api_logged")


def test_a_mistyped_key_in_hpo_runs_logging_block_fails_in_one_line_before_ray(tmp_path):
    with pytest.raises(ValueError) as caught:
        hpo.run(quadratic, config={"x": 1.0}, metric="score", storage_path=str(tmp_path),
                logging={"mlflow": {"tracking_url": "sqlite:///m.db"}})
    assert str(caught.value) == "logging.mlflow.tracking_url: Extra inputs are not permitted"
    assert not any(tmp_path.iterdir()), "no sweep started"


@pytest.mark.slow
def test_wandb_offline_writes_a_run_per_trial_with_its_metrics(logged_sweep):
    runs = sorted((logged_sweep / "runs" / "logged" / "wandb").glob("offline-run-*"))
    assert len(runs) == len(X_VALUES), "one offline W&B run per trial, in the sweep's folder"
    seen = []
    for run in runs:
        # W&B's own reader of its offline transaction log.
        shown = subprocess.run(
            [str(Path(sys.executable).with_name("wandb")), "leet", "inspect", "--summary", "--json", str(run)],
            capture_output=True, text=True, check=True, timeout=patience(120),
        )
        summary = json.loads(shown.stdout)
        assert summary["project"] == "hpo-tests" and summary["state"] == "finished"
        assert summary["summary"]["training_iteration"] == ITERATIONS
        seen.append(summary["summary"]["score"])
    assert sorted(seen) == pytest.approx(sorted(expected_scores(x)[-1] for x in X_VALUES))


def offline_run_ids(folder: Path) -> set[str]:
    """The trial ids of the offline W&B runs under `folder/wandb` (offline-run-<time>-<run id>)."""
    return {run.name.rsplit("-", 1)[1] for run in (folder / "wandb").glob("offline-run-*")}


@pytest.mark.slow
def test_a_second_run_of_a_sweep_writes_its_wandb_runs_in_its_own_run_folder(ray_local, tmp_path, monkeypatch):
    # the second run is runs/logged-2; its W&B runs had gone into the first run's folder, runs/logged
    path = sweep_file(tmp_path, "logging: {wandb: {project: hpo-tests, mode: offline}}\n")
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert main(["run", str(path)]) == 0
    assert main(["run", str(path)]) == 0
    for run in (tmp_path / "runs" / "logged", tmp_path / "runs" / "logged-2"):
        trials = {json.loads(result.read_text().splitlines()[-1])["trial_id"] for result in run.glob("*/result.json")}
        assert len(trials) == len(X_VALUES) and offline_run_ids(run) == trials, run


def test_a_missing_logging_library_is_a_one_line_error_naming_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # what `import wandb` sees where it is not installed
    path = sweep_file(tmp_path, "logging:\n  wandb: {project: p}\n")
    with pytest.raises(SweepConfigError) as caught:
        SweepSpec.from_source(YamlSource.from_file(path))
    assert str(caught.value) == (
        f"{path}:10: logging.wandb: needs the wandb package, which is not installed: pip install 'hydro-hpo[logging]'"
    )


@pytest.mark.parametrize("block, key, says", [
    ("{project: my/runs, mode: offline}", "project", "Invalid project name 'my/runs'"),
    (f"{{project: p, mode: offline, tags: [ok, {'t' * 65}]}}", "tags", "Tags must be between 1 and 64 characters"),
])
def test_a_wandb_project_or_tag_wandb_refuses_names_its_line_before_ray(tmp_path, block, key, says):
    # W&B refused it only inside each trial's run: the sweep went on without a single run and exited 0
    path = sweep_file(tmp_path, f"logging:\n  wandb: {block}\n")
    with pytest.raises(SweepConfigError) as caught:
        SweepSpec.from_source(YamlSource.from_file(path))
    assert str(caught.value).startswith(f"{path}:10: logging.wandb.{key}: W&B refuses it: ") and says in str(caught.value)


def test_an_unknown_key_in_the_logging_block_names_its_line_and_a_suggestion(tmp_path):
    path = sweep_file(tmp_path, "logging:\n  mlflow:\n    tracking_url: sqlite:///m.db\n")
    with pytest.raises(SweepConfigError) as caught:
        SweepSpec.from_source(YamlSource.from_file(path))
    assert str(caught.value) == f"{path}:11: logging.mlflow.tracking_url: unknown key 'tracking_url' (did you mean 'tracking_uri'?)"


def test_relative_mlflow_store_and_wandb_dir_are_relative_to_the_sweep_files_folder_as_storage_path_is(tmp_path, monkeypatch):
    # `hpo run sweeps/x.yaml` from another folder (or its --resume from a third) put the MLflow store
    # and the W&B runs under whichever folder hpo ran in, apart from the run they log
    from hpo.config.sweep_file import load_sweep
    from hpo.tuner.sweep import build_tuner

    sweeps, elsewhere = tmp_path / "sweeps", tmp_path / "elsewhere"
    sweeps.mkdir(), elsewhere.mkdir()
    path = sweep_file(sweeps, "logging:\n  mlflow: {tracking_uri: 'sqlite:///runs/mlflow.db'}\n  wandb: {mode: offline, dir: wb}\n")
    monkeypatch.chdir(elsewhere)
    callbacks = build_tuner(load_sweep(path)).run_config.callbacks
    (mlflow,) = [cb for cb in callbacks if type(cb).__name__ == "MLflowLoggerCallback"]
    assert mlflow.tracking_uri == f"sqlite:///{sweeps / 'runs' / 'mlflow.db'}"
    assert (sweeps / "runs" / "mlflow.db").is_file() and (sweeps / "wb").is_dir()
    assert list(elsewhere.iterdir()) == []


def test_a_tracking_store_mlflow_refuses_fails_before_any_trial_with_exit_status_2(ray_local, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    path = sweep_file(tmp_path, f"logging:\n  mlflow: {{tracking_uri: 'file://{tmp_path / 'store'}'}}\n")
    assert main(["run", str(path)]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, errors
    assert errors[0].startswith(f"error: {path}:10: logging.mlflow.tracking_uri: MLflow cannot use tracking store")
    assert not (tmp_path / "runs" / "logged").exists(), "no trial ran"


def test_a_metric_name_mlflow_refuses_stops_the_sweep_in_one_line_naming_it_with_exit_status_2(ray_local, tmp_path, capsys):
    # Ray's MLflow callback raised from inside Tune's controller: a 90-line traceback, exit 1
    path = sweep_file(tmp_path, f"logging:\n  mlflow: {{tracking_uri: 'sqlite:///{tmp_path / 'mlflow.db'}'}}\n")
    path.write_text(path.read_text().replace(":quadratic", ":top1"))
    assert main(["run", str(path)]) == 2
    captured = capsys.readouterr()
    errors = [line for line in captured.err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in captured.err + captured.out, captured.err
    assert errors[0].startswith(f"error: {path}:10: logging.mlflow: MLflow refused a trial's metric or parameter: ") and "acc@1" in errors[0]


def test_an_online_wandb_sweep_without_an_api_key_fails_before_any_trial_with_exit_status_2(ray_local, tmp_path, monkeypatch, capsys):
    for name in ("WANDB_MODE", "WANDB_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc key
    monkeypatch.setattr(sys, "stdin", io.StringIO())  # not a terminal: W&B cannot ask for one
    path = sweep_file(tmp_path, "logging:\n  wandb: {project: p}\n")
    assert main(["run", str(path)]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, errors
    assert errors[0].startswith(f"error: {path}:10: logging.wandb: W&B has no API key for online runs")
    assert not (tmp_path / "runs" / "logged").exists(), "no trial ran"


FUSED_LRS = (1e-3, 1e-2, 1e-1)


@pytest.fixture(scope="module")
def fused_logged_sweep(ray_local, tmp_path_factory):
    """Three configurations fused into two groups on the fixture's two CPU slots, every logger on."""
    folder = tmp_path_factory.mktemp("fused_logged")
    path = folder / "fused.yaml"
    path.write_text(textwrap.dedent(f"""\
        name: fused_logged
        trainable: mlp_digits
        method: grid
        metric: {{name: val_loss, goal: minimize}}
        parameters:
          lr: {{values: {list(FUSED_LRS)}}}
          width: {{value: 16}}
        max_iterations: {ITERATIONS}
        storage_path: {folder / 'runs'}
        fusion: {{enabled: true, max_members: 3}}
        logging:
          tensorboard: true
          mlflow: {{tracking_uri: "file://{folder / 'mlruns'}"}}
          wandb: {{project: hpo-fused-tests, mode: offline}}
        """))
    with pytest.MonkeyPatch.context() as env:
        env.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
        env.setenv("WANDB_MODE", "offline")
        assert main(["run", str(path)]) == 0
    experiment = folder / "runs" / "fused_logged"
    members = {}  # member id -> (its config, its val_loss per iteration), as the member folders hold them
    for member in (experiment / "members").iterdir():
        history = [json.loads(line) for line in (member / "result.json").read_text().splitlines()]
        members[member.name] = (json.loads((member / "params.json").read_text()), [h["val_loss"] for h in history])
    groups = [p for p in experiment.iterdir() if p.name.startswith("group_")]
    assert len(members) == len(FUSED_LRS) and len(groups) == 2, (members, groups)
    return folder, experiment, members


@pytest.mark.slow
def test_a_fused_sweep_logs_one_mlflow_run_per_configuration_not_per_group(fused_logged_sweep):
    from mlflow.tracking import MlflowClient

    folder, _, members = fused_logged_sweep
    with pytest.MonkeyPatch.context() as env:
        env.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
        client = MlflowClient(tracking_uri=f"file://{folder / 'mlruns'}")
        runs = client.search_runs([client.get_experiment_by_name("fused_logged").experiment_id])
        assert sorted(run.info.run_name for run in runs) == sorted(f"mlp_digits_{m}" for m in members)
        for run in runs:
            config, losses = members[run.info.run_name.removeprefix("mlp_digits_")]
            assert float(run.data.params["lr"]) == config["lr"] and run.data.params["width"] == "16"
            history = client.get_metric_history(run.info.run_id, "val_loss")
            assert [m.value for m in sorted(history, key=lambda m: m.step)] == pytest.approx(losses)
            assert [m.step for m in sorted(history, key=lambda m: m.step)] == list(range(1, ITERATIONS + 1))
            assert run.info.status == "FINISHED"


@pytest.mark.slow
def test_a_fused_sweep_writes_tensorboard_events_per_configuration_and_none_per_group(fused_logged_sweep):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _, experiment, members = fused_logged_sweep
    runs = {path.parent for path in experiment.rglob("events.out.tfevents.*")}
    assert runs == {experiment / "members" / m for m in members}, "TensorBoard shows configurations, not groups"
    for member, (_, losses) in members.items():
        events = EventAccumulator(str(experiment / "members" / member)).Reload()
        assert [e.value for e in events.Scalars("ray/tune/val_loss")] == pytest.approx(losses)


@pytest.mark.slow
def test_a_fused_sweep_writes_one_wandb_offline_run_per_configuration(fused_logged_sweep):
    _, experiment, members = fused_logged_sweep
    runs = sorted((experiment / "wandb").glob("offline-run-*"))
    assert len(runs) == len(members), "one offline W&B run per configuration, none per group"
    seen = {}
    for run in runs:
        shown = subprocess.run(
            [str(Path(sys.executable).with_name("wandb")), "leet", "inspect", "--summary", "--json", str(run)],
            capture_output=True, text=True, check=True, timeout=patience(120),
        )
        summary = json.loads(shown.stdout)
        assert summary["project"] == "hpo-fused-tests" and summary["state"] == "finished"
        assert summary["summary"]["training_iteration"] == ITERATIONS
        seen[run.name.rsplit("-", 1)[1]] = summary["summary"]["val_loss"]  # offline-run-<time>-<run id = member id>
    assert seen == pytest.approx({member: losses[-1] for member, (_, losses) in members.items()})
