"""Depth scaling: the proxy is shallower, its residual branches and hidden optimizer settings
follow CompleteP, the target is the user's own model, and a workload must declare the contract."""

import json

import pytest
import torch
from torch import nn

from examples.char_gpt import workload as char_gpt
from examples.mlp_digits import workload as mlp_digits
from fusion.optim import FusedOptimizer
from hpo.base.checkpointing import CHECKPOINT_FILE
from hpo.base.hparams import OptimHParams, build_torch_optimizer, workload_optimizer
from hpo.base.workload import Workload
from hpo.examples.vit_digits import workload as vit_digits
from hpo.engines.scaled import build_proxy
from hpo.scaling import (
    MuPWorkload,
    ScalingConfig,
    ScalingError,
    complete_transfer,
    depth_coord_check,
    proxy_workload,
    target_workload,
)

GPT = {"width": 32, "block_size": 16, "batch_size": 4}


def trained(workload, config, steps=3):
    """The model after `steps` optimizer steps, built and trained as a trial would."""
    config = workload.resolve(config)
    torch.manual_seed(0)
    model = workload.build_model(config)
    optimizer = workload_optimizer(workload, model, OptimHParams.from_config(config))
    batches = workload.train_batches(config, seed=0)
    for _ in range(steps):
        inputs, targets = next(batches)
        optimizer.zero_grad()
        workload.loss(model(inputs), targets).backward()
        optimizer.step()
    return model


def test_the_proxy_has_the_proxy_depth_and_each_branch_carries_completeps_multiplier():
    scaling = ScalingConfig(target_width=64, ratio=2, target_depth=8, proxy_depth=2, base_depth=8)
    proxy = proxy_workload(char_gpt, scaling, config={**GPT, "attn_scale": "inv_d"})
    model = proxy.build_model(proxy.resolve({**GPT, "residual_mult": 0.5}))
    assert len(model.blocks) == 2
    assert [block.residual_mult for block in model.blocks] == [0.5 * (2 / 8) ** -1] * 2, "user's multiplier x (L/L_base)^-1"
    assert proxy.resolve({})["n_layer"] == 2 and proxy.resolve({})["residual_mult"] == 1.0, "the trial's config keeps the user's value"


@pytest.mark.parametrize("alpha", [1.0, 0.5])
def test_hidden_parameters_get_the_depth_lr_and_eps_factors_and_the_rest_keep_muPs(alpha):
    width_only = MuPWorkload(char_gpt, 32, base_width=64)
    deep = MuPWorkload(char_gpt, 32, base_width=64, depth=2, base_depth=8, depth_alpha=alpha)
    model = deep.build_model(deep.resolve({**GPT, "n_layer": 2}))
    plain_lr = width_only.lr_multipliers(model, "adamw")
    lr, eps = deep.lr_multipliers(model, "adamw"), deep.eps_multipliers(model, "adamw")
    for name in plain_lr:
        hidden = name.startswith("blocks.")
        assert lr[name] == pytest.approx(plain_lr[name] * (0.25 ** (alpha - 1) if hidden else 1)), name
        assert eps.get(name, 1.0) == pytest.approx(0.25**-alpha if hidden else 1.0), name
    sgd = width_only.lr_multipliers(model, "sgd")["blocks.0.ln_1.weight"]
    assert deep.lr_multipliers(model, "sgd")["blocks.0.ln_1.weight"] == pytest.approx(sgd * 0.25 ** (2 * alpha - 1))
    assert deep.eps_multipliers(model, "sgd") == {}, "SGD has no eps"
    assert deep.weight_decay_multipliers(model, "adamw") == width_only.weight_decay_multipliers(model, "adamw")


def test_at_its_base_depth_a_depth_scaled_model_trains_bit_for_bit_as_the_unscaled_one():
    config = {**GPT, "n_layer": 3, "lr": 1e-2, "eps": 1e-4}
    scaled = trained(MuPWorkload(char_gpt, 32, base_width=64, depth=3, base_depth=3), config)
    plain = trained(MuPWorkload(char_gpt, 32, base_width=64), config)
    for (name, a), b in zip(scaled.named_parameters(), plain.parameters()):
        assert torch.equal(a, b), name


