"""Every supported layer fuses exactly, on both strategies; unsupported layers fail by name."""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from examples.char_gpt import workload as char_gpt
from examples.mlp_digits import workload as mlp_digits
from fusion import FusedTrainer, FusionError, fuse_models
from hpo.base.training import build_trial_model
from hpo.base.training import TrialTrainer
from hpo.examples.char_gpt import SelfAttention


def conv1d_net() -> nn.Module:
    return nn.Sequential(
        nn.Conv1d(3, 4, 3, padding=1), nn.ReLU(), nn.BatchNorm1d(4), nn.Conv1d(4, 2, 3, padding=1, padding_mode="reflect")
    )


def conv2d_net() -> nn.Module:
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.GELU(), nn.BatchNorm2d(4), nn.Conv2d(4, 2, 3, stride=2, groups=2))


def embedding_net() -> nn.Module:
    return nn.Sequential(nn.Embedding(12, 6, padding_idx=0), nn.LayerNorm(6), nn.Linear(6, 5))


def inputs_for(name: str) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1)
    if name == "embedding":
        tokens = torch.randint(0, 12, (5, 7), generator=generator)
        tokens[0, :3] = 0  # padding positions
        return tokens
    return torch.randn((6, 3, 8) if name == "conv1d" else (6, 1, 8, 8), generator=generator)


FACTORIES = {"conv1d": conv1d_net, "conv2d": conv2d_net, "embedding": embedding_net}


@pytest.mark.parametrize("strategy", ["stacked", "vmap"])
@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_fused_layers_compute_each_members_outputs_gradients_and_statistics(name, strategy):
    torch.manual_seed(0)
    members = [FACTORIES[name]() for _ in range(3)]
    references = copy.deepcopy(members)
    x = inputs_for(name)
    fused = fuse_models(members, x, strategy=strategy)
    assert fused.strategy == strategy
    fused.train()
    out = fused(x)
    out.square().sum().backward()
    for i, reference in enumerate(references):
        reference.train()
        expected = reference(x)
        expected.square().sum().backward()
        torch.testing.assert_close(out[i], expected, rtol=1e-5, atol=1e-6, msg=f"member {i} output")
        for param_name, param in reference.named_parameters():
            fused_grad = fused.module.get_parameter(param_name).grad[i]
            torch.testing.assert_close(fused_grad, param.grad, rtol=1e-4, atol=1e-5, msg=f"member {i} grad of {param_name}")
        for buffer_name, buffer in reference.named_buffers():  # BatchNorm running statistics
            torch.testing.assert_close(fused.module.get_buffer(buffer_name)[i], buffer, msg=f"member {i} {buffer_name}")


@pytest.mark.parametrize("strategy", ["stacked", "vmap"])
def test_embedding_padding_row_gets_no_gradient_in_any_member(strategy):
    members = [embedding_net() for _ in range(3)]
    x = inputs_for("embedding")
    fused = fuse_models(members, x, strategy=strategy)
    fused(x).sum().backward()
    grad = fused.module.get_parameter("0.weight").grad
    assert torch.count_nonzero(grad[:, 0]) == 0, "the padding row received a gradient"
    assert torch.count_nonzero(grad[:, 1:]) > 0


@pytest.mark.parametrize("strategy", ["stacked", "vmap"])
def test_dropout_masks_are_independent_per_member(strategy):
    torch.manual_seed(0)
    member = nn.Sequential(nn.Linear(8, 64), nn.Dropout(0.5))
    members = [copy.deepcopy(member) for _ in range(4)]  # identical weights: only the masks can differ
    x = torch.randn(16, 8)
    fused = fuse_models(members, x, strategy=strategy)
    fused.train()
    out = fused(x)
    dropped = out == 0
    assert not torch.equal(dropped[0], dropped[1]), "two members drew the same dropout mask"
    assert 0.3 < dropped.float().mean() < 0.7
    fused.eval()
    evaluated = fused(x)
    assert torch.equal(evaluated[0], evaluated[3])


