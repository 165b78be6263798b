"""The muP proxy: built at the requested width with muP shapes, trained with mup's own factors."""

import pickle
import warnings

import mup
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
import torch
from torch import nn

from examples.char_gpt import workload as char_gpt
from examples.mlp_digits import workload as mlp_digits
from hpo.base.hparams import OptimHParams, workload_optimizer
from hpo.scaling import MuPWorkload, ScalingConfig, ScalingError, proxy_workload, target_workload
from hpo.base.workload import Workload

SCALING = ScalingConfig(target_width=128, ratio=4)


def test_proxy_is_built_at_the_proxy_width_with_mup_shapes_relative_to_the_target():
    proxy = proxy_workload(mlp_digits, SCALING)
    model = proxy.build_model(proxy.resolve({}))
    assert model.body[0].weight.shape == (32, 64), "first layer should be built at the proxy width 32"
    assert isinstance(model.readout, mup.MuReadout)
    assert model.readout.width_mult() == 32 / 128
    hidden = model.body[2].weight.infshape
    assert (hidden.ninf(), hidden[1].base_dim, hidden[1].dim) == (2, 128, 32)
    assert model.body[0].weight.infshape.ninf() == 1, "input weights have one width dimension"


def test_target_at_the_base_width_is_the_users_own_model_bit_for_bit():
    target = target_workload(char_gpt, ScalingConfig(target_width=64, ratio=2))
    config = target.resolve({})
    torch.manual_seed(0)
    scaled = target.build_model(config)
    torch.manual_seed(0)
    plain = char_gpt.build_model(char_gpt.resolve({"width": 64}))
    tokens = torch.randint(0, 50, (2, 16))
    assert torch.equal(scaled(tokens), plain(tokens))
    assert set(target.lr_multipliers(scaled, "adamw").values()) == {1.0}


@pytest.mark.parametrize(
    "optimizer, mup_optimizer",
    [("adam", mup.MuAdam), ("adamw", mup.MuAdamW), ("sgd", mup.MuSGD)],
)
def test_trial_optimizer_trains_exactly_like_mups_optimizer(optimizer, mup_optimizer):
    proxy = MuPWorkload(mlp_digits, width=32, base_width=128)
    config = proxy.resolve({"optimizer": optimizer, "lr": 0.05, "weight_decay": 0.1})
    torch.manual_seed(0)
    ours = proxy.build_model(config)
    torch.manual_seed(0)
    theirs = proxy.build_model(config)
    ours_opt = workload_optimizer(proxy, ours, OptimHParams.from_config(config))
    theirs_opt = mup_optimizer(theirs.parameters(), lr=0.05, weight_decay=0.1)
    inputs, targets = next(proxy.train_batches(config, seed=0))
    for model, opt in ((ours, ours_opt), (theirs, theirs_opt)):
        for _ in range(2):
            opt.zero_grad()
            proxy.loss(model(inputs), targets).backward()
            opt.step()
    for (name, mine), reference in zip(ours.named_parameters(), theirs.parameters()):
        torch.testing.assert_close(mine, reference, msg=f"{name} differs from {mup_optimizer.__name__}")


def test_weight_decay_multipliers_match_mups_param_groups():
    proxy = MuPWorkload(mlp_digits, width=32, base_width=128)
    model = proxy.build_model(proxy.resolve({}))
    groups = mup.MuAdam(model.parameters(), lr=1.0, weight_decay=0.1).param_groups
    by_param = {id(p): group["weight_decay"] for group in groups for p in group["params"]}
    expected = {name: by_param[id(p)] / 0.1 for name, p in model.named_parameters()}
    assert proxy.weight_decay_multipliers(model, "adam") == pytest.approx(expected)


def test_the_proxy_survives_pickling_as_ray_ships_it():
    proxy = pickle.loads(pickle.dumps(proxy_workload(mlp_digits, SCALING)))
    assert proxy.build_model(proxy.resolve({})).readout.weight.infshape[1].dim == 32


