"""`nn.LSTM`, `nn.GRU`, `nn.RNN` and their cells on the stacked path.

PyTorch runs a recurrent layer as one opaque kernel call per layer stack, and `torch.func.vmap`
has no batching rule for it, so the layer is written out here step by step for all B members at
once: per time step one batched GEMM for the hidden-to-hidden projection of every member, the
input projection of the whole sequence in one batched GEMM up front. The order of operations is
that of PyTorch's own CPU implementation (`aten/src/ATen/native/RNN.cpp`: input projection
precomputed, `linear_hh(h) + input_w`, then the gates), so in float64 a member computes bit for
bit what its own layer computes; in float32 PyTorch's CPU layer runs oneDNN's kernel instead,
which rounds differently (within the usual float32 tolerance).

Packed sequences are refused with a FusionError: a `PackedSequence` has no member dimension to
carry, and its per-step batch sizes differ per sequence. An LSTM with `proj_size` projects each
step's hidden state with its own GEMM, as RNN.cpp does (`matmul_hr`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.utils.rnn import PackedSequence

from fusion.layers import FusionError, _stack, member_linear


def _lstm_cell(input_w: torch.Tensor, hidden: tuple[torch.Tensor, torch.Tensor], w_hh, b_hh):
    hx, cx = hidden
    gates = member_linear(hx, w_hh, b_hh) + input_w
    ingate, forgetgate, cellgate, outgate = gates.chunk(4, dim=-1)
    ingate, forgetgate, cellgate, outgate = ingate.sigmoid(), forgetgate.sigmoid(), cellgate.tanh(), outgate.sigmoid()
    cy = forgetgate * cx + ingate * cellgate
    return outgate * cy.tanh(), cy


def _gru_cell(input_w: torch.Tensor, hidden: torch.Tensor, w_hh, b_hh) -> torch.Tensor:
    # In place on unsafe chunks, as RNN.cpp: element-wise kernels on these strided views round
    # (by an ulp) unlike the same kernels on fresh contiguous tensors.
    i_r, i_z, i_n = input_w.unsafe_chunk(3, dim=-1)
    h_r, h_z, h_n = member_linear(hidden, w_hh, b_hh).unsafe_chunk(3, dim=-1)
    reset_gate = h_r.add_(i_r).sigmoid_()
    input_gate = h_z.add_(i_z).sigmoid_()
    new_gate = i_n.add(h_n.mul_(reset_gate)).tanh_()
    return (hidden - new_gate).mul_(input_gate).add_(new_gate)


def _rnn_cell(nonlinearity):
    def cell(input_w: torch.Tensor, hidden: torch.Tensor, w_hh, b_hh) -> torch.Tensor:
        return nonlinearity(member_linear(hidden, w_hh, b_hh) + input_w)

    return cell


def _lstm_cell_fast(input_w: torch.Tensor, hidden: tuple[torch.Tensor, torch.Tensor], w_hh, b_hh):
    """The same cell in fewer and cheaper kernels, for precisions where PyTorch's own CPU LSTM
    (oneDNN) rounds its own way anyway: one GEMM with the input projection as its addend, one
    sigmoid over all gates, and tanh as `2 sigmoid(2x) - 1` (within an ulp of 1). PyTorch's CPU
    tanh (MKL VML) costs about ten times its sigmoid, and the two tanh of every step took 5% of
    the fused zoo LSTM's cycles under perf. `input_w` and `w_hh` come with the cell gate's rows doubled
    (`_doubled_cell_gate`), so the one sigmoid gives sigmoid(2g); `b_hh` is folded into `input_w`."""
    hx, cx = hidden
    gates = torch.baddbmm(input_w, hx, w_hh.transpose(1, 2)).sigmoid()
    ingate, forgetgate, cellgate, outgate = gates.chunk(4, dim=-1)
    cy = torch.addcmul(forgetgate * cx, ingate, cellgate * 2 - 1)
    return outgate * (torch.sigmoid(cy * 2) * 2 - 1), cy


def _doubled_cell_gate(weight: torch.Tensor) -> torch.Tensor:
    """`(B, 4H, ...)` or `(B, 4H)` with the cell gate's rows times 2 (exact: a power of two)."""
    scale = torch.ones(weight.shape[1], dtype=weight.dtype, device=weight.device)
    hidden = weight.shape[1] // 4
    scale[2 * hidden : 3 * hidden] = 2.0
    return weight * scale.view(1, -1, *[1] * (weight.dim() - 2))