def test_by_default_the_proxys_blocks_are_the_users_own_and_the_targets_branches_shrink():
    scaling = ScalingConfig(target_width=32, ratio=2, target_depth=4, depth_ratio=2)
    proxy, target = proxy_workload(vit_digits, scaling), target_workload(vit_digits, scaling)
    proxy_model = proxy.build_model(proxy.resolve({}))
    assert {block.residual_mult for block in proxy_model.encoder} == {1.0}
    assert set(proxy.eps_multipliers(proxy_model, "adamw").values()) == {1.0}
    config = target.resolve({})
    assert (config["width"], config["depth"]) == (32, 4)
    model = target.build_model(config)
    assert {block.residual_mult for block in model.encoder} == {0.5}, "x (4/2)^-1"
    assert set(target.lr_multipliers(model, "adamw").values()) == {1.0}, "width at its base; CompleteP keeps Adam's lr"
    assert set(target.eps_multipliers(model, "adamw").values()) == {0.5}


def test_a_depth_only_proxy_keeps_the_users_width_and_its_plain_readout():
    proxy = proxy_workload(vit_digits, ScalingConfig(target_depth=8, proxy_depth=2))
    model = proxy.build_model(proxy.resolve({"width": 32}))
    assert model.readout.weight.shape == (10, 32) and type(model.readout) is nn.Linear
    assert len(model.encoder) == 2 and model.encoder[0].residual_mult == 1.0, "at the default base depth, its own"


def test_a_workload_without_the_depth_contract_is_refused_naming_the_fix():
    with pytest.raises(ScalingError, match=r"'mlp_digits' has no depth contract.*depth_key.*residual_mult"):
        proxy_workload(mlp_digits, ScalingConfig(target_depth=8, proxy_depth=2))


def test_a_factory_that_ignores_the_residual_multiplier_is_warned_about():
    class Unscaled(type(vit_digits)):
        def build_model(self, config):
            return super().build_model({**config, "residual_mult": 1.0})

    with pytest.warns(UserWarning, match="compute the same with residual_mult=1 and 2"):
        proxy_workload(Unscaled(), ScalingConfig(target_depth=4, proxy_depth=2))


def test_blocks_outside_residual_blocks_are_refused():
    class Misnamed(type(vit_digits)):
        residual_blocks = "blocks"

    with pytest.raises(ScalingError, match=r"0 parameters under 'blocks' at depth=2.*`residual_blocks`"):
        proxy_workload(Misnamed(), ScalingConfig(target_depth=4, proxy_depth=2))


def test_fused_adam_gives_each_member_its_own_eps_per_parameter_as_torch_groups_do():
    torch.manual_seed(0)
    shapes = {"blocks.0.weight": (3, 4), "readout.weight": (2, 3)}
    hparams = [OptimHParams(optimizer="adam", lr=1e-2, eps=1e-3), OptimHParams(optimizer="adam", lr=3e-2, eps=1e-2)]
    eps_multipliers = [{"blocks.0.weight": 4.0}, {"blocks.0.weight": 0.5}]
    fused = {name: nn.Parameter(torch.randn(2, *shape)) for name, shape in shapes.items()}
    alone = [{name: nn.Parameter(p[b].detach().clone()) for name, p in fused.items()} for b in range(2)]
    optimizer = FusedOptimizer(fused, hparams, eps_multipliers=eps_multipliers)
    references = [build_torch_optimizer(alone[b].items(), hparams[b], eps_multipliers=eps_multipliers[b]) for b in range(2)]
    for _ in range(3):
        grads = {name: 1e-3 * torch.randn(2, *shape) for name, shape in shapes.items()}
        optimizer.zero_grad()  # gradients come from backward, whose hooks tell the optimizer which parameters got one
        sum((param * grads[name]).sum() for name, param in fused.items()).backward()
        optimizer.step()
        for b, reference in enumerate(references):
            for name, param in alone[b].items():
                param.grad = grads[name][b].clone()
            reference.step()
    for b in range(2):
        for name, param in alone[b].items():
            assert torch.equal(fused[name][b], param), f"member {b} {name}"


def test_the_coordinate_check_across_depth_passes_completep_and_fails_unscaled_residuals():
    config = {"lr": 3e-3, "width": 16}
    report = depth_coord_check(vit_digits, [1, 2, 4, 8], config=config, seeds=1, steps=3)
    assert report.ok, report.summary()
    unscaled = depth_coord_check(vit_digits, [1, 2, 4, 8], config=config, seeds=1, steps=3, parametrization="sp")
    assert not unscaled.ok and {"encoder", "readout"} & set(unscaled.offending), unscaled.summary()
    assert "Activations that grow with depth" in unscaled.summary()


