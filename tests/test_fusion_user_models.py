"""Models and configs as users bring them from outside this project: fused, each member trains as
the same config trains alone with plain PyTorch, or fusion refuses it in one line (a FusionError,
or the ValueError the config gets alone) that names the layer, parameter or key and says why;
never an internal exception, a misleading reason, or a group that trains what PyTorch refuses."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint
from torch.utils.data import Dataset, TensorDataset

from fusion import FusedTrainer, FusionError, fuse_models
from hpo import DatasetWorkload
from hpo.base.training import TrialTrainer
from tests.test_fusion_hooks import assert_members_train_as_alone

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


class Doubling(nn.Module):
    def forward(self, x):
        return torch.cat([x, x], dim=1)


def test_a_model_without_parameters_is_refused_in_one_line():
    # fuse_models raised StopIteration from FusedModel.num_members
    with pytest.raises(FusionError, match=r"^the model \(Doubling\) has no parameters or buffers: there is nothing to fuse$"):
        fuse_models([Doubling(), Doubling()], torch.randn(4, 6))
    with pytest.raises(FusionError, match=r"^the model has nothing to train: it has no parameters$"):
        FusedTrainer(workload(lambda config: Doubling()), CONFIGS)


def frozen(config):
    return nn.Sequential(nn.Linear(6, 3)).requires_grad_(False)


@pytest.mark.parametrize("verify", [True, False])
def test_a_model_whose_parameters_are_all_frozen_is_refused_saying_there_is_nothing_to_train(verify):
    # the guard said it "cannot train this group in float64" and that verify: false trains it
    with pytest.raises(FusionError, match=r"^the model has nothing to train: its 2 parameters are all frozen \(requires_grad=False\)$"):
        FusedTrainer(workload(frozen), CONFIGS, verify=verify)


class ComplexFilter(nn.Module):
    def __init__(self):
        super().__init__()
        self.filter = nn.Parameter(torch.randn(6, 3, dtype=torch.complex64) * 0.3)

    def forward(self, x):
        return (x.to(torch.complex64) @ self.filter).abs()


@pytest.mark.parametrize("verify", [True, False])
def test_a_complex_parameter_is_refused_naming_it(verify):
    # verify on: the guard "cannot train this group"; off: NotImplementedError from the first step
    with pytest.raises(FusionError, match=r"^parameter 'filter' is torch\.complex64, and the fused optimizer steps real parameters only" + ONE_LINE):
        FusedTrainer(workload(lambda config: ComplexFilter()), CONFIGS, verify=verify)


class HalfGate(nn.Module):
    """A float64 model with a float32 gate (the guard's float64 copy hides the difference)."""

    def __init__(self):
        super().__init__()
        self.gate = nn.Parameter(torch.ones(3, dtype=torch.float32))
        self.fc = nn.Linear(6, 3, dtype=torch.float64)

    def forward(self, x):
        return self.fc(x) * self.gate.double()


@pytest.mark.parametrize("verify", [True, False])
def test_parameters_of_two_dtypes_are_refused_naming_both(verify):
    # a ValueError that named no parameter, after the guard had trained a float64 copy
    with pytest.raises(FusionError, match=r"^parameter 'fc\.weight' is torch\.float64 but 'gate' is torch\.float32" + ONE_LINE):
        FusedTrainer(workload(lambda config: HalfGate(), torch.float64), CONFIGS, verify=verify)


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


#: Config values torch.optim refuses for an optimizer, by key: (optimizer, values beside it).
REFUSED_BY_TORCH = {
    "beta1": ("adam", st.one_of(st.floats(max_value=-1e-9, min_value=-10), st.floats(min_value=1.0, max_value=10))),
    "beta2": ("adamw", st.one_of(st.floats(max_value=-1e-9, min_value=-10), st.floats(min_value=1.0, max_value=10))),
    "eps": ("adam", st.floats(max_value=-1e-12, min_value=-1.0)),
    "weight_decay": ("adamw", st.floats(max_value=-1e-12, min_value=-1.0)),
    "momentum": ("sgd", st.floats(max_value=-1e-9, min_value=-1.0)),
    "nesterov": ("sgd", st.just(True)),  # with the default momentum, 0
}


@settings(max_examples=25, deadline=None, database=None)
@given(key=st.sampled_from(sorted(REFUSED_BY_TORCH)), data=st.data(), verify=st.booleans())
def test_optimizer_values_torch_optim_refuses_are_refused_alike_fused_and_alone(key, data, verify):
    # fused, these trained unchecked with verify off (beta2 = 1 divides by zero, a negative decay
    # grows the weights) and were refused as a group "the differential check cannot train" with it on
    optimizer, values = REFUSED_BY_TORCH[key]
    configs = [{**config, "optimizer": optimizer, key: data.draw(values)} for config in CONFIGS]
    message = rf"^config key '{key}' " + ONE_LINE
    with pytest.raises(ValueError, match=message):
        TrialTrainer(workload(lambda config: nn.Linear(6, 3)), configs[0])
    with pytest.raises(ValueError, match=message):
        FusedTrainer(workload(lambda config: nn.Linear(6, 3)), configs, verify=verify)


def test_nesterov_with_adam_is_ignored_fused_as_torch_ignores_it_alone():
    # alone, torch.optim.Adam has no Nesterov and trains; fused, the group was refused
    configs = [{**config, "nesterov": True} for config in CONFIGS]
    data = workload(lambda config: nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3)).double(), torch.float64)
    assert_members_train_as_alone(FusedTrainer(data, configs), rtol=1e-12, atol=0)


