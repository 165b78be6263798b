"""A small Vision Transformer on scikit-learn's bundled digits: each 8x8 image is 16 patches of 2x2.

The model: a linear patch embedding plus a learned position embedding, `depth` parallel
pre-LayerNorm encoder blocks (attention and MLP side by side on one normalised input, as in
ViT-22B, with bidirectional attention), a final LayerNorm, mean pooling over the patches and a
linear `readout`. The data and the split are `mlp_digits`'.

Depth contract (`scaling: {target_depth: ...}`): `depth` blocks under `encoder`, and the block's
one residual branch multiplied by `residual_mult` (1 by default: the plain model). muP knobs as
in `char_gpt`: `attn_scale`, `attn_mult`, `output_mult`, `init_std`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from hpo.examples.char_gpt import SelfAttention, normal_init
from hpo.examples.mlp_digits import NUM_CLASSES, DigitsMLP
from hpo.examples.model_from_config import build_from_config

IMAGE_SIDE = 8
PATCH_SIDE = 2
NUM_PATCHES = (IMAGE_SIDE // PATCH_SIDE) ** 2


class ParallelBlock(nn.Module):
    def __init__(self, width: int, head_dim: int, attn_scale: str, attn_mult: float, residual_mult: float):
        super().__init__()
        self.ln = nn.LayerNorm(width)
        self.attn = SelfAttention(width, head_dim, 0.0, attn_scale, attn_mult, causal=False)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
        # --- depth scaling: residual-branch multiplier (CompleteP's (L/L_base)**-alpha, set by hpo.scaling) ---
        self.residual_mult = residual_mult

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln(x)
        return x + self.residual_mult * (self.attn(h) + self.mlp(h))


class ViT(nn.Module):
    def __init__(
        self,
        width: int,
        depth: int = 2,
        head_dim: int = 16,
        attn_scale: str = "inv_sqrt_d",
        attn_mult: float = 1.0,
        output_mult: float = 1.0,
        residual_mult: float = 1.0,
        init_std: float | None = None,
    ):
        super().__init__()
        self.patch_embedding = nn.Linear(PATCH_SIDE * PATCH_SIDE, width)
        self.position_embedding = nn.Embedding(NUM_PATCHES, width)
        self.encoder = nn.Sequential(
            *(ParallelBlock(width, head_dim, attn_scale, attn_mult, residual_mult) for _ in range(depth))
        )
        self.ln_f = nn.LayerNorm(width)
        self.readout = nn.Linear(width, NUM_CLASSES)
        # --- muP: output multiplier and init scale (transferable hyperparameters) ---
        self.output_mult = output_mult
        if init_std is not None:  # under hpo.scaling it is redrawn with mup.init's width rules
            self.apply(lambda module: normal_init(module, init_std))

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:  # (N, 64) -> (N, 10)
        n = pixels.shape[0]
        grid = IMAGE_SIDE // PATCH_SIDE
        patches = pixels.view(n, grid, PATCH_SIDE, grid, PATCH_SIDE).transpose(2, 3).reshape(n, NUM_PATCHES, -1)
        x = self.patch_embedding(patches) + self.position_embedding.weight  # (N, 16, width)
        return self.output_mult * self.readout(self.ln_f(self.encoder(x)).mean(dim=1))


class DigitsViT(DigitsMLP):
    name = "vit_digits"
    defaults = {
        "width": 64,
        "depth": 2,
        "head_dim": 16,
        "attn_scale": "inv_sqrt_d",
        "attn_mult": 1.0,
        "output_mult": 1.0,
        "residual_mult": 1.0,
        "init_std": None,
        "batch_size": 64,
        "optimizer": "adamw",
        "lr": 1e-3,
    }
    depth_key = "depth"  # depth contract: `depth` blocks under `encoder`, the branch x residual_mult
    residual_blocks = "encoder"

    def build_model(self, config: Mapping[str, Any]) -> nn.Module:
        return build_from_config(ViT, config)


workload = DigitsViT()
