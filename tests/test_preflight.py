"""`hpo validate` and `hpo run` check a sweep against its trainable and this machine before Ray
starts: what passes runs, what cannot be checked is a warning, and `--no-exec` runs no user code."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from patience import patience

from hpo.cli import main
from hpo.config.preflight import machine_capacity

USER_CODE = '''\
"""A user's trainables, written outside the project."""
import os
from pathlib import Path

Path(os.environ["PREFLIGHT_MARKER"]).touch()  # proves whether the module's code ran


def train(config):
    return {"score": config["x"]}


train.reported_metrics = ("score",)


def silent(config):
    return {"score": config["x"]}


def no_config():
    return None
'''

FUNCTION_SWEEP = """\
trainable: preflight_user_code:{function}
metric: {{name: score, goal: maximize}}
parameters:
  x: {{min: 0.0, max: 1.0}}
"""

WORKLOAD_SWEEP = """\
name: tiny_scaled
trainable: bad_workloads:tiny
metric: {name: val_loss, goal: minimize}
parameters:
  lr: {distribution: log_uniform_values, min: 0.001, max: 0.1}
  weight_decay: {value: 0.0}
  optimizer: {values: [adam, sgd]}
scaling: {target_width: 64, ratio: 4}
"""


@pytest.fixture()
def user_dir(tmp_path: Path, monkeypatch) -> Path:
    (tmp_path / "preflight_user_code.py").write_text(USER_CODE)
    monkeypatch.setenv("PREFLIGHT_MARKER", str(tmp_path / "module-ran"))
    sys.modules.pop("preflight_user_code", None)
    yield tmp_path
    sys.modules.pop("preflight_user_code", None)


def sweep(folder: Path, text: str, name: str = "sweep.yaml") -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(text))
    return path


def test_a_correct_function_trainable_passes_without_warnings(user_dir, capsys):
    code = main(["validate", str(sweep(user_dir, FUNCTION_SWEEP.format(function="train")))])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert captured.err == ""


def test_a_function_that_does_not_declare_its_metrics_gets_one_warning_line(user_dir, capsys):
    path = sweep(user_dir, FUNCTION_SWEEP.format(function="silent"))
    code = main(["validate", str(path)])
    err = capsys.readouterr().err
    assert code == 0
    assert err.count("\n") == 1, err
    assert f"{path}:2: metric.name: warning: cannot check that" in err
    assert "silent.reported_metrics = ('score',)" in err


def test_validate_runs_the_trainables_module_but_no_exec_does_not(user_dir, capsys):
    path = sweep(user_dir, FUNCTION_SWEEP.format(function="train"))
    assert main(["validate", "--no-exec", str(path)]) == 0
    assert not (user_dir / "module-ran").exists()
    assert "static checks only" in capsys.readouterr().out
    assert main(["validate", str(path)]) == 0
    assert (user_dir / "module-ran").exists()


def test_no_exec_still_finds_a_function_without_a_config_argument(user_dir, capsys):
    path = sweep(user_dir, FUNCTION_SWEEP.format(function="no_config"))
    assert main(["validate", "--no-exec", str(path)]) == 2
    err = capsys.readouterr().err
    assert "trainable: no_config() must take the trial's config as its one argument" in err
    assert "preflight_user_code.py:" in err
    assert not (user_dir / "module-ran").exists()


def test_no_exec_imports_neither_torch_nor_ray(user_dir):
    path = sweep(user_dir, FUNCTION_SWEEP.format(function="train"))
    probe = (
        "import sys; from hpo.cli import main; code = main(['validate', '--no-exec', sys.argv[1]]); "
        "print(code, sorted(m for m in ('torch', 'ray', 'sklearn', 'pandas') if m in sys.modules))"
    )
    proc = subprocess.run([sys.executable, "-c", probe, str(path)], capture_output=True, text=True, timeout=patience(60))
    assert proc.stdout.strip().splitlines()[-1] == "0 []", proc.stdout + proc.stderr


def test_a_workload_with_scaling_is_built_at_two_widths_and_passes(tmp_path, capsys):
    shutil.copy(Path(__file__).resolve().parent / "bad_sweeps" / "bad_workloads.py", tmp_path)
    code = main(["validate", str(sweep(tmp_path, WORKLOAD_SWEEP))])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "scaling: proxy width 16 -> target width 64" in captured.out


def test_a_trial_may_ask_for_every_core_of_the_machine(user_dir, capsys):
    cores = int(machine_capacity()["cpu"])
    path = sweep(user_dir, FUNCTION_SWEEP.format(function="train") + f"resources: {{cpu: {cores}}}\n")
    assert main(["validate", str(path)]) == 0, capsys.readouterr().err


def test_gpus_hidden_by_cuda_visible_devices_are_not_counted(user_dir, capsys, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    path = sweep(user_dir, FUNCTION_SWEEP.format(function="train") + "resources: {gpu: 1}\n")
    assert main(["validate", str(path)]) == 2
    assert "resources.gpu: a trial asks for 1 GPU but this machine has 0" in capsys.readouterr().err


def test_run_refuses_before_ray_starts(tmp_path):
    corpus = Path(__file__).resolve().parent / "bad_sweeps"
    env = {**os.environ, "RAY_ADDRESS": "", "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.Popen(
        [sys.executable, "-m", "hpo.cli", "run", str(corpus / "optimizer-rmsprop.yaml")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=env, start_new_session=True,
    )
    try:
        _, err = proc.communicate(timeout=patience(60))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # it started Ray: take every process it made with it
        proc.communicate()
        pytest.fail("hpo run did not refuse the sweep before starting it")
    assert proc.returncode == 2, err
    assert "expected one of sgd, adam, adamw" in err
    assert "Traceback" not in err and "Ray" not in err
    assert not (tmp_path / "runs").exists()


def test_dry_run_reports_grid_size_and_inclusive_bounds_as_written(user_dir, capsys):
    text = """\
    trainable: preflight_user_code:train
    method: grid
    metric: {name: score, goal: maximize}
    parameters:
      x: {values: [1, 2]}
      y: {values: [a, b, c]}
    """
    assert main(["run", "--dry-run", str(sweep(user_dir, text))]) == 0
    out = capsys.readouterr().out
    assert "trials: 6 (grid of 2 x 3 = 6 combinations, run once)" in out
    random = """\
    trainable: preflight_user_code:train
    metric: {name: score, goal: maximize}
    parameters:
      x: {min: 1, max: 3}
    """
    assert main(["run", "--dry-run", str(sweep(user_dir, random, "random.yaml"))]) == 0
    out = capsys.readouterr().out
    assert "x: integer from 1 to 3 inclusive" in out
    assert "trials: 10" in out


def test_dry_run_describes_unbounded_normal_distributions(user_dir, capsys):
    """`normal` and `q_normal` have a mean and a spread but no min or max; describing them must
    not read bounds they do not have."""
    text = """\
    trainable: preflight_user_code:train
    method: random
    metric: {name: score, goal: maximize}
    parameters:
      x: {distribution: normal, mu: 0, sigma: 1}
      y: {distribution: q_normal, mu: 10, sigma: 2.5, q: 1}
    """
    path = str(sweep(user_dir, text))
    assert main(["validate", path]) == 0
    assert main(["run", "--dry-run", path]) == 0
    out = capsys.readouterr().out
    assert "x: normal, mean 0, std 1" in out
    assert "y: normal, mean 10, std 2.5 in steps of 1" in out


def test_a_key_the_workloads_own_code_reads_is_accepted_without_a_default(tmp_path, capsys):
    shutil.copy(Path(__file__).resolve().parent / "bad_sweeps" / "bad_workloads.py", tmp_path)
    (tmp_path / "logged_tiny.py").write_text(textwrap.dedent('''
        from bad_workloads import Tiny

        class Logged(Tiny):
            def build_model(self, config):
                print("building for", config["log_path"], config.get("tag"))
                return super().build_model(config)

        workload = Logged()
    '''))
    text = WORKLOAD_SWEEP.replace("bad_workloads:tiny", "logged_tiny:workload").replace("scaling: {target_width: 64, ratio: 4}\n", "")
    text += "  log_path: {value: /tmp/x}\n  tag: {values: [a, b]}\n"
    code = main(["validate", str(sweep(tmp_path, text))])
    assert code == 0, capsys.readouterr().err
    code = main(["validate", str(sweep(tmp_path, text + "  wd: {value: 0.1}\n"))])
    err = capsys.readouterr().err
    assert code == 2 and "parameters.wd: workload 'tiny' never reads 'wd'" in err, err



def test_a_key_a_dataset_workloads_model_reads_is_accepted_without_a_default(tmp_path, capsys):
    """A user's own model handed to `DatasetWorkload` reads the config in the user's file (here
    `n_head`, inside the model class), not in hpo's DatasetWorkload: sweeping it is allowed."""
    (tmp_path / "own_model.py").write_text(textwrap.dedent('''
        import torch
        from torch import nn
        from torch.nn import functional as F
        from torch.utils.data import TensorDataset
        from hpo.base.workload import DatasetWorkload

        class Net(nn.Module):
            def __init__(self, config):
                super().__init__()
                self.heads = config.get("n_head", 1)
                self.hidden = nn.Linear(4, config["width"])
                self.readout = nn.Linear(config["width"], 2)

            def forward(self, x):
                return self.readout(torch.relu(self.hidden(x)))

        data = TensorDataset(torch.randn(16, 4), torch.randint(0, 2, (16,)))
        workload = DatasetWorkload(model=lambda config: Net(config), train=data, val=data, loss=F.cross_entropy,
                                   defaults={"width": 16, "batch_size": 4}, name="own")
    '''))
    text = WORKLOAD_SWEEP.replace("bad_workloads:tiny", "own_model:workload")

    def with_parameter(line: str) -> str:
        return text.replace("scaling:", f"  {line}\nscaling:")

    code = main(["validate", str(sweep(tmp_path, with_parameter("n_head: {values: [1, 2]}")))])
    assert code == 0, capsys.readouterr().err
    code = main(["validate", str(sweep(tmp_path, with_parameter("wd: {value: 0.1}")))])
    err = capsys.readouterr().err
    assert code == 2 and "parameters.wd: workload 'own' never reads 'wd'" in err, err

def test_coord_check_finds_a_module_in_the_current_folder(tmp_path, monkeypatch, capsys):
    (tmp_path / "cwd_functions.py").write_text("def train(config):\n    return config\n")
    (tmp_path / "cwd_broken.py").write_text("def train(config:\n    return config\n")
    monkeypatch.chdir(tmp_path)
    assert main(["coord-check", "cwd_functions:train"]) == 2
    assert "'cwd_functions:train' is a function; the coordinate check needs a Workload" in capsys.readouterr().err
    assert main(["coord-check", "cwd_broken:train"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"SyntaxError: '(' was never closed ({tmp_path / 'cwd_broken.py'}:1)" in err, err


def test_the_refusal_to_scale_a_function_points_at_the_workload_guide(tmp_path, capsys):
    (tmp_path / "guide_trainable.py").write_text("def train(config):\n    pass\ntrain.reported_metrics = ('val_loss',)\n")
    path = tmp_path / "sweep.yaml"
    path.write_text("trainable: guide_trainable:train\nmetric: {name: val_loss}\nparameters:\n  lr: {values: [0.1]}\n"
                    "scaling: {target_width: 128, ratio: 4}\n")
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert "scaling needs a Workload trainable" in err and "docs/workload_guide.md" in err and "workload.py" not in err


def test_coord_check_across_depth_needs_the_depth_contract(capsys):
    assert main(["coord-check", "mlp_digits", "--depths", "2", "4"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("error: --depths: workload 'mlp_digits' has no depth contract"), err


@pytest.mark.parametrize("args, message", [
    (["bad_workloads:fixed_width"], "error: workload 'tiny' builds the same parameter shapes at width"),
    (["bad_workloads:head_named"], "error: muP scaling: the model of workload 'tiny' (Sequential) has no module named 'readout'"),
    (["bad_workloads:tiny", "--widths", "64"], "error: --widths: the coordinate check compares at least two sizes, got [64]"),
    (["bad_workloads:broken_factory"], "error: the coordinate check of 'bad_workloads:broken_factory' failed: KeyError: 'hidden_size' ("),
    (["bad_workloads:tiny", "--set", "lr=fast"], "error: --set: config key 'lr' must be a float, got 'fast'"),
    (["bad_workloads:tiny", "--set", "optimizer=rmsprop"], "error: --set: config key 'optimizer' is 'rmsprop'"),
    (["bad_workloads:tiny", "--widths", "0", "16"], "error: --widths: sizes must be positive, got [0, 16]"),
    (["bad_workloads:tiny", "--tolerance", "-1"], "error: --tolerance: must be positive, got -1.0"),
], ids=["ignores-width", "no-readout", "one-width", "factory-fails", "lr-not-a-number", "unknown-optimizer", "zero-width", "negative-tolerance"])
def test_coord_check_answers_a_model_it_cannot_scale_or_bad_input_in_one_line_with_exit_status_2(
        tmp_path, monkeypatch, capsys, args, message):
    shutil.copy(Path(__file__).resolve().parent / "bad_sweeps" / "bad_workloads.py", tmp_path)
    monkeypatch.chdir(tmp_path)
    assert main(["coord-check", *args, "--plot", str(tmp_path / "coord.png")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(message), err


def test_coord_check_across_depth_passes_a_depth_scaled_vit_and_writes_its_plot(tmp_path, capsys):
    plot = tmp_path / "coord.png"
    args = ["--depths", "1", "2", "4", "--set", "width=16", "--set", "lr=0.003", "--plot", str(plot)]
    assert main(["coord-check", "vit_digits", *args]) == 0
    out = capsys.readouterr().out
    assert "coordinate check (mup, depths [1, 2, 4], 4 steps): OK" in out, out
    assert (tmp_path / "coord_depth.png").stat().st_size > 10_000 and not plot.exists(), "only the depth check ran"


def test_coord_check_prints_a_warning_about_the_users_model_as_one_line(tmp_path, monkeypatch, capsys):
    (tmp_path / "unscaled_vit.py").write_text(textwrap.dedent('''
        from hpo.examples.vit_digits import workload as vit

        class Unscaled(type(vit)):
            def build_model(self, config):
                return super().build_model({**config, "residual_mult": 1.0})

        workload = Unscaled()
    '''))
    monkeypatch.chdir(tmp_path)
    args = ["--depths", "1", "2", "--set", "width=16", "--set", "lr=0.003", "--plot", str(tmp_path / "c.png")]
    assert main(["coord-check", "unscaled_vit:workload", *args]) in (0, 1)
    err = capsys.readouterr().err
    assert err.startswith("warning: depth scaling: the residual blocks of workload") and err.count("\n") == 1, err


def test_coord_check_scales_a_model_whose_output_layer_is_named_by_readout(tmp_path, monkeypatch, capsys):
    shutil.copy(Path(__file__).resolve().parent / "bad_sweeps" / "bad_workloads.py", tmp_path)
    monkeypatch.chdir(tmp_path)
    code = main(["coord-check", "bad_workloads:head_named", "--readout", "head", "--widths", "8", "16", "--plot", str(tmp_path / "c.png")])
    captured = capsys.readouterr()
    assert code in (0, 1) and "coordinate check (mup, widths [8, 16]" in captured.out, captured.err


def test_coord_check_reads_true_and_false_in_set_as_booleans():
    from hpo.cli import _literal

    assert _literal("false") is False and _literal("True") is True
    assert _literal("3") == 3 and _literal("0.5") == 0.5 and _literal("inv_d") == "inv_d"


def test_a_sweep_whose_model_fails_its_coordinate_check_stops_in_one_line_with_exit_status_2(tmp_path, monkeypatch, capsys):
    from hpo import cli

    (tmp_path / "unscaled.py").write_text(textwrap.dedent('''
        import torch
        from torch import nn
        from hpo.base.workload import Workload

        class Unscaled(Workload):
            name = "unscaled"
            defaults = {"width": 8}

            def build_model(self, config):
                width = int(config["width"])
                model = nn.Sequential(nn.Linear(4, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU())
                nn.init.normal_(model[2].weight, std=0.5)  # a fixed std: grows with width, not muP
                model.add_module("readout", nn.Linear(width, 2))
                return model

            def train_batches(self, config, seed):
                generator = torch.Generator().manual_seed(seed)
                while True:
                    x = torch.randn(16, 4, generator=generator)
                    yield x, (x[:, 0] > 0).long()

            def eval_batches(self, config):
                return [next(self.train_batches(config, 1))]

        workload = Unscaled()
    '''))
    (tmp_path / "sweep.yaml").write_text(
        "trainable: unscaled:workload\nmetric: {name: val_loss, goal: minimize}\nparameters:\n  lr: {value: 0.01}\n"
        f"storage_path: {tmp_path / 'runs'}\nscaling: {{target_width: 256, ratio: 8, coord_check: true}}\n"
    )
    monkeypatch.setattr(cli, "_start_ray", lambda *args, **kwargs: None)  # the check runs before any trial
    assert cli.main(["run", str(tmp_path / "sweep.yaml")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "sweep.yaml:6: scaling: coordinate check (mup, widths [32, 64, 128, 256]" in err, err
    assert "FAILED" in err and "Traceback" not in err
