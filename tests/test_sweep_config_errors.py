"""`hpo validate` and `hpo run` reject each class of bad input with exit 2 and the key's name."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hpo.cli import main
from hpo.config.sweep_file import load_sweep

VALID = """\
name: t
trainable: mlp_digits
method: random
metric: {name: val_loss, goal: minimize}
parameters:
  lr: {distribution: log_uniform_values, min: 0.001, max: 0.1}
  width: {values: [16, 32]}
run_cap: 2
max_iterations: 1
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "sweep.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def validate(path: Path, capsys) -> tuple[int, str]:
    code = main(["validate", str(path)])
    return code, capsys.readouterr().err


def test_valid_file_passes(tmp_path, capsys):
    code, _ = validate(write(tmp_path, VALID), capsys)
    assert code == 0


@pytest.mark.parametrize(
    ("bad", "key", "line", "words"),
    [
        (VALID.replace("run_cap: 2", "run_cpa: 2"), "run_cpa", 8, "did you mean 'run_cap'"),
        (VALID.replace("max_iterations: 1", "max_iterations: many"), "max_iterations", 9, "integer"),
        (VALID.replace("min: 0.001, max: 0.1", "min: 0.1, max: 0.01"), "parameters.lr.max", 6, "greater than min"),
        (VALID.replace("min: 0.001, max: 0.1", "min: 0.0, max: 0.1"), "parameters.lr.min", 6, "positive"),
        (VALID.replace("method: random", "method: grid"), "parameters.lr.distribution", 6, "grid search needs discrete"),
        (VALID.replace("name: val_loss", "name: val_f1"), "metric.name", 4, "never reports 'val_f1'"),
        (VALID.replace("trainable: mlp_digits", "trainable: nowhere.module:train"), "trainable", 2, "cannot import"),
        (VALID.replace("{values: [16, 32]}", "{valeus: [16, 32]}"), "parameters.width.valeus", 7, "did you mean 'values'"),
        (VALID.replace("goal: minimize", "goal: smallest"), "metric.goal", 4, "minimize"),
        (VALID + "fusion: {placement: bubbles}\n", "fusion", 10, "needs an explicit max_members"),
        (VALID + "fusion: {placement: bubbles, max_members: two}\n", "fusion.max_members", 10,
         "max_members must be 'auto' or a positive integer, got 'two'"),
        (VALID.replace("{values: [16, 32]}", "32"), "parameters.width", 7, "32 is not a parameter: write {value: 32}"),
        (VALID.replace("{values: [16, 32]}", "[16, 32]"), "parameters.width", 7, "write {values: [16, 32]} to search these values"),
        (VALID + "fusion: true\n", "fusion", 10, "true is not a block of settings: write {enabled: true} (its keys: enabled, max_members"),
        (VALID + "early_terminate: asha\n", "early_terminate", 10, "'asha' is not a block of settings: write {key: value, ...} (its keys: type"),
        (VALID.replace("method: random", "method: grid").replace("{distribution: log_uniform_values, min: 0.001, max: 0.1}", "{values: [0.01, 0.1, 1.0]}"),
         "run_cap", 8, "a grid runs each of its 6 combinations once, so run_cap would not cap it"),
        (VALID + "early_terminate: {type: hyperband, min_iter: 3}\n", "early_terminate", 10, "min_iter 3 does not go with type hyperband"),
    ],
    ids=["unknown-key", "wrong-type", "min-ge-max", "non-positive-log-bound", "grid-continuous",
         "metric-never-reported", "unimportable-trainable", "unknown-nested-key", "bad-enum",
         "bubbles-without-group-size", "group-size-in-words", "bare-value", "bare-list", "bare-block-flag", "bare-block-value", "grid-with-run-cap",
         "hyperband-min-iter"],
)
def test_bad_input_names_key_and_line(tmp_path, capsys, bad, key, line, words):
    code, err = validate(write(tmp_path, bad), capsys)
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1, err
    assert f"sweep.yaml:{line}: {key}:" in err, err
    assert words in err, err


