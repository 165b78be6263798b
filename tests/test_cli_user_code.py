"""A user's own code under `hpo run`: a trainable beside its sweep file imports its sibling
modules on Ray's workers wherever the command is started from, what it prints reaches the
terminal, and the console carries hydro-hpo's progress lines, not Optuna's or Ray's chatter."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest

from patience import patience

from hpo.base.ray_runtime import SUBMITTED_JOB_CONFIG_ENV, _beside_submitted_job, code_runtime_env
from hpo.config.errors import SweepConfigError
from hpo.config.sweep_file import load_sweep
from hpo.config.trainable_lookup import found_in

REPO = Path(__file__).resolve().parents[1]
MARKER = "USER-PRINT-7f3a"


@pytest.fixture(scope="module")
def run_from_root(tmp_path_factory):
    """`hpo run /abs/path/sweep.yaml` started from `/`, its trainable importing a sibling module,
    printing a marker and checkpointing as a Tune user's function does."""
    project = tmp_path_factory.mktemp("project")
    (project / "scoring.py").write_text("def score(x):\n    return (x - 0.3) ** 2\n")
    (project / "my_trainable.py").write_text(textwrap.dedent(f"""\
        import json
        import sys
        import tempfile
        from pathlib import Path

        from ray import tune

        import scoring


        def train(config):
            print("{MARKER}", config["x"], flush=True)
            print("{MARKER}-err", end="", file=sys.stderr)  # a partial line, ended by the next print
            print("", config["x"], file=sys.stderr, flush=True)
            for _ in range(2):
                with tempfile.TemporaryDirectory() as folder:
                    Path(folder, "state.json").write_text(json.dumps(config))
                    tune.report({{"loss": scoring.score(config["x"])}}, checkpoint=tune.Checkpoint.from_directory(folder))
        """))
    storage = project / "runs"
    sweep = project / "sweep.yaml"
    sweep.write_text(textwrap.dedent(f"""\
        name: from_root
        trainable: my_trainable:train
        method: tpe
        metric: {{name: loss, goal: minimize}}
        parameters:
          x: {{min: 0.0, max: 1.0}}
        run_cap: 2
        max_concurrent_trials: 1
        max_iterations: 2
        seed: 0
        storage_path: {storage}
        """))
    # A newcomer's shell: no RAY_ADDRESS, and no RAY_AUTH_MODE (Ray then turns token authentication
    # on for the new local Ray itself, and says so).
    env = {key: value for key, value in os.environ.items() if key not in ("RAY_ADDRESS", "RAY_AUTH_MODE")}
    env["PYTHONPATH"] = str(REPO)  # this checkout, for the driver and for Ray's workers
    proc = subprocess.run(
        [sys.executable, "-m", "hpo.cli", "run", str(sweep)],
        cwd="/", env=env, capture_output=True, text=True, timeout=patience(300),
    )
    return proc, storage / "from_root"


@pytest.mark.slow
def test_a_trainable_importing_a_sibling_module_runs_when_hpo_run_starts_elsewhere(run_from_root):
    proc, run = run_from_root
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = pd.read_csv(run / "results.csv")
    assert list(rows["status"]) == ["completed", "completed"]
    assert "ModuleNotFoundError" not in proc.stdout + proc.stderr


@pytest.mark.slow
def test_what_a_trainable_prints_reaches_the_terminal(run_from_root):
    proc, run = run_from_root
    xs = pd.read_csv(run / "results.csv")["config/x"]
    printed = re.findall(rf"{MARKER} ([\d.e-]+)", proc.stdout)
    assert sorted(float(x) for x in printed) == pytest.approx(sorted(xs)), proc.stdout


@pytest.mark.slow
def test_every_line_a_trial_prints_carries_that_trials_id_when_one_process_serves_both(run_from_root):
    """One trial at a time, trial processes reused: Ray's `(train pid=...)` prefix is the same on
    both trials' lines, the trial id tells them apart."""
    proc, run = run_from_root
    x_of = dict(zip(*pd.read_csv(run / "results.csv")[["trial_id", "config/x"]].T.values))
    for stream, marker in ((proc.stdout, MARKER), (proc.stderr, f"{MARKER}-err")):
        plain = re.sub(r"\x1b\[[\d;]*m", "", stream)  # Ray colours its prefix on a terminal and in CI
        printed = re.findall(rf"^\(train pid=(\d+)\) \[trial (\w+)\] {marker} ([\d.e-]+)$", plain, re.M)
        assert sorted(trial_id for _, trial_id, _ in printed) == sorted(x_of), stream
        assert all(float(x) == pytest.approx(x_of[trial_id]) for _, trial_id, x in printed), printed
        assert len({pid for pid, _, _ in printed}) == 1, "one reused process served both trials"


