"""`nn.MultiheadAttention` on the stacked path, and so every `nn.Transformer*` layer built on it.

Only the projections belong to a member; the attention itself is per sequence. So the in- and
out-projections run as one batched GEMM per projection (each member's own weights), and between
them the B members' N sequences are folded into one batch of B*N sequences that goes through the
steps of `F.multi_head_attention_forward` once: the same mask handling, the same
`scaled_dot_product_attention` kernel (or the same explicit softmax when `need_weights`), so a
member computes what its own `nn.MultiheadAttention` computes, operation for operation.

Masks are shared input (a causal mask) or derived from the stacked input (a key padding mask
computed from token ids has the member dimension in front); both layouts are accepted:
`key_padding_mask` `[N, S]` or `[B, N, S]`, `attn_mask` `[L, S]`, `[N*H, L, S]`, `[B, L, S]` or
`[B, N*H, L, S]`. Configurations this does not implement (separate key/value widths, `bias_k`,
`add_zero_attn`) are left to the vmap path.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn
from torch.nn import functional as F
from torch.overrides import TorchFunctionMode

from fusion.layers import FusedLinear, NotStackedHere, _param, _stack, member_linear


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
        if not batched:  # a member's unbatched (L, E) input: a batch of one
            # separately, as F.multi_head_attention_forward does (so the projections are unpacked)
            query, key, value = query.unsqueeze(2), key.unsqueeze(2), value.unsqueeze(2)
            if key_padding_mask is not None:
                key_padding_mask = key_padding_mask.unsqueeze(-2)
        if self.batch_first and batched:  # to (B, L, N, E), keeping the `is` relations as PyTorch does
            if key is value:
                if query is key:
                    query = key = value = query.transpose(1, 2)
                else:
                    query, key = (x.transpose(1, 2) for x in (query, key))
                    value = key
            else:
                query, key, value = (x.transpose(1, 2) for x in (query, key, value))
        tgt_len, bsz, embed_dim = query.shape[1:]
        src_len = key.shape[1]
        q, k, v = self._in_projection(query, key, value)  # each (L or S, B*N, E)
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
        q = q.view(tgt_len, folded * heads, head_dim).transpose(0, 1)
        k = k.view(k.shape[0], folded * heads, head_dim).transpose(0, 1)
        v = v.view(v.shape[0], folded * heads, head_dim).transpose(0, 1)
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


class FoldedAttentionCalls(TorchFunctionMode):
    """Keeps `F.scaled_dot_product_attention` on its fused kernel on the stacked path.

    User attention code on the stacked path passes `[B, N, H, L, E]` tensors; PyTorch's CPU
    flash kernel takes 4-D input only and anything more runs the unfused math path. Inside a
    stacked forward this mode folds the leading dimensions into one batch (masks broadcast to
    match), makes the one kernel call and unfolds the result; 4-D calls pass through.
    """

    def __init__(self):
        super().__init__()
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is not F.scaled_dot_product_attention:
            return func(*args, **kwargs)
        names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
        bound = {"attn_mask": None, "dropout_p": 0.0, "is_causal": False, "scale": None, "enable_gqa": False}
        bound.update(zip(names, args))
        bound.update(kwargs)
        query, key, value = bound["query"], bound["key"], bound["value"]
        if query.dim() <= 4 or isinstance(bound["scale"], torch.Tensor):
            return func(*args, **kwargs)
        self.calls += 1
        lead = query.shape[:-3]

        def fold(t: torch.Tensor) -> torch.Tensor:
            return t.expand(*lead, *t.shape[-3:]).reshape(-1, *t.shape[-3:])

        mask = bound["attn_mask"]
        if mask is not None:
            mask = fold(mask.expand(*lead, *mask.shape[-3:]) if mask.dim() >= 3 else mask.expand(*lead, 1, *mask.shape))
        out = func(
            fold(query),
            fold(key),
            fold(value),
            attn_mask=mask,
            dropout_p=bound["dropout_p"],
            is_causal=bound["is_causal"],
            scale=bound["scale"],
            enable_gqa=bound["enable_gqa"],
        )
        return out.reshape(*lead, *out.shape[-3:])