@pytest.mark.parametrize(
    ("old", "new", "key", "line", "words"),
    [
        ("run_cap: 2", "run_cap: true", "run_cap", 8, "valid integer, got true"),  # was read as 1 run
        ("run_cap: 2", "run_cap: '5'", "run_cap", 8, "valid integer, got '5'"),
        ("max_iterations: 1", "max_iterations: yes", "max_iterations", 9, "valid integer, got true"),
        ("min: 0.001, max: 0.1", "min: '0.001', max: 0.1", "parameters.lr.min", 6, "valid number, got '0.001'"),
        ("goal: minimize}", "goal: minimize}\nmax_concurrent_trials: on", "max_concurrent_trials", 5, "got true"),
        ("run_cap: 2", "run_cap: 2\nseed: -1", "seed", 9, "greater than or equal to 0"),  # NumPy refused it in the driver
        ("run_cap: 2", "run_cap: 2\nseed: 4294967296", "seed", 9, "less than or equal to 4294967295"),  # so did Optuna
    ],
    ids=["bool-count", "quoted-count", "yes-count", "quoted-bound", "bool-limit", "negative-seed", "seed-past-32-bits"],
)
def test_a_boolean_or_quoted_number_where_a_number_is_wanted_is_refused_with_what_was_given(
    tmp_path, capsys, old, new, key, line, words
):
    """Pydantic's lax mode read `true` as 1 and `'5'` as 5: a sweep of one run, or a bound from a string."""
    code, err = validate(write(tmp_path, VALID.replace(old, new)), capsys)
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1, err
    assert f"sweep.yaml:{line}: {key}:" in err and words in err, err


def test_a_misspelt_required_key_is_one_line_that_suggests_it_not_also_a_missing_key(tmp_path, capsys):
    code, err = validate(write(tmp_path, VALID.replace("parameters:", "paramters:")), capsys)
    assert code == 2
    assert err.strip().splitlines() == [
        f"error: {tmp_path / 'sweep.yaml'}:5: paramters: unknown key 'paramters' (did you mean 'parameters'?)"
    ]


def test_missing_file_is_a_clear_error(tmp_path, capsys):
    code, err = validate(tmp_path / "absent.yaml", capsys)
    assert code == 2
    assert "no such sweep file" in err


def test_malformed_yaml_names_the_line(tmp_path, capsys):
    code, err = validate(write(tmp_path, VALID.replace("run_cap: 2", "run_cap: [2")), capsys)
    assert code == 2
    assert "malformed YAML" in err and "sweep.yaml:" in err


def test_yaml_tags_never_construct_python_objects(tmp_path, capsys):
    marker = tmp_path / "pwned"
    evil = VALID + f"description: !!python/object/apply:os.system ['touch {marker}']\n"
    code, err = validate(write(tmp_path, evil), capsys)
    assert code == 2 and "malformed YAML" in err
    assert not marker.exists()


def test_run_rejects_bad_input_the_same_way_without_a_traceback(tmp_path):
    path = write(tmp_path, VALID.replace("run_cap: 2", "run_cpa: 2"))
    proc = subprocess.run([sys.executable, "-m", "hpo.cli", "run", str(path)], capture_output=True, text=True)
    assert proc.returncode == 2
    assert "run_cpa" in proc.stderr and "Traceback" not in proc.stderr


def test_dry_run_prints_the_plan_without_starting_ray(tmp_path, capsys):
    import ray

    code = main(["run", "--dry-run", str(write(tmp_path, VALID))])
    out = capsys.readouterr().out
    assert code == 0
    assert "BasicVariantGenerator" in out and "lr: log-uniform from 0.001 to 0.1" in out
    assert not ray.is_initialized()


def test_every_shipped_config_validates(capsys):
    configs = sorted((Path(__file__).resolve().parents[1] / "configs").glob("*.yaml"))
    assert configs
    for path in configs:
        assert main(["validate", str(path)]) == 0, capsys.readouterr().err


def test_run_via_the_allocator_needs_a_sweep_that_targets_bubbles(tmp_path, capsys):
    code = main(["run", "--allocator", str(write(tmp_path, VALID + "fusion: {max_members: 2}\n"))])
    assert code == 2
    assert "needs fusion: {placement: bubbles" in capsys.readouterr().err


@pytest.mark.parametrize("command, env, says", [
    (["run", "--address", "127.0.0.1:9"], {}, "--address 127.0.0.1:9: no Ray cluster answers there"),
    (["run"], {"RAY_ADDRESS": "127.0.0.1:9"}, "RAY_ADDRESS 127.0.0.1:9: no Ray cluster answers there"),
    (["validate", "--address", "127.0.0.1:9"], {}, "--address 127.0.0.1:9: no Ray cluster answers there"),
    (["run"], {"RAY_ADDRESS": "head-node"}, "RAY_ADDRESS 'head-node': expected HOST:PORT of the cluster's head"),
])
def test_an_address_where_no_cluster_listens_is_one_line_at_once(tmp_path, capsys, monkeypatch, command, env, says):
    # `ray.init` retried such an address for minutes, a warning every few seconds, and never gave
    # up; nothing listens on port 9 here, and ray.init must not even be called
    import ray

    monkeypatch.setattr(ray, "init", lambda *a, **k: pytest.fail("ray.init was called"))
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    path = write(tmp_path, VALID)
    assert main([*command, str(path)]) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1, err


