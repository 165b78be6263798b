"""A grammar of models as PyTorch users write them, and the differential check every fused one must pass.

`cases()` is a hypothesis strategy of `Case`s: a model built from `torch.nn` layers and common
`forward` idioms, and B members with per-member hyperparameters. The grammar:

- inputs: feature vectors, images, 1-d signals, or token ids with padding;
- layers: Linear, Conv1d/2d (Conv2d grouped, dilated, reflect- or circular-padded, or transposed),
  max/avg/adaptive pools, BatchNorm/LayerNorm/GroupNorm (after the activation, LayerNorm and
  GroupNorm also without affine weights, or BatchNorm between a Linear or Conv2d and its
  activation), per-channel PReLU, Bilinear, Embedding
  (with and without `padding_idx`), MultiheadAttention (causal and key-padding masks built in
  `forward`, `batch_first` both ways, with or without weights, self or cross), Transformer
  encoder and decoder layers (`norm_first` and `batch_first` both ways), LSTM/GRU (`batch_first`,
  one or two layers, bidirectional, an LSTM's `proj_size`), Dropout with p=0;
- parameters outside layers: weights in an nn.ParameterList and nn.ParameterDict used with `@`, a
  0-d parameter (a learned temperature) on the user's own module;
- idioms: residual adds, a block applied twice, a block registered under two names, tied
  embeddings, a frozen block, an unused module, in-place ops on activations (`mul_`, item
  assignment, `relu_`), a custom `torch.autograd.Function`, `torch.utils.checkpoint` (reentrant
  or not), a buffer the block updates in `forward` (a running mean it subtracts),
  `view`/`flatten`/`reshape` heads, the last time
  step, an RNN's final state, positions from `torch.arange` inside `forward`, masks built from
  the sequence length, `mean` over time, a padding-masked mean;
- members: SGD with momentum, Adam or AdamW, every per-member key drawn per member (learning
  rate, weight decay, momentum, Nesterov, betas, clipping, schedule, warm-up), `eps` left at
  its default.

`check(case)` is the property: fusing either refuses with a FusionError naming a construct it
does not take (a refusal by the differential check fails the property), or the fused group (its
guard on) trains every member, for a step more and on whole batches than the guard does, exactly
as the member trains alone (float64, 1e-12 relative or within the member's own rounding noise,
by the guard's own comparison).
It returns the path taken ("stacked", "vmap" or "refused") and a refusal's reason.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from hypothesis import strategies as st
from torch import nn
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint

from fusion import FusedTrainer, FusionError
from hpo.base.training import build_trial_model
from fusion.verification import verify_fused_training
from hpo.base.workload import Batch, Workload

SAMPLES = 8
LENGTH = 6  # tokens per sequence
VOCAB = 11
CLASSES = 4
IMAGE = 6
SIGNAL = 8
#: Steps the check observes after the guard has passed (the guard takes 2 on 4 samples): one more,
#: on whole batches, for every member. Not more: where two kernels round alike only to the last
#: bit (BatchNorm's backward given its gradient in another memory layout, 1e-17), a few steps of
#: SGD at lr 0.3 with momentum grow that past 1e-12 (1.1e-12 after 4 steps), unrelated to what
#: the check is for.
OBSERVED_STEPS = 3

ACTIVATIONS = {"relu": nn.ReLU, "gelu": nn.GELU, "tanh": nn.Tanh}


# --- blocks: each is a module with the forward a user would write --------------------------------


class Dense(nn.Module):
    def __init__(self, width: int, out: int, activation: str, norm: str):
        super().__init__()
        self.fc = nn.Linear(width, out)
        self.act = ACTIVATIONS[activation]()
        self.norm = {"none": nn.Identity(), "layer": nn.LayerNorm(out), "layer_plain": nn.LayerNorm(out, elementwise_affine=False),
                     "batch": nn.BatchNorm1d(out), "batch_before": nn.BatchNorm1d(out)}[norm]
        self.norm_first = norm == "batch_before"  # Linear, BatchNorm, activation: the bias's gradient cancels to rounding

    def forward(self, x, padding=None):
        if self.norm_first:
            return self.act(self.norm(self.fc(x)))
        return self.norm(self.act(self.fc(x)))


class Residual(nn.Module):
    def __init__(self, width: int, activation: str):
        super().__init__()
        self.fc = nn.Linear(width, width)
        self.act = ACTIVATIONS[activation]()

    def forward(self, x, padding=None):
        return x + self.fc(self.act(x))


class Twice(nn.Module):
    """One layer applied twice (its weights shared between the uses)."""

    def __init__(self, width: int):
        super().__init__()
        self.fc = nn.Linear(width, width)

    def forward(self, x, padding=None):
        return self.fc(torch.tanh(self.fc(x)))


class Aliased(nn.Module):
    """One block registered under two names, applied through both."""

    def __init__(self, width: int):
        super().__init__()
        block = nn.Sequential(nn.Linear(width, width), nn.GELU())
        self.first = block
        self.second = block

    def forward(self, x, padding=None):
        return self.second(self.first(x))


class ParameterTable(nn.Module):
    """Weights in an nn.ParameterList and an nn.ParameterDict, applied with `@` (no layer holds them)."""

    def __init__(self, width: int, out: int):
        super().__init__()
        self.weights = nn.ParameterList([nn.Parameter(torch.randn(width, out) / width**0.5)])
        self.biases = nn.ParameterDict({"out": nn.Parameter(torch.zeros(out))})

    def forward(self, x, padding=None):
        return torch.tanh(x @ self.weights[0] + self.biases["out"])


class Temperature(nn.Module):
    """A Linear whose output a 0-d parameter on the block itself divides (a learned temperature)."""

    def __init__(self, width: int):
        super().__init__()
        self.fc = nn.Linear(width, width)
        self.temperature = nn.Parameter(torch.tensor(1.5))

    def forward(self, x, padding=None):
        return self.fc(x) / self.temperature


class SoftSign(torch.autograd.Function):
    """x / (1 + |x|) with a hand-written backward."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x / (1 + x.abs())

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad / (1 + x.abs()) ** 2


