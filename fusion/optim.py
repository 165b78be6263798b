"""Fused SGD / Adam / AdamW whose every hyperparameter is a per-member [B] tensor.

PyTorch's optimizers take one `lr` per parameter group; a fused group needs one per member, per
parameter. `FusedOptimizer` lays out the parameters, the gradients and each optimizer state as
one `[B, P]` matrix each (P: the parameters of one member, flattened and concatenated; every
parameter and its `.grad` are views into them), so a step is a dozen element-wise kernels on
whole matrices however many layers the model has (vectorised further than `torch._foreach_*`,
which still launches per tensor), a member's state is one row, and removing members is a row
index.

The arithmetic follows `torch.optim.SGD/Adam/AdamW` (single-tensor path) operation by
operation, so a member trains as `hpo.base.hparams.build_torch_optimizer` would train it alone:
- learning rate of member b at its step s for parameter n: `lr_b * lr_multiplier_b[n] * lr_factor_b(s)`
  (`OptimHParams.lr_factor`, the same schedule `TrialTrainer` applies through LambdaLR);
- Adam's eps of member b for parameter n: `eps_b * eps_multiplier_b[n]` (depth scaling's per-group eps);
- per-member gradient clipping by each member's own global norm (`clip_grad_norm_`'s formula);
- members never mix: every reduction is along a member's row.

Parameters whose gradient is None in a step are treated as having a zero gradient (PyTorch
would skip them); every layer of the supported workloads receives a gradient every step.

Example::

    optimizer = FusedOptimizer(dict(fused.module.named_parameters()), [OptimHParams.from_config(c) for c in configs])
    loss.backward(); optimizer.step(); optimizer.zero_grad()
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import torch

# Gradients are views into the gradient matrix by design (see `_repack`); autograd's note that
# such views do not match its preferred layout is about speed, not correctness.
warnings.filterwarnings("ignore", message="grad and param do not obey the gradient layout contract")

from hpo.base.hparams import OptimHParams

#: Per-optimizer state matrices, named as in `torch.optim`'s own state.
STATE_NAMES = {"sgd": ("momentum_buffer",), "adam": ("exp_avg", "exp_avg_sq"), "adamw": ("exp_avg", "exp_avg_sq")}


class FusedOptimizer:
    """One optimizer for B members; `params` maps member parameter names to `[B, ...]` tensors."""

    def __init__(
        self,
        params: Mapping[str, torch.nn.Parameter],
        hparams: Sequence[OptimHParams],
        lr_multipliers: Sequence[Mapping[str, float]] | None = None,
        steps: Sequence[int] | None = None,
        weight_decay_multipliers: Sequence[Mapping[str, float]] | None = None,
        eps_multipliers: Sequence[Mapping[str, float]] | None = None,
    ):
        self.names = list(params)
        self.params = [params[name] for name in self.names]
        self.hparams = list(hparams)
        kinds = {hp.optimizer for hp in self.hparams}
        if len(kinds) != 1:
            raise ValueError(f"one fused optimizer needs one optimizer type; members use {sorted(kinds)}")
        self.kind = kinds.pop()
        for i, hp in enumerate(self.hparams):
            if hp.nesterov and (hp.momentum <= 0 or self.kind != "sgd"):
                raise ValueError(f"member {i}: Nesterov momentum requires optimizer 'sgd' and momentum > 0")
        dtypes = {p.dtype for p in self.params}
        if len(dtypes) != 1:
            raise ValueError(f"fused parameters must share one dtype, got {sorted(map(str, dtypes))}")
        first = self.params[0]
        self.num_members = first.shape[0]
        if len(self.hparams) != self.num_members:
            raise ValueError(f"{len(self.hparams)} hyperparameter sets for {self.num_members} members")
        self.sizes = [p[0].numel() for p in self.params]
        # Every member's every parameter starts on a 64-byte boundary, as a freshly allocated
        # unfused parameter does: MKL's GEMM kernels round differently on unaligned operands.
        align = max(64 // first.element_size(), 1)
        self.offsets = [0]
        for size in self.sizes:
            self.offsets.append(self.offsets[-1] + -(-size // align) * align)
        self.steps = list(steps) if steps is not None else [0] * self.num_members
        self.lr_multipliers = self._multiplier_matrix(lr_multipliers)
        self.weight_decay_multipliers = self._multiplier_matrix(weight_decay_multipliers)
        self.eps_multipliers = self._multiplier_matrix(eps_multipliers)
        total = self.offsets[-1]
        self.state = {
            name: torch.zeros(self.num_members, total, dtype=first.dtype, device=first.device) for name in STATE_NAMES[self.kind]
        }
        self._repack()
        self._refresh_hparams()
        #: Each member's global gradient norm at the last step (before clipping).
        self.last_grad_norms: torch.Tensor | None = None

    # -- layout --------------------------------------------------------------------------------

    def _multiplier_matrix(self, multipliers: Sequence[Mapping[str, float]] | None) -> torch.Tensor | None:
        """`[B or 1, P]` per-element multipliers (float64), or None when every multiplier is 1."""
        if not multipliers or all(all(float(v) == 1.0 for v in m.values()) for m in multipliers):
            return None
        rows = []
        for member in multipliers:
            rows.append(torch.cat([torch.full((self._width(i),), float(member.get(name, 1.0))) for i, name in enumerate(self.names)]))
        matrix = torch.stack(rows).double()
        if all(torch.equal(row, matrix[0]) for row in matrix[1:]):
            matrix = matrix[:1]
        return matrix.to(self.params[0].device)

    def _refresh_hparams(self) -> None:
        device, dtype = self.params[0].device, self.params[0].dtype

        def column(values: list[float]) -> torch.Tensor:
            return torch.tensor(values, dtype=dtype).view(-1, 1).to(device)

        hps = self.hparams
        self._beta1 = column([hp.beta1 for hp in hps])
        self._one_minus_beta1 = column([1 - hp.beta1 for hp in hps])
        self._beta2 = column([hp.beta2 for hp in hps])
        self._one_minus_beta2 = column([1 - hp.beta2 for hp in hps])
        self._eps = column([hp.eps for hp in hps])
        if self.eps_multipliers is not None:  # per element, in double and rounded once, as torch rounds a group's eps
            eps = torch.tensor([hp.eps for hp in hps], dtype=torch.float64, device=device).view(-1, 1)
            self._eps = (eps * self.eps_multipliers).to(dtype)
        self._weight_decay = column([hp.weight_decay for hp in hps])
        if self.weight_decay_multipliers is not None:  # muP: decay per element, rounded once
            self._weight_decay = self._decay_matrix().to(dtype)
        self._momentum = column([hp.momentum for hp in hps])
        self._nesterov = torch.tensor([hp.nesterov for hp in hps], device=device).view(-1, 1)
        self._any_decay = any(hp.weight_decay != 0 for hp in hps)
        self._any_nesterov = any(hp.nesterov for hp in hps)
        self._clip = column([hp.grad_clip if hp.grad_clip > 0 else math.inf for hp in hps])
        self._any_clip = any(hp.grad_clip > 0 for hp in hps)

    @torch.no_grad()
    def _repack(self) -> None:
        """Make every parameter and gradient a view into one `[B, P]` matrix, and allocate scratch.

        The step then runs on whole matrices without copying parameters in and out, and without
        allocating (large fresh CPU allocations page-fault on every step).
        """
        self._params_flat = self.flat(self.params)
        self._grads_flat = torch.zeros_like(self._params_flat)
        self._grad_views = self.unflat(self._grads_flat)
        for param, value, grad in zip(self.params, self.unflat(self._params_flat), self._grad_views):
            param.data = value
            param.grad = grad
        self._scratch = [torch.empty_like(self._params_flat) for _ in range(2)]

    def _width(self, i: int) -> int:
        """Columns of parameter i in the matrix: its size plus the zero padding that aligns the next."""
        return self.offsets[i + 1] - self.offsets[i]

    def flat(self, tensors: Sequence[torch.Tensor | None]) -> torch.Tensor:
        """Concatenate per-parameter `[B, ...]` tensors into one `[B, P]` matrix (None: zeros)."""
        members, p0 = self.num_members, self.params[0]
        matrix = torch.zeros(members, self.offsets[-1], dtype=p0.dtype, device=p0.device)
        for t, start, size in zip(tensors, self.offsets, self.sizes):
            if t is not None:
                matrix[:, start : start + size] = t.reshape(members, -1)
        return matrix

    def unflat(self, matrix: torch.Tensor) -> list[torch.Tensor]:
        """Views of a `[B, P]` matrix shaped like each parameter (padding columns left out)."""
        return [matrix[:, start : start + size].view(p.shape) for start, size, p in zip(self.offsets, self.sizes, self.params)]

    # -- stepping ------------------------------------------------------------------------------

    def zero_grad(self) -> None:
        """Zero the gradient matrix; autograd then accumulates into it in place."""
        self._grads_flat.zero_()
        for param, grad in zip(self.params, self._grad_views):
            if param.grad is None or param.grad.data_ptr() != grad.data_ptr():
                param.grad = grad

    def current_lrs(self) -> list[float]:
        """Each member's scheduled learning rate for its next step (before lr multipliers)."""
        return [hp.lr * hp.lr_factor(step) for hp, step in zip(self.hparams, self.steps)]

    def _column(self, values: list[float]) -> torch.Tensor:
        return self._columns(values)[0]

    def _columns(self, *values: list[float]) -> list[torch.Tensor]:
        """`[B, 1]` columns of per-member scalars, sent to the device in one transfer."""
        table = torch.tensor(values, dtype=self.params[0].dtype).view(len(values), -1, 1)
        return list(table.to(self.params[0].device, non_blocking=True).unbind(0))

    def _decay_matrix(self) -> torch.Tensor:
        """Each member's weight decay times the per-element multipliers, in double precision."""
        wd = torch.tensor([hp.weight_decay for hp in self.hparams], dtype=torch.float64, device=self.params[0].device)
        return wd.view(-1, 1) * self.weight_decay_multipliers

    def _per_member(self, values: list[float], transform=None) -> torch.Tensor:
        """An lr-scaled quantity per member (`[B, 1]`), or per element (`[B, P]`) with lr multipliers.

        Computed in double precision and rounded once, as torch rounds its Python-float lr."""
        if self.lr_multipliers is None:
            return self._column([transform(v) for v in values] if transform else values)
        device, dtype = self.params[0].device, self.params[0].dtype
        scaled = torch.tensor(values, dtype=torch.float64, device=device).view(-1, 1) * self.lr_multipliers
        return (transform(scaled) if transform else scaled).to(dtype)

    @torch.no_grad()
    def step(self) -> None:
        """One optimizer step for every member, each with its own schedule, clipping and state."""
        grads, params = self._grads_flat, self._params_flat
        for param, grad in zip(self.params, self._grad_views):
            if param.grad is not None and param.grad.data_ptr() != grad.data_ptr():
                grad.copy_(param.grad)  # someone replaced .grad; take it into the matrix
        if self._any_clip:
            # torch.nn.utils.clip_grad_norm_: coef = max_norm / (norm + 1e-6), clamped at 1.
            self.last_grad_norms = torch.linalg.vector_norm(grads, dim=1, keepdim=True)
            grads.mul_(torch.clamp(self._clip / (self.last_grad_norms + 1e-6), max=1.0))
        lrs = self.current_lrs()
        if self.kind == "sgd":
            self._sgd(params, grads, lrs)
        else:
            self._adam(params, grads, lrs)
        self.steps = [s + 1 for s in self.steps]

    # `x.add(y, alpha=a)` is emulated as `torch.addcmul(x, y, a)` and `x.addcdiv(y, z, value=v)`
    # as `x.addcdiv(v * y, z)`: with [B]-shaped a and v these round exactly as torch's scalar forms.
    # The gradient matrix is consumed by the step, so weight decay is added to it in place.

    def _sgd(self, params: torch.Tensor, grads: torch.Tensor, lrs: list[float]) -> None:
        if self._any_decay:
            grads.addcmul_(params, self._weight_decay)
        buffer = self.state["momentum_buffer"]
        # The first step's buffer is the gradient itself: 0 * momentum + grad, as torch clones it;
        # with momentum 0 the buffer is just the gradient, as torch uses it.
        buffer.mul_(self._momentum).add_(grads)
        update = buffer
        if self._any_nesterov:
            update = torch.addcmul(grads, buffer, self._momentum, out=self._scratch[0])
            torch.where(self._nesterov, update, buffer, out=update)
        params.addcmul_(update, self._per_member([-lr for lr in lrs]))

    def _adam(self, params: torch.Tensor, grads: torch.Tensor, lrs: list[float]) -> None:
        steps = [s + 1 for s in self.steps]
        # Bias corrections and step sizes in double precision, as torch computes them in Python.
        neg_step = [-lr / (1 - hp.beta1**s) for lr, hp, s in zip(lrs, self.hparams, steps)]
        correction2_sqrt = [math.sqrt(1 - hp.beta2**s) for hp, s in zip(self.hparams, steps)]
        decoupled = self.kind == "adamw" and self._any_decay
        if self.lr_multipliers is None and self.weight_decay_multipliers is None:
            decay = [1 - lr * hp.weight_decay for lr, hp in zip(lrs, self.hparams)]
            neg_step_t, correction2_t, decay_t = self._columns(neg_step, correction2_sqrt, decay)
        else:
            (correction2_t,) = self._columns(correction2_sqrt)
            neg_step_t = self._per_member(neg_step)
            if decoupled:
                if self.weight_decay_multipliers is None:
                    wd = torch.tensor([hp.weight_decay for hp in self.hparams], dtype=torch.float64, device=params.device)
                    wd = wd.view(-1, 1)
                else:
                    wd = self._decay_matrix()
                lr = torch.tensor(lrs, dtype=torch.float64, device=params.device).view(-1, 1)
                if self.lr_multipliers is not None:
                    lr = lr * self.lr_multipliers
                decay_t = (1 - lr * wd).to(params.dtype)
        if decoupled:
            params.mul_(decay_t)
        elif self.kind == "adam" and self._any_decay:
            grads.addcmul_(params, self._weight_decay)
        exp_avg, exp_avg_sq = self.state["exp_avg"], self.state["exp_avg_sq"]
        scaled, denom = self._scratch
        exp_avg.lerp_(grads, self._one_minus_beta1)
        exp_avg_sq.mul_(self._beta2).addcmul_(torch.mul(grads, self._one_minus_beta2, out=scaled), grads)
        torch.sqrt(exp_avg_sq, out=denom).div_(correction2_t).add_(self._eps)
        params.addcdiv_(torch.mul(exp_avg, neg_step_t, out=scaled), denom)

    # -- members -------------------------------------------------------------------------------

    def select_members(self, index: Sequence[int]) -> None:
        """Keep members at `index`, in that order (call after the model's `select_members`, which
        already re-indexed the parameters; this re-indexes the state and repacks)."""
        index = list(index)
        rows = torch.as_tensor(index, dtype=torch.long, device=self.params[0].device)
        self.state = {name: matrix[rows] for name, matrix in self.state.items()}
        if self.lr_multipliers is not None and self.lr_multipliers.shape[0] > 1:
            self.lr_multipliers = self.lr_multipliers[rows]
        if self.weight_decay_multipliers is not None and self.weight_decay_multipliers.shape[0] > 1:
            self.weight_decay_multipliers = self.weight_decay_multipliers[rows]
        if self.eps_multipliers is not None and self.eps_multipliers.shape[0] > 1:
            self.eps_multipliers = self.eps_multipliers[rows]
        self.hparams = [self.hparams[i] for i in index]
        self.steps = [self.steps[i] for i in index]
        self.num_members = len(index)
        self._repack()
        self._refresh_hparams()

    def member_state(self, index: int) -> dict[str, Any]:
        """Member `index`'s state: its step and, per parameter name, its state tensors."""
        per_param: dict[str, dict[str, torch.Tensor]] = {name: {} for name in self.names}
        for state_name, matrix in self.state.items():
            for name, view in zip(self.names, self.unflat(matrix)):
                per_param[name][state_name] = view[index].clone()
        return {"step": self.steps[index], "params": per_param}

    @torch.no_grad()
    def load_member_state(self, index: int, state: Mapping[str, Any]) -> None:
        self.steps[index] = int(state["step"])
        for state_name, matrix in self.state.items():
            for name, view in zip(self.names, self.unflat(matrix)):
                value = state["params"].get(name, {}).get(state_name)
                view[index].copy_(value if value is not None else torch.zeros_like(view[index]))

    def tensors(self) -> list[torch.Tensor]:
        """Every matrix the optimizer holds: parameters, gradients, state and scratch (for sizing)."""
        return [self._params_flat, self._grads_flat, *self.state.values(), *self._scratch]

    def state_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "steps": list(self.steps), "state": {k: v.clone() for k, v in self.state.items()}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state["kind"] != self.kind:
            raise ValueError(f"optimizer state is for {state['kind']!r}, this optimizer is {self.kind!r}")
        self.steps = list(state["steps"])
        for name, matrix in state["state"].items():
            self.state[name].copy_(matrix)