def test_run_with_the_dashboard_where_rays_dashboard_is_not_installed_is_one_line_before_ray_starts(
        tmp_path, capsys, monkeypatch):
    # `ray` without its `[default]` extra: Ray logged five lines, then `hpo run --dashboard` died
    # with a 30-line traceback ("Cannot include dashboard with missing packages"), exit 1
    import ray

    monkeypatch.setitem(sys.modules, "aiohttp_cors", None)  # a package of the extra, not installed
    monkeypatch.delitem(sys.modules, "ray.dashboard.optional_deps", raising=False)
    monkeypatch.setattr(ray, "init", lambda *a, **k: pytest.fail("ray.init was called"))
    assert main(["run", "--dashboard", str(write(tmp_path, VALID))]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --dashboard: ") and "ray[default]" in err and "aiohttp_cors" in err, err
    assert err.count("\n") == 1, err


@pytest.mark.parametrize(
    ("old", "new", "key", "line", "words"),
    [
        ("run_cap: 2", "run_cap: 2\ncommand: [python, train.py]", "command", 9, "name it in 'trainable'"),
        ("run_cap: 2", "run_cap: 2\nproject: digits", "project", 9, "logging: {wandb: {project: ...}}"),
        ("run_cap: 2", "run_cap: 2\nentity: me", "entity", 9, "logging: {wandb: {entity: ...}}"),
        ("  width: {values: [16, 32]}", "  optim:\n    parameters:\n      momentum: {values: [0.9]}",
         "parameters.optim.parameters", 8, "nested parameters are not supported"),
        ("goal: minimize}", "goal: minimize, target: 0.1}", "metric.target", 4, "stop: {<metric>: <value>}"),
        ("run_cap: 2", "run_cap: 2\nearly_terminate: {type: hyperband, eta: 3, s: 2}", "early_terminate.s", 9,
         "from max_iter and eta"),
    ],
    ids=["command", "project", "entity", "nested-parameters", "metric-target", "hyperband-s"],
)
def test_a_key_only_wandb_sweeps_have_says_what_to_write_here(tmp_path, capsys, old, new, key, line, words):
    code, err = validate(write(tmp_path, VALID.replace(old, new)), capsys)
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1, err
    assert f"sweep.yaml:{line}: {key}: W&B's {key.rpartition('.')[2]!r} has no counterpart here: " in err and words in err, err


def test_a_key_written_to_override_one_a_merge_brings_is_no_duplicate(tmp_path, capsys):
    """`<<: *base` then `max: 0.1`: YAML's merge keys exist to be overridden; the file was refused
    as giving `max` twice, 'first given on line 6' (the anchor's line, in another parameter)."""
    text = VALID.replace(
        "  lr: {distribution: log_uniform_values, min: 0.001, max: 0.1}",
        "  dropout: &log {distribution: log_uniform_values, min: 0.001, max: 0.01}\n  lr:\n    <<: *log\n    max: 0.1",
    )
    path = write(tmp_path, text)
    code, err = validate(path, capsys)
    assert code == 0, err
    assert load_sweep(path, execute=False).spec.parameters["lr"].max == 0.1


def test_an_error_in_a_merged_key_names_the_line_it_was_written_on(tmp_path, capsys):
    text = VALID.replace(
        "  lr: {distribution: log_uniform_values, min: 0.001, max: 0.1}",
        "  dropout: &log {distribution: log_uniform_values, min: 0.001, max: 0.01}\n  lr: {<<: *log, min: 0}",
    )
    code, err = validate(write(tmp_path, text), capsys)
    assert code == 2 and "sweep.yaml:7: parameters.lr.min: log bounds must be positive" in err, err
    text = text.replace("lr: {<<: *log, min: 0}", "lr: {<<: *log}").replace("min: 0.001", "min: -1")
    code, err = validate(write(tmp_path, text), capsys)
    assert "sweep.yaml:6: parameters.lr.min: log bounds must be positive" in err, err
