"""The differential guard: a fused group that would train a member wrongly is refused before any
training step, by name; valid models, attention's key-bias null space and the rounding noise of a
bias under BatchNorm included, are not.

Broken fusion is injected where a real bug would sit: the fused optimizer applying one member's
learning rate to another, and the stacked layers forgetting that a parameter is frozen.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import TensorDataset

import fusion.model
import fusion.optim
from examples.char_gpt import workload as char_gpt
from fusion import FusedTrainer, FusionError
from fusion.verification import choose_witnesses
from hpo import DatasetWorkload, FusionConfig
from hpo.base.hparams import OptimHParams
from hpo.examples.vit_digits import workload as vit_digits
from hpo.scaling import MuPWorkload

CONFIGS = [
    {"seed": 0, "optimizer": "adamw", "lr": 1e-3},
    {"seed": 1, "optimizer": "adamw", "lr": 3e-3, "weight_decay": 1e-2, "beta1": 0.8, "grad_clip": 0.5, "warmup_steps": 2},
    {"seed": 2, "optimizer": "adamw", "lr": 5e-4, "weight_decay": 0.1, "beta2": 0.99, "lr_schedule": "cosine", "schedule_steps": 10},
]


class Probe(nn.Module):
    """A frozen backbone under a trainable head (linear probing)."""

    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(12, 16), nn.ReLU())
        self.backbone.requires_grad_(False)
        self.head = nn.Linear(16, 5)

    def forward(self, x):
        return self.head(self.backbone(x))


def probing_workload() -> DatasetWorkload:
    generator = torch.Generator().manual_seed(0)
    x, y = torch.randn(64, 12, generator=generator), torch.randint(0, 5, (64,), generator=generator)
    return DatasetWorkload(model=lambda config: Probe(), train=TensorDataset(x, y), val=TensorDataset(x[:16], y[:16]),
                           loss=F.cross_entropy, defaults={"batch_size": 8})


@pytest.fixture
def steps_taken(monkeypatch) -> list[int]:
    """Counts the fused group's real training steps (the guard trains a copy, not the group)."""
    taken: list[int] = []
    train_step = FusedTrainer.train_step
    monkeypatch.setattr(FusedTrainer, "train_step", lambda self, *a: taken.append(1) or train_step(self, *a))
    return taken


@pytest.fixture
def swapped_learning_rates(monkeypatch) -> None:
    """The fused optimizer gives member 0 member 1's learning rate and back: a bug the guard must catch."""
    scheduled_lrs = fusion.optim.FusedOptimizer.scheduled_lrs

    def swapped(self, steps):
        lrs = scheduled_lrs(self, steps)
        lrs[0], lrs[1] = lrs[1], lrs[0]
        return lrs

    monkeypatch.setattr(fusion.optim.FusedOptimizer, "scheduled_lrs", swapped)


def test_a_group_that_swaps_two_members_learning_rates_is_refused_before_it_trains(swapped_learning_rates, steps_taken):
    with pytest.raises(FusionError, match=r"member [01]'s parameter 'head\.weight' differs .* it is not trained"):
        FusedTrainer(probing_workload(), CONFIGS)
    assert not steps_taken


def test_a_group_that_unfreezes_a_frozen_parameter_is_refused_naming_it(monkeypatch, steps_taken):
    monkeypatch.setattr(fusion.model, "_freeze_as_members", lambda fused, member: None)
    with pytest.raises(FusionError, match=r"member [01]'s parameter 'backbone\.0\.(weight|bias)' moved although it gets no gradient"):
        FusedTrainer(probing_workload(), CONFIGS)
    assert not steps_taken