class _HeadModel(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.body = nn.Linear(64, width)
        self.head = nn.Linear(width, 10)

    def forward(self, x):
        return self.head(torch.relu(self.body(x)))


class _HeadWorkload(Workload):
    name = "head_mlp"
    defaults = {"width": 16}

    def build_model(self, config):
        return _HeadModel(int(config["width"]))

    def train_batches(self, config, seed):
        raise NotImplementedError

    def eval_batches(self, config):
        raise NotImplementedError


def test_a_model_without_the_readout_gets_an_error_naming_the_module_and_the_fix():
    with pytest.raises(ScalingError) as caught:
        proxy_workload(_HeadWorkload(), SCALING)
    message = str(caught.value)
    assert "no module named 'readout'" in message
    assert "last nn.Linear is 'head'" in message
    assert "scaling.readout" in message


def test_naming_the_readout_in_the_scaling_config_fixes_it():
    proxy = proxy_workload(_HeadWorkload(), ScalingConfig(target_width=128, ratio=4, readout="head"))
    assert isinstance(proxy.build_model(proxy.resolve({})).head, mup.MuReadout)


class _Attention(nn.Module):
    """Heads fixed at 2, so head_dim grows with width; logits scaled by 1/sqrt(head_dim)."""

    def __init__(self, width):
        super().__init__()
        self.head_dim = width // 2
        self.scale = self.head_dim**-0.5
        self.qkv = nn.Linear(width, 3 * width)


class _AttentionModel(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.attn = _Attention(width)
        self.readout = nn.Linear(width, 10)


class _AttentionWorkload(_HeadWorkload):
    def build_model(self, config):
        return _AttentionModel(int(config["width"]))


def test_attention_scaled_by_one_over_sqrt_d_warns_naming_the_layer_and_the_fix():
    with pytest.warns(UserWarning, match=r"attention layer 'attn' .*head_dim grows with width.*attn_scale: inv_d"):
        proxy_workload(_AttentionWorkload(), SCALING)


def test_char_gpt_with_mup_attention_builds_without_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        proxy_workload(char_gpt, ScalingConfig(target_width=64, ratio=2), config={"attn_scale": "inv_d"})


def test_readout_zero_init_and_init_std_give_mups_width_scaled_init():
    proxy = MuPWorkload(mlp_digits, width=32, base_width=128)
    torch.manual_seed(0)
    model = proxy.build_model(proxy.resolve({"init_std": 0.02, "readout_zero_init": True}))
    assert not model.readout.weight.any(), "readout_zero_init zeroes the readout"
    hidden_std = model.body[2].weight.std().item()
    assert hidden_std == pytest.approx(0.02 * (32 / 128) ** -0.5, rel=0.1), "hidden std scales like width**-0.5"
    assert model.body[0].weight.std().item() == pytest.approx(0.02, rel=0.1), "input weights keep init_std"


class _TiedLM(nn.Module):
    """A language model whose output head is its embedding (weight tying), biases off."""

    def __init__(self, width, vocab=24):
        super().__init__()
        self.emb = nn.Embedding(vocab, width)
        self.body = nn.Linear(width, width, bias=False)
        self.readout = nn.Linear(width, vocab, bias=False)
        self.readout.weight = self.emb.weight

    def forward(self, tokens):
        return self.readout(torch.relu(self.body(self.emb(tokens))))


class _TiedWorkload(_HeadWorkload):
    name = "tied_lm"

    def build_model(self, config):
        return _TiedLM(int(config["width"]))


def test_a_readout_tied_to_the_embedding_stays_tied_in_the_proxy_and_the_target():
    scaling = ScalingConfig(target_width=128, ratio=4)
    proxy = proxy_workload(_TiedWorkload(), scaling)
    model = proxy.build_model(proxy.resolve({}))
    assert isinstance(model.readout, mup.MuReadout)
    assert model.readout.weight is model.emb.weight, "the proxy must keep the user's weight tying"
    assert [name for name, _ in model.named_parameters()] == ["emb.weight", "body.weight"]
    target = target_workload(_TiedWorkload(), scaling)
    torch.manual_seed(0)
    scaled = target.build_model(target.resolve({}))
    torch.manual_seed(0)
    plain = _TiedLM(128)
    tokens = torch.randint(0, 24, (2, 8))
    assert torch.equal(scaled(tokens), plain(tokens)), "at the base width the tied target is the user's model"


def test_a_tied_embedding_keeps_its_width_independent_init_in_the_proxy():
    """The shared weight is an embedding (N(0, 1) at every width); mup's readout rescale, meant for
    an nn.Linear's 1/fan_in init, must not shrink it in the proxy."""
    torch.manual_seed(0)
    model = MuPWorkload(_TiedWorkload(), width=32, base_width=512).build_model({"width": 32})
    assert model.emb.weight.std().item() == pytest.approx(1.0, rel=0.1)


def test_readout_zero_init_on_a_readout_tied_to_the_embedding_is_refused_not_a_zeroed_embedding():
    proxy = proxy_workload(_TiedWorkload(), SCALING)
    with pytest.raises(ScalingError, match=r"readout_zero_init.*'readout'.*'emb\.weight'"):
        proxy.build_model(proxy.resolve({"readout_zero_init": True}))


@settings(max_examples=12, deadline=None)
@given(
    width=st.sampled_from([8, 16, 24, 48]),
    base_width=st.sampled_from([16, 32, 64]),
    optimizer=st.sampled_from(["adam", "adamw", "sgd"]),
)
def test_a_tied_proxy_trains_exactly_like_mups_own_optimizer_on_mups_shared_readout(width, base_width, optimizer):
    proxy = MuPWorkload(_TiedWorkload(), width=width, base_width=base_width)
    config = proxy.resolve({"optimizer": optimizer, "lr": 0.02, "weight_decay": 0.1})
    torch.manual_seed(0)
    ours = proxy.build_model(config)
    theirs = _TiedLM(width)
    theirs.readout = mup.MuSharedReadout(theirs.emb.weight, bias=False)
    mup.set_base_shapes(theirs, _TiedLM(base_width), delta=_TiedLM(2 * base_width), rescale_params=False)
    theirs.load_state_dict(ours.state_dict())
    mup_optimizer = {"adam": mup.MuAdam, "adamw": mup.MuAdamW, "sgd": mup.MuSGD}[optimizer]
    ours_opt = workload_optimizer(proxy, ours, OptimHParams.from_config(config))
    theirs_opt = mup_optimizer(theirs.parameters(), lr=0.02, weight_decay=0.1)
    tokens = torch.randint(0, 24, (4, 9), generator=torch.Generator().manual_seed(1))
    for model, opt in ((ours, ours_opt), (theirs, theirs_opt)):
        for _ in range(2):
            opt.zero_grad()
            proxy.loss(model(tokens[:, :-1]), tokens[:, 1:]).backward()
            opt.step()
    assert ours.readout.weight is ours.emb.weight
    for (name, mine), reference in zip(ours.named_parameters(), theirs.parameters()):
        torch.testing.assert_close(mine, reference, msg=f"{name} differs from {mup_optimizer.__name__}")
