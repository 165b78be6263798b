"""The coordinate check passes a muP model and fails, naming layers, a standard-parametrised one."""

from collections import OrderedDict

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from examples.mlp_digits import workload as mlp_digits
from hpo.base.workload import Workload
from hpo.scaling import ScalingError, coord_check

WIDTHS = [32, 64, 128, 256]


def test_mup_proxy_passes_and_the_plot_is_saved(tmp_path):
    plot = tmp_path / "coord.png"
    report = coord_check(mlp_digits, WIDTHS, config={"lr": 0.01}, seeds=2, plot_path=str(plot))
    assert report.ok, report.summary()
    assert plot.stat().st_size > 10_000


def test_standard_parametrisation_fails_loudly_naming_the_readout():
    report = coord_check(mlp_digits, WIDTHS, config={"lr": 0.01}, seeds=2, parametrization="sp")
    assert not report.ok
    assert "readout" in report.offending, report.summary()
    with pytest.raises(ScalingError, match=r"FAILED.*readout \(width\*\*"):
        report.raise_for_failure()



class _TwoHeadAttention(nn.Module):
    """Two heads at every width, so head_dim grows with width; logits x `scale`."""

    def __init__(self, width: int, inv_d: bool):
        super().__init__()
        self.head_dim = width // 2
        self.scale = 1.0 / self.head_dim if inv_d else self.head_dim**-0.5
        self.qkv = nn.Linear(width, 3 * width)

    def forward(self, x):
        q, k, v = (t.unflatten(-1, (2, self.head_dim)).transpose(1, 2) for t in self.qkv(x).chunk(3, dim=-1))
        weights = (q @ k.transpose(-1, -2) * self.scale).softmax(-1)
        return (weights @ v).transpose(1, 2).flatten(-2)


class _AttentionWorkload(Workload):
    name = "two_heads"
    defaults = {"width": 16, "batch_size": 4, "inv_d": False}

    def build_model(self, config):
        width = int(config["width"])
        return nn.Sequential(
            OrderedDict(embed=nn.Linear(3, width), attn=_TwoHeadAttention(width, config["inv_d"]), readout=nn.Linear(width, 2))
        )

    def train_batches(self, config, seed):
        generator = torch.Generator().manual_seed(seed)
        while True:
            x = torch.randn(4, 5, 3, generator=generator)
            yield x, (x[..., 0] > 0).long()

    def eval_batches(self, config):
        return [next(self.train_batches(config, 1))]

    def loss(self, output, target):
        return F.cross_entropy(output.flatten(0, 1), target.flatten())


def test_a_passing_check_still_warns_about_attention_that_muP_would_not_transfer():
    """A few steps at small widths need not show that 1/sqrt(head_dim) logits grow with width, so
    the check also says what the model's structure shows, as a sweep does."""
    report = coord_check(_AttentionWorkload(), [8, 16, 32, 64], config={"lr": 0.01}, steps=3)
    assert report.ok, report.summary()
    assert "attention layer 'attn'" in report.summary() and "head_dim grows with width" in report.summary(), report.summary()
    report = coord_check(_AttentionWorkload(), [8, 16, 32, 64], config={"lr": 0.01, "inv_d": True}, steps=3)
    assert report.ok and report.notes == [], report.summary()