def test_a_group_whose_optimizer_drops_the_depth_scaled_adam_eps_is_refused(monkeypatch, steps_taken):
    # CompleteP's per-parameter eps (`Workload.eps_multipliers`) is checked as the group trains it
    fused_optimizer = fusion.optim.FusedOptimizer.__init__

    def without_eps_multipliers(self, *args, **kwargs):
        fused_optimizer(self, *args, **{**kwargs, "eps_multipliers": None})

    monkeypatch.setattr(fusion.optim.FusedOptimizer, "__init__", without_eps_multipliers)
    proxy = MuPWorkload(vit_digits, 16, base_width=32, depth=1, base_depth=4)
    configs = [{"seed": 0, "lr": 2e-3, "eps": 1e-4}, {"seed": 1, "lr": 4e-3, "eps": 1e-3}]
    with pytest.raises(FusionError, match=r"member [01]'s parameter '.*' differs"):
        FusedTrainer(proxy, configs)
    assert not steps_taken


def test_a_workload_whose_batches_follow_the_trial_seed_is_refused_before_it_trains(monkeypatch, steps_taken):
    # fused, every member trains on config 0's batches; alone, each would shuffle by its own seed
    workload = probing_workload()
    stream = workload.train_batches
    monkeypatch.setattr(workload, "train_batches", lambda config, seed: stream(config, seed + int(config["seed"])))
    with pytest.raises(FusionError, match=r"config 2's training batches differ from config 0's.*seed argument \(data_seed\)"):
        FusedTrainer(workload, CONFIGS)
    assert not steps_taken


def test_verify_false_trains_the_group_unchecked(monkeypatch):
    monkeypatch.setattr(fusion.model, "_freeze_as_members", lambda fused, member: None)
    trainer = FusedTrainer(probing_workload(), CONFIGS, verify=False)
    trainer.train_iteration()
    assert FusionConfig(verify=False).verify is False and FusionConfig().verify is True


def test_attention_whose_key_bias_rounds_differently_is_accepted_on_the_vmap_path():
    # a per-member attention multiplier on the vmap path (where a per-member emb_mult, which the
    # model's code computes with, sends the group) rounds the key bias's (mathematically zero)
    # gradient differently; Adam with the default eps turns that noise into lr-sized steps in a
    # direction the outputs ignore (member 2's qkv.bias ended 3.2e-12 apart after the check's 2 steps)
    base = char_gpt.resolve({"width": 16, "n_layer": 1, "batch_size": 4, "block_size": 8})
    configs = [
        {**base, "seed": 0, "optimizer": "adamw", "lr": 3e-3, "weight_decay": 0.1},
        {**base, "seed": 1, "optimizer": "adamw", "lr": 1e-2, "attn_mult": 2.0, "emb_mult": 1.5, "grad_clip": 0.3, "warmup_steps": 2},
        {**base, "seed": 2, "optimizer": "adamw", "lr": 2e-2, "beta2": 0.95, "lr_schedule": "cosine", "schedule_steps": 5},
    ]
    trainer = FusedTrainer(char_gpt, configs)
    assert trainer.model.strategy == "vmap"


