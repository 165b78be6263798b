"""Models and configs as users bring them from outside this project: fused, each member trains as
the same config trains alone with plain PyTorch, or fusion refuses it in one line (a FusionError,
or the ValueError the config gets alone) that names the layer, parameter or key and says why;
never an internal exception, a misleading reason, or a group that trains what PyTorch refuses."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import TensorDataset

from fusion import FusedTrainer, FusionError
from hpo import DatasetWorkload

CONFIGS = [
    {"optimizer": "adam", "lr": 1e-2, "seed": 0},
    {"optimizer": "adam", "lr": 3e-2, "seed": 1, "weight_decay": 0.01, "grad_clip": 0.5},
]

#: One line, and nothing after it: what a sweep shows as the member's reason.
ONE_LINE = r"[^\n]*$"


def workload(model, dtype: torch.dtype = torch.float32) -> DatasetWorkload:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(64, 6, generator=generator, dtype=dtype)
    y = torch.randint(0, 3, (64,), generator=generator)
    return DatasetWorkload(
        model=model, train=TensorDataset(x, y), val=TensorDataset(x[:16], y[:16]), loss=F.cross_entropy,
        defaults={"batch_size": 16}, steps_per_iteration=2, name="outside",
    )


class MonteCarloDropout(nn.Dropout):
    """Dropout kept on at evaluation, for uncertainty estimates (MC dropout)."""

    def forward(self, x):
        return F.dropout(x, self.p, training=True)


def mc_dropout(config):
    return nn.Sequential(nn.Linear(6, 8), MonteCarloDropout(0.2), nn.Linear(8, 3))


@pytest.mark.parametrize("strategy", ["auto", "stacked", "vmap"])
def test_a_model_that_draws_random_numbers_in_eval_mode_is_refused_naming_the_layer(strategy):
    # auto and vmap raised fusion.model._NotStackable ("member 1's fused output differs from its
    # own model's in eval mode"), an internal exception; stacked gave that reason without the layer
    with pytest.raises(FusionError, match=r"^layer '1' \(MonteCarloDropout\) draws random numbers in eval mode" + ONE_LINE):
        FusedTrainer(workload(mc_dropout), CONFIGS, strategy=strategy)


class Annealed(nn.Module):
    """A temperature annealed by a step count the class keeps (shared by every instance)."""

    calls = 0

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 3)

    def forward(self, x):
        type(self).calls += 1
        return self.fc(x) / (1.0 + 0.01 * type(self).calls)


def test_a_model_whose_eval_output_changes_from_call_to_call_is_refused_naming_the_layer():
    with pytest.raises(FusionError, match=r"^layer '<root>' \(Annealed\) gives another output for one input at every call" + ONE_LINE):
        FusedTrainer(workload(lambda config: Annealed()), CONFIGS)


def factory_defined(config):
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(6, 3)

        def forward(self, x):
            return self.fc(x)

    return Net()


def test_a_class_defined_inside_the_model_factory_is_refused_saying_so():
    # "members differ in layer '<root>': ['Net']": one name, no reason
    with pytest.raises(FusionError, match=r"^members' layer '<root>' are instances of different classes that share the name .*factory_defined\.<locals>\.Net .*define the class once, outside the factory$"):
        FusedTrainer(workload(factory_defined), CONFIGS)