def test_a_depth_only_sweep_transfers_and_trains_the_deep_target(tmp_path):
    scaling = ScalingConfig(target_depth=4, proxy_depth=1, final_training=True, target_iterations=1)
    best = {"lr": 3e-3, "width": 16, "depth": 1, "steps_per_iteration": 2}
    complete_transfer(vit_digits, scaling, best, tmp_path, max_iterations=3)
    saved = json.loads((tmp_path / "transfer.json").read_text())
    assert saved["target_config"] == {**best, "depth": 4}
    assert (saved["proxy_width"], saved["proxy_depth"], saved["target_depth"]) == (None, 1, 4)
    assert set(saved["scaled"]) == {"depth"} and saved["target_run"]["iterations"] == 1
    state = torch.load(tmp_path / "target_checkpoint" / CHECKPOINT_FILE, weights_only=True)
    assert sum(name.endswith(".ln.weight") for name in state["model"]) == 4, "the target has 4 blocks"


def test_the_python_api_refuses_what_validation_refuses(tmp_path):
    scaling = ScalingConfig(target_depth=4, proxy_depth=1)
    with pytest.raises(ScalingError, match="scaling.target_depth: workload 'mlp_digits' has no depth contract"):
        build_proxy(mlp_digits, scaling, {"lr": 1e-3}, tmp_path)
    with pytest.raises(ScalingError, match="depth is set by scaling.proxy_depth/depth_ratio"):
        build_proxy(vit_digits, scaling, {"depth": 2}, tmp_path)


class _ListBlock(nn.Module):
    def __init__(self, width, residual_mult):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width))
        self.residual_mult = residual_mult

    def forward(self, x):
        return x + self.residual_mult * self.mlp(self.norm(x))


class _ListModel(nn.Module):
    """Pre-LN residual blocks in an nn.ModuleList, called in a loop: no module's output is the
    residual stream leaving the blocks (the final norm flattens it)."""

    def __init__(self, width, depth, residual_mult):
        super().__init__()
        self.embed = nn.Linear(8, width)
        self.layers = nn.ModuleList(_ListBlock(width, residual_mult) for _ in range(depth))
        self.norm = nn.LayerNorm(width)
        self.readout = nn.Linear(width, 3)

    def forward(self, x):
        x = self.embed(x)
        for layer in self.layers:
            x = layer(x)
        return self.readout(self.norm(x))


class _ListWorkload(Workload):
    name = "module_list"
    depth_key, residual_blocks = "n_blocks", "layers"
    defaults = {"width": 32, "n_blocks": 2, "residual_mult": 1.0}

    def build_model(self, config):
        return _ListModel(int(config["width"]), int(config["n_blocks"]), float(config["residual_mult"]))

    def train_batches(self, config, seed):
        generator = torch.Generator().manual_seed(seed)
        while True:
            x = torch.randn(16, 8, generator=generator)
            yield x, (x[:, 0] > 0).long()

    def eval_batches(self, config):
        return [next(self.train_batches(config, 1))]


def test_the_depth_check_sees_the_residual_stream_of_blocks_held_in_a_module_list():
    config = {"lr": 3e-3}
    unscaled = depth_coord_check(_ListWorkload(), [1, 2, 4, 8, 16], config=config, seeds=1, steps=3, parametrization="sp")
    assert not unscaled.ok and "layers[-1]" in unscaled.offending, unscaled.summary()
    scaled = depth_coord_check(_ListWorkload(), [1, 2, 4, 8, 16], config=config, seeds=1, steps=3)
    assert scaled.ok, scaled.summary()


def test_the_depth_check_refuses_a_depth_key_the_factory_ignores_instead_of_passing_one_model():
    """A depth key the model never reads builds the same model at every depth, whose activations
    trivially stay flat: the check must refuse it, as a sweep does, not report OK."""

    class IgnoresItsDepthKey(_ListWorkload):
        depth_key = "depth"

    with pytest.raises(ScalingError, match=r"at depth=1 and .* at depth=2; its build_model must build config\['depth'\]"):
        depth_coord_check(IgnoresItsDepthKey(), [1, 2, 4], config={"lr": 3e-3}, seeds=1, steps=1)


def test_a_depth_key_that_is_not_a_config_key_name_is_refused_naming_it():
    class NumberedDepthKey(_ListWorkload):
        depth_key = 3

    message = r"'module_list': depth_key must name the config key .* got 3$"
    with pytest.raises(ScalingError, match=message):
        proxy_workload(NumberedDepthKey(), ScalingConfig(target_depth=8, proxy_depth=2))
    with pytest.raises(ScalingError, match=message):
        depth_coord_check(NumberedDepthKey(), [1, 2], seeds=1, steps=1)
