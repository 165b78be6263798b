"""A zoo of small models written as PyTorch users write them (none is one of the project's examples).

Each entry builds one member model and a deterministic stream of (input, target) batches. The
fusion tests train B of them fused and each alone and compare; the throughput benchmark times
them. Widths are tiny so a 50-step float64 comparison stays fast on a 2-core CPU.

Code here is written the way the layers are meant to be used, without knowing about fusion;
where a model does what fusion cannot follow (shape unpacking, batch statistics), that is the
point of the entry and its docstring says so.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

VOCAB = 23
CLASSES = 5


class BasicBlock(nn.Module):
    """ResNet's basic block: two 3x3 convolutions with BatchNorm and a residual connection."""

    def __init__(self, cin: int, cout: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class TinyResNet(nn.Module):
    def __init__(self, width: int = 4):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(), nn.MaxPool2d(2))
        self.layer1 = BasicBlock(width, width)
        self.layer2 = BasicBlock(width, 2 * width, stride=2)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.flatten = nn.Flatten()
        self.fc = nn.Linear(2 * width, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.flatten(self.pool(self.layer2(self.layer1(self.stem(x))))))


class TransformerClassifier(nn.Module):
    """Token + position embeddings, an nn.TransformerEncoder with a padding mask, mean pooling."""

    def __init__(self, width: int = 16, heads: int = 2, layers: int = 2, max_len: int = 16):
        super().__init__()
        self.tokens = nn.Embedding(VOCAB, width, padding_idx=0)
        self.positions = nn.Embedding(max_len, width)
        layer = nn.TransformerEncoderLayer(width, heads, 2 * width, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(width, CLASSES)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        padding = tokens == 0
        positions = torch.cumsum(torch.ones_like(tokens), dim=-1) - 1
        h = self.encoder(self.tokens(tokens) + self.positions(positions), src_key_padding_mask=padding)
        keep = (~padding).unsqueeze(-1).to(h.dtype)
        return self.head((h * keep).sum(-2) / keep.sum(-2))


class LSTMLanguageModel(nn.Module):
    def __init__(self, width: int = 16, layers: int = 2):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, width)
        self.lstm = nn.LSTM(width, width, num_layers=layers, batch_first=True)
        self.out = nn.Linear(width, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden, _ = self.lstm(self.embed(tokens))
        return self.out(hidden)


class MixerBlock(nn.Module):
    def __init__(self, patches: int, width: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(width)
        self.tokens_mlp = nn.Sequential(nn.Linear(patches, 2 * patches), nn.GELU(), nn.Linear(2 * patches, patches))
        self.norm2 = nn.LayerNorm(width)
        self.channels_mlp = nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., patches, width)
        x = x + self.tokens_mlp(self.norm1(x).transpose(-1, -2)).transpose(-1, -2)
        return x + self.channels_mlp(self.norm2(x))


class MLPMixer(nn.Module):
    def __init__(self, width: int = 16, patch: int = 4, image: int = 8, depth: int = 2):
        super().__init__()
        self.patchify = nn.Conv2d(3, width, patch, stride=patch)
        patches = (image // patch) ** 2
        self.blocks = nn.Sequential(*[MixerBlock(patches, width) for _ in range(depth)])
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, CLASSES)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.patchify(images).flatten(-2).transpose(-1, -2)  # (..., patches, width)
        return self.head(self.norm(self.blocks(x)).mean(-2))


class CausalSelfAttention(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.c_attn = nn.Linear(width, 3 * width)
        self.c_proj = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.size()  # nanoGPT's shape unpacking
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))


class NanoGPT(nn.Module):
    """One nanoGPT block with the input embedding tied to the output head."""

    def __init__(self, width: int = 16, heads: int = 2, block_size: int = 8):
        super().__init__()
        self.wte = nn.Embedding(VOCAB, width)
        self.wpe = nn.Embedding(block_size, width)
        self.ln_1 = nn.LayerNorm(width)
        self.attn = CausalSelfAttention(width, heads)
        self.ln_2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
        self.ln_f = nn.LayerNorm(width)
        self.lm_head = nn.Linear(width, VOCAB, bias=False)
        self.wte.weight = self.lm_head.weight  # weight tying

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        b, t = idx.size()
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return self.lm_head(self.ln_f(x))