def _input_projection(x: torch.Tensor, w_ih: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """The short form's input projection of a whole `(B, T, N, I)` sequence: one batched GEMM
    with the biases inside it, on the input as it lies (a batch_first input, `(B, N, T, I)` in
    memory, needs no transposing copy and no separate bias passes over the result)."""
    sample_major = x.transpose(1, 2)
    if sample_major.is_contiguous():
        return member_linear(sample_major, w_ih, bias).transpose(1, 2)
    return member_linear(x, w_ih, bias)


_CELLS = {"LSTM": _lstm_cell, "GRU": _gru_cell, "RNN_TANH": _rnn_cell(torch.tanh), "RNN_RELU": _rnn_cell(torch.relu)}


class FusedRNN(nn.Module):
    """B `nn.LSTM`/`nn.GRU`/`nn.RNN` layers: input `[B, T, N, I]` (`[B, N, T, I]` batch_first)."""

    def __init__(self, template: nn.RNNBase, members: Sequence[nn.RNNBase]):
        super().__init__()
        self.mode, self.hidden_size, self.num_layers = template.mode, template.hidden_size, template.num_layers
        self.bias, self.batch_first, self.dropout = template.bias, template.batch_first, float(template.dropout)
        self.bidirectional = template.bidirectional
        self.proj_size = getattr(template, "proj_size", 0)
        self._weight_names = list(template._flat_weights_names)
        for name in self._weight_names:
            self.register_parameter(name, nn.Parameter(_stack([getattr(m, name) for m in members])))

    @classmethod
    def from_members(cls, modules: Sequence[nn.RNNBase]) -> "FusedRNN":
        return cls(modules[0], modules)

    def _weights(self, layer: int, suffix: str) -> tuple[torch.Tensor | None, ...]:
        """`(w_ih, w_hh, b_ih, b_hh, w_hr)` of one layer and direction (None where absent)."""
        get = lambda kind: getattr(self, f"{kind}_l{layer}{suffix}")  # noqa: E731
        biases = (get("bias_ih"), get("bias_hh")) if self.bias else (None, None)
        return get("weight_ih"), get("weight_hh"), *biases, get("weight_hr") if self.proj_size else None

    def forward(self, input: torch.Tensor, hx=None):
        if isinstance(input, PackedSequence):
            raise FusionError(
                f"{type(self).__name__} ({self.mode}) cannot fuse packed sequences: pass the padded tensor "
                "(and mask the padding in the loss) instead of a PackedSequence"
            )
        members = input.shape[0]
        batched = input.dim() == 4
        x = input if batched else input.unsqueeze(2)  # (B, T, N, I) or (B, N, T, I)
        if self.batch_first and batched:
            x = x.transpose(1, 2)
        samples = x.shape[2]
        directions = 2 if self.bidirectional else 1
        lstm = self.mode == "LSTM"
        h0, c0 = (hx if lstm and hx is not None else (hx, None))
        h0 = self._initial(h0, members, samples, batched, x, self.proj_size or self.hidden_size)
        c0 = self._initial(c0, members, samples, batched, x, self.hidden_size) if lstm else None
        # float64 mirrors RNN.cpp op for op (bit-exact); elsewhere the LSTM takes the short form
        fast = lstm and x.dtype != torch.float64
        cell = _lstm_cell_fast if fast else _CELLS[self.mode]
        finals_h, finals_c = [], []
        layer_input = x
        for layer in range(self.num_layers):
            outputs = []
            for direction in range(directions):
                w_ih, w_hh, b_ih, b_hh, w_hr = self._weights(layer, "_reverse" if direction else "")
                if fast:
                    bias = None if b_ih is None else _doubled_cell_gate(b_ih + b_hh)
                    inputs_w = _input_projection(layer_input, _doubled_cell_gate(w_ih), bias)
                    w_hh, b_hh = _doubled_cell_gate(w_hh), None
                else:
                    # F.linear adds the bias inside the GEMM only for a contiguous input (per member)
                    inputs_w = member_linear(layer_input, w_ih, b_ih, bias_in_gemm=layer_input[0].is_contiguous())
                index = layer * directions + direction
                hidden = (h0[:, index], c0[:, index]) if lstm else h0[:, index]
                step_outputs = []
                step_inputs = inputs_w.unbind(1)  # one UnbindBackward, not a zero-filled gradient per step
                for step_input in reversed(step_inputs) if direction else step_inputs:
                    hidden = cell(step_input, hidden, w_hh, b_hh)
                    if w_hr is not None:  # LSTM with projections: h = (o * tanh(c)) W_hr^T
                        hidden = (member_linear(hidden[0], w_hr, None), hidden[1])
                    step_outputs.append(hidden[0] if lstm else hidden)
                if direction:
                    step_outputs.reverse()
                outputs.append(torch.stack(step_outputs, 1))
                finals_h.append(hidden[0] if lstm else hidden)
                if lstm:
                    finals_c.append(hidden[1])
            layer_input = outputs[0] if directions == 1 else torch.cat(outputs, -1)
            if self.dropout and self.training and layer < self.num_layers - 1:
                layer_input = F.dropout(layer_input, self.dropout, training=True)
        output = layer_input
        if self.batch_first and batched:
            output = output.transpose(1, 2)
        h_n = torch.stack(finals_h, 1)
        c_n = torch.stack(finals_c, 1) if lstm else None
        if not batched:
            output = output.squeeze(2)
            h_n = h_n.squeeze(2)
            c_n = None if c_n is None else c_n.squeeze(2)
        return output, ((h_n, c_n) if lstm else h_n)

    def _initial(self, h: torch.Tensor | None, members: int, samples: int, batched: bool, x: torch.Tensor, size: int) -> torch.Tensor:
        """`[B, L*D, N, size]`: zeros, or the caller's state (per member, or shared by all members)."""
        layers = self.num_layers * (2 if self.bidirectional else 1)
        if h is None:
            return torch.zeros(members, layers, samples, size, dtype=x.dtype, device=x.device)
        member_rank = 3 if batched else 2
        if h.dim() == member_rank:  # one state for all members
            h = h.unsqueeze(0).expand(members, *h.shape)
        return h if batched else h.unsqueeze(2)


class FusedRNNCell(nn.Module):
    """B `nn.LSTMCell`/`nn.GRUCell`/`nn.RNNCell`: input `[B, N, I]`, state `[B, N, H]` (or shared `[N, H]`)."""

    def __init__(self, template: nn.RNNCellBase, members: Sequence[nn.RNNCellBase]):
        super().__init__()
        self.hidden_size = template.hidden_size
        if isinstance(template, nn.LSTMCell):
            self.mode = "LSTM"
        elif isinstance(template, nn.GRUCell):
            self.mode = "GRU"
        else:
            self.mode = "RNN_TANH" if template.nonlinearity == "tanh" else "RNN_RELU"
        for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
            self.register_parameter(name, None if getattr(template, name) is None else nn.Parameter(_stack([getattr(m, name) for m in members])))

    @classmethod
    def from_members(cls, modules: Sequence[nn.RNNCellBase]) -> "FusedRNNCell":
        return cls(modules[0], modules)

    def _state(self, h: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
        if h is None:
            return torch.zeros(*x.shape[:-1], self.hidden_size, dtype=x.dtype, device=x.device)
        return h if h.dim() == x.dim() else h.unsqueeze(0).expand(x.shape[0], *h.shape)

    def forward(self, input: torch.Tensor, hx=None):
        batched = input.dim() == 3
        x = input if batched else input.unsqueeze(1)
        lstm = self.mode == "LSTM"
        if lstm:
            h, c = (None, None) if hx is None else hx
            hidden = (self._state(h if h is None or batched else h.unsqueeze(-2), x), self._state(c if c is None or batched else c.unsqueeze(-2), x))
        else:
            hidden = self._state(hx if hx is None or batched else hx.unsqueeze(-2), x)
        input_w = member_linear(x, self.weight_ih, self.bias_ih)
        out = _CELLS[self.mode](input_w, hidden, self.weight_hh, self.bias_hh)
        if not batched:
            out = tuple(t.squeeze(1) for t in out) if lstm else out.squeeze(1)
        return out


RNN_FUSERS = {
    nn.LSTM: FusedRNN.from_members,
    nn.GRU: FusedRNN.from_members,
    nn.RNN: FusedRNN.from_members,
    nn.LSTMCell: FusedRNNCell.from_members,
    nn.GRUCell: FusedRNNCell.from_members,
    nn.RNNCell: FusedRNNCell.from_members,
}