@pytest.mark.slow
def test_one_trial_id_in_the_progress_lines_the_rows_and_the_trial_folders(run_from_root):
    """Issue 34: the id a progress line names is the row's `trial_id` and is in its trial's folder
    and checkpoint path, under the CLI as under `hpo.run` (tests/test_progress_line.py)."""
    proc, run = run_from_root
    rows = pd.read_csv(run / "results.csv")
    printed = re.findall(r"^\[\s*\d/2\] trial (\w+) finished after 2 it: loss=", proc.stdout, re.M)
    assert sorted(printed) == sorted(rows["trial_id"]), proc.stdout
    folders = [folder.name for folder in run.iterdir() if folder.is_dir()]
    for trial_id, checkpoint in zip(rows["trial_id"], rows["checkpoint"]):
        assert [name for name in folders if f"_{trial_id}_" in name] == [Path(checkpoint).parent.name], (trial_id, folders)


@pytest.mark.slow
def test_the_console_shows_hpos_progress_lines_and_no_optuna_or_tune_chatter(run_from_root):
    proc, _ = run_from_root
    console = proc.stdout + proc.stderr
    assert "A new study created" not in console  # Optuna's INFO line
    assert "Checkpoint successfully created" not in console  # Ray Tune's INFO line, on the workers
    for table in ("Trial status", "Trial name", "Current time", "+-----"):  # Tune's status tables
        assert table not in proc.stdout, proc.stdout
    assert "Started a local Ray instance" not in console


@pytest.mark.slow
def test_no_advice_to_disable_auth_no_exception_at_shutdown_and_nothing_after_the_time_line(run_from_root):
    proc, _ = run_from_root
    console = proc.stdout + proc.stderr
    assert "to opt out" not in console, "Ray's advice to turn token authentication off"
    assert "Exception ignored" not in console and "SystemExit" not in console
    assert "Restored on" not in console and "Trials did not complete" not in console
    assert proc.stdout.rstrip().splitlines()[-1].startswith("time:    sweep "), proc.stdout[-2000:]


def test_a_ctrl_c_before_the_sweep_started_is_one_line_and_exit_130(tmp_path, monkeypatch, capsys):
    from hpo import cli

    (tmp_path / "my_trainable.py").write_text("def train(config):\n    pass\n\n\ntrain.reported_metrics = ('loss',)\n")
    (tmp_path / "sweep.yaml").write_text(
        "trainable: my_trainable:train\nmetric: {name: loss, goal: minimize}\nparameters:\n  x: {value: 1}\n"
        f"storage_path: {tmp_path / 'runs'}\n"
    )

    def ctrl_c(*args, **kwargs):
        raise KeyboardInterrupt  # as while the local Ray starts

    monkeypatch.setattr(cli, "_start_ray", ctrl_c)
    assert cli.main(["run", str(tmp_path / "sweep.yaml")]) == cli.EXIT_INTERRUPTED
    assert capsys.readouterr().err.splitlines() == [
        f"error: interrupted before any trial ran; nothing was lost; start it again with: hpo run {tmp_path / 'sweep.yaml'}"
    ]


@pytest.mark.slow
def test_a_folder_too_large_for_ray_to_ship_is_a_one_line_error_naming_it(tmp_path):
    (tmp_path / "my_trainable.py").write_text("def train(config):\n    pass\n")
    (tmp_path / "data.bin").write_bytes(os.urandom(3 * 1024**2))
    (tmp_path / "sweep.yaml").write_text(
        "trainable: my_trainable:train\nmetric: {name: loss, goal: minimize}\nparameters:\n  x: {value: 1}\n"
        f"storage_path: {tmp_path / 'runs'}\n"
    )
    env = {key: value for key, value in os.environ.items() if key != "RAY_ADDRESS"}
    # Ray's package limit is its largest gRPC message (512 MiB); 2 MiB makes a 3 MiB folder too large.
    env.update(PYTHONPATH=str(REPO), RAY_max_grpc_message_size=str(2 * 1024**2))
    proc = subprocess.run([sys.executable, "-m", "hpo.cli", "run", str(tmp_path / "sweep.yaml")],
                          cwd="/", env=env, capture_output=True, text=True, timeout=patience(300))
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert errors[0].startswith(f"error: {tmp_path / 'sweep.yaml'}:1: trainable: Ray cannot ship the trainable's folder {tmp_path}")
    assert "'.rayignore'" in errors[0], "Ray's own advice: how to leave files behind"



@pytest.mark.slow
def test_a_metric_the_function_reports_under_another_name_is_one_line_naming_what_it_reported(tmp_path):
    """Tune's strict metric check raises in its controller and stops the sweep; the user sees
    one line with the names the trial did report, not Tune's traceback."""
    (tmp_path / "my_trainable.py").write_text(
        "from ray import tune\n\n\ndef train(config):\n    tune.report({'loss': config['x'], 'val_acc': 0.5})\n")
    (tmp_path / "sweep.yaml").write_text(
        "trainable: my_trainable:train\nmetric: {name: accuracy, goal: maximize}\nparameters:\n  x: {value: 1}\n"
        f"storage_path: {tmp_path / 'runs'}\n"
    )
    env = {key: value for key, value in os.environ.items() if key != "RAY_ADDRESS"}
    env["PYTHONPATH"] = str(REPO)
    proc = subprocess.run([sys.executable, "-m", "hpo.cli", "run", str(tmp_path / "sweep.yaml")],
                          cwd="/", env=env, capture_output=True, text=True, timeout=patience(300))
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert errors[0].startswith(f"error: {tmp_path / 'sweep.yaml'}:2: metric.name: a trial's result has no 'accuracy' "
                                "(it reported: loss, val_acc)"), errors[0]