class SharedBlockNet(nn.Module):
    """One block registered under two names and applied twice (weights shared between the uses)."""

    def __init__(self, width: int = 16):
        super().__init__()
        self.inp = nn.Linear(12, width)
        block = nn.Sequential(nn.Linear(width, width), nn.LayerNorm(width), nn.GELU())
        self.first = block
        self.second = block
        self.out = nn.Linear(width, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.second(self.first(self.inp(x))))


class TrainModeCentering(nn.Module):
    """Subtracts the batch mean in training only (a common normalisation trick, no parameters)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x - x.mean(dim=0, keepdim=True) if self.training else x


class CenteredMLP(nn.Module):
    """Mixes the samples of its batch, in training only: must never mix members."""

    def __init__(self, width: int = 16):
        super().__init__()
        self.fc1 = nn.Linear(12, width)
        self.center = TrainModeCentering()
        self.fc2 = nn.Linear(width, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.tanh(self.center(self.fc1(x))))


class BatchStatScale(nn.Module):
    """Divides by the batch's standard deviation, read as a Python number (a batch statistic
    across the batch dimension that neither fused path can keep per member)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x / max(float(x.detach().std()), 1e-3)


class BatchStatMLP(nn.Module):
    def __init__(self, width: int = 16):
        super().__init__()
        self.fc1 = nn.Linear(12, width)
        self.scale = BatchStatScale()
        self.fc2 = nn.Linear(width, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.scale(self.fc1(x))))


class FrozenBackbone(nn.Module):
    """Linear probing: a frozen backbone (as if pretrained) under a trainable head."""

    def __init__(self, width: int = 16):
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(12, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU())
        self.backbone.requires_grad_(False)
        self.head = nn.Linear(width, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x))


class AttentionWithUnusedTable(nn.Module):
    """Embedding -> MultiheadAttention -> Linear, with a position table forward never uses."""

    def __init__(self, width: int = 16, heads: int = 2, max_len: int = 16):
        super().__init__()
        self.tokens = nn.Embedding(VOCAB, width)
        self.positions = nn.Embedding(max_len, width)  # declared, then forgotten
        self.attention = nn.MultiheadAttention(width, heads, batch_first=True)
        self.head = nn.Linear(width, CLASSES)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tokens(tokens)
        h, _ = self.attention(h, h, h, key_padding_mask=tokens == 0)
        return self.head(h.mean(dim=1))


class LastStepClassifier(nn.Module):
    """A batch-first LSTM or GRU whose last time step (`out[:, -1]`) or final state (`h_n[-1]`) is classified."""

    def __init__(self, kind: str = "LSTM", final_state: bool = False, width: int = 16):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, width)
        self.rnn = getattr(nn, kind)(width, width, batch_first=True)
        self.head = nn.Linear(width, CLASSES)
        self.final_state = final_state

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out, state = self.rnn(self.embed(tokens))
        if self.final_state:
            h_n = state[0] if isinstance(state, tuple) else state
            return self.head(h_n[-1])
        return self.head(out[:, -1])


class BidirectionalGRU(nn.Module):
    """A 2-layer bidirectional GRU run time-major, both directions' final states concatenated."""

    def __init__(self, width: int = 12):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, width)
        self.gru = nn.GRU(width, width, num_layers=2, bidirectional=True)
        self.head = nn.Linear(2 * width, CLASSES)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        _, h_n = self.gru(self.embed(tokens).transpose(0, 1))  # (T, N, width)
        return self.head(torch.cat([h_n[-2], h_n[-1]], dim=-1))


