"""No zoo model is silently wrong: each is fused on the path it should take and trains exactly as
its members trained alone, or it is refused with a FusionError naming the module at fault.

Float64 leaves rounding nowhere to hide: the stacked path must match bit for bit, the vmap path
(whose batching rules reorder some reductions) within 1e-12. Float32 runs check the usual
tolerance. As in a sweep, members differ in every per-member hyperparameter (learning rate,
weight decay, betas or momentum and Nesterov, clipping, schedule, warm-up) and keep the default
`eps`; each model trains under one of SGD, Adam and AdamW.
"""

from __future__ import annotations

import copy

import pytest
import torch

from fusion import FusedOptimizer, FusionError, fuse_models
from hpo.base.hparams import OptimHParams, build_torch_optimizer
from hpo.base.training import optimizer_step
from tests.fusion_zoo import ZOO, ZooModel, loss

MEMBERS = 3
SAMPLES = 6
#: float64 steps: past every member's warm-up and its step schedule's first decay (bit-exact is bit-exact at any length)
STEPS = 30
ACCEPTED = sorted(name for name, entry in ZOO.items() if entry.path != "refused")
#: Each model's optimizer: every one of the three for several models.
OPTIMIZER = {name: ("adam", "adamw", "sgd")[i % 3] for i, name in enumerate(ACCEPTED)}


def configs(optimizer: str = "adam") -> list[dict]:
    """Members that differ in every per-member key of `optimizer`; eps stays at its default."""
    schedules = [
        {"lr_schedule": "constant"},
        {"lr_schedule": "cosine", "schedule_steps": 40, "min_lr_ratio": 0.1, "warmup_steps": 5},
        {"lr_schedule": "step", "schedule_steps": 15, "lr_gamma": 0.5, "warmup_steps": 2},
    ]
    members = []
    for i in range(MEMBERS):
        config = {"seed": i, "optimizer": optimizer, "weight_decay": (0.0, 1e-4, 0.1)[i], "grad_clip": (0.0, 1.0, 0.05)[i], **schedules[i]}
        if optimizer == "sgd":
            config.update(lr=(0.05, 0.02, 0.1)[i], momentum=(0.9, 0.5, 0.9)[i], nesterov=(False, False, True)[i])
        else:
            config.update(lr=(1e-3, 3e-3, 2e-3)[i], beta1=(0.9, 0.8, 0.85)[i], beta2=(0.999, 0.99, 0.95)[i])
        members.append(config)
    return members


def build(entry: ZooModel, seed: int, dtype: torch.dtype) -> torch.nn.Module:
    torch.manual_seed(seed)
    return entry.build().to(dtype)


def cast(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return x.to(dtype) if x.is_floating_point() else x


def train_fused(entry: ZooModel, optimizer_name: str, dtype: torch.dtype, steps: int):
    members = [build(entry, c["seed"], dtype) for c in configs(optimizer_name)]
    example, _ = next(entry.batches(SAMPLES))
    fused = fuse_models(members, cast(example, dtype))
    optimizer = FusedOptimizer(dict(fused.module.named_parameters()), [OptimHParams.from_config(c) for c in configs(optimizer_name)])
    fused.train()
    history = []
    for _, (x, y) in zip(range(steps), entry.batches(SAMPLES)):
        out = fused(cast(x, dtype))
        losses = torch.stack([loss(out[i], y) for i in range(MEMBERS)])
        optimizer.zero_grad()
        losses.sum().backward()
        optimizer.step()
        history.append(losses.detach())
    return fused, torch.stack(history)


def train_alone(entry: ZooModel, config: dict, dtype: torch.dtype, steps: int):
    """The member trained as `TrialTrainer` trains it: torch.optim, LambdaLR, clip_grad_norm_."""
    net = build(entry, config["seed"], dtype)
    hp = OptimHParams.from_config(config)
    optimizer = build_torch_optimizer(net.named_parameters(), hp)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, hp.lr_factor)
    net.train()
    history = []
    for _, (x, y) in zip(range(steps), entry.batches(SAMPLES)):
        value = loss(net(cast(x, dtype)), y)
        optimizer_step(net, optimizer, value, grad_clip=hp.grad_clip, schedule=schedule)
        history.append(value.detach())
    return net, torch.stack(history)