def test_unsupported_layer_fails_naming_the_layer():
    class Tagger(nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = nn.EmbeddingBag(10, 8)
            self.head = nn.Linear(8, 2)

        def forward(self, x):
            return self.head(self.encoder(x))

    with pytest.raises(FusionError, match=r"layer 'encoder' \(EmbeddingBag\) is not supported"):
        fuse_models([Tagger(), Tagger()], torch.randint(0, 10, (3, 5)))


def test_embedding_with_max_norm_fails_naming_the_reason():
    with pytest.raises(FusionError, match="max_norm"):
        fuse_models([nn.Embedding(5, 3, max_norm=1.0) for _ in range(2)], torch.tensor([1, 2]))


class ScalesItsImages(nn.Module):
    """The usual image pipeline: uint8 pixels in, scaled to [0, 1] by the model itself."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        return self.head(self.conv(x.float() / 255).relu().mean((-1, -2)))


def test_uint8_images_fuse_stacked_with_pixels_up_to_255():
    # the independence check changes one member's input: its pixels stay uint8 values in range
    torch.manual_seed(0)
    members = [ScalesItsImages() for _ in range(2)]
    references = copy.deepcopy(members)
    x = torch.randint(0, 256, (5, 3, 6, 6), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    x[0, 0, 0, 0] = 255
    fused = fuse_models(members, x)
    assert fused.strategy == "stacked"
    outputs = fused(x)
    for i, reference in enumerate(references):  # float32: a grouped convolution rounds its own way
        torch.testing.assert_close(outputs[i], reference(x))


def test_cumulative_batchnorm_fuses_by_module_swapping_but_not_under_vmap():
    members = [nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4, momentum=None)) for _ in range(2)]
    x = torch.randn(5, 3)
    assert fuse_models(copy.deepcopy(members), x).strategy == "stacked"
    with pytest.raises(FusionError, match=r"layer '1' \(BatchNorm1d\).*momentum=None"):
        fuse_models(members, x, strategy="vmap")


def test_members_of_different_architectures_cannot_fuse():
    with pytest.raises(FusionError, match="different tensors"):
        fuse_models([nn.Linear(4, 3), nn.Linear(4, 5)], torch.randn(2, 4))


@pytest.mark.parametrize("parametrization", [nn.utils.parametrizations.weight_norm, nn.utils.parametrizations.spectral_norm])
def test_a_parametrized_layer_is_refused_naming_it_and_its_parametrization_not_as_members_that_differ(parametrization):
    # each member's parametrized Linear is a class of its own (`ParametrizedLinear`, made per module)
    models = [nn.Sequential(parametrization(nn.Linear(4, 3)), nn.ReLU(), nn.Linear(3, 2)) for _ in range(2)]
    with pytest.raises(FusionError, match=r"layer '0' \(Linear\) has parametrized tensors \['weight'\] .*fusion: \{enabled: false\}"):
        fuse_models(models, torch.randn(5, 4))


def test_members_that_freeze_different_parameters_are_refused_naming_the_parameter():
    trainable, frozen = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2)), nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2))
    frozen[0].requires_grad_(False)
    with pytest.raises(FusionError, match=r"parameter '0\.weight' is frozen \(requires_grad=False\) in member 1 only"):
        fuse_models([trainable, frozen], torch.randn(5, 4))


@pytest.mark.parametrize("strategy", ["stacked", "vmap"])
def test_frozen_parameters_stay_frozen_on_both_paths(strategy):
    members = [nn.Sequential(nn.Linear(4, 3), nn.Tanh(), nn.Linear(3, 2)) for _ in range(2)]
    for member in members:
        member[0].requires_grad_(False)
    fused = fuse_models(members, torch.randn(5, 4), strategy=strategy)
    assert {name: p.requires_grad for name, p in fused.module.named_parameters()} == {
        "0.weight": False, "0.bias": False, "2.weight": True, "2.bias": True
    }


def test_auto_strategy_uses_module_swapping_when_it_fits_and_vmap_otherwise():
    mlp = mlp_digits.resolve({"width": 16})
    gpt = char_gpt.resolve({"width": 16, "n_layer": 1, "block_size": 8, "batch_size": 2})
    assert FusedTrainer(mlp_digits, [mlp, {**mlp, "seed": 1}]).model.strategy == "stacked"
    # code that reads shapes (`batch, time, width = x.shape`) runs on the members folded into the batch
    assert FusedTrainer(char_gpt, [gpt, {**gpt, "seed": 1}]).model.strategy == "stacked"
    # a per-member attention scale (muP's attn_mult) stacks: it only reaches scaled_dot_product_attention
    assert FusedTrainer(char_gpt, [gpt, {**gpt, "seed": 1, "attn_mult": 2.0}]).model.strategy == "stacked"
    # a per-member multiplier the user's code computes with (emb_mult): only vmap stacks it
    assert FusedTrainer(char_gpt, [gpt, {**gpt, "seed": 1, "emb_mult": 2.0}]).model.strategy == "vmap"


class _AttentionKernelCalls(TorchDispatchMode):
    """Records the shape of the query each attention kernel (forward or backward) is called on."""

    def __init__(self):
        super().__init__()
        self.calls: list[tuple[str, tuple[int, ...]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if "scaled_dot_product" in func.name():
            self.calls.append((func.name(), tuple(args[0].shape)))
        return func(*args, **(kwargs or {}))


def test_char_gpt_causal_attention_runs_once_per_layer_on_all_members_folded():
    # GPT proxies stay off vmap: each layer's causal attention is one kernel call on [B*N, heads, T, d]
    gpt = char_gpt.resolve({"width": 32, "head_dim": 16, "n_layer": 2, "block_size": 8, "batch_size": 3})
    trainer = FusedTrainer(char_gpt, [{**gpt, "seed": s, "lr": 1e-3 * (s + 1)} for s in range(4)])
    assert trainer.model.strategy == "stacked"
    with _AttentionKernelCalls() as kernels:
        trainer.train_step(*trainer.batches.batch(0))
    forward = [shape for name, shape in kernels.calls if not name.endswith("_backward")]
    backward = [shape for name, shape in kernels.calls if name.endswith("_backward")]
    assert forward == backward == [(4 * 3, 2, 8, 16)] * 2


@settings(max_examples=8, derandomize=True, deadline=None, database=None)
@given(
    scales=st.lists(st.tuples(st.sampled_from([0.5, 1.0, 2.5]), st.sampled_from(["inv_sqrt_d", "inv_d"])), min_size=1, max_size=4),
    causal=st.booleans(),
)
def test_members_with_their_own_attention_scales_stack_and_compute_what_they_compute_alone(scales, causal):
    # muP's attention scale per member (attn_mult, attn_scale) stays on the stacked path, bit-exact in float64
    members = [
        SelfAttention(16, 8, 0.0, attn_scale, attn_mult, causal=causal).double()
        for attn_mult, attn_scale in scales
    ]
    for seed, member in enumerate(members):
        torch.manual_seed(seed)
        member.apply(lambda m: m.reset_parameters() if isinstance(m, nn.Linear) else None)
    references = copy.deepcopy(members)
    x = torch.randn(3, 6, 16, dtype=torch.float64)
    fused = fuse_models(members, x, strategy="stacked")
    assert_fused_equals_members(fused, references, x, exact=True)


def test_per_member_attention_and_output_multipliers_fuse():
    # muP's attn_mult reaches scaled_dot_product_attention as a per-member scale.
    base = char_gpt.resolve({"width": 16, "n_layer": 1, "block_size": 8, "batch_size": 3})
    configs = [
        {**base, "seed": 0},
        {**base, "seed": 1, "attn_mult": 2.5, "output_mult": 0.5, "emb_mult": 3.0},
        {**base, "seed": 2, "attn_scale": "inv_d", "init_std": 0.05},
    ]
    x, _ = next(char_gpt.train_batches(base, 0))
    fused = fuse_models([build_trial_model(char_gpt, c) for c in configs], x)
    fused.eval()
    with torch.no_grad():
        out = fused(x)
        for i, config in enumerate(configs):
            reference = build_trial_model(char_gpt, config).eval()
            torch.testing.assert_close(out[i], reference(x), rtol=1e-5, atol=1e-5, msg=f"member {i}")


@pytest.mark.parametrize("optimizer", ["adam", "adamw"])
def test_mup_proxy_members_match_training_alone(optimizer):
    from hpo.scaling import MuPWorkload

    proxy = MuPWorkload(mlp_digits, width=32, base_width=16)
    configs = [
        {"seed": 0, "lr": 3e-3, "optimizer": optimizer, "weight_decay": 0.1, "steps_per_iteration": 25},
        {"seed": 1, "lr": 1e-2, "optimizer": optimizer, "output_mult": 2.0, "init_std": 0.05, "steps_per_iteration": 25},
    ]
    fused = FusedTrainer(proxy, configs)
    fused.train_iteration()
    for i, config in enumerate(configs):
        alone = TrialTrainer(proxy, config)
        alone.train_iteration()
        for name, tensor in alone.model.state_dict().items():
            fused_tensor = fused.model.member_state_dict(i)[name]
            error = ((fused_tensor - tensor).norm() / tensor.norm()).item()
            assert error <= 1e-5, f"member {i} {name}: rel err {error:.2e} (muP lr or weight-decay multipliers, or readout scale, not applied)"


# --- layers that read their input's layout, attention, recurrent layers, sharing -----------------


def assert_fused_equals_members(fused, references, x, exact: bool) -> None:
    """Train-mode outputs, gradients and buffers of every member, bit-exact or within 1e-12."""
    check = (lambda a, b, msg: torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True, msg=msg)) if exact else (
        lambda a, b, msg: torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12, equal_nan=True, msg=msg)
    )
    fused.train()
    outs = fused(x)
    outs = outs if isinstance(outs, tuple) else (outs,)
    sum(out.square().sum() for out in outs).backward()
    for i, reference in enumerate(references):
        reference.train()
        expected = reference(x)
        expected = expected if isinstance(expected, tuple) else (expected,)
        sum(e.square().sum() for e in expected).backward()
        for k, (out, e) in enumerate(zip(outs, expected)):
            check(out[i], e, f"member {i} output {k}")
        for name, param in reference.named_parameters():
            if param.grad is not None:
                check(fused.module.get_parameter(name).grad[i], param.grad, f"member {i} grad of {name}")
        for name, buffer in reference.named_buffers():
            check(fused.module.get_buffer(name)[i], buffer, f"member {i} {name}")


def layout_net() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1),
        nn.GroupNorm(2, 4),
        nn.MaxPool2d(2),
        nn.InstanceNorm2d(4, affine=True, track_running_stats=True),
        nn.AvgPool2d(2, ceil_mode=True),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(4, 3),
        nn.Softmax(dim=1),
    )


def sequence_net() -> nn.Module:
    return nn.Sequential(nn.Conv1d(2, 4, 3), nn.MaxPool1d(2), nn.GroupNorm(1, 4), nn.AdaptiveMaxPool1d(2), nn.Flatten(), nn.Linear(8, 2))


@pytest.mark.parametrize("factory,shape", [(layout_net, (5, 3, 8, 8)), (sequence_net, (5, 2, 11))])
def test_pooling_group_and_instance_norm_fuse_stacked_bit_exactly(factory, shape):
    torch.manual_seed(0)
    members = [factory().double() for _ in range(3)]
    references = copy.deepcopy(members)
    x = torch.randn(shape, dtype=torch.float64)
    fused = fuse_models(members, x)
    assert fused.strategy == "stacked"
    assert_fused_equals_members(fused, references, x, exact=True)


@pytest.mark.parametrize("kind,spatial", [(nn.Dropout1d, (9,)), (nn.Dropout2d, (5, 5)), (nn.Dropout3d, (3, 3, 3))])
def test_channel_dropout_drops_whole_channels_of_each_member_and_sample(kind, spatial):
    torch.manual_seed(0)
    conv = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}[len(spatial)]
    members = [nn.Sequential(conv(3, 32, 1), kind(0.5)) for _ in range(4)]
    x = torch.rand(16, 3, *spatial) + 0.1
    fused = fuse_models(members, x)
    assert fused.strategy == "stacked"
    fused.train()
    zero = fused(x) == 0  # (B, N, C, *spatial)
    channel_zero = zero.flatten(3).all(-1)
    assert torch.equal(channel_zero, zero.flatten(3).any(-1)), "a channel was partly dropped"
    assert 0.4 < channel_zero.float().mean() < 0.6
    assert channel_zero.all(-1).float().mean() < 0.01, "whole samples were dropped"
    assert not torch.equal(channel_zero[0], channel_zero[1]), "two members drew the same channel mask"


def test_alpha_dropout_fuses_stacked_with_independent_masks_and_is_identity_in_eval():
    torch.manual_seed(0)
    members = [nn.Sequential(nn.Linear(4, 64), nn.AlphaDropout(0.5), nn.FeatureAlphaDropout(0.2)) for _ in range(3)]
    references = copy.deepcopy(members)
    x = torch.randn(8, 4)
    fused = fuse_models(members, x)
    assert fused.strategy == "stacked"
    fused.train()
    out = fused(x)
    assert not torch.allclose(out[0], out[1])
    fused.eval()
    torch.testing.assert_close(fused(x)[2], references[2].eval()(x))


class Attention(nn.Module):
    def __init__(self, batch_first: bool, need_weights: bool, causal: bool, padding: bool, cross: bool):
        super().__init__()
        self.attention = nn.MultiheadAttention(8, 2, batch_first=batch_first)
        self.memory = nn.Linear(8, 8)
        self.batch_first, self.need_weights, self.causal, self.padding, self.cross = batch_first, need_weights, causal, padding, cross

    def forward(self, x):  # (N, L, 8), sequence-major inside when not batch_first
        padding = x[..., 0] > 1.0 if self.padding else None
        x = x if self.batch_first else x.transpose(0, 1)
        kv = self.memory(x) if self.cross else x
        length = x.shape[-2] if self.batch_first else x.shape[0]
        mask = torch.triu(torch.full((length, length), float("-inf"), dtype=x.dtype), 1) if self.causal else None
        out, weights = self.attention(x, kv, kv, key_padding_mask=padding, attn_mask=mask, need_weights=self.need_weights)
        return out if weights is None else (out, weights)


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("need_weights", [False, True])
@pytest.mark.parametrize("causal,padding,cross", [(False, False, False), (True, True, False), (False, True, True), (True, False, True)])
def test_multihead_attention_fuses_stacked_bit_exactly(batch_first, need_weights, causal, padding, cross):
    torch.manual_seed(0)
    members = [Attention(batch_first, need_weights, causal, padding, cross).double() for _ in range(3)]
    references = copy.deepcopy(members)
    x = torch.randn(4, 5, 8, dtype=torch.float64)
    fused = fuse_models(members, x)
    assert fused.strategy == "stacked"
    assert_fused_equals_members(fused, references, x, exact=True)


class SelfAttentionBlock(nn.Module):
    """A batch-first self-attention block as `nn.TransformerEncoderLayer` calls it (no weights)."""

    def __init__(self):
        super().__init__()
        self.attention = nn.MultiheadAttention(16, 2, batch_first=True)

    def forward(self, x):
        return self.attention(x, x, x, key_padding_mask=x[..., 0] > 1.0, need_weights=False)[0]


@pytest.mark.parametrize("samples,length", [(7, 10), (3, 5), (32, 10)])
def test_batch_first_self_attention_is_bit_exact_in_either_row_order(samples, length):
    # The projections run on the batch-first rows as they lie where MKL rounds a row the same
    # wherever it sits, through sequence-major copies where it does not (on the CI machine
    # 7x10 and 3x5 in float64 take the copies, 32x10 does not).
    torch.manual_seed(0)
    members = [SelfAttentionBlock().double() for _ in range(3)]
    references = copy.deepcopy(members)
    x = torch.randn(samples, length, 16, dtype=torch.float64)
    fused = fuse_models(members, x)
    assert fused.strategy == "stacked"
    assert_fused_equals_members(fused, references, x, exact=True)


class Recurrent(nn.Module):
    def __init__(self, kind: str, bidirectional: bool, batch_first: bool):
        super().__init__()
        self.rnn = getattr(nn, kind)(3, 5, num_layers=2, bidirectional=bidirectional, batch_first=batch_first)
        self.head = nn.Linear(10 if bidirectional else 5, 2)

    def forward(self, x):
        out, state = self.rnn(x)
        state = state[0] if isinstance(state, tuple) else state
        return self.head(out), state


@pytest.mark.parametrize("kind", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("bidirectional,batch_first", [(False, False), (True, True), (True, False)])
def test_recurrent_layers_fuse_stacked_bit_exactly(kind, bidirectional, batch_first):
    torch.manual_seed(0)
    members = [Recurrent(kind, bidirectional, batch_first).double() for _ in range(3)]
    references = copy.deepcopy(members)
    x = torch.randn(4, 6, 3, dtype=torch.float64)
    fused = fuse_models(members, x)
    assert fused.strategy == "stacked"
    assert_fused_equals_members(fused, references, x, exact=True)
    fused.eval()
    with torch.no_grad():
        _, state = fused(x)
        torch.testing.assert_close(state[1], references[1].eval()(x)[1], rtol=0, atol=0)


class ProjectedLSTM(nn.Module):
    """A classifier on an LSTM with projections (`proj_size`), its last step and final states."""

    def __init__(self, batch_first: bool, bidirectional: bool):
        super().__init__()
        self.rnn = nn.LSTM(3, 5, num_layers=2, proj_size=2, bidirectional=bidirectional, batch_first=batch_first)
        self.head = nn.Linear(4 if bidirectional else 2, 3)

    def forward(self, x):  # (N, T, 3)
        out, (h_n, c_n) = self.rnn(x if self.rnn.batch_first else x.transpose(0, 1))
        last = out[:, -1] if self.rnn.batch_first else out[-1]
        return self.head(last) + h_n[-1].sum(-1, keepdim=True) + c_n[-1].sum(-1, keepdim=True)


@pytest.mark.parametrize("batch_first,bidirectional", [(True, True), (False, False)])
def test_lstm_with_projections_fuses_stacked_bit_exactly(batch_first, bidirectional):
    torch.manual_seed(0)
    members = [ProjectedLSTM(batch_first, bidirectional).double() for _ in range(3)]
    references = copy.deepcopy(members)
    x = torch.randn(4, 6, 3, dtype=torch.float64)
    fused = fuse_models(members, x)
    assert fused.strategy == "stacked"
    assert_fused_equals_members(fused, references, x, exact=True)


class Cells(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm, self.gru, self.rnn = nn.LSTMCell(3, 4), nn.GRUCell(4, 5), nn.RNNCell(5, 2, nonlinearity="relu")

    def forward(self, x):  # (N, T, 3)
        h = c = g = None
        outputs = []
        for t in range(x.shape[-2]):
            h, c = self.lstm(x[..., t, :], None if h is None else (h, c))
            g = self.gru(h, g)
            outputs.append(self.rnn(g))
        return torch.stack(outputs, -2)


@pytest.mark.parametrize("seed", range(4))
def test_recurrent_cells_fuse_stacked_bit_exactly(seed):
    # The GRU's state [B, 4, 5] in float64 puts member 1 at byte 160: MKL's batched GEMM picks
    # other kernels for operands off a 64-byte boundary, which the GEMM probe has to see.
    torch.manual_seed(seed)
    members = [Cells().double() for _ in range(3)]
    references = copy.deepcopy(members)
    x = torch.randn(4, 5, 3, dtype=torch.float64)
    fused = fuse_models(members, x)
    assert fused.strategy == "stacked"
    assert_fused_equals_members(fused, references, x, exact=True)


def test_packed_sequences_are_refused_naming_the_layer():
    class Packed(nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = nn.LSTM(3, 4, batch_first=True)

        def forward(self, x):
            packed = nn.utils.rnn.pack_padded_sequence(x, torch.full((x.shape[-3],), x.shape[-2]), batch_first=True)
            return nn.utils.rnn.pad_packed_sequence(self.lstm(packed)[0], batch_first=True)[0]

    with pytest.raises(FusionError, match=r"layer 'lstm' \(LSTM\).*packed sequences"):
        fuse_models([Packed(), Packed()], torch.randn(2, 4, 3))


class SharedAndTied(nn.Module):
    def __init__(self):
        super().__init__()
        block = nn.Sequential(nn.Linear(6, 6), nn.Tanh())
        self.a = self.b = block
        self.embed = nn.Embedding(10, 6)
        self.head = nn.Linear(6, 10, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens):
        return self.head(self.b(self.a(self.embed(tokens))))


@pytest.mark.parametrize("strategy", ["stacked", "vmap"])
def test_shared_submodules_and_tied_weights_stay_shared_and_run_again(strategy):
    torch.manual_seed(0)
    members = [SharedAndTied().double() for _ in range(3)]
    references = copy.deepcopy(members)
    x = torch.randint(0, 10, (4, 5))
    fused = fuse_models(members, x, strategy=strategy)
    assert fused.module.a is fused.module.b
    assert fused.module.head.weight is fused.module.embed.weight
    assert len(list(fused.parameters())) == 3
    assert_fused_equals_members(fused, references, x, exact=strategy == "stacked")
    assert fused(x).shape == (3, 4, 5, 10), "the fused model broke after its first forward"
    assert all(t.shape[0] == 3 for t in fused.module.state_dict().values())


def test_members_that_share_differently_are_refused_up_front():
    shared, separate = SharedAndTied(), SharedAndTied()
    separate.b = copy.deepcopy(separate.a)
    with pytest.raises(FusionError, match=r"member 1 shares submodules or tied parameters differently from member 0: a.0.bias = b.0.bias is one object in member 0 only"):
        fuse_models([shared, separate], torch.randint(0, 10, (4, 5)))


def test_runtime_errors_become_the_same_fusion_error_every_time():
    class Broken(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            raise RuntimeError(f"no luck with {object()}")

    messages = set()
    for _ in range(2):
        with pytest.raises(FusionError) as refused:
            fuse_models([Broken(), Broken()], torch.randn(3, 4))
        messages.add(str(refused.value))
    assert len(messages) == 1, messages
    assert "layer '<root>' (Broken)" in messages.pop()


class HeadsAttention(nn.Module):
    """Attention written with negative dimensions only, calling scaled_dot_product_attention itself."""

    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(8, 24)
        self.proj = nn.Linear(8, 8)

    def forward(self, x):  # (..., L, 8)
        q, k, v = self.qkv(x).unflatten(-1, (3, 2, 4)).movedim(-3, 0).transpose(-2, -3)  # (..., heads, L, 4)
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(out.transpose(-2, -3).flatten(-2))


def test_scaled_dot_product_attention_stays_on_its_fused_kernel_on_the_stacked_path():
    torch.manual_seed(0)
    members = [HeadsAttention().double() for _ in range(3)]
    references = copy.deepcopy(members)
    x = torch.randn(4, 6, 8, dtype=torch.float64)
    fused = fuse_models(members, x)
    assert fused.strategy == "stacked"
    assert_fused_equals_members(fused, references, x, exact=True)
    with torch.profiler.profile() as profile:
        fused(x).sum().backward()
    kernels = {event.key for event in profile.key_averages()}
    assert "aten::_scaled_dot_product_flash_attention_for_cpu" in kernels
    assert "aten::_scaled_dot_product_attention_math" not in kernels


class TrainOnlyBatchScale(nn.Module):
    """Divides by the batch size in training only: on the stacked path the batch holds every member's samples."""

    def forward(self, x):
        return x / x.shape[0] if self.training else x


def test_a_layer_wrong_only_in_training_is_caught_and_fused_by_vmap_instead():
    torch.manual_seed(0)
    members = [nn.Sequential(nn.Linear(4, 6), TrainOnlyBatchScale(), nn.Linear(6, 2)).double() for _ in range(3)]
    references = copy.deepcopy(members)
    x = torch.randn(5, 4, dtype=torch.float64)
    with pytest.raises(FusionError, match="differs from its own model's in train mode"):
        fuse_models(copy.deepcopy(members), x, strategy="stacked")
    fused = fuse_models(members, x)
    assert fused.strategy == "vmap"
    assert_fused_equals_members(fused, references, x, exact=False)


class RescalesLargeActivations(nn.Module):
    """Branches in Python on its activations: each member alone rescales only once its own grow."""

    def __init__(self):
        super().__init__()
        self.fc, self.out = nn.Linear(12, 16), nn.Linear(16, 5)

    def forward(self, x):
        h = self.fc(x)
        if h.abs().max() > 4:  # not reached on the first batches
            h = h / h.abs().max()
        return self.out(h)


def test_a_branch_on_values_computed_from_the_weights_is_not_stacked_even_before_training_reaches_it():
    # folded into one batch, every member would take the branch once any member's activations grow
    torch.manual_seed(0)
    x = torch.randn(6, 12)
    with pytest.raises(FusionError, match=r"layer '<root>' \(RescalesLargeActivations\) reads a value computed from its parameters into Python \(__bool__\)"):
        fuse_models([RescalesLargeActivations() for _ in range(2)], x, strategy="stacked")
    with pytest.raises(FusionError, match="data-dependent control flow"):  # nor can vmap run it
        fuse_models([RescalesLargeActivations() for _ in range(2)], x)


def test_members_whose_layers_differ_in_a_setting_are_refused_naming_it_not_fused_with_member_0s():
    # a config key the members may differ in (here Adam's eps, or SGD's momentum), read by the model too
    with pytest.raises(FusionError, match=r"layer '1' \(LayerNorm\) differs between members in \['eps'\]"):
        fuse_models([nn.Sequential(nn.Linear(4, 6), nn.LayerNorm(6, eps=eps)) for eps in (1e-5, 1e-6)], torch.randn(5, 4))
    with pytest.raises(FusionError, match=r"layer '1' \(BatchNorm1d\) differs between members in \['momentum'\]"):
        fuse_models([nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6, momentum=m)) for m in (0.1, 0.9)], torch.randn(5, 4))