class ArangePositions(nn.Module):
    """Positions looked up at `torch.arange(T)` inside forward, mean over time."""

    def __init__(self, width: int = 16, max_len: int = 16):
        super().__init__()
        self.tokens = nn.Embedding(VOCAB, width)
        self.positions = nn.Embedding(max_len, width)
        self.mix = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, width), nn.GELU())
        self.head = nn.Linear(width, CLASSES)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.size(1), device=tokens.device)
        return self.head(self.mix(self.tokens(tokens) + self.positions(positions)).mean(1))


class ViewHeadCNN(nn.Module):
    """The classic CNN: convolutions and pooling, then `x.view(x.size(0), -1)` into a Linear."""

    def __init__(self, channels: int = 4):
        super().__init__()
        self.conv1 = nn.Conv2d(3, channels, 3, padding=1)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1)
        self.fc = nn.Linear(channels * 2 * 2, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc(x.view(x.size(0), -1))


def _images(generator: torch.Generator, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(n, 3, 8, 8, generator=generator), torch.randint(0, CLASSES, (n,), generator=generator)


def _vectors(generator: torch.Generator, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(n, 12, generator=generator), torch.randint(0, CLASSES, (n,), generator=generator)


def _padded_sentences(generator: torch.Generator, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    tokens = torch.randint(1, VOCAB, (n, 10), generator=generator)
    lengths = torch.randint(4, 11, (n,), generator=generator)
    tokens[torch.arange(10).unsqueeze(0) >= lengths.unsqueeze(1)] = 0
    return tokens, torch.randint(0, CLASSES, (n,), generator=generator)


def _next_tokens(generator: torch.Generator, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    tokens = torch.randint(0, VOCAB, (n, 9), generator=generator)
    return tokens[:, :-1], tokens[:, 1:]


@dataclass(frozen=True)
class ZooModel:
    build: Callable[[], nn.Module]
    batch: Callable[[torch.Generator, int], tuple[torch.Tensor, torch.Tensor]]
    #: the path `auto` must pick ("stacked" or "vmap"), or "refused" where fusion must refuse the model
    path: str

    def batches(self, n: int, seed: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        generator = torch.Generator().manual_seed(seed)
        while True:
            yield self.batch(generator, n)


def loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over every position (classification or next-token)."""
    return F.cross_entropy(output.reshape(-1, output.shape[-1]), target.reshape(-1))


ZOO: dict[str, ZooModel] = {
    "resnet": ZooModel(TinyResNet, _images, "stacked"),
    "transformer": ZooModel(TransformerClassifier, _padded_sentences, "stacked"),
    "lstm_lm": ZooModel(LSTMLanguageModel, _next_tokens, "stacked"),
    "mixer": ZooModel(MLPMixer, _images, "stacked"),
    "nanogpt_tied": ZooModel(NanoGPT, _next_tokens, "stacked"),
    "shared_block": ZooModel(SharedBlockNet, _vectors, "stacked"),
    # what users write most, and what the stacked path once refused or trained wrongly
    "frozen_backbone": ZooModel(FrozenBackbone, _vectors, "stacked"),
    "attention_unused_table": ZooModel(AttentionWithUnusedTable, _padded_sentences, "stacked"),
    "lstm_last_step": ZooModel(LastStepClassifier, _padded_sentences, "stacked"),
    "gru_final_state": ZooModel(lambda: LastStepClassifier("GRU", final_state=True), _padded_sentences, "stacked"),
    "bigru_time_major": ZooModel(BidirectionalGRU, _padded_sentences, "stacked"),
    "arange_positions": ZooModel(ArangePositions, _padded_sentences, "stacked"),
    "cnn_view_head": ZooModel(ViewHeadCNN, _images, "stacked"),
    # mix samples across the batch: the stacked path would mix members and must refuse them
    "train_mode_centering": ZooModel(CenteredMLP, _vectors, "vmap"),
    "batch_statistics": ZooModel(BatchStatMLP, _vectors, "refused"),
}
