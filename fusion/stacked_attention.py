"""`nn.MultiheadAttention` on the stacked path, and so every `nn.Transformer*` layer built on it.

Only the projections belong to a member; the attention itself is per sequence. So the in- and
out-projections run as one batched GEMM per projection (each member's own weights), and between
them the B members' N sequences are folded into one batch of B*N sequences that goes through the
steps of `F.multi_head_attention_forward` once: the same mask handling, the same
`scaled_dot_product_attention` kernel (or the same explicit softmax when `need_weights`), so a
member computes what its own `nn.MultiheadAttention` computes, operation for operation.

Batch-first self-attention (every `nn.Transformer*` layer built with `batch_first=True`) takes a
shorter way with the same arithmetic: PyTorch transposes the input to sequence-major, projects it,
and copies q, k and v apart; here the projection runs on the input as it lies and q, k, v, the
attention output and the out-projection's output are all views, with no copy in between (see
`_BatchFirstLinear` for why the rounding stays PyTorch's).

Masks are shared input (a causal mask) or derived from the stacked input (a key padding mask
computed from token ids has the member dimension in front); both layouts are accepted:
`key_padding_mask` `[N, S]` or `[B, N, S]`, `attn_mask` `[L, S]`, `[N*H, L, S]`, `[B, L, S]` or
`[B, N*H, L, S]`. Configurations this does not implement (separate key/value widths, `bias_k`,
`add_zero_attn`) are left to the vmap path.

A user's own attention module whose scale differs between members (muP's `attn_mult` and
`attn_scale`, kept as a float attribute passed to `scaled_dot_product_attention(scale=...)`)
stacks too: the attribute becomes `MemberScales`, and `MemberScaledAttention` (entered by the
stacked model's forward) runs the folded call in runs of members that share a scale, each with
that Python float. One call when every member has the same scale, one per run otherwise:
folding the scale into the query instead (`q * s`, scale 1) rounds differently from the kernel's
own scaling, and members must compute what they compute alone (bit-exact in float64).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import torch
from torch import nn
from torch.nn import functional as F
from torch.overrides import TorchFunctionMode

from fusion.layers import FusedLinear, NotStackedHere, _member_gemm, _param, _placement, _random_like, _stack, member_linear


class FusedMultiheadAttention(nn.Module):
    """B `nn.MultiheadAttention` layers; inputs and outputs carry a leading member dimension."""

    def __init__(self, template: nn.MultiheadAttention, members: Sequence[nn.MultiheadAttention]):
        super().__init__()
        self.embed_dim, self.num_heads = template.embed_dim, template.num_heads
        self.head_dim, self.dropout, self.batch_first = template.head_dim, template.dropout, template.batch_first
        self.in_proj_weight = _param(_stack([m.in_proj_weight for m in members]))  # (B, 3E, E)
        self.in_proj_bias = _param(_stack([m.in_proj_bias for m in members]))  # (B, 3E)
        self.out_proj = FusedLinear.from_members([m.out_proj for m in members])

    @classmethod
    def from_members(cls, modules: Sequence[nn.MultiheadAttention]) -> "FusedMultiheadAttention":
        first = modules[0]
        if not first._qkv_same_embed_dim:
            raise NotStackedHere("separate key/value widths (kdim/vdim)")
        if first.bias_k is not None or first.add_zero_attn:
            raise NotStackedHere("add_bias_kv or add_zero_attn")
        return cls(first, modules)

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        key_padding_mask: torch.Tensor | None = None,
        need_weights: bool = True,
        attn_mask: torch.Tensor | None = None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        members = self.in_proj_weight.shape[0]
        batched = query.dim() == 4
        # batch-first self-attention without weights: projections on the input as it lies
        views = batched and self.batch_first and query is key and key is value and not need_weights
        if not batched:  # a member's unbatched (L, E) input: a batch of one
            # separately, as F.multi_head_attention_forward does (so the projections are unpacked)
            query, key, value = query.unsqueeze(2), key.unsqueeze(2), value.unsqueeze(2)
            if key_padding_mask is not None:
                key_padding_mask = key_padding_mask.unsqueeze(-2)
        if views:
            bsz, tgt_len, embed_dim = query.shape[1:]
            src_len = tgt_len
            q, k, v = self._self_attention_heads(query)  # each (B*N, H, L, hd)
        elif self.batch_first and batched:  # to (B, L, N, E), keeping the `is` relations as PyTorch does
            if key is value:
                if query is key:
                    query = key = value = query.transpose(1, 2)
                else:
                    query, key = (x.transpose(1, 2) for x in (query, key))
                    value = key
            else:
                query, key, value = (x.transpose(1, 2) for x in (query, key, value))
        if not views:
            tgt_len, bsz, embed_dim = query.shape[1:]
            src_len = key.shape[1]
            q, k, v = self._in_projection(query, key, value)  # each (L or S, B*N, E)
            q = q.view(tgt_len, members * bsz * self.num_heads, self.head_dim).transpose(0, 1)
            k = k.view(k.shape[0], members * bsz * self.num_heads, self.head_dim).transpose(0, 1)
            v = v.view(v.shape[0], members * bsz * self.num_heads, self.head_dim).transpose(0, 1)
        folded = members * bsz
        key_padding_mask = _fold_padding_mask(key_padding_mask, members, bsz)
        attn_mask = _fold_attention_mask(attn_mask, members, bsz, self.num_heads)
        key_padding_mask = F._canonical_mask(
            mask=key_padding_mask,
            mask_name="key_padding_mask",
            other_type=F._none_or_dtype(attn_mask),
            other_name="attn_mask",
            target_type=query.dtype,
        )
        if is_causal and attn_mask is None:
            raise RuntimeError("Need attn_mask if specifying the is_causal hint.")
        if is_causal and key_padding_mask is None and not need_weights:
            attn_mask = None
        else:
            attn_mask = F._canonical_mask(
                mask=attn_mask, mask_name="attn_mask", other_type=None, other_name="", target_type=query.dtype, check_other=False
            )
            if key_padding_mask is not None:
                is_causal = False
        if attn_mask is not None and attn_mask.dim() == 2:
            attn_mask = attn_mask.unsqueeze(0)
        heads, head_dim = self.num_heads, self.head_dim
        if key_padding_mask is not None:
            key_padding_mask = key_padding_mask.view(folded, 1, 1, src_len).expand(-1, heads, -1, -1).reshape(folded * heads, 1, src_len)
            attn_mask = key_padding_mask if attn_mask is None else attn_mask + key_padding_mask
        dropout_p = self.dropout if self.training else 0.0
        if need_weights:
            q_scaled = q * math.sqrt(1.0 / float(head_dim))
            if is_causal and attn_mask is None:
                raise RuntimeError("is_causal without attn_mask is not implemented for need_weights")
            if attn_mask is not None:
                weights = torch.baddbmm(attn_mask, q_scaled, k.transpose(-2, -1))
            else:
                weights = torch.bmm(q_scaled, k.transpose(-2, -1))
            weights = F.softmax(weights, dim=-1)
            if dropout_p > 0.0:
                weights = F.dropout(weights, p=dropout_p)
            out = torch.bmm(weights, v)  # (B*N*H, L, hd)
            out = out.transpose(0, 1).reshape(tgt_len, members, bsz, embed_dim)
            weights = weights.view(members, bsz, heads, tgt_len, src_len)
            if average_attn_weights:
                weights = weights.mean(dim=2)
        else:
            if attn_mask is not None:
                if attn_mask.size(0) == 1 and attn_mask.dim() == 3:
                    attn_mask = attn_mask.unsqueeze(0)
                else:
                    attn_mask = attn_mask.view(folded, heads, -1, src_len)
            q = q.view(folded, heads, tgt_len, head_dim)
            k = k.view(folded, heads, src_len, head_dim)
            v = v.view(folded, heads, src_len, head_dim)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, is_causal)
            if views:  # (B*N, H, L, hd) -> (B, N, L, E): a view of the kernel's (B*N, L, H, hd) output
                out = out.transpose(1, 2).reshape(members, bsz, tgt_len, embed_dim)
                w, b = self.out_proj.weight, self.out_proj.bias
                return _BatchFirstLinear.apply(out, w, b, True), None  # out_proj: addmm on 2-D rows, as unfused
            out = out.permute(2, 0, 1, 3).reshape(tgt_len, members, bsz, embed_dim)
            weights = None
        # out_proj: each member's rows in (l, n) order, as its own linear sees them
        out = self.out_proj(out.transpose(0, 1).reshape(members, tgt_len * bsz, embed_dim)).view(members, tgt_len, bsz, -1)
        if not batched:
            out = out.squeeze(2)
            weights = None if weights is None else weights.squeeze(1)
        elif self.batch_first:
            out = out.transpose(1, 2)
        return out, weights

    def _self_attention_heads(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """q, k and v of batch-first `(B, N, L, E)` self-attention as `(B*N, H, L, hd)` views of one projection."""
        members, bsz, length, _ = x.shape
        # F.linear adds the bias after the GEMM here: PyTorch's input is the transposed (non-contiguous) one
        proj = _BatchFirstLinear.apply(x, self.in_proj_weight, self.in_proj_bias, False)  # (B, N, L, 3E)
        heads = proj.view(members, bsz, length, 3, self.num_heads, self.head_dim).unbind(3)
        return tuple(h.transpose(2, 3).reshape(members * bsz, self.num_heads, length, self.head_dim) for h in heads)

    def _in_projection(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """`F._in_projection_packed` per member; returns q, k, v folded to `(L, B*N, E)`."""
        w, b, E = self.in_proj_weight, self.in_proj_bias, self.embed_dim

        def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
            # F.linear adds the bias inside the GEMM only for a contiguous input (per member)
            return member_linear(x, weight, bias, bias_in_gemm=x[0].is_contiguous())

        def fold(t: torch.Tensor) -> torch.Tensor:  # (B, L, N, E) -> (L, B*N, E)
            return t.transpose(0, 1).reshape(t.shape[1], -1, t.shape[-1])

        if key is value and query is key:
            proj = linear(query, w, b)  # (B, L, N, 3E)
            proj = proj.unflatten(-1, (3, E)).permute(3, 1, 0, 2, 4).contiguous()  # (3, L, B, N, E)
            return tuple(p.reshape(p.shape[0], -1, E) for p in proj)
        if key is value:
            w_q, w_kv = w.split([E, 2 * E], dim=1)
            b_q, b_kv = (None, None) if b is None else b.split([E, 2 * E], dim=1)
            kv = linear(key, w_kv, b_kv).unflatten(-1, (2, E)).permute(3, 1, 0, 2, 4).contiguous()
            return fold(linear(query, w_q, b_q)), *(p.reshape(p.shape[0], -1, E) for p in kv)
        w_q, w_k, w_v = w.chunk(3, dim=1)
        b_q, b_k, b_v = (None, None, None) if b is None else b.chunk(3, dim=1)
        return fold(linear(query, w_q, b_q)), fold(linear(key, w_k, b_k)), fold(linear(value, w_v, b_v))


#: Shapes for which a GEMM rounds each output row the same whatever row order its input has (measured once).
_ROW_ORDER_FREE: dict[tuple, bool] = {}


def _rows_any_order(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None, samples: int) -> bool:
    """Whether `_member_gemm(a, b, bias)` on `a`'s rows in (n, l) order rounds every row exactly as
    on the same rows in (l, n) order. A row's dot products do not depend on where the row sits,
    but MKL handles a block of leftover rows with other kernels, and for some shapes those round
    differently; so this is measured once per shape and placement (see `_member_gemm`) on
    random operands. A compiled step takes the rows as they lie (its kernels are inductor's choice)."""
    if torch.compiler.is_compiling():
        return True
    key = (a.dtype, _placement(a), _placement(b), None if bias is None else _placement(bias), samples, torch.get_num_threads())
    if key not in _ROW_ORDER_FREE:
        gen = torch.Generator().manual_seed(0)  # a private generator: probing must not move the global RNG
        rows = a.shape[1]
        probe_a, probe_b = _random_like(a, gen), _random_like(b, gen)
        probe_c = None if bias is None else _random_like(bias, gen)
        as_is = _member_gemm(probe_a, probe_b, probe_c)
        reordered = _member_gemm(_swap_rows(probe_a, samples), probe_b, probe_c)
        _ROW_ORDER_FREE[key] = torch.equal(as_is, _swap_rows(reordered, rows // samples))
    return _ROW_ORDER_FREE[key]


def _swap_rows(t: torch.Tensor, outer: int) -> torch.Tensor:
    """`(B, outer*inner, C)` rows in (outer, inner) order -> (inner, outer) order (a copy)."""
    members, rows, width = t.shape
    return t.reshape(members, outer, rows // outer, width).transpose(1, 2).reshape(members, rows, width)


def _rows_gemm(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None, samples: int) -> torch.Tensor:
    """`_member_gemm` on `(B, N*L, in)` rows in (n, l) order, rounding each row as PyTorch's GEMM on
    the (l, n) order does: directly where the shape allows, through transposing copies otherwise."""
    if _rows_any_order(a, b, bias, samples):
        return _member_gemm(a, b, bias)
    return _swap_rows(_member_gemm(_swap_rows(a, samples), b, bias), a.shape[1] // samples)


class _BatchFirstLinear(torch.autograd.Function):
    """`F.linear` of each member on a batch-first `(B, N, L, in)` input that PyTorch's attention
    projects sequence-major, its rows in (l, n) order.

    An output row depends on its input row only, so the forward GEMM (and the input gradient's)
    runs on the rows as they lie, in (n, l) order, and the output is batch-first with no copy.
    The weight and bias gradients sum over the rows, and a sum's rounding depends on its order:
    those run on (l, n)-ordered copies, with the operands in the layouts autograd gives `addmm`'s
    backward, so every member's gradients are bit for bit its unfused layer's.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, bias_in_gemm: bool) -> torch.Tensor:
        members, samples, length, width = x.shape
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        rows = x.reshape(members, samples * length, width)
        out = _rows_gemm(rows, weight.transpose(1, 2), bias if bias_in_gemm else None, samples)
        if bias is not None and not bias_in_gemm:
            out = out + bias.unsqueeze(1)
        return out.view(members, samples, length, -1)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight = ctx.saved_tensors
        members, samples, length, width = x.shape
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            rows = grad.reshape(members, samples * length, -1)
            grad_x = _rows_gemm(rows, weight, None, samples).view(x.shape)
        if ctx.needs_input_grad[1] or (ctx.has_bias and ctx.needs_input_grad[2]):
            sequence_major = grad.transpose(1, 2).reshape(members, length * samples, -1)
            if ctx.needs_input_grad[1]:
                x_rows = x.transpose(1, 2).reshape(members, length * samples, width)
                grad_w = _member_gemm(sequence_major.transpose(1, 2), x_rows)
            if ctx.has_bias and ctx.needs_input_grad[2]:
                grad_b = sequence_major.sum(dim=1)
        return grad_x, grad_w, grad_b, None


def _fold_padding_mask(mask: torch.Tensor | None, members: int, bsz: int) -> torch.Tensor | None:
    """`[N, S]` (shared) or `[B, N, S]` (per member) -> `[B*N, S]`."""
    if mask is None:
        return None
    if mask.dim() == 2:
        mask = mask.unsqueeze(0).expand(members, *mask.shape)
    return mask.reshape(members * bsz, mask.shape[-1])


def _fold_attention_mask(mask: torch.Tensor | None, members: int, bsz: int, heads: int) -> torch.Tensor | None:
    """`[L, S]` stays shared; `[N*H, L, S]`, `[B, L, S]` and `[B, N*H, L, S]` -> `[B*N*H, L, S]`."""
    if mask is None or mask.dim() == 2:
        return mask
    if mask.dim() == 3 and mask.shape[0] == bsz * heads:
        mask = mask.unsqueeze(0).expand(members, *mask.shape)
    elif mask.dim() == 3 and mask.shape[0] == members:
        mask = mask.unsqueeze(1).expand(members, bsz * heads, *mask.shape[1:])
    return mask.reshape(-1, *mask.shape[-2:])


ATTENTION_FUSERS = {nn.MultiheadAttention: FusedMultiheadAttention.from_members}


_SDPA_ARGS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
_SDPA_DEFAULTS = {"attn_mask": None, "dropout_p": 0.0, "is_causal": False, "scale": None, "enable_gqa": False}


def sdpa_arguments(args: tuple, kwargs: dict) -> dict:
    """A `scaled_dot_product_attention` call's arguments by name, in its order, defaults filled in."""
    given = {**_SDPA_DEFAULTS, **dict(zip(_SDPA_ARGS, args)), **kwargs}
    return {name: given[name] for name in _SDPA_ARGS}


class MemberScales(float):
    """A float attribute of a user module that differs between members, on the stacked path.

    The members' values live in a float64 buffer of the module (`name`), so every row-wise
    operation on the fused model (removing members, the guard's copy of some rows, moving it to
    a device) keeps them right; they are read to the host once per such change, never per step.
    Only `MemberScaledAttention` reads them. Any other use fails, and the group is fused by vmap
    instead (which stacks any scalar attribute): Python arithmetic, comparisons and truth tests
    raise, and as a number (a kernel taking it as a scalar) it is NaN, which the probe rejects."""

    def __new__(cls, module: nn.Module, name: str) -> "MemberScales":
        scales = super().__new__(cls, math.nan)
        scales.module, scales.name = module, name
        scales._read: tuple[torch.Tensor | None, tuple[float, ...]] = (None, ())
        return scales

    def __reduce__(self):
        return MemberScales, (self.module, self.name)

    def _refused(self, *args: object) -> None:
        raise TypeError(f"a per-member attribute of the stacked path ({self.name}) is only a scaled_dot_product_attention scale")

    __bool__ = __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __int__ = __index__ = __round__ = _refused
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __rtruediv__ = _refused
    __pow__ = __rpow__ = __neg__ = __abs__ = __floordiv__ = __rfloordiv__ = __mod__ = __rmod__ = _refused
    __hash__ = object.__hash__

    @property
    def values(self) -> tuple[float, ...]:
        tensor = self.module._buffers[self.name]
        if self._read[0] is not tensor:
            self._read = (tensor, tuple(tensor.tolist()))
        return self._read[1]


class MemberScaledAttention(TorchFunctionMode):
    """Routes `scaled_dot_product_attention(..., scale=MemberScales)` to `member_scaled_attention`."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            bound = sdpa_arguments(args, kwargs)
            if isinstance(bound["scale"], MemberScales):
                return member_scaled_attention(**bound)
        return func(*args, **kwargs)


def member_scaled_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None,
    dropout_p: float,
    is_causal: bool,
    scale: MemberScales,
    enable_gqa: bool,
) -> torch.Tensor:
    """Attention on the members folded member-major into dimension 0 (`[B*N, ...]`), each member
    with its own scale: one kernel call per run of members sharing a scale (the probe and the
    independence check catch a layout where dimension 0 is not the members' fold)."""
    values = scale.values
    members = len(values)
    if query.shape[0] % members or key.shape[0] != query.shape[0] or value.shape[0] != query.shape[0]:
        raise RuntimeError(f"a per-member attention scale needs the {members} members folded into dimension 0, got {tuple(query.shape)}")
    per_member = query.shape[0] // members
    outputs, start = [], 0
    for member_scale, run in itertools.groupby(values):
        rows = slice(start * per_member, (start + len(list(run))) * per_member)
        start = rows.stop // per_member
        mask = attn_mask
        if mask is not None and mask.dim() == query.dim() and mask.shape[0] == query.shape[0]:
            mask = mask[rows]
        outputs.append(
            F.scaled_dot_product_attention(
                query[rows], key[rows], value[rows], attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal,
                scale=member_scale, enable_gqa=enable_gqa,
            )
        )
    return outputs[0] if len(outputs) == 1 else torch.cat(outputs)

