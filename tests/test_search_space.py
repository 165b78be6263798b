"""W&B parameter specs become exactly the Tune domains they mean."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, strategies as st
from pydantic import ValidationError
from ray import tune

from hpo.cli import main
from hpo.tuner.sweep import to_tune_domain
from hpo.config.spec import DISTRIBUTION_ALIASES, ParameterSpec
from hpo.config.sweep_file import YamlSource


def samples(spec: dict, n: int = 2000) -> list:
    domain = to_tune_domain(ParameterSpec.model_validate(spec))
    random.seed(0)
    import numpy as np

    np.random.seed(0)
    return [domain.sample() for _ in range(n)]


def test_int_uniform_includes_its_max_unlike_tune_randint():
    values = samples({"distribution": "int_uniform", "min": 1, "max": 3})
    assert set(values) == {1, 2, 3}


def test_log_uniform_takes_natural_log_exponents():
    values = samples({"distribution": "log_uniform", "min": math.log(1e-4), "max": math.log(1e-1)})
    assert 1e-4 <= min(values) and max(values) <= 1e-1
    assert min(values) < 1e-3 < max(values)


def test_log_uniform_values_takes_the_values_themselves():
    values = samples({"distribution": "log_uniform_values", "min": 1e-4, "max": 1e-1})
    assert 1e-4 <= min(values) and max(values) <= 1e-1
    share_below = sum(v < 1e-2 for v in values) / len(values)
    assert 0.6 < share_below < 0.73  # two of three decades on a log scale


def test_q_uniform_rounds_to_multiples_of_q():
    values = samples({"distribution": "q_uniform", "min": 0, "max": 1, "q": 0.25})
    assert set(values) <= {0.0, 0.25, 0.5, 0.75, 1.0}


def test_inferred_distributions_follow_wandb():
    assert ParameterSpec.model_validate({"min": 1, "max": 5}).distribution == "int_uniform"
    assert ParameterSpec.model_validate({"min": 1.0, "max": 5}).distribution == "uniform"
    assert ParameterSpec.model_validate({"values": [1, 2]}).distribution == "categorical"
    assert ParameterSpec.model_validate({"value": 3}).distribution == "constant"


def test_values_become_a_grid_under_the_grid_method():
    domain = to_tune_domain(ParameterSpec.model_validate({"values": [1, 2]}), grid=True)
    assert domain == tune.grid_search([1, 2])


def test_yaml_reads_scientific_notation_as_numbers_not_strings():
    parameters = YamlSource.from_text("lr: {values: [1e-3, 3E-2, 1.5e-1]}\nwd: {min: 1e-5, max: 1e-2}").data
    lr = ParameterSpec.model_validate(parameters["lr"])
    assert lr.values == [1e-3, 3e-2, 0.15]
    assert ParameterSpec.model_validate(parameters["wd"]).distribution == "uniform"


# -- other tools' names (issue 34, item 1): a suggestion never silently searches the wrong space --

FUNCTION_SWEEP = """\
name: t
trainable: space_trainable:train
metric: {{name: loss, goal: minimize}}
parameters:
  lr: {lr}
