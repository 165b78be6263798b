"""The central property of fusion: a fused member trains exactly as the same config trained alone.

Each test trains B configs fused for 50 steps and each config alone with `TrialTrainer`
(PyTorch's own optimizers and schedules), then compares every member's parameters and losses.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.data import TensorDataset

from examples.char_gpt import workload as char_gpt
from examples.mlp_digits import workload as mlp_digits
from fusion import FusedTrainer
from hpo import DatasetWorkload
from hpo.base.training import TrialTrainer
from hpo.base.workload import Workload
from hpo.examples.vit_digits import workload as vit_digits
from hpo.scaling import MuPWorkload



STEPS = 50
TOLERANCE = 1e-5
MLP = {"width": 32, "steps_per_iteration": 25}
GPT = {"width": 32, "n_layer": 1, "batch_size": 8, "block_size": 16, "steps_per_iteration": 25}


def relative_error(fused: dict[str, torch.Tensor], alone: dict[str, torch.Tensor]) -> float:
    """|fused - alone| / |alone| over all of a model's floating-point tensors, as one vector."""
    names = [k for k, v in alone.items() if v.is_floating_point()]
    a = torch.cat([fused[k].detach().cpu().flatten() for k in names])
    b = torch.cat([alone[k].detach().cpu().flatten() for k in names])
    return ((a - b).norm() / b.norm()).item()