def test_the_code_folder_travels_without_the_sweeps_own_storage(tmp_path):
    env = code_runtime_env(tmp_path, exclude=[tmp_path / "runs", "/elsewhere/runs"])
    assert env == {"working_dir": str(tmp_path.resolve()), "excludes": ["/runs/"]}


def test_under_ray_job_submit_the_jobs_own_working_dir_wins(monkeypatch, tmp_path):
    """Ray refuses a driver runtime env that repeats a field of the submitted job's."""
    ours = {"env_vars": {"B": "2"}, **code_runtime_env(tmp_path, exclude=[tmp_path / "runs"])}
    monkeypatch.setenv(SUBMITTED_JOB_CONFIG_ENV, json.dumps({"runtime_env": {"working_dir": "gcs://pkg.zip"}}))
    assert _beside_submitted_job(ours) == {"env_vars": {"B": "2"}}
    monkeypatch.setenv(SUBMITTED_JOB_CONFIG_ENV, json.dumps({"runtime_env": {"pip": ["torch"]}}))
    assert _beside_submitted_job(ours) == ours
    monkeypatch.delenv(SUBMITTED_JOB_CONFIG_ENV)
    assert _beside_submitted_job(ours) == ours


def test_only_a_module_imported_from_the_sweep_files_folder_travels(tmp_path, monkeypatch):
    """A package installed from a checkout below the sweep file's folder (a sweep file in the home
    that holds the checkout) is importable on the workers already; shipping its folder would zip
    the whole home."""
    checkout = tmp_path / "checkout"
    (checkout / "mypkg").mkdir(parents=True)
    (checkout / "mypkg" / "__init__.py").write_text("")
    (checkout / "mypkg" / "train.py").write_text("def train(config):\n    pass\n")
    monkeypatch.syspath_prepend(str(checkout))
    sweep = textwrap.dedent("""\
        name: where
        trainable: mypkg.train:train
        metric: {name: loss, goal: minimize}
        parameters:
          x: {min: 0.0, max: 1.0}
        """)
    (tmp_path / "above.yaml").write_text(sweep)
    (checkout / "beside.yaml").write_text(sweep)
    assert load_sweep(tmp_path / "above.yaml", execute=False).code_folder is None
    assert load_sweep(checkout / "beside.yaml", execute=False).code_folder == checkout.resolve()


@pytest.mark.parametrize("named, module", [
    ("byfile_train.py:train", "byfile_train"),
    ("byfile_models/train.py:train", "byfile_models.train"),
])
def test_a_trainable_named_by_its_file_beside_the_sweep_file_is_that_module(tmp_path, monkeypatch, named, module):
    """`program: train.py`, as W&B names it, written `trainable: train.py:main`."""
    monkeypatch.setattr(sys, "path", list(sys.path))  # the sweep file's folder is added: this test's only
    (tmp_path / "byfile_models").mkdir()
    for file in (tmp_path / "byfile_train.py", tmp_path / "byfile_models" / "train.py"):
        file.write_text("def train(config):\n    return config\n")
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(f"name: byfile\ntrainable: {named}\nmetric: {{name: loss, goal: minimize}}\nparameters:\n  x: {{min: 0.0, max: 1.0}}\n")
    loaded = load_sweep(sweep, for_ray=False)
    assert loaded.located.module == module and loaded.code_folder == tmp_path.resolve()
    assert loaded.trainable.obj({"x": 1}) == {"x": 1}


def test_a_trainable_file_outside_the_sweep_files_folder_is_a_one_line_error(tmp_path):
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text("name: outside\ntrainable: ../train.py:train\nmetric: {name: loss, goal: minimize}\nparameters:\n  x: {min: 0.0, max: 1.0}\n")
    with pytest.raises(SweepConfigError, match=r"sweep\.yaml:2: trainable: '\.\./train\.py' is a file outside the sweep file's folder"):
        load_sweep(sweep, execute=False)


def test_a_built_in_trainable_never_takes_the_folder_above_its_checkout_along():
    example = REPO / "hpo" / "examples" / "mlp_digits.py"
    assert not found_in(REPO.parent, "hpo.examples.mlp_digits", example)
    assert found_in(REPO, "hpo.examples.mlp_digits", example)
    assert found_in(REPO / "hpo", "hpo", REPO / "hpo" / "__init__.py") is False
    assert found_in(REPO, "hpo", REPO / "hpo" / "__init__.py")
