"""A small character-level GPT on the Python Language Reference that ships with CPython.

The corpus is `pydoc_data.topics` (about 465k characters of real English technical prose,
available offline on every Python install). The model follows nanoGPT: token and position
embeddings, pre-LayerNorm blocks of causal self-attention and an MLP, a final LayerNorm and a
linear `readout`. `width` is the embedding size; heads keep `head_dim` fixed as width grows,
which is how muP scales transformers.

muP knobs (config keys; their defaults are the plain nanoGPT model): `attn_scale` ('inv_d' is
muP's 1/d attention), `attn_mult`, `emb_mult`, `output_mult`, `init_std` and `readout_zero_init`. They are the
hyperparameters muP transfers from a narrow proxy to the wide target (Tensor Programs V,
table 1); `hpo.scaling` does the width-dependent part (MuReadout, base shapes, per-layer lr).

Depth contract (`scaling: {target_depth: ...}`): `n_layer` blocks under `blocks`, each residual
branch multiplied by `residual_mult` (1 by default: the plain model). `hpo.scaling` sets it to
(L/L_base)**-alpha and scales the blocks' learning rate and Adam eps, as CompleteP does.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from functools import lru_cache
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from hpo.base.workload import Batch, Workload
from hpo.examples.model_from_config import build_from_config

EVAL_WINDOWS = 256


@lru_cache(maxsize=1)
def load_corpus() -> tuple[str, torch.Tensor]:
    """The characters of the corpus (the vocabulary) and the whole text encoded as indices."""
    import pydoc_data.topics

    text = "".join(pydoc_data.topics.topics[key] for key in sorted(pydoc_data.topics.topics))
    vocabulary = "".join(sorted(set(text)))
    index = {char: i for i, char in enumerate(vocabulary)}
    return vocabulary, torch.tensor([index[char] for char in text], dtype=torch.long)


class SelfAttention(nn.Module):
    """Multi-head self-attention on `F.scaled_dot_product_attention`, causal unless `causal=False`."""

    def __init__(
        self, width: int, head_dim: int, dropout: float, attn_scale: str, attn_mult: float = 1.0, causal: bool = True
    ):
        super().__init__()
        if width % head_dim:
            raise ValueError(f"width {width} is not a multiple of head_dim {head_dim}")
        self.n_head = width // head_dim
        self.head_dim = head_dim
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.dropout = dropout
        self.causal = causal
        # Standard parametrisation scales logits by 1/sqrt(d); muP needs 1/d so that they stay
        # O(1) as the head dimension grows (Tensor Programs V, section 4).
        # --- muP: attention multiplier (a transferable hyperparameter) ---
        self.scale = attn_mult * (1.0 / head_dim if attn_scale == "inv_d" else 1.0 / math.sqrt(head_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, time, width = x.shape
        q, k, v = self.qkv(x).split(width, dim=-1)
        q, k, v = (t.view(batch, time, self.n_head, self.head_dim).transpose(1, 2) for t in (q, k, v))  # (B, nh, T, hs)
        y = F.scaled_dot_product_attention(
            q, k, v, is_causal=self.causal, dropout_p=self.dropout if self.training else 0.0, scale=self.scale
        )
        return self.proj(y.transpose(1, 2).reshape(batch, time, width))


class Block(nn.Module):
    def __init__(
        self, width: int, head_dim: int, dropout: float, attn_scale: str, attn_mult: float = 1.0, residual_mult: float = 1.0
    ):
        super().__init__()
        self.ln_1 = nn.LayerNorm(width)
        self.attn = SelfAttention(width, head_dim, dropout, attn_scale, attn_mult)
        self.ln_2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width), nn.Dropout(dropout))
        # --- depth scaling: residual-branch multiplier (CompleteP's (L/L_base)**-alpha, set by hpo.scaling) ---
        self.residual_mult = residual_mult

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.residual_mult * self.attn(self.ln_1(x))
        return x + self.residual_mult * self.mlp(self.ln_2(x))


class CharGPT(nn.Module):
    def __init__(
        self,
        vocab_size: int,
        width: int,
        n_layer: int = 2,
        head_dim: int = 16,
        block_size: int = 32,
        dropout: float = 0.0,
        attn_scale: str = "inv_sqrt_d",
        attn_mult: float = 1.0,
        emb_mult: float = 1.0,
        output_mult: float = 1.0,
        init_std: float | None = None,
        readout_zero_init: bool = False,
        residual_mult: float = 1.0,
    ):
        super().__init__()
        self.block_size = block_size
        self.token_embedding = nn.Embedding(vocab_size, width)
        self.position_embedding = nn.Embedding(block_size, width)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.Sequential(
            *(Block(width, head_dim, dropout, attn_scale, attn_mult, residual_mult) for _ in range(n_layer))
        )
        self.ln_f = nn.LayerNorm(width)
        self.readout = nn.Linear(width, vocab_size)
        # --- muP: input and output multipliers (transferable hyperparameters) ---
        self.emb_mult = emb_mult
        self.output_mult = output_mult
        if init_std is not None:  # GPT-2 init; under hpo.scaling it is redrawn with mup.init's width rules
            self.apply(lambda module: normal_init(module, init_std))
        if readout_zero_init:  # muP's recommended readout init: logits start at 0 at every width
            nn.init.zeros_(self.readout.weight)
            nn.init.zeros_(self.readout.bias)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:  # (N, T) -> (N, T, vocab)
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.drop(self.emb_mult * (self.token_embedding(idx) + self.position_embedding(positions)))  # (N, T, width)
        return self.output_mult * self.readout(self.ln_f(self.blocks(x)))


def normal_init(module: nn.Module, std: float) -> None:
    """GPT-2's init, for `model.apply`: Linear and Embedding weights ~ N(0, std), biases zero."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, std=std)
        if getattr(module, "bias", None) is not None:
            nn.init.zeros_(module.bias)