def assert_members_match_trained_alone(workload, configs, **trainer_kwargs) -> None:
    fused = FusedTrainer(workload, configs, **trainer_kwargs)
    fused_metrics = [fused.train_iteration() for _ in range(STEPS // fused.steps_per_iteration)]
    assert fused.step == STEPS
    for index, config in enumerate(configs):
        alone = TrialTrainer(workload, config)
        alone_metrics = [alone.train_iteration() for _ in range(STEPS // alone.steps_per_iteration)]
        error = relative_error(fused.model.member_state_dict(index), alone.model.state_dict())
        assert error <= TOLERANCE, f"member {index} ({config}) parameters differ from training alone: rel err {error:.2e}"
        for fused_iteration, alone_iteration in zip(fused_metrics, alone_metrics):
            for key in ("train_loss", "val_loss", "val_accuracy"):
                got, want = fused_iteration[index][key], alone_iteration[key]
                assert got == pytest.approx(want, rel=TOLERANCE), f"member {index} {key}: fused {got} vs alone {want}"
            assert fused_iteration[index]["step"] == alone_iteration["step"]


def test_adam_members_with_schedules_and_clipping_match_training_alone():
    configs = [
        {**MLP, "seed": 0, "optimizer": "adam", "lr": 1e-3},
        {**MLP, "seed": 1, "optimizer": "adam", "lr": 3e-3, "beta1": 0.8, "beta2": 0.99, "eps": 1e-7, "weight_decay": 1e-3},
        {**MLP, "seed": 2, "optimizer": "adam", "lr": 5e-3, "lr_schedule": "cosine", "warmup_steps": 5, "schedule_steps": 40, "min_lr_ratio": 0.1},
        {**MLP, "seed": 3, "optimizer": "adam", "lr": 2e-3, "grad_clip": 0.5, "lr_schedule": "step", "schedule_steps": 15, "lr_gamma": 0.5},
    ]
    assert_members_match_trained_alone(mlp_digits, configs)


def test_adamw_members_match_training_alone():
    configs = [
        {**MLP, "seed": 0, "optimizer": "adamw", "lr": 2e-3, "weight_decay": 0.1},
        {**MLP, "seed": 1, "optimizer": "adamw", "lr": 4e-3, "weight_decay": 0.0, "grad_clip": 1.0, "warmup_steps": 10},
    ]
    assert_members_match_trained_alone(mlp_digits, configs)


def test_sgd_momentum_and_nesterov_members_match_training_alone():
    configs = [
        {**MLP, "seed": 0, "optimizer": "sgd", "lr": 0.05, "momentum": 0.9, "nesterov": True, "weight_decay": 1e-3},
        {**MLP, "seed": 1, "optimizer": "sgd", "lr": 0.1, "momentum": 0.0, "grad_clip": 1.0},
        {**MLP, "seed": 2, "optimizer": "sgd", "lr": 0.02, "momentum": 0.5, "lr_schedule": "cosine", "schedule_steps": 50},
    ]
    assert_members_match_trained_alone(mlp_digits, configs)


def test_char_gpt_members_match_training_alone():
    # eps=1e-6: the key part of qkv.bias has an exactly zero gradient (softmax ignores a shift of
    # all logits), so its "gradient" is rounding noise that Adam with eps=1e-8 would amplify to
    # lr-sized random steps in fused and unfused runs alike; a larger eps keeps noise as noise.
    configs = [
        {**GPT, "seed": 0, "optimizer": "adamw", "lr": 3e-3, "eps": 1e-6, "weight_decay": 0.1},
        {**GPT, "seed": 1, "optimizer": "adamw", "lr": 1e-3, "eps": 1e-6, "grad_clip": 0.3, "warmup_steps": 10, "lr_schedule": "cosine", "schedule_steps": 50},
    ]
    assert_members_match_trained_alone(char_gpt, configs)


def test_both_fusion_strategies_train_the_mlp_identically_to_training_alone():
    configs = [{**MLP, "seed": 0, "lr": 2e-3}, {**MLP, "seed": 1, "lr": 1e-3, "grad_clip": 0.5}]
    assert_members_match_trained_alone(mlp_digits, configs, strategy="vmap")


def test_muP_multipliers_may_differ_between_members():
    # output_mult and init_std are per-member hyperparameters (muP); they fuse as per-member buffers.
    configs = [
        {**MLP, "seed": 0, "lr": 2e-3, "output_mult": 1.0},
        {**MLP, "seed": 1, "lr": 2e-3, "output_mult": 0.25, "init_std": 0.05},
    ]
    assert_members_match_trained_alone(mlp_digits, configs)


def test_depth_scaled_proxy_members_match_training_alone():
    # CompleteP's residual multiplier (per member here: the users' residual_mult differ) and its
    # per-parameter Adam eps and lr, fused as each member's torch.optim groups train it alone.
    proxy = MuPWorkload(vit_digits, 16, base_width=32, depth=1, base_depth=4)
    configs = [
        {"steps_per_iteration": 25, "seed": 0, "lr": 2e-3, "eps": 1e-4},
        {"steps_per_iteration": 25, "seed": 1, "lr": 4e-3, "eps": 1e-3, "residual_mult": 0.5, "weight_decay": 0.1},
    ]
    assert_members_match_trained_alone(proxy, configs)


def test_a_per_member_multiplier_on_the_vmap_path_is_the_members_own_value_not_its_float32_rounding():
    # the ViT proxy fuses by vmap, where a scalar attribute the members differ in becomes a buffer;
    # 0.3 (unlike 0.5) has no exact float32 value, and float64 training and the guard would see that
    proxy = MuPWorkload(vit_digits, 16, base_width=32, depth=1, base_depth=4)
    configs = [
        {"steps_per_iteration": 25, "seed": 0, "lr": 2e-3, "eps": 1e-4},
        {"steps_per_iteration": 25, "seed": 1, "lr": 4e-3, "eps": 1e-3, "residual_mult": 0.3},
    ]
    assert_members_match_trained_alone(proxy, configs)


class TiedNextToken(Workload):
    """A language model whose output head is its embedding (weight tying), no biases."""

    vocab, length = 11, 8
    steps_per_iteration = 25
    defaults = {"width": 16}

    def build_model(self, config):
        embedding = nn.Embedding(self.vocab, config["width"])
        readout = nn.Linear(config["width"], self.vocab, bias=False)
        readout.weight = embedding.weight
        model = nn.Sequential(embedding, nn.Linear(config["width"], config["width"], bias=False), nn.Tanh())
        model.add_module("readout", readout)
        return model

    def train_batches(self, config, seed):
        generator = torch.Generator().manual_seed(seed)
        while True:
            tokens = torch.randint(0, self.vocab, (8, self.length + 1), generator=generator)
            yield tokens[:, :-1], tokens[:, 1:]

    def eval_batches(self, config):
        return [next(self.train_batches(config, 1))]


def test_muP_proxy_members_with_a_readout_tied_to_the_embedding_match_training_alone():
    proxy = MuPWorkload(TiedNextToken(), 16, base_width=64)
    configs = [
        {"steps_per_iteration": 25, "seed": 0, "lr": 2e-3},
        {"steps_per_iteration": 25, "seed": 1, "lr": 5e-3, "weight_decay": 0.1},
    ]
    assert_members_match_trained_alone(proxy, configs)


class PaddedNextToken(Workload):
    """Next-token prediction on sequences padded at their end, whose padded targets are -100
    (F.cross_entropy's ignore_index, as Hugging Face's collators mark them); the default loss."""

    vocab, length = 11, 8
    steps_per_iteration = 25
    defaults = {"width": 16}

    def build_model(self, config):
        return nn.Sequential(nn.Embedding(self.vocab, config["width"]), nn.Tanh(), nn.Linear(config["width"], self.vocab))

    def _batch(self, generator: torch.Generator, n: int):
        tokens = torch.randint(1, self.vocab, (n, self.length + 1), generator=generator)
        lengths = torch.randint(2, self.length + 1, (n, 1), generator=generator)
        targets = tokens[:, 1:].masked_fill(torch.arange(self.length) >= lengths, -100)
        return tokens[:, :-1], targets

    def train_batches(self, config, seed):
        generator = torch.Generator().manual_seed(seed)
        while True:
            yield self._batch(generator, 8)

    def eval_batches(self, config):
        return [self._batch(torch.Generator().manual_seed(99), 16)]


def test_members_whose_default_loss_ignores_padded_targets_match_training_alone():
    # each member's loss is the mean over the positions F.cross_entropy counts, not over all of them
    configs = [{"seed": 0, "lr": 3e-3}, {"seed": 1, "lr": 1e-2, "weight_decay": 0.1, "grad_clip": 0.5}]
    assert_members_match_trained_alone(PaddedNextToken(), configs)


class LabelSmoothingInInit(PaddedNextToken):
    """The loss set on the instance, as a user may write it in `__init__`."""

    def __init__(self):
        self.loss = lambda output, target: F.cross_entropy(
            output.reshape(-1, output.shape[-1]), target.reshape(-1), label_smoothing=0.1
        )


def test_members_train_on_a_loss_the_workload_sets_in_init():
    configs = [{"seed": 0, "lr": 3e-3}, {"seed": 1, "lr": 1e-2, "beta1": 0.8}]
    assert_members_match_trained_alone(LabelSmoothingInInit(), configs)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_members_match_training_alone_on_cpu():
    # CUDA and CPU GEMMs round differently, so this checks the CUDA path over 20 steps at 1e-4.
    short = {**MLP, "steps_per_iteration": 10}
    configs = [{**short, "seed": 0, "lr": 2e-3}, {**short, "seed": 1, "lr": 1e-3, "weight_decay": 0.1, "grad_clip": 0.5}]
    fused = FusedTrainer(mlp_digits, configs, device="cuda")
    for _ in range(2):
        fused.train_iteration()
    for index, config in enumerate(configs):
        alone = TrialTrainer(mlp_digits, config)
        for _ in range(2):
            alone.train_iteration()
        error = relative_error(fused.model.member_state_dict(index), alone.model.state_dict())
        assert error <= 1e-4, f"member {index}: CUDA fused vs CPU alone rel err {error:.2e}"


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_bf16_autocast_trains_the_char_gpt_on_cuda():
    fused = FusedTrainer(char_gpt, [{**GPT, "seed": s, "lr": 3e-3} for s in range(4)], device="cuda", dtype="bf16")
    first = fused.train_iteration()
    second = fused.train_iteration()
    assert all(b["train_loss"] < a["train_loss"] for a, b in zip(first, second)), "bf16 fused training does not learn"


def batch_normed_cnn() -> DatasetWorkload:
    generator = torch.Generator().manual_seed(0)
    images, labels = torch.randn(64, 3, 8, 8, generator=generator), torch.randint(0, 4, (64,), generator=generator)
    return DatasetWorkload(
        model=lambda config: nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4)
        ),
        train=TensorDataset(images, labels), val=TensorDataset(images[:16], labels[:16]), loss=F.cross_entropy,
        defaults={"batch_size": 16}, steps_per_iteration=5,
    )


def test_bf16_trains_batch_norm_on_fp32_weights_beside_its_fp32_statistics():
    # as under autocast alone: PyTorch's batch norm takes a bf16 input with fp32 weights and
    # running statistics, and refuses bf16 weights beside fp32 statistics
    configs = [{"seed": s, "lr": 1e-3 * (s + 1)} for s in range(2)]
    full, half = (FusedTrainer(batch_normed_cnn(), configs, dtype=dtype) for dtype in ("fp32", "bf16"))
    for trainer in (full, half):
        trainer.train_iteration()
    torch.testing.assert_close(half.model.module.get_buffer("1.running_mean"), full.model.module.get_buffer("1.running_mean"), rtol=0, atol=2e-2)
    for name, parameter in half.model.module.named_parameters():
        torch.testing.assert_close(parameter, full.model.module.get_parameter(name), rtol=0, atol=2e-2, msg=name)


class PatchEmbedded(nn.Module):
    """A ViT's stem: a convolution cuts patches, a class token of its own (a bare nn.Parameter,
    so the group fuses by vmap); a PReLU after a linear layer in its head."""

    def __init__(self):
        super().__init__()
        self.patches = nn.Conv2d(3, 8, 4, stride=4)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, 8))
        self.head = nn.Sequential(nn.Linear(8, 8), nn.PReLU(8), nn.Linear(8, 4))

    def forward(self, images):
        tokens = self.patches(images).flatten(2).transpose(1, 2)
        tokens = torch.cat([self.cls_token.expand(tokens.shape[0], -1, -1), tokens], dim=1)
        return self.head(tokens.mean(1))