def linear(config):
    return nn.Sequential(nn.Linear(6, 3))


@pytest.mark.parametrize("verify", [True, False])
def test_a_per_sample_loss_is_refused_as_training_alone_refuses_it(verify):
    # `reduction="none"`: alone, loss.backward() refuses it; fused, the guard "cannot train this
    # group ... verify: false trains it unchecked", and unchecked the group summed it and trained
    # until the iteration's loss sum failed on a shape
    data = workload(linear)
    data.loss_fn = lambda output, target: F.cross_entropy(output, target, reduction="none")
    with pytest.raises(RuntimeError, match="only for scalar outputs"):
        TrialTrainer(data, CONFIGS[0]).train_iteration()
    with pytest.raises(FusionError, match=r"^the workload's loss is a tensor of shape \(\d+,\) for one member's output, not one number" + ONE_LINE):
        FusedTrainer(data, CONFIGS, verify=verify).train_iteration()


def test_a_per_sample_metric_is_refused_as_evaluating_alone_refuses_it():
    # alone, `.item()` refuses it; fused, every member reported a list of numbers as its metric
    data = workload(linear)
    data.metric_fns = {"hits": lambda output, target: (output.argmax(-1) == target).float()}
    with pytest.raises(RuntimeError, match="cannot be converted to Scalar"):
        TrialTrainer(data, CONFIGS[0]).train_iteration()
    with pytest.raises(FusionError, match=r"^the workload's metric 'hits' is a tensor of shape \(16,\) for one member's output" + ONE_LINE):
        FusedTrainer(data, CONFIGS).train_iteration()


def test_a_loss_of_one_element_trains_as_alone():
    # `.view(1)`: alone, backward takes it; fused, the loss sum failed on a broadcast ([B] + [B, 1])
    data = workload(lambda config: nn.Sequential(nn.Linear(6, 3)).double(), torch.float64)
    data.loss_fn = lambda output, target: F.cross_entropy(output, target).view(1)
    assert_members_train_as_alone(FusedTrainer(data, CONFIGS), rtol=1e-12, atol=0)


class CompiledBody(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.compile(nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3)), backend="eager")

    def forward(self, x):
        return self.body(x)


def test_a_torch_compile_wrapper_is_refused_saying_to_compile_in_place():
    # "differs between members in attribute 'dynamo_ctx'", and on the stacked path "it is called a
    # different number of times at another batch size": the wrapper's code calls the member's own module
    with pytest.raises(FusionError, match=r"^layer 'body' is torch\.compile's wrapper \(OptimizedModule\) of a Sequential, .*module\.compile\(\)" + ONE_LINE):
        FusedTrainer(workload(lambda config: CompiledBody()), CONFIGS)


def test_a_module_compiled_in_place_trains_as_alone():
    def model(config):
        net = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3)).double()
        net.compile(backend="eager")
        return net

    assert_members_train_as_alone(FusedTrainer(workload(model, torch.float64), CONFIGS), rtol=1e-12, atol=0)


class TwoViews(Dataset):
    """Items of two input tensors and a label: ((x, x * 2), y)."""

    def __init__(self):
        generator = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(32, 6, generator=generator), torch.randint(0, 3, (32,), generator=generator)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, index):
        return (self.x[index], self.x[index] * 2), self.y[index]


class TwoInputs(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(6, 3), nn.Linear(6, 3)

    def forward(self, views):
        return self.a(views[0]) + self.b(views[1])


@pytest.mark.parametrize("verify", [True, False])
def test_batches_whose_inputs_are_not_one_tensor_are_refused_naming_what_they_are(verify):
    # "TypeError: equal(): argument 'input' (position 1) must be Tensor, not list" (verify on), or
    # "'list' object has no attribute 'unsqueeze'" from both fusion paths
    data = DatasetWorkload(model=lambda config: TwoInputs(), train=TwoViews(), val=TwoViews(), loss=F.cross_entropy, defaults={"batch_size": 8})
    with pytest.raises(FusionError, match=r"^the workload's batches give their inputs as a list; " + ONE_LINE):
        FusedTrainer(data, CONFIGS, verify=verify)


class UnfreezesLater(nn.Module):
    """A frozen backbone that the model unfreezes at its third training call (gradual unfreezing)."""

    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(6, 8), nn.Tanh()).requires_grad_(False)
        self.head = nn.Linear(8, 3)
        self.calls = 0

    def forward(self, x):
        if self.training:
            self.calls += 1
            if self.calls == 3:
                self.backbone.requires_grad_(True)
        return self.head(self.backbone(x))