class CharGPTWorkload(Workload):
    name = "char_gpt"
    metric = "val_loss"
    defaults = {
        "width": 64,
        "n_layer": 2,
        "head_dim": 16,
        "block_size": 32,
        "dropout": 0.0,
        "attn_scale": "inv_sqrt_d",
        "attn_mult": 1.0,
        "emb_mult": 1.0,
        "output_mult": 1.0,
        "init_std": None,
        "readout_zero_init": False,
        "residual_mult": 1.0,
        "batch_size": 32,
        "optimizer": "adamw",
        "lr": 3e-3,
    }
    steps_per_iteration = 25
    depth_key = "n_layer"  # depth contract: n_layer blocks under `blocks`, branches x residual_mult
    residual_blocks = "blocks"

    def build_model(self, config: Mapping[str, Any]) -> nn.Module:
        vocabulary, _ = load_corpus()
        return build_from_config(CharGPT, config, vocab_size=len(vocabulary))

    @staticmethod
    def _split(validation: bool) -> torch.Tensor:
        _, data = load_corpus()
        cut = int(0.9 * len(data))
        return data[cut:] if validation else data[:cut]

    @staticmethod
    def _windows(data: torch.Tensor, starts: torch.Tensor, block_size: int) -> Batch:
        offsets = torch.arange(block_size)
        inputs = data[starts[:, None] + offsets]
        return inputs, data[starts[:, None] + offsets + 1]

    def train_batches(self, config: Mapping[str, Any], seed: int) -> Iterator[Batch]:
        data = self._split(validation=False)
        block_size, batch_size = int(config["block_size"]), int(config["batch_size"])
        generator = torch.Generator().manual_seed(seed)
        while True:
            starts = torch.randint(len(data) - block_size - 1, (batch_size,), generator=generator)
            yield self._windows(data, starts, block_size)

    def eval_batches(self, config: Mapping[str, Any]) -> list[Batch]:
        data = self._split(validation=True)
        block_size = int(config["block_size"])
        starts = torch.linspace(0, len(data) - block_size - 2, EVAL_WINDOWS).long()
        return [self._windows(data, starts, block_size)]


workload = CharGPTWorkload()