def test_bf16_trains_a_convolution_and_a_prelu_on_the_vmap_path():
    # autocast does not reach a convolution or a PReLU under vmap: the fused model casts their
    # tensors as autocast would (the images are fp32, the PReLU's input bf16)
    generator = torch.Generator().manual_seed(0)
    images, labels = torch.randn(64, 3, 8, 8, generator=generator), torch.randint(0, 4, (64,), generator=generator)
    workload = DatasetWorkload(model=lambda config: PatchEmbedded(), train=TensorDataset(images, labels),
                               val=TensorDataset(images[:16], labels[:16]), loss=F.cross_entropy,
                               defaults={"batch_size": 16}, steps_per_iteration=5)
    configs = [{"seed": s, "lr": 1e-3 * (s + 1)} for s in range(2)]
    full, half = (FusedTrainer(workload, configs, dtype=dtype) for dtype in ("fp32", "bf16"))
    assert half.model.strategy == "vmap"
    for trainer in (full, half):
        trainer.train_iteration()
    for name, parameter in half.model.module.named_parameters():
        torch.testing.assert_close(parameter, full.model.module.get_parameter(name), rtol=0, atol=2e-2, msg=name)


class _MasterWeightCasts(TorchDispatchMode):
    """Counts the casts whose input lies in the given (master weight) storage."""

    def __init__(self, storage: torch.Tensor):
        super().__init__()
        self.pointer, self.count = storage.untyped_storage().data_ptr(), 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._to_copy.default and args[0].untyped_storage().data_ptr() == self.pointer:
            self.count += 1
        return func(*args, **(kwargs or {}))


def test_bf16_trains_on_one_cast_per_step_of_fp32_master_weights():
    configs = [{**GPT, "seed": s, "lr": 1e-3 * (s + 1)} for s in range(3)]
    full, half = (FusedTrainer(char_gpt, configs, dtype=dtype, verify=False) for dtype in ("fp32", "bf16"))
    losses = {trainer: torch.stack([trainer.train_step(*trainer.batches.batch(i)) for i in range(10)]) for trainer in (full, half)}
    with _MasterWeightCasts(half.optimizer.tensors()[0]) as casts:
        half.train_step(*half.batches.batch(10))
    assert casts.count == 1  # the whole [B, P] weight matrix, not each weight at each use
    assert {p.dtype for p in half.model.parameters()} == {torch.float32}
    assert {t.dtype for t in half.optimizer.tensors()} == {torch.float32}  # gradients and optimizer state
    # bf16 keeps about 3 significant digits; ten steps of a cross-entropy near 4 stay within 1e-2
    torch.testing.assert_close(losses[half], losses[full], rtol=0, atol=1e-2)