class TransformableSoftSign(torch.autograd.Function):
    """SoftSign written for torch.func: `setup_context` apart, and a generated vmap rule."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x):
        return x / (1 + x.abs())

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad / (1 + x.abs()) ** 2


class CustomFunction(nn.Module):
    """A Linear, then SoftSign as a custom autograd Function (the classic style: the vmap path
    refuses it, as torch.func does; or the torch.func style)."""

    def __init__(self, width: int, transformable: bool):
        super().__init__()
        self.fc = nn.Linear(width, width)
        self.function = TransformableSoftSign if transformable else SoftSign

    def forward(self, x, padding=None):
        return self.function.apply(self.fc(x))


class Checkpointed(nn.Module):
    """A Linear and its activation under `torch.utils.checkpoint` (recomputed in the backward)."""

    def __init__(self, width: int, reentrant: bool):
        super().__init__()
        self.block = nn.Sequential(nn.Linear(width, width), nn.Tanh())
        self.reentrant = reentrant

    def forward(self, x, padding=None):
        return checkpoint(self.block, x, use_reentrant=self.reentrant)


class InPlace(nn.Module):
    """In-place ops on a Linear's output: a scale, an item assignment, an in-place ReLU."""

    def __init__(self, width: int):
        super().__init__()
        self.fc = nn.Linear(width, width)

    def forward(self, x, padding=None):
        h = self.fc(x)
        h.mul_(0.5)
        h[..., 0] = 0.0
        return torch.relu_(h)


class RunningCenter(nn.Module):
    """Subtracts a running mean of its inputs that it keeps in a buffer and updates in training."""

    def __init__(self, width: int):
        super().__init__()
        self.register_buffer("mean", torch.zeros(width))

    def forward(self, x, padding=None):
        if self.training:
            with torch.no_grad():
                self.mean.mul_(0.9).add_(x.mean(0), alpha=0.1)
        return x - self.mean