"""


def sweep_file(tmp_path, lr: str, trainable: bool = True):
    if trainable:
        (tmp_path / "space_trainable.py").write_text("def train(config):\n    pass\ntrain.reported_metrics = ('loss',)\n")
    path = tmp_path / "sweep.yaml"
    path.write_text(FUNCTION_SWEEP.format(lr=lr))
    return path


@pytest.mark.parametrize(("alias", "meaning"), sorted(DISTRIBUTION_ALIASES.items()))
def test_ray_and_optuna_names_are_read_as_the_distribution_they_name_there(alias, meaning):
    bounds = {
        "categorical": {"values": [1, 2]},
        "int_uniform": {"min": 1, "max": 3},
        "normal": {"mu": 0.0, "sigma": 1.0},
        "q_normal": {"mu": 0.0, "sigma": 1.0, "q": 1e-4},
        "q_uniform": {"min": 1e-4, "max": 0.05, "q": 1e-4},
        "q_log_uniform_values": {"min": 1e-4, "max": 0.05, "q": 1e-4},
    }.get(meaning, {"min": 1e-4, "max": 0.05})
    param = ParameterSpec.model_validate({"distribution": alias, **bounds})
    assert param.distribution == meaning


def test_rays_loguniform_searches_the_values_it_is_given_not_their_exponentials():
    values = samples({"distribution": "loguniform", "min": 1e-4, "max": 0.05})
    assert 1e-4 <= min(values) < 1e-3 and 1e-2 < max(values) <= 0.05


def test_rays_randint_is_refused_with_what_to_write_since_its_upper_bound_is_excluded(tmp_path, capsys):
    assert main(["validate", "--no-exec", str(sweep_file(tmp_path, "{distribution: randint, min: 1, max: 4}"))]) == 2
    err = capsys.readouterr().err
    assert "sweep.yaml:5: parameters.lr.distribution: unknown distribution 'randint': Ray's randint excludes" in err
    assert "write distribution: int_uniform" in err


@pytest.mark.parametrize("typo", ["logunifrom", "log-uniform", "LogUniform"])
def test_a_misspelt_log_scale_with_value_bounds_suggests_log_uniform_values(tmp_path, capsys, typo):
    assert main(["validate", "--no-exec", str(sweep_file(tmp_path, f"{{distribution: {typo}, min: 0.0001, max: 0.05}}"))]) == 2
    assert "(did you mean 'log_uniform_values'?)" in capsys.readouterr().err


def test_log_uniform_with_bounds_that_read_as_values_is_flagged_before_ray_starts(tmp_path, capsys):
    path = sweep_file(tmp_path, "{distribution: log_uniform, min: 0.0001, max: 0.05}")
    assert main(["validate", str(path)]) == 0
    captured = capsys.readouterr()
    assert captured.err.startswith(
        f"{path}:5: parameters.lr.distribution: warning: log_uniform takes natural-log exponents (as in W&B): "
        "min 0.0001 and max 0.05 search lr from exp(0.0001) = 1 to exp(0.05) = 1.051"
    ), captured.err
    assert "write distribution: log_uniform_values" in captured.err
    assert f"{path}: OK (all checks; 1 warning above)" in captured.out


def test_real_exponents_raise_no_warning(tmp_path, capsys):
    assert main(["validate", str(sweep_file(tmp_path, "{distribution: log_uniform, min: -9.2, max: -3}"))]) == 0
    assert "warning" not in capsys.readouterr().err


@given(low=st.floats(-50, 50), span=st.floats(0.0, 60))
def test_log_uniform_bounds_look_like_values_exactly_when_both_are_in_0_1_or_span_under_a_tenth(low, span):
    high = low + span
    if not high > low:
        return
    param = ParameterSpec.model_validate({"distribution": "log_uniform", "min": low, "max": high})
    in_unit = 0 < low <= 1 and 0 < high <= 1
    assert param.log_bounds_look_like_values == (in_unit or math.exp(high - low) < 1.1)


@pytest.mark.parametrize(
    ("written", "meant"),
    [
        ("{distribution: log_uniform_values, low: 0.0001, max: 0.05}", "min"),
        ("{distribution: log_uniform_values, min: 0.0001, upper: 0.05}", "max"),
        ("{distribution: normal, mean: 0, std: 1}", "mu"),
        ("{choices: [1, 2]}", "values"),
    ],
)
def test_every_key_written_as_another_tool_writes_it_gets_a_did_you_mean(tmp_path, capsys, written, meant):
    assert main(["validate", "--no-exec", str(sweep_file(tmp_path, written))]) == 2
    assert f"(did you mean {meant!r}?)" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("extra", "meant"),
    [("num_samples: 8", "run_cap"), ("search_alg: tpe", "method"), ("scheduler: {type: asha}", "early_terminate"),
     ("early_terminate: {type: asha, grace_period: 2}", "min_iter"), ("resources: {cpus: 1}", "cpu"),
     ("metric2: 1", "metric")],
)
def test_top_level_and_nested_keys_from_tune_get_a_did_you_mean(tmp_path, capsys, extra, meant):
    path = sweep_file(tmp_path, "{values: [1, 2]}")
    path.write_text(path.read_text() + extra + "\n")
    assert main(["validate", "--no-exec", str(path)]) == 2
    assert f"(did you mean {meant!r}?)" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("written", "key"),
    [
        ("{distribution: normal, mu: 0, sigma: 1, min: -1}", "min"),  # would look truncated; Tune's normal is not
        ("{distribution: int_uniform, min: 1, max: 9, q: 2}", "q"),  # would look stepped; every integer is drawn
        ("{distribution: uniform, min: 0, max: 1, mu: 0.5}", "mu"),
        ("{value: 1, values: [1, 2]}", "values"),  # a constant: the list would never be searched
        ("{values: [1, 2], min: 0, max: 3}", "max"),
    ],
)
def test_a_key_the_distribution_does_not_use_is_refused_not_ignored(tmp_path, capsys, written, key):
    assert main(["validate", "--no-exec", str(sweep_file(tmp_path, written))]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"sweep.yaml:5: parameters.lr.{key}: distribution " in err
    assert f"does not use '{key}'" in err


@given(
    kind=st.sampled_from(["q_uniform", "q_log_uniform_values"]),
    low=st.integers(1, 40),
    span=st.integers(1, 40),
    q=st.sampled_from([0.1, 0.25, 0.3, 1, 2, 3, 5]),
    scale=st.sampled_from([0.1, 1, 7]),
)
def test_a_quantised_range_either_is_refused_at_its_bound_or_draws_only_multiples_of_q_within_it(kind, low, span, q, scale):
    """Tune refuses bounds that are not multiples of q only once the sweep starts; the spec must refuse
    them first, naming the bound, and every range it accepts must build and stay within its bounds."""
    spec = {"distribution": kind, "min": low * scale, "max": (low + span) * scale, "q": q}
    try:
        param = ParameterSpec.model_validate(spec)
    except ValidationError as exc:
        assert "is not a multiple of q" in str(exc)
        return
    domain = to_tune_domain(param)
    values = domain.sample(size=200)
    assert all(param.min - 1e-9 <= v <= param.max + 1e-9 for v in values)
    assert all(math.isclose(v / q, round(v / q), abs_tol=1e-6) for v in values)


@pytest.mark.parametrize("method", ["bayes", "tpe", "optuna"])
@pytest.mark.parametrize(
    "written",
    [
        "{distribution: normal, mu: 0, sigma: 1}",  # OptunaSearch raised once Ray had started: a traceback, exit 1
        "{distribution: q_normal, mu: 0, sigma: 1, q: 1}",
        "{distribution: q_log_uniform_values, min: 1, max: 64, q: 1}",  # Optuna dropped q with a warning
    ],
)
def test_distributions_optunas_tpe_cannot_sample_are_refused_for_its_methods(tmp_path, capsys, method, written):
    path = sweep_file(tmp_path, written)
    path.write_text(path.read_text().replace("parameters:", f"method: {method}\nparameters:"))
    assert main(["validate", "--no-exec", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "sweep.yaml:6: parameters.lr.distribution: method " in err
    assert "Optuna's TPE cannot" in err


@pytest.mark.parametrize("distribution", ["constant", "categorical", "int_uniform", "uniform", "q_uniform",
                                          "log_uniform", "log_uniform_values"])
def test_every_distribution_a_tpe_sweep_accepts_converts_to_optuna(distribution):
    from ray.tune.search.optuna import OptunaSearch

    written = {
        "constant": {"value": 3}, "categorical": {"values": [1, 2]}, "int_uniform": {"min": 1, "max": 4},
        "q_uniform": {"min": 0, "max": 1, "q": 0.25}, "log_uniform": {"min": -9, "max": -2},
    }.get(distribution, {"min": 0.001, "max": 0.1})
    domain = to_tune_domain(ParameterSpec.model_validate({"distribution": distribution, **written}))
    if distribution != "constant":
        assert OptunaSearch.convert_search_space({"x": domain})


def test_int_uniform_bounds_a_float_cannot_hold_exactly_are_refused(tmp_path, capsys):
    """`max: 10**29` read as 99999999999999991433150857216 and then overflowed NumPy's int64 in the trial."""
    assert main(["validate", "--no-exec", str(sweep_file(tmp_path, "{min: 0, max: 100000000000000000000000000000}"))]) == 2
    assert "sweep.yaml:5: parameters.lr.max: int_uniform bounds must lie within ±2**53" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("written", "key", "words"),
    [
        ("{distribution: log_uniform, min: -800, max: -1}", "min", "exp(-800) is 0 to a float"),  # Ray: lower bound 0
        ("{min: -1.0e308, max: 1.0e308}", "max", "overflows a float"),  # NumPy: OverflowError in the searcher
    ],
)
def test_bounds_whose_range_a_float_cannot_hold_are_refused_before_ray_starts(tmp_path, capsys, written, key, words):
    assert main(["validate", "--no-exec", str(sweep_file(tmp_path, written))]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"sweep.yaml:5: parameters.lr.{key}: " in err and words in err, err


@given(low=st.floats(-1e308, 1e308), high=st.floats(-1e308, 1e308),
       kind=st.sampled_from(["uniform", "log_uniform", "log_uniform_values"]))
def test_every_range_the_spec_accepts_draws_finite_values_within_its_bounds(low, high, kind):
    try:
        param = ParameterSpec.model_validate({"distribution": kind, "min": low, "max": high})
    except ValidationError:
        return
    values = to_tune_domain(param).sample(size=50)
    lo, hi = (math.exp(low), math.exp(high)) if kind == "log_uniform" else (low, high)
    assert all(math.isfinite(v) and lo - 1e-9 * abs(lo) <= v <= hi + 1e-9 * abs(hi) for v in values)
