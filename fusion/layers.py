"""Hand-fused layers: B members' weights stacked along a leading dimension, one kernel for all.

Every layer here takes activations laid out as `[B, N, ...]` (member, sample, ...) and keeps
each parameter under the member layer's own name with shape `[B, *member_shape]`, so a fused
state dict indexed at `[i]` is member i's ordinary state dict. `fuse_leaf(modules)` turns the B
corresponding leaf modules of the member models into one fused layer.

The member dimension never mixes: every op below is a batched GEMM, a grouped convolution or a
per-channel reduction whose groups are exactly the members, so a NaN in one member stays there.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

import torch
from torch import nn
from torch.nn import functional as F


class FusionError(ValueError):
    """A model or group of configs that cannot be fused; the message names the layer or key."""


def describe_error(error: BaseException) -> str:
    """The error's type and first line, without memory addresses, so a message is the same every run."""
    lines = str(error).strip().splitlines() or [""]
    return f"{type(error).__name__}: " + re.sub(r" at 0x[0-9a-fA-F]+", "", lines[0])


class NotStackedHere(Exception):
    """This configuration of a layer has no stacked version; the caller falls back to vmap."""


class ScaledLinear(nn.Linear):
    """`F.linear(x * input_scale, W, b)`: a Linear with a (per-member) input multiplier.

    muP's readout (`mup.MuReadout`) computes `output_mult * x / width_mult`; members with
    different output multipliers become ScaledLinear layers with different `input_scale`
    buffers, which fuse like any other buffer.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool, input_scale: float):
        super().__init__(in_features, out_features, bias=bias)
        self.register_buffer("input_scale", torch.tensor(float(input_scale)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x * self.input_scale, self.weight, self.bias)


def _stack(tensors: Sequence[torch.Tensor | None]) -> torch.Tensor | None:
    """`[B, *shape]` with every member's slice starting on a 64-byte boundary, as a freshly
    allocated unfused tensor does: MKL's kernels may round differently on unaligned operands."""
    if tensors[0] is None:
        return None
    first = tensors[0]
    align = max(64 // first.element_size(), 1)
    size = first.numel()
    rows = torch.zeros(len(tensors), -(-size // align) * align, dtype=first.dtype, device=first.device)
    stacked = rows[:, :size].view(len(tensors), *first.shape)
    for member, tensor in zip(stacked, tensors):
        member.copy_(tensor.detach())
    return stacked


def _stack_contiguous(tensors: Sequence[torch.Tensor | None]) -> torch.Tensor | None:
    """`[B, *shape]` in one contiguous block: buffers that kernels update in place through a flat view."""
    return None if tensors[0] is None else torch.stack([t.detach() for t in tensors])


def _param(tensor: torch.Tensor | None) -> nn.Parameter | None:
    return None if tensor is None else nn.Parameter(tensor)


def _member_view(t: torch.Tensor, ndim: int, trailing: int) -> torch.Tensor:
    """View `[B, *trailing_shape]` so it broadcasts against a `[B, ..., *trailing_shape]` tensor of `ndim` dims."""
    return t.view(t.shape[0], *([1] * (ndim - 1 - trailing)), *t.shape[1:])


#: CPU placements (`_placement`) for which MKL's batched GEMM rounds exactly as one GEMM per member (measured once).
_BATCHED_GEMM_EXACT: dict[tuple, bool] = {}


def _member_gemm(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`bias[i] + a[i] @ b[i]` for every member i, rounding exactly as unfused `addmm`/`mm` on CPU.

    One batched GEMM when it rounds like per-member GEMMs; MKL's batched kernel does not for
    some small shapes (e.g. a 10-row result), and those fall back to one GEMM per member, so a
    fused member's arithmetic stays bit-identical to its unfused model's on CPU. Which kernel
    MKL picks depends on the operands' strides and on where they start relative to a 64-byte
    boundary, so the probe lays its random operands out exactly as the real ones (a state
    `[B, N, 5]` in float64 puts member 1 at byte 160, and there the two differ).
    A compiled step (`FusedTrainer(compile=...)`) takes the batched GEMM: its kernels are
    inductor's choice, and the probe (which reads the operands' addresses) cannot be traced.
    """
    if a.device.type == "cpu" and a.shape[0] > 1 and not torch.compiler.is_compiling():
        key = (a.dtype, _placement(a), _placement(b), None if bias is None else _placement(bias), torch.get_num_threads())
        if key not in _BATCHED_GEMM_EXACT:
            # a private generator: probing must not move the global RNG (dropout masks, user code)
            gen = torch.Generator().manual_seed(0)
            probe_a, probe_b = _random_like(a, gen), _random_like(b, gen)
            probe_c = None if bias is None else _random_like(bias, gen)
            batched = _batched_gemm(probe_a, probe_b, probe_c)
            looped = _looped_gemm(probe_a, probe_b, probe_c)
            _BATCHED_GEMM_EXACT[key] = torch.equal(batched, looped)
        if not _BATCHED_GEMM_EXACT[key]:
            return _looped_gemm(a, b, bias)
    return _batched_gemm(a, b, bias)


def _placement(t: torch.Tensor) -> tuple:
    """What MKL's kernel choice can see of a tensor: shape, strides, offset from a 64-byte boundary."""
    return (tuple(t.shape), t.stride(), t.data_ptr() % 64)


def _random_like(t: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Random values placed as `t` is (`_placement`): same strides, same offset from 64 bytes."""
    offset = (t.data_ptr() % 64) // t.element_size()
    span = 1 + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride())) if t.numel() else 0
    storage = torch.randn(offset + span, dtype=t.dtype, generator=generator)  # CPU allocations start 64-byte aligned
    return storage.as_strided(t.shape, t.stride(), offset)


def _batched_gemm(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.bmm(a, b) if bias is None else torch.baddbmm(bias.unsqueeze(1), a, b)


def _looped_gemm(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    if bias is None:
        return torch.stack([x.mm(y) for x, y in zip(a, b)])
    return torch.stack([torch.addmm(c, x, y) for c, x, y in zip(bias, a, b)])


class _BatchedLinear(torch.autograd.Function):
    """`bias + x @ W^T` per member whose backward computes each member's gradients with the
    same GEMMs, in the same operand order, as autograd does for `nn.Linear` (`grad^T @ x` for
    the weight), so a fused member's gradients round exactly as its unfused model's do."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return _member_gemm(x, weight.transpose(1, 2), bias)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight = ctx.saved_tensors
        # Under autocast the forward ran in grad's dtype; compute in it and return each
        # gradient in its input's dtype, as autocast's own casts would.
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = _member_gemm(grad, weight.to(grad.dtype)).to(x.dtype)
        if ctx.needs_input_grad[1]:
            grad_w = _member_gemm(grad.transpose(1, 2), x.to(grad.dtype)).to(weight.dtype)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = grad.sum(dim=1).to(weight.dtype)
        return grad_x, grad_w, grad_b


class FusedLinear(nn.Module):
    """B Linear layers as one `baddbmm`: `[B, N, ..., in] -> [B, N, ..., out]`."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, input_scale: torch.Tensor | None = None):
        super().__init__()
        self.weight = nn.Parameter(weight)  # (B, out, in)
        self.bias = _param(bias)  # (B, out)
        if input_scale is not None:
            self.register_buffer("input_scale", input_scale)  # (B,)
        else:
            self.input_scale = None

    @classmethod
    def from_members(cls, modules: Sequence[nn.Linear]) -> "FusedLinear":
        scales = [m.input_scale for m in modules] if isinstance(modules[0], ScaledLinear) else None
        return cls(_stack([m.weight for m in modules]), _stack([m.bias for m in modules]), _stack(scales) if scales else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # F.linear adds the bias inside the GEMM for a 2-D or contiguous input, after it otherwise
        return member_linear(x, self.weight, self.bias, self.input_scale, bias_in_gemm=x.dim() == 3 or x[0].is_contiguous())


def member_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    input_scale: torch.Tensor | None = None,
    bias_in_gemm: bool = True,
) -> torch.Tensor:
    """`F.linear(x[i], weight[i], bias[i])` for every member i: `[B, ..., in] -> [B, ..., out]`.

    `bias_in_gemm=False` adds the bias after the GEMM, as `F.linear` itself does for an input
    that is not contiguous, so callers that mirror PyTorch code can match its rounding.
    """
    members, out_features, in_features = weight.shape
    lead = x.shape[1:-1]
    # A 3-D input needs no reshape: skipping it spares two autograd view nodes per call, which
    # adds up in recurrent cells that call this every time step.
    flat = x if x.dim() == 3 else x.reshape(members, -1, in_features)  # (B, M, in)
    if input_scale is not None:
        flat = flat * input_scale.view(members, 1, 1)
    late_bias = None if bias_in_gemm else bias
    bias = bias if bias_in_gemm else None
    if torch.is_autocast_enabled(x.device.type):
        dtype = torch.get_autocast_dtype(x.device.type)
        flat, weight = flat.to(dtype), weight.to(dtype)
        bias = None if bias is None else bias.to(dtype)
        late_bias = None if late_bias is None else late_bias.to(dtype)
    if flat.device.type == "cpu":
        out = _BatchedLinear.apply(flat, weight, bias)
    else:  # on GPUs, native autograd (less Python per layer); bit-equality with CPU is moot there
        out = _batched_gemm(flat, weight.transpose(1, 2), bias)
    if late_bias is not None:
        out = out + late_bias.unsqueeze(1)
    return out if x.dim() == 3 else out.reshape(members, *lead, out_features)


class FusedConv(nn.Module):
    """B Conv1d/Conv2d/Conv3d layers as one grouped convolution: `[B, N, C, *spatial] -> [B, N, C', *spatial']`."""

    def __init__(self, template: nn.Conv1d | nn.Conv2d, weight: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.weight = nn.Parameter(weight)  # (B, C_out, C_in / groups, *kernel)
        self.bias = _param(bias)  # (B, C_out)
        self.conv = {nn.Conv1d: F.conv1d, nn.Conv2d: F.conv2d, nn.Conv3d: F.conv3d}[type(template)]
        self.stride, self.padding, self.dilation = template.stride, template.padding, template.dilation
        self.groups = template.groups
        self.padding_mode = template.padding_mode
        self._reversed_padding = template._reversed_padding_repeated_twice

    @classmethod
    def from_members(cls, modules: Sequence[nn.Conv1d | nn.Conv2d]) -> "FusedConv":
        return cls(modules[0], _stack([m.weight for m in modules]), _stack([m.bias for m in modules]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        members, samples = x.shape[:2]
        folded = x.transpose(0, 1).reshape(samples, -1, *x.shape[3:])  # (N, B*C_in, *spatial)
        padding = self.padding
        if self.padding_mode != "zeros":
            folded = F.pad(folded, self._reversed_padding, mode=self.padding_mode)
            padding = 0
        weight = self.weight.reshape(-1, *self.weight.shape[2:])  # (B*C_out, C_in/groups, *kernel)
        exact_bias_grad = self.bias is not None and x.device.type == "cpu"
        bias = None if self.bias is None else self.bias.reshape(-1)
        if exact_bias_grad:
            bias = bias.detach()
        out = self.conv(folded, weight, bias, self.stride, padding, self.dilation, self.groups * members)
        out = out.reshape(samples, members, -1, *out.shape[2:]).transpose(0, 1)  # (B, N, C_out, *spatial')
        return _ConvBiasGrad.apply(out, self.bias) if exact_bias_grad else out


class _ConvBiasGrad(torch.autograd.Function):
    """Identity on a fused convolution's output that gives each member's bias the gradient its
    own convolution computes: `grad.sum((0, 2, 3, ...))` of that member's slice, in the layout it
    arrives in (a grouped convolution reduces over the folded layout and rounds differently)."""

    @staticmethod
    def forward(ctx, out: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return out.view_as(out)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        dims = (0, *range(2, grad.dim() - 1))
        return grad, torch.stack([member.sum(dims) for member in grad])


class FusedLayerNorm(nn.Module):
    """B LayerNorms: one normalisation, then each member's own affine transform."""

    def __init__(self, template: nn.LayerNorm, weight: torch.Tensor | None, bias: torch.Tensor | None):
        super().__init__()
        self.normalized_shape = tuple(template.normalized_shape)
        self.eps = template.eps
        self.weight = _param(weight)  # (B, *normalized_shape)
        self.bias = _param(bias)

    @classmethod
    def from_members(cls, modules: Sequence[nn.LayerNorm]) -> "FusedLayerNorm":
        return cls(modules[0], _stack([m.weight for m in modules]), _stack([m.bias for m in modules]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type == "cpu" and x.dtype == torch.float64 and self.weight is not None and self.bias is not None:
            # One kernel call per member, each with its own affine: PyTorch's CPU kernel applies
            # the affine inside the normalisation (and reduces its gradients there), so only
            # this rounds exactly as each member's own LayerNorm, forward and backward. Worth
            # its B calls where rounding is the point (float64, the precision equality is
            # checked in); in lower precision one call for all members is faster.
            return torch.stack(
                [F.layer_norm(x[i], self.normalized_shape, self.weight[i], self.bias[i], self.eps) for i in range(x.shape[0])]
            )
        out = F.layer_norm(x, self.normalized_shape, None, None, self.eps)
        trailing = len(self.normalized_shape)
        if self.weight is not None:
            out = out * _member_view(self.weight, x.dim(), trailing)
        if self.bias is not None:
            out = out + _member_view(self.bias, x.dim(), trailing)
        return out


class _FusedChannelNorm(nn.Module):
    """B channel norms (batch or instance) stacked: per-member affine parameters `(B, C)` and
    running statistics; the subclass's forward folds members into the channel dimension."""

    def __init__(self, template: nn.Module, members: Sequence[nn.Module]):
        super().__init__()
        self.eps, self.momentum = template.eps, template.momentum
        self.track_running_stats = template.track_running_stats
        self.weight = _param(_stack([m.weight for m in members]))  # (B, C)
        self.bias = _param(_stack([m.bias for m in members]))
        for name in ("running_mean", "running_var", "num_batches_tracked"):
            self.register_buffer(name, _stack_contiguous([getattr(m, name) for m in members]))

    @classmethod
    def from_members(cls, modules: Sequence[nn.Module]) -> "_FusedChannelNorm":
        return cls(modules[0], modules)


class FusedBatchNorm(_FusedChannelNorm):
    """B BatchNorms with exact per-member statistics: members become channel groups of one batch norm."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Mirrors nn.BatchNorm.forward, with (N, B*C, ...) as the input so every member's
        # channels are normalised over that member's samples only.
        members, samples = x.shape[:2]
        folded = x.transpose(0, 1).reshape(samples, -1, *x.shape[3:])
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            factor = 1.0 / float(self.num_batches_tracked[0]) if self.momentum is None else self.momentum
        use_batch_stats = self.training or (self.running_mean is None and self.running_var is None)
        track = not self.training or self.track_running_stats
        running = (self.running_mean, self.running_var) if track else (None, None)
        if x.device.type == "cpu" and x.dtype == torch.float64:
            return member_batch_norm(x, *running, self.weight, self.bias, use_batch_stats, factor, self.eps)
        out = F.batch_norm(
            folded,
            self.running_mean.view(-1) if track and self.running_mean is not None else None,
            self.running_var.view(-1) if track and self.running_var is not None else None,
            None if self.weight is None else self.weight.reshape(-1),
            None if self.bias is None else self.bias.reshape(-1),
            use_batch_stats,
            factor,
            self.eps,
        )
        return out.reshape(samples, members, *x.shape[2:]).transpose(0, 1)


def member_batch_norm(
    x: torch.Tensor,
    running_mean: torch.Tensor | None,
    running_var: torch.Tensor | None,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    training: bool,
    momentum: float,
    eps: float,
) -> torch.Tensor:
    """`F.batch_norm` of each member's `[N, C, ...]` slice of `x` with its own statistics and affine.

    One call per member: PyTorch's CPU kernel reduces a channel's gradient in an order that
    depends on how many channels it is given, and a bias feeding a BatchNorm has a gradient that
    cancels to almost nothing (the batch mean removes it), where Adam turns the last bit into a
    visible step (5e-11 relative after 3 float64 steps). Worth its B calls where rounding is the
    point (float64), as `FusedLayerNorm`'s; running statistics are updated in place, row by row."""
    rows = lambda t, i: None if t is None else t[i]  # noqa: E731
    return torch.stack(
        [
            F.batch_norm(x[i], rows(running_mean, i), rows(running_var, i), rows(weight, i), rows(bias, i), training, momentum, eps)
            for i in range(x.shape[0])
        ]
    )


class FusedGroupNorm(nn.Module):
    """B GroupNorms as one: members' channels side by side, B * num_groups groups (exact per-member statistics)."""

    def __init__(self, template: nn.GroupNorm, weight: torch.Tensor | None, bias: torch.Tensor | None):
        super().__init__()
        self.num_groups, self.eps = template.num_groups, template.eps
        self.weight = _param(weight)  # (B, C)
        self.bias = _param(bias)

    @classmethod
    def from_members(cls, modules: Sequence[nn.GroupNorm]) -> "FusedGroupNorm":
        return cls(modules[0], _stack([m.weight for m in modules]), _stack([m.bias for m in modules]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        members, samples = x.shape[:2]
        folded = x.transpose(0, 1).reshape(samples, -1, *x.shape[3:])  # (N, B*C, *spatial)
        out = F.group_norm(
            folded,
            self.num_groups * members,
            None if self.weight is None else self.weight.reshape(-1),
            None if self.bias is None else self.bias.reshape(-1),
            self.eps,
        )
        return out.reshape(samples, members, *x.shape[2:]).transpose(0, 1)


class FusedInstanceNorm(_FusedChannelNorm):
    """B InstanceNorms as one over `(N, B*C, ...)`: statistics are per (sample, channel) anyway."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        members, samples = x.shape[:2]
        folded = x.transpose(0, 1).reshape(samples, -1, *x.shape[3:])
        use_input_stats = self.training or not self.track_running_stats
        out = F.instance_norm(
            folded,
            None if self.running_mean is None else self.running_mean.view(-1),
            None if self.running_var is None else self.running_var.view(-1),
            None if self.weight is None else self.weight.reshape(-1),
            None if self.bias is None else self.bias.reshape(-1),
            use_input_stats,
            self.momentum if self.momentum is not None else 0.0,
            self.eps,
        )
        return out.reshape(samples, members, *x.shape[2:]).transpose(0, 1)


class FusedEmbedding(nn.Module):
    """B embedding tables as one `[B*V, D]` table indexed at `member * V + index`."""

    def __init__(self, template: nn.Embedding, weight: torch.Tensor):
        super().__init__()
        self.weight = nn.Parameter(weight)  # (B, V, D)
        self.padding_idx = template.padding_idx
        self.scale_grad_by_freq = template.scale_grad_by_freq

    @classmethod
    def from_members(cls, modules: Sequence[nn.Embedding]) -> "FusedEmbedding":
        return cls(modules[0], _stack([m.weight for m in modules]))

    def forward(self, index: torch.Tensor) -> torch.Tensor:
        members, vocabulary, dim = self.weight.shape
        offsets = torch.arange(members, device=index.device).view(members, *([1] * (index.dim() - 1))) * vocabulary
        # Frequencies for scale_grad_by_freq are counted per (member, row), as each member would.
        out = F.embedding(
            index + offsets, self.weight.reshape(members * vocabulary, dim), scale_grad_by_freq=self.scale_grad_by_freq
        )
        if self.padding_idx is not None:
            # nn.Embedding's padding row gets no gradient; one padding index cannot express B rows.
            out = torch.where((index == self.padding_idx).unsqueeze(-1), out.detach(), out)
        return out


def _embedding_check(module: nn.Embedding) -> str | None:
    if module.max_norm is not None:
        return "max_norm renormalises the table in place during forward"
    if module.sparse:
        return "sparse gradients"
    return None


#: The layers with hand-written fused kernels, in lookup order (subclasses before bases never
#: matter: lookup is by exact type, so a user's Linear subclass with its own forward is not
#: mistaken for a Linear).
LEAF_FUSERS: dict[type, Callable[[Sequence[nn.Module]], nn.Module]] = {
    nn.Linear: FusedLinear.from_members,
    ScaledLinear: FusedLinear.from_members,
    nn.Conv1d: FusedConv.from_members,
    nn.Conv2d: FusedConv.from_members,
    nn.Conv3d: FusedConv.from_members,
    nn.LayerNorm: FusedLayerNorm.from_members,
    nn.BatchNorm1d: FusedBatchNorm.from_members,
    nn.BatchNorm2d: FusedBatchNorm.from_members,
    nn.BatchNorm3d: FusedBatchNorm.from_members,
    nn.Embedding: FusedEmbedding.from_members,
    nn.GroupNorm: FusedGroupNorm.from_members,
    nn.InstanceNorm1d: FusedInstanceNorm.from_members,
    nn.InstanceNorm2d: FusedInstanceNorm.from_members,
    nn.InstanceNorm3d: FusedInstanceNorm.from_members,
}

#: Per-layer reasons a supported layer type is still not fusible in a given configuration.
LEAF_CHECKS: dict[type, Callable[[nn.Module], str | None]] = {nn.Embedding: _embedding_check}

#: Layers that hold weights but have no fused version on either path.
UNSUPPORTED: tuple[type, ...] = (nn.EmbeddingBag,)
