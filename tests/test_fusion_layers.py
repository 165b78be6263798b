"""Every supported layer fuses exactly, on both strategies; unsupported layers fail by name."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from examples.char_gpt import workload as char_gpt
from examples.mlp_digits import workload as mlp_digits
from fusion import FusedTrainer, FusionError, build_member, fuse_models
from hpo.training import TrialTrainer


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


def test_cumulative_batchnorm_fuses_by_module_swapping_but_not_under_vmap():
    members = [nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4, momentum=None)) for _ in range(2)]
    x = torch.randn(5, 3)
    assert fuse_models(copy.deepcopy(members), x).strategy == "stacked"
    with pytest.raises(FusionError, match=r"layer '1' \(BatchNorm1d\).*momentum=None"):
        fuse_models(members, x, strategy="vmap")


def test_members_of_different_architectures_cannot_fuse():
    with pytest.raises(FusionError, match="different tensors"):
        fuse_models([nn.Linear(4, 3), nn.Linear(4, 5)], torch.randn(2, 4))


def test_auto_strategy_uses_module_swapping_when_it_fits_and_vmap_otherwise():
    mlp = mlp_digits.resolve({"width": 16})
    gpt = char_gpt.resolve({"width": 16, "n_layer": 1, "block_size": 8, "batch_size": 2})
    assert FusedTrainer(mlp_digits, [mlp, {**mlp, "seed": 1}]).model.strategy == "stacked"
    assert FusedTrainer(char_gpt, [gpt, {**gpt, "seed": 1}]).model.strategy == "vmap"


def test_per_member_attention_and_output_multipliers_fuse():
    # muP's attn_mult reaches scaled_dot_product_attention as a per-member scale.
    base = char_gpt.resolve({"width": 16, "n_layer": 1, "block_size": 8, "batch_size": 3})
    configs = [
        {**base, "seed": 0},
        {**base, "seed": 1, "attn_mult": 2.5, "output_mult": 0.5, "emb_mult": 3.0},
        {**base, "seed": 2, "attn_scale": "inv_d", "init_std": 0.05},
    ]
    x, _ = next(char_gpt.train_batches(base, 0))
    fused = fuse_models([build_member(char_gpt, c) for c in configs], x)
    fused.eval()
    with torch.no_grad():
        out = fused(x)
        for i, config in enumerate(configs):
            reference = build_member(char_gpt, config).eval()
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