class BilinearMix(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.mix = nn.Bilinear(width, width, width)

    def forward(self, x, padding=None):
        return self.mix(x, torch.tanh(x))


class ChannelPReLU(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.fc = nn.Linear(width, width)
        self.act = nn.PReLU(width, init=0.1)

    def forward(self, x, padding=None):
        return self.act(self.fc(x))


class ZeroDropout(nn.Module):
    def __init__(self):
        super().__init__()
        self.drop = nn.Dropout(0.0)

    def forward(self, x, padding=None):
        return self.drop(x)


class SeqNorm(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.norm = nn.LayerNorm(width)

    def forward(self, x, padding=None):
        return self.norm(x)


def causal_mask(length: int) -> torch.Tensor:
    return torch.triu(torch.ones(length, length, dtype=torch.bool), diagonal=1)


class Attention(nn.Module):
    def __init__(self, width: int, heads: int, batch_first: bool, causal: bool, masked: bool, weights: bool, cross: bool):
        super().__init__()
        self.attn = nn.MultiheadAttention(width, heads, batch_first=batch_first)
        self.memory = nn.Linear(width, width) if cross else None
        self.batch_first, self.causal, self.masked, self.weights = batch_first, causal, masked, weights

    def forward(self, x, padding=None):  # (N, T, D)
        kv = self.memory(x) if self.memory is not None else x
        mask = causal_mask(x.shape[1]) if self.causal else None
        keys = padding if self.masked else None
        if self.batch_first:
            out, _ = self.attn(x, kv, kv, key_padding_mask=keys, attn_mask=mask, need_weights=self.weights)
            return x + out
        q, kv = x.transpose(0, 1), kv.transpose(0, 1)
        out, _ = self.attn(q, kv, kv, key_padding_mask=keys, attn_mask=mask, need_weights=self.weights)
        return x + out.transpose(0, 1)


class Encoder(nn.Module):
    def __init__(self, width: int, heads: int, batch_first: bool, norm_first: bool, causal: bool, masked: bool):
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(width, heads, 2 * width, dropout=0.0, batch_first=batch_first, norm_first=norm_first)
        self.batch_first, self.causal, self.masked = batch_first, causal, masked

    def forward(self, x, padding=None):
        mask = causal_mask(x.size(1)) if self.causal else None
        keys = padding if self.masked else None
        if self.batch_first:
            return self.layer(x, src_mask=mask, src_key_padding_mask=keys)
        return self.layer(x.transpose(0, 1), src_mask=mask, src_key_padding_mask=keys).transpose(0, 1)


class Decoder(nn.Module):
    def __init__(self, width: int, heads: int, batch_first: bool, norm_first: bool, projected_memory: bool):
        super().__init__()
        self.layer = nn.TransformerDecoderLayer(width, heads, 2 * width, dropout=0.0, batch_first=batch_first, norm_first=norm_first)
        self.memory = nn.Linear(width, width) if projected_memory else nn.Identity()
        self.batch_first = batch_first

    def forward(self, x, padding=None):
        memory = self.memory(x)
        mask = nn.Transformer.generate_square_subsequent_mask(x.shape[1], dtype=x.dtype)
        if self.batch_first:
            return self.layer(x, memory, tgt_mask=mask)
        return self.layer(x.transpose(0, 1), memory.transpose(0, 1), tgt_mask=mask).transpose(0, 1)


class Recurrent(nn.Module):
    """An LSTM/GRU over the sequence; `final` returns the last layer's final state(s) instead."""

    def __init__(self, kind: str, width: int, hidden: int, layers: int, bidirectional: bool, batch_first: bool, final: bool, projected: int = 0):
        super().__init__()
        extra = {"proj_size": projected} if projected else {}
        self.rnn = getattr(nn, kind)(width, hidden, num_layers=layers, bidirectional=bidirectional, batch_first=batch_first, **extra)
        self.batch_first, self.bidirectional, self.final = batch_first, bidirectional, final

    def forward(self, x, padding=None):
        out, state = self.rnn(x if self.batch_first else x.transpose(0, 1))
        if self.final:
            h = state[0] if isinstance(state, tuple) else state
            return torch.cat([h[-2], h[-1]], dim=-1) if self.bidirectional else h[-1]
        return out if self.batch_first else out.transpose(0, 1)


class ConvTime(nn.Module):
    def __init__(self, width: int, out: int):
        super().__init__()
        self.conv = nn.Conv1d(width, out, 3, padding=1)

    def forward(self, x, padding=None):
        return self.conv(x.transpose(1, 2)).transpose(1, 2)


class Positions(nn.Module):
    def __init__(self, width: int, length: int):
        super().__init__()
        self.table = nn.Embedding(length, width)

    def forward(self, x, padding=None):
        return x + self.table(torch.arange(x.shape[1], device=x.device))


class MeanTime(nn.Module):
    def forward(self, x, padding=None):
        return x.mean(dim=1)


class LastStep(nn.Module):
    def forward(self, x, padding=None):
        return x[:, -1]


class MaskedMean(nn.Module):
    def forward(self, x, padding=None):
        keep = (~padding).unsqueeze(-1).to(x.dtype)
        return (x * keep).sum(1) / keep.sum(1).clamp(min=1)


class FlattenHead(nn.Module):
    """`view(n, -1)`, `flatten(1)` or `reshape(n, -1)`, then a Linear."""

    def __init__(self, features: int, out: int, how: str):
        super().__init__()
        self.fc = nn.Linear(features, out)
        self.how = how

    def forward(self, x, padding=None):
        if self.how == "view":
            x = x.contiguous().view(x.size(0), -1)
        elif self.how == "flatten":
            x = torch.flatten(x, 1)
        else:
            x = x.reshape(x.shape[0], -1)
        return self.fc(x)


#: Size-keeping 3x3 convolutions: Conv2d's options, or a transposed one.
CONV2D = {
    "plain": lambda cin, cout: nn.Conv2d(cin, cout, 3, padding=1),
    "groups": lambda cin, cout: nn.Conv2d(cin, cout, 3, padding=1, groups=2),
    "dilated": lambda cin, cout: nn.Conv2d(cin, cout, 3, padding=2, dilation=2),
    "reflect": lambda cin, cout: nn.Conv2d(cin, cout, 3, padding=1, padding_mode="reflect"),
    "circular": lambda cin, cout: nn.Conv2d(cin, cout, 3, padding=1, padding_mode="circular"),
    "transposed": lambda cin, cout: nn.ConvTranspose2d(cin, cout, 3, padding=1),
}


class Conv2dBlock(nn.Module):
    def __init__(self, channels: int, out: int, activation: str, norm: str, pool: str, residual: bool, conv: str = "plain"):
        super().__init__()
        self.conv = CONV2D[conv](channels, out)
        self.act = ACTIVATIONS[activation]()
        self.norm = {"none": nn.Identity(), "batch": nn.BatchNorm2d(out), "batch_before": nn.BatchNorm2d(out), "group": nn.GroupNorm(2, out),
                     "group_plain": nn.GroupNorm(2, out, affine=False), "dropout": nn.Dropout2d(0.0)}[norm]
        self.norm_first = norm == "batch_before"  # Conv, BatchNorm, activation: a ResNet's block
        self.pool = {"none": nn.Identity(), "max": nn.MaxPool2d(2), "avg": nn.AvgPool2d(2)}[pool]
        self.residual = residual

    def forward(self, x, padding=None):
        h = self.act(self.norm(self.conv(x))) if self.norm_first else self.norm(self.act(self.conv(x)))
        return self.pool(x + h if self.residual else h)


class Conv1dBlock(nn.Module):
    def __init__(self, channels: int, out: int, activation: str, norm: str, pool: str):
        super().__init__()
        self.conv = nn.Conv1d(channels, out, 3, padding=1)
        self.act = ACTIVATIONS[activation]()
        self.norm = {"none": nn.Identity(), "batch": nn.BatchNorm1d(out), "group": nn.GroupNorm(2, out)}[norm]
        self.pool = {"none": nn.Identity(), "max": nn.MaxPool1d(2), "avg": nn.AvgPool1d(2)}[pool]

    def forward(self, x, padding=None):
        return self.pool(self.norm(self.act(self.conv(x))))


class GlobalPool(nn.Module):
    """Images or signals to vectors: an adaptive pool and nn.Flatten, or a mean over space."""

    def __init__(self, spatial: int, how: str):
        super().__init__()
        self.how = how
        pools = {1: (nn.AdaptiveAvgPool1d, nn.AdaptiveMaxPool1d), 2: (nn.AdaptiveAvgPool2d, nn.AdaptiveMaxPool2d)}[spatial]
        self.pool = nn.Sequential(pools[how == "max"](1), nn.Flatten()) if how != "mean" else None
        self.dims = tuple(range(2, 2 + spatial))

    def forward(self, x, padding=None):
        return x.mean(self.dims) if self.pool is None else self.pool(x)


class SignalToSequence(nn.Module):
    def forward(self, x, padding=None):
        return x.transpose(1, 2)


class Stem(nn.Module):
    """Token ids to vectors; positions from `torch.arange` or a cumulative sum of ones, or none."""

    def __init__(self, width: int, padding_idx: bool, positions: str):
        super().__init__()
        self.tokens = nn.Embedding(VOCAB, width, padding_idx=0 if padding_idx else None)
        self.positions = nn.Embedding(LENGTH, width) if positions != "none" else None
        self.how = positions

    def forward(self, tokens):
        h = self.tokens(tokens)
        if self.how == "arange":
            h = h + self.positions(torch.arange(tokens.shape[1], device=tokens.device))
        elif self.how == "cumsum":
            h = h + self.positions(torch.cumsum(torch.ones_like(tokens), dim=-1) - 1)
        return h


# --- the model ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelSpec:
    """What to build: the input kind, the stem, the blocks (name, *arguments), the head."""

    inputs: str
    stem: tuple = ()
    blocks: tuple = ()
    head: tuple = ("classify",)
    frozen: tuple[int, ...] = ()
    unused: str = "none"


BLOCKS = {
    "dense": Dense, "residual": Residual, "twice": Twice, "aliased": Aliased, "dropout": ZeroDropout, "seq_norm": SeqNorm,
    "attention": Attention, "encoder": Encoder, "decoder": Decoder, "rnn": Recurrent, "conv_time": ConvTime,
    "positions": Positions, "mean_time": MeanTime, "last_step": LastStep, "masked_mean": MaskedMean, "flatten": FlattenHead,
    "conv2d": Conv2dBlock, "conv1d": Conv1dBlock, "pool": GlobalPool, "to_sequence": SignalToSequence,
    "parameter_table": ParameterTable, "temperature": Temperature, "custom_function": CustomFunction, "checkpointed": Checkpointed,
    "in_place": InPlace, "running_center": RunningCenter, "bilinear": BilinearMix, "prelu": ChannelPReLU,
}


class FuzzNet(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.stem = Stem(*spec.stem) if spec.inputs == "tokens" else None
        self.blocks = nn.ModuleList([BLOCKS[name](*arguments) for name, *arguments in spec.blocks])
        kind, *arguments = spec.head
        if kind == "classify":
            self.head = nn.Linear(arguments[0], CLASSES)
        else:  # next-token logits, optionally tied to the token embedding
            width, tied = arguments
            self.head = nn.Linear(width, VOCAB, bias=False)
            if tied:
                self.head.weight = self.stem.tokens.weight
        if spec.unused == "linear":
            self.spare = nn.Linear(3, 3)
        elif spec.unused == "embedding":
            self.spare = nn.Embedding(5, 3)
        for index in spec.frozen:
            self.blocks[index].requires_grad_(False)
        self.padded = spec.inputs == "tokens"

    def forward(self, x):
        padding = x == 0 if self.padded else None
        h = self.stem(x) if self.stem is not None else x
        for block in self.blocks:
            h = block(h, padding)
        return self.head(h)


# --- the grammar ----------------------------------------------------------------------------------

widths = st.sampled_from([4, 6, 8])
#: Blocks written with what torch offers beyond its layers (parameters held outside layers, a
#: custom autograd Function, checkpointing, in-place ops), for vectors and sequences alike.
OUTSIDE_BLOCKS = ["parameter_table", "temperature", "custom_function", "checkpointed", "in_place", "bilinear"]
activations = st.sampled_from(sorted(ACTIVATIONS))


@st.composite
def vector_blocks(draw, width: int, count: int) -> tuple[list[tuple], int]:
    blocks = []
    for _ in range(count):
        kind = draw(st.sampled_from(["dense", "residual", "twice", "aliased", "dropout", "outside", "outside"]))
        if kind == "outside":  # running_center and prelu take vectors ([N, width]) only
            block, width = draw(outside_block(width, draw(st.sampled_from([*OUTSIDE_BLOCKS, "running_center", "prelu"]))))
            blocks.append(block)
        elif kind == "dense":
            out = draw(widths)
            blocks.append(("dense", width, out, draw(activations), draw(st.sampled_from(["none", "layer", "layer_plain", "batch", "batch_before"]))))
            width = out
        elif kind == "residual":
            blocks.append(("residual", width, draw(activations)))
        elif kind in ("twice", "aliased"):
            blocks.append((kind, width))
        else:
            blocks.append(("dropout",))
    return blocks, width


@st.composite
def outside_block(draw, width: int, kind: str | None = None) -> tuple[tuple, int]:
    """One block of `kind` (drawn from OUTSIDE_BLOCKS if None) and its output width."""
    kind = kind or draw(st.sampled_from(OUTSIDE_BLOCKS))
    if kind == "parameter_table":
        out = draw(widths)
        return (kind, width, out), out
    if kind in ("checkpointed", "custom_function"):
        return (kind, width, draw(st.booleans())), width
    return (kind, width), width
    return blocks, width


@st.composite
def sequence_blocks(draw, width: int, length: int, count: int, padded: bool) -> tuple[list[tuple], int]:
    blocks = []
    for _ in range(count):
        kind = draw(st.sampled_from(["dense", "seq_norm", "attention", "encoder", "decoder", "rnn", "conv_time", "positions", "dropout", "outside"]))
        heads = draw(st.sampled_from([h for h in (1, 2) if width % h == 0]))
        if kind == "outside":
            block, width = draw(outside_block(width))
            blocks.append(block)
        elif kind == "dense":
            out = draw(widths)
            blocks.append(("dense", width, out, draw(activations), draw(st.sampled_from(["none", "layer"]))))
            width = out
        elif kind == "seq_norm":
            blocks.append(("seq_norm", width))
        elif kind == "attention":
            masked = padded and draw(st.booleans())
            blocks.append(("attention", width, heads, draw(st.booleans()), draw(st.booleans()), masked, draw(st.booleans()), draw(st.booleans())))
        elif kind == "encoder":
            masked = padded and draw(st.booleans())
            blocks.append(("encoder", width, heads, draw(st.booleans()), draw(st.booleans()), draw(st.booleans()), masked))
        elif kind == "decoder":
            blocks.append(("decoder", width, heads, draw(st.booleans()), draw(st.booleans()), draw(st.booleans())))
        elif kind == "rnn":
            block, width = draw(recurrent(width, final=False))
            blocks.append(block)
        elif kind == "conv_time":
            out = draw(widths)
            blocks.append(("conv_time", width, out))
            width = out
        elif kind == "positions":
            blocks.append(("positions", width, length))
        else:
            blocks.append(("dropout",))
    return blocks, width


@st.composite
def sequence_to_vector(draw, width: int, length: int, padded: bool) -> tuple[tuple, int]:
    kind = draw(st.sampled_from(["mean_time", "last_step", "flatten", "rnn_final"] + (["masked_mean"] if padded else [])))
    if kind == "flatten":
        out = draw(widths)
        return ("flatten", length * width, out, draw(st.sampled_from(["view", "flatten", "reshape"]))), out
    if kind == "rnn_final":
        return draw(recurrent(width, final=True))
    return (kind,), width


@st.composite
def recurrent(draw, width: int, final: bool) -> tuple[tuple, int]:
    """An LSTM or GRU (batch_first or time-major, 1-2 layers, bidirectional, an LSTM's proj_size) and its output width."""
    kind, hidden, bidirectional = draw(st.sampled_from(["LSTM", "GRU"])), draw(st.sampled_from([4, 6])), draw(st.booleans())
    projected = draw(st.sampled_from([0, 0, 3])) if kind == "LSTM" else 0
    block = ("rnn", kind, width, hidden, draw(st.sampled_from([1, 2])), bidirectional, draw(st.booleans()), final, projected)
    return block, (projected or hidden) * (2 if bidirectional else 1)


@st.composite
def model_specs(draw) -> ModelSpec:
    inputs = draw(st.sampled_from(["vectors", "images", "signals", "tokens"]))
    stem: tuple = ()
    head: tuple
    if inputs == "vectors":
        blocks, width = draw(vector_blocks(6, draw(st.integers(1, 3))))
    elif inputs == "images":
        channels, size, blocks = 2, IMAGE, []
        for _ in range(draw(st.integers(1, 2))):
            out = draw(st.sampled_from([2, 4]))
            pool = draw(st.sampled_from(["none", "max", "avg"])) if size >= 2 else "none"
            residual = out == channels and draw(st.booleans())
            norm = draw(st.sampled_from(["none", "batch", "batch_before", "group", "group_plain", "dropout"]))
            conv = draw(st.sampled_from(sorted(CONV2D)))
            blocks.append(("conv2d", channels, out, draw(activations), norm, pool, residual, conv))
            channels, size = out, size // 2 if pool != "none" else size
        if draw(st.booleans()):
            width = draw(widths)
            blocks.append(("flatten", channels * size * size, width, draw(st.sampled_from(["view", "flatten", "reshape"]))))
        else:
            blocks.append(("pool", 2, draw(st.sampled_from(["avg", "max", "mean"]))))
            width = channels
        more, width = draw(vector_blocks(width, draw(st.integers(0, 1))))
        blocks += more
    elif inputs == "signals":
        channels, length, blocks = 2, SIGNAL, []
        for _ in range(draw(st.integers(1, 2))):
            out = draw(st.sampled_from([2, 4]))
            pool = draw(st.sampled_from(["none", "max", "avg"]))
            blocks.append(("conv1d", channels, out, draw(activations), draw(st.sampled_from(["none", "batch", "group"])), pool))
            channels, length = out, length // 2 if pool != "none" else length
        if draw(st.booleans()):
            blocks.append(("to_sequence",))
            more, width = draw(sequence_blocks(channels, length, draw(st.integers(0, 2)), padded=False))
            end, width = draw(sequence_to_vector(width, length, padded=False))
            blocks += [*more, end]
        elif draw(st.booleans()):
            width = draw(widths)
            blocks.append(("flatten", channels * length, width, draw(st.sampled_from(["view", "flatten", "reshape"]))))
        else:
            blocks.append(("pool", 1, draw(st.sampled_from(["avg", "max", "mean"]))))
            width = channels
    else:
        width = draw(widths)
        stem = (width, draw(st.booleans()), draw(st.sampled_from(["none", "arange", "cumsum"])))
        blocks, out = draw(sequence_blocks(width, LENGTH, draw(st.integers(1, 3)), padded=True))
        if draw(st.booleans()):  # next-token prediction, tied to the embedding where the widths allow
            head = ("lm", out, out == width and draw(st.booleans()))
            return _extras(draw, ModelSpec(inputs, stem, tuple(blocks), head))
        end, width = draw(sequence_to_vector(out, LENGTH, padded=True))
        blocks.append(end)
    return _extras(draw, ModelSpec(inputs, stem, tuple(blocks), ("classify", width)))


def _extras(draw, spec: ModelSpec) -> ModelSpec:
    """A frozen block (one that holds parameters) and an unused module, sometimes."""
    holding = [i for i, (name, *_) in enumerate(spec.blocks) if name not in ("dropout", "mean_time", "last_step", "masked_mean", "pool", "to_sequence", "running_center")]
    frozen = (draw(st.sampled_from(holding)),) if holding and draw(st.integers(0, 3)) == 0 else ()
    unused = draw(st.sampled_from(["none", "none", "linear", "embedding"]))
    return ModelSpec(spec.inputs, spec.stem, spec.blocks, spec.head, frozen, unused)


@st.composite
def member_configs(draw, members: int) -> list[dict[str, Any]]:
    """Per-member hyperparameters for one optimizer; every per-member key drawn for every member."""
    optimizer = draw(st.sampled_from(["sgd", "adam", "adamw"]))
    configs = []
    for seed in range(members):
        config: dict[str, Any] = {
            "seed": seed,
            "optimizer": optimizer,
            "lr": draw(st.sampled_from([0.3, 0.1, 0.03]) if optimizer == "sgd" else st.sampled_from([3e-2, 1e-2, 3e-3, 1e-3])),
            "weight_decay": draw(st.sampled_from([0.0, 1e-4, 1e-2, 0.1])),
            "grad_clip": draw(st.sampled_from([0.0, 0.0, 0.1, 1.0])),
            "lr_schedule": draw(st.sampled_from(["constant", "cosine", "step"])),
            "warmup_steps": draw(st.sampled_from([0, 2])),
            "schedule_steps": draw(st.sampled_from([3, 10])),
            "lr_gamma": draw(st.sampled_from([0.5, 0.1])),
            "min_lr_ratio": draw(st.sampled_from([0.0, 0.1])),
        }
        if optimizer == "sgd":
            config["momentum"] = draw(st.sampled_from([0.0, 0.5, 0.9]))
            config["nesterov"] = config["momentum"] > 0 and draw(st.booleans())
        else:
            config["beta1"] = draw(st.sampled_from([0.9, 0.8]))
            config["beta2"] = draw(st.sampled_from([0.999, 0.99]))
        configs.append(config)
    return configs


@dataclass(frozen=True)
class Case:
    spec: ModelSpec
    configs: tuple = field(default=())
    data_seed: int = 0
    #: `fuse_models`' strategy: "auto" mostly, "vmap" to hold the vmap path to the same standard.
    strategy: str = "auto"


@st.composite
def cases(draw) -> Case:
    spec = draw(model_specs())
    configs = tuple(draw(member_configs(draw(st.integers(2, 3)))))
    return Case(spec, configs, draw(st.integers(0, 3)), draw(st.sampled_from(["auto", "auto", "auto", "vmap"])))


# --- the workload and the check ------------------------------------------------------------------


class FuzzWorkload(Workload):
    """A case's model in float64 and a deterministic stream of its inputs and targets."""

    def __init__(self, case: Case):
        self.case = case
        self.defaults = {"batch_size": SAMPLES, "data_seed": case.data_seed}
        self.steps_per_iteration = OBSERVED_STEPS

    def build_model(self, config: Mapping[str, Any]) -> nn.Module:
        return FuzzNet(self.case.spec).double()

    def _batch(self, generator: torch.Generator) -> Batch:
        inputs = self.case.spec.inputs
        if inputs == "tokens":
            x = torch.randint(1, VOCAB, (SAMPLES, LENGTH), generator=generator)
            lengths = torch.randint(2, LENGTH + 1, (SAMPLES,), generator=generator)
            x[torch.arange(LENGTH).unsqueeze(0) >= lengths.unsqueeze(1)] = 0
        else:
            shape = {"vectors": (6,), "images": (2, IMAGE, IMAGE), "signals": (2, SIGNAL)}[inputs]
            x = torch.randn(SAMPLES, *shape, generator=generator, dtype=torch.float64)
        if self.case.spec.head[0] == "lm":
            return x, torch.randint(0, VOCAB, (SAMPLES, LENGTH), generator=generator)
        return x, torch.randint(0, CLASSES, (SAMPLES,), generator=generator)

    def train_batches(self, config: Mapping[str, Any], seed: int) -> Iterator[Batch]:
        generator = torch.Generator().manual_seed(seed)
        while True:
            yield self._batch(generator)

    def eval_batches(self, config: Mapping[str, Any]) -> list[Batch]:
        return [self._batch(torch.Generator().manual_seed(10_000))]


@dataclass(frozen=True)
class Outcome:
    #: "stacked", "vmap" or "refused"
    path: str
    #: Why it was refused (the FusionError's message), for refusals.
    reason: str = ""


def check(case: Case) -> Outcome:
    """Fuse the case's members and say how; raise AssertionError naming what differs when an
    accepted group trains a member otherwise than the member trains alone."""
    workload = FuzzWorkload(case)
    configs = [workload.resolve(c) for c in case.configs]
    member = build_trial_model(workload, configs[0])
    x, y = next(workload.train_batches(configs[0], case.data_seed))
    workload.loss(member(x), y).backward()  # a grammar that builds a broken model fails here, not as a refusal
    try:
        trainer = FusedTrainer(workload, configs, strategy=case.strategy)
    except FusionError as refusal:
        # The check refuses a group that trains otherwise than its members alone: on a model the
        # grammar makes, that is a wrong fused step or a check stricter than PyTorch's rounding.
        if "does not train as its members do alone" in str(refusal) or "differential check cannot" in str(refusal):
            raise AssertionError(f"refused by the differential check: {refusal}") from None
        return Outcome("refused", str(refusal))
    everyone = {i: build_trial_model(workload, config) for i, config in enumerate(trainer.configs)}
    stream = workload.train_batches(configs[0], case.data_seed)
    batches = [next(stream) for _ in range(OBSERVED_STEPS + 1)]
    try:
        verify_fused_training(trainer.model, everyone, trainer.hparams, [({}, {}, {})] * len(configs), workload, batches, trainer.train_step_on, samples=None)
    except FusionError as difference:
        raise AssertionError(f"accepted on the {trainer.model.strategy} path and different: {difference}") from None
    return Outcome(trainer.model.strategy)
