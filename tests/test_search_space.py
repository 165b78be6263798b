"""W&B parameter specs become exactly the Tune domains they mean."""

from __future__ import annotations

import math
import random

from ray import tune

from hpo.sweep import to_tune_domain
from hpo.spec import ParameterSpec
from hpo.sweep_file import YamlSource


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