def test_a_parameter_unfrozen_during_training_is_refused_naming_it_not_left_untrained():
    # alone, torch.optim holds the frozen backbone and steps it once it has gradients; fused, the
    # optimizer's matrices held only the head and the backbone never moved (0.25 relative after 6 steps)
    trainer = FusedTrainer(workload(lambda config: UnfreezesLater()), CONFIGS)
    trainer.train_iteration()  # steps 1 and 2 (the guard trained a copy, which left this model's count at 0)
    with pytest.raises(FusionError, match=r"^parameter 'backbone\.0\.weight' was frozen when the group formed and has a gradient at step 3 " + ONE_LINE):
        trainer.train_iteration()


class ClipsByReassigning(nn.Module):
    """Weight clipping written as `weight.data = weight.data.clamp(...)` (WGAN style) in forward."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(6, 8), nn.Linear(8, 3)

    def forward(self, x):
        if self.training:
            self.a.weight.data = self.a.weight.data.clamp(-0.3, 0.3)
        return self.b(torch.tanh(self.a(x)))


def test_a_parameter_given_new_storage_in_forward_is_refused_naming_the_cause():
    # alone, torch.optim steps the parameter whatever its storage; fused, the optimizer steps its
    # matrix, which the parameter no longer reads: refused only as "member 1's parameter 'a.weight' differs"
    with pytest.raises(FusionError, match=r"^parameter 'a\.weight' got new storage during training \(param\.data = \.\.\.\)" + ONE_LINE):
        FusedTrainer(workload(lambda config: ClipsByReassigning()), CONFIGS)


class RescalesLargeInputs(nn.Module):
    """A branch on the input's values: eager code, which dynamo cannot trace as one graph."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(6, 8), nn.Linear(8, 3)

    def forward(self, x):
        if x.abs().max() > 100:
            x = x / 100
        return self.b(torch.tanh(self.a(x)))


def test_a_forward_with_a_graph_break_is_refused_in_one_line_when_compiling_was_asked_for():
    # a multi-line torch._dynamo.exc.Unsupported from the first step, where the config alone trains
    trainer = FusedTrainer(workload(lambda config: RescalesLargeInputs()), CONFIGS, compile="inductor")
    with pytest.raises(FusionError, match=r"^the fused step cannot be compiled whole \(fusion: \{compile: inductor\}\): the model's forward has a graph break \(Unsupported: Data-dependent branching\)" + ONE_LINE):
        trainer.train_iteration()


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_forward_with_a_graph_break_trains_eagerly_and_as_alone_under_auto_on_cuda():
    # "auto" is the captured step on CUDA (fullgraph=True): every model with a graph break failed
    # its first fused step there, while each config alone trained
    data = workload(lambda config: RescalesLargeInputs().double(), torch.float64)
    trainer = FusedTrainer(data, CONFIGS, device="cuda")
    assert trainer.compile_path == "graphs"
    assert_members_train_as_alone(trainer, rtol=1e-10, atol=1e-12)
    assert trainer.compile_path == "off"


class CheckpointedWithTemperature(nn.Module):
    """A checkpointed block, and a learned temperature on the model itself (which sends it to vmap)."""

    def __init__(self, reentrant: bool):
        super().__init__()
        self.block, self.head = nn.Sequential(nn.Linear(6, 6), nn.Tanh()), nn.Linear(6, 3)
        self.temperature = nn.Parameter(torch.tensor(1.5))
        self.reentrant = reentrant

    def forward(self, x):
        return self.head(checkpoint(self.block, x, use_reentrant=self.reentrant)) / self.temperature


@pytest.mark.parametrize("reentrant", [False, True])
def test_checkpointing_on_the_vmap_path_is_refused_naming_torch_utils_checkpoint(reentrant):
    # "layer 'block.0' (Linear) cannot run vmap-fused: RuntimeError: t() expects a tensor with <= 2
    # dimensions": the recomputation in the backward runs outside vmap, on every member's weights
    with pytest.raises(FusionError, match=r"^layer '[^']*' \(\w+\) cannot run vmap-fused under torch\.utils\.checkpoint, which torch\.func\.vmap does not run per member"):
        FusedTrainer(workload(lambda config: CheckpointedWithTemperature(reentrant)), CONFIGS)