def relative_error(fused: dict[str, torch.Tensor], alone: dict[str, torch.Tensor]) -> float:
    names = [k for k, v in alone.items() if v.is_floating_point()]
    a = torch.cat([fused[k].flatten() for k in names])
    b = torch.cat([alone[k].flatten() for k in names])
    return ((a - b).norm() / b.norm()).item()


@pytest.mark.parametrize("name", ACCEPTED)
def test_zoo_model_fuses_on_its_path_and_trains_as_alone_in_float64(name):
    entry = ZOO[name]
    fused, fused_losses = train_fused(entry, OPTIMIZER[name], torch.float64, steps=STEPS)
    assert fused.strategy == entry.path
    for i, config in enumerate(configs(OPTIMIZER[name])):
        alone, alone_losses = train_alone(entry, config, torch.float64, steps=STEPS)
        state = fused.member_state_dict(i)
        if fused.strategy == "stacked":
            for key, tensor in alone.state_dict().items():
                assert torch.equal(state[key], tensor), f"member {i} {key} is not bit-identical after {STEPS} float64 steps"
            assert torch.equal(fused_losses[:, i], alone_losses)
        else:
            error = relative_error(state, alone.state_dict())
            assert error <= 1e-12, f"member {i}: rel err {error:.2e} after {STEPS} float64 steps on the vmap path"
            torch.testing.assert_close(fused_losses[:, i], alone_losses, rtol=1e-12, atol=0)


@pytest.mark.slow
@pytest.mark.parametrize("name", ACCEPTED)
def test_zoo_model_trains_as_alone_in_float32(name):
    entry = ZOO[name]
    fused, fused_losses = train_fused(entry, OPTIMIZER[name], torch.float32, steps=50)
    for i, config in enumerate(configs(OPTIMIZER[name])):
        alone, alone_losses = train_alone(entry, config, torch.float32, steps=50)
        # float32 rounding differs between batched and single kernels (and oneDNN's LSTM), and
        # 50 Adam steps amplify it; float64 above is the strict check, this one the usual 5e-4
        error = relative_error(fused.member_state_dict(i), alone.state_dict())
        assert error <= 5e-4, f"member {i}: rel err {error:.2e} after 50 float32 steps"
        torch.testing.assert_close(fused_losses[:, i], alone_losses, rtol=5e-4, atol=1e-5)


def test_model_that_mixes_the_batch_in_training_only_is_refused_on_the_stacked_path_by_module():
    entry = ZOO["train_mode_centering"]
    example, _ = next(entry.batches(SAMPLES))
    with pytest.raises(FusionError, match=r"layer 'center' \(TrainModeCentering\) mixes members in train mode"):
        fuse_models([build(entry, i, torch.float64) for i in range(MEMBERS)], example.double(), strategy="stacked")


def test_model_with_a_python_batch_statistic_is_refused_by_module_on_every_path():
    entry = ZOO["batch_statistics"]
    example, _ = next(entry.batches(SAMPLES))
    members = [build(entry, i, torch.float64) for i in range(MEMBERS)]
    with pytest.raises(FusionError) as refused:
        fuse_models(copy.deepcopy(members), example.double())
    message = str(refused.value)
    assert "layer 'scale' (BatchStatScale) cannot run vmap-fused" in message
    assert "layer 'scale' (BatchStatScale) reads a value computed from its parameters into Python" in message
    with pytest.raises(FusionError) as again:
        fuse_models(members, example.double())
    assert str(again.value) == message, "the refusal's message changed between two runs"