class BatchNormed(nn.Module):
    """Linear, BatchNorm, ReLU: the block of most image and tabular models. The Linear's bias gets
    a gradient the batch mean cancels to rounding noise, which Adam divides by its own size."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(12, 16)
        self.norm = nn.BatchNorm1d(16)
        self.head = nn.Linear(16, 5)

    def forward(self, x):
        return self.head(F.relu(self.norm(self.fc(x))))


#: Member 0 clips and decays at a large lr: without the noise floor its fc.bias was refused.
BATCHNORM_CONFIGS = [
    {"seed": 0, "optimizer": "adamw", "lr": 1e-2, "weight_decay": 0.1, "grad_clip": 1.0},
    {"seed": 1, "optimizer": "adamw", "lr": 3e-3},
    {"seed": 2, "optimizer": "adamw", "lr": 1e-3, "weight_decay": 1e-2, "grad_clip": 0.1},
]


def batchnorm_workload() -> DatasetWorkload:
    workload = probing_workload()
    workload.model_factory = lambda config: BatchNormed()
    return workload


@pytest.mark.parametrize("strategy", ["auto", "vmap"])
def test_a_bias_under_batchnorm_that_rounds_differently_is_accepted_as_pytorch_itself_rounds_it(strategy):
    # refused before the check knew the member's own noise: fc.bias ended 5.4e-11 apart fused and
    # alone; alone, with every parameter one ulp away, such a bias ends 1e-10 apart
    trainer = FusedTrainer(batchnorm_workload(), BATCHNORM_CONFIGS, strategy=strategy)
    assert trainer.model.strategy == ("stacked" if strategy == "auto" else "vmap")


def test_a_group_whose_learning_rates_are_one_percent_off_under_batchnorm_is_still_refused(monkeypatch, steps_taken):
    """The rounding allowance is no cover for a fault: 1% of a step is a million times the noise."""
    scheduled_lrs = fusion.optim.FusedOptimizer.scheduled_lrs
    monkeypatch.setattr(fusion.optim.FusedOptimizer, "scheduled_lrs",
                        lambda self, steps: [[lr * 1.01 for lr in member] for member in scheduled_lrs(self, steps)])
    with pytest.raises(FusionError, match=r"member 0's parameter '(fc|norm|head)\.\w+' differs .* it is not trained"):
        FusedTrainer(batchnorm_workload(), BATCHNORM_CONFIGS)
    assert not steps_taken


def test_witnesses_cover_every_optimizer_feature_and_multiplier_some_member_uses():
    configs = [
        {"lr": 1e-3},
        {"lr": 2e-3, "weight_decay": 0.1},
        {"lr": 3e-3, "weight_decay": 0.1, "grad_clip": 1.0, "warmup_steps": 2},
        {"lr": 4e-3, "lr_schedule": "cosine"},
        {"lr": 5e-3, "output_mult": 2.0},
        {"lr": 6e-3},
    ]
    hparams = [OptimHParams.from_config(c) for c in configs]
    assert choose_witnesses(configs, hparams) == [2, 3, 4]
    assert choose_witnesses(configs[:1] + configs[5:], hparams[:1] + hparams[5:]) == [0]


class CastsItsInputs(nn.Module):
    """What users write for uint8 pixels and for the precision they train in."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(12, 16)
        self.out = nn.Linear(16, 5)

    def forward(self, x):
        h = torch.relu(self.fc(x.float() / 255.0))
        return self.out(h.to(torch.float32) + torch.zeros(16, dtype=torch.float32))


def pixel_workload(model: type[nn.Module]) -> DatasetWorkload:
    generator = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (64, 12), generator=generator, dtype=torch.uint8)
    y = torch.randint(0, 5, (64,), generator=generator)
    return DatasetWorkload(model=lambda config: model(), train=TensorDataset(x, y), val=TensorDataset(x[:16], y[:16]),
                           loss=F.cross_entropy, defaults={"batch_size": 8})


def test_a_model_that_casts_to_float32_in_forward_is_checked_in_float64_and_trains(steps_taken):
    trainer = FusedTrainer(pixel_workload(CastsItsInputs), CONFIGS)
    assert not steps_taken  # checked first
    assert all(math.isfinite(r["train_loss"]) for r in trainer.train_iteration())


def test_the_check_of_a_model_that_casts_to_float32_still_refuses_a_wrong_group(swapped_learning_rates, steps_taken):
    with pytest.raises(FusionError, match=r"member [01]'s parameter '(fc|out)\.(weight|bias)' differs"):
        FusedTrainer(pixel_workload(CastsItsInputs), CONFIGS)
    assert not steps_taken


class LeavesTorch(nn.Module):
    """Its input goes through numpy as float32: nothing can run that in float64."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(12, 5)

    def forward(self, x):
        return self.fc(torch.from_numpy(x.numpy().astype("float32")))


def test_a_model_the_check_cannot_run_in_float64_is_refused_saying_how_to_train_it_unchecked():
    workload = pixel_workload(LeavesTorch)
    with pytest.raises(FusionError, match=r"cannot train this group in float64 .* fusion: \{verify: false\} trains it unchecked"):
        FusedTrainer(workload, CONFIGS)
    FusedTrainer(workload, CONFIGS, verify=False).train_iteration()
