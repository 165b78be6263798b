"""Fused SGD / Adam / AdamW whose every hyperparameter is a per-member [B] tensor.

PyTorch's optimizers take one `lr` per parameter group; a fused group needs one per member, per
parameter. `FusedOptimizer` lays out the parameters, the gradients and each optimizer state as
one `[B, P]` matrix each (P: the parameters of one member, flattened and concatenated; every
parameter is a view into its matrix), so a step is a dozen element-wise kernels on whole
matrices however many layers the model has (vectorised further than `torch._foreach_*`, which
still launches per tensor), a member's state is one row, and removing members is a row index.
Gradients arrive as torch hands them over (`zero_grad` clears them to None, so autograd gives
each parameter its gradient without an add) and the step gathers them into the gradient matrix
with one concatenation: before, each parameter's `.grad` was a view into that matrix and
autograd launched one add per parameter outside any compiled graph, a third of a compiled
char-GPT step's kernels.

The arithmetic follows `torch.optim.SGD/Adam/AdamW` (single-tensor path) operation by
operation, so a member trains as `hpo.base.hparams.build_torch_optimizer` would train it alone:
- learning rate of member b at its step s for parameter n: `lr_b * lr_multiplier_b[n] * lr_factor_b(s)`
  (`OptimHParams.lr_factor`, the same schedule `TrialTrainer` applies through LambdaLR);
- Adam's eps of member b for parameter n: `eps_b * eps_multiplier_b[n]` (depth scaling's per-group eps);
- per-member gradient clipping by each member's own global norm, computed as `clip_grad_norm_`
  computes it (each parameter's norm, then the norm of those: one norm over the whole row
  rounds differently);
- members never mix: every reduction is along a member's row.

Parameters are treated as `torch.optim` treats them:
- a parameter with `requires_grad=False` stays out of the matrices: nothing updates or decays
  it, and it has no state;
- a parameter whose gradient is None in a step (an unused embedding table, a head or branch
  that step did not run) is skipped in that step: no decay, no moment update, no step count
  (Adam's bias correction counts each parameter's own steps, as `state["step"]` does).
  The step reads which parameters have a `.grad`, as `torch.optim` does; it updates every
  column and then puts the skipped ones back from a device index tensor, cached per pattern,
  so the arithmetic has no per-parameter branch and a fixed pattern (as in a captured graph)
  always reuses one index.

Nothing in a step crosses from the host to the device or back: the step counts (per member,
and per parameter once some parameter has skipped a step) are device tensors that the step
advances in place, and each member's scheduled learning rate and Adam's bias corrections are
read from per-member device tables indexed by those counts. The tables hold the values torch
computes in Python (double precision) for steps 0..capacity-1, written once and grown (doubled)
when the host's count of steps taken reaches them, so float64 training stays bit-exact against
unfused runs. The arithmetic of the update (`_device_update`) is a function of device tensors
only, which `torch.compile(fullgraph=True)` takes whole (`compile_update`).

Example::

    optimizer = FusedOptimizer(dict(fused.module.named_parameters()), [OptimHParams.from_config(c) for c in configs])
    optimizer.zero_grad(); loss.backward(); optimizer.step()
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from fusion.compiled import compile_method
from fusion.layers import FusionError
from hpo.base.hparams import OptimHParams

#: Steps the schedule and bias-correction tables first hold; they double when training reaches them.
TABLE_STEPS = 512

#: The device tables `_ensure_tables` builds.
TABLES = ("_lr_table", "_bias1_table", "_bias2_table")

#: Per-optimizer state matrices, named as in `torch.optim`'s own state.
STATE_NAMES = {"sgd": ("momentum_buffer",), "adam": ("exp_avg", "exp_avg_sq"), "adamw": ("exp_avg", "exp_avg_sq")}


def optimized_names(params: Mapping[str, torch.Tensor]) -> list[str]:
    """The names of the parameters a fused optimizer steps: those that require a gradient (frozen
    ones stay out of the matrices, as torch.optim never touches them).

    A FusionError names the parameter where there is nothing to step, or a parameter the `[B, P]`
    matrices cannot hold: a complex one (its arithmetic is not the real one the step does;
    torch.optim steps it as pairs of reals), or one of another dtype than the first (a member's
    parameters are one matrix of one dtype, where torch.optim steps each in its own)."""
    names = [name for name, param in params.items() if param.requires_grad]
    if not names:
        held = f"its {len(params)} parameters are all frozen (requires_grad=False)" if params else "it has no parameters"
        raise FusionError(f"the model has nothing to train: {held}")
    first = params[names[0]]
    for name in names:
        dtype = params[name].dtype
        if dtype.is_complex:
            raise FusionError(
                f"parameter '{name}' is {dtype}, and the fused optimizer steps real parameters only; train these "
                "configurations unfused (fusion: {enabled: false})"
            )
        if dtype != first.dtype:
            raise FusionError(
                f"parameter '{name}' is {dtype} but '{names[0]}' is {first.dtype}, and the fused optimizer holds a "
                "member's parameters in one matrix of one dtype; give the model one dtype (model.to(...)) or train "
                "these configurations unfused (fusion: {enabled: false})"
            )
    return names


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
        table_steps: int = TABLE_STEPS,
    ):
        """`table_steps`: the steps the schedule tables first hold (a run that knows it takes only
        a few steps, the differential guard's, does not compute hundreds per member)."""
        self.names = optimized_names(params)
        self.params = [params[name] for name in self.names]
        #: The parameters left out as frozen: one that gets a gradient later is refused (`step`).
        self._frozen = [(name, param) for name, param in params.items() if not param.requires_grad]
        self.hparams = list(hparams)
        kinds = {hp.optimizer for hp in self.hparams}
        if len(kinds) != 1:
            raise ValueError(f"one fused optimizer needs one optimizer type; members use {sorted(kinds)}")
        self.kind = kinds.pop()
        for i, hp in enumerate(self.hparams):  # torch.optim.SGD's rule; Adam and AdamW have no Nesterov to ask for
            if hp.nesterov and hp.momentum <= 0 and self.kind == "sgd":
                raise ValueError(f"member {i}: Nesterov momentum requires momentum > 0")
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
        #: Each member's steps, counted on the host too (it never reads the device's count).
        self.steps = list(steps) if steps is not None else [0] * self.num_members
        self._sync_step_counts()
        #: `[B, n]` steps each member took on each parameter (torch's per-parameter
        #: `state["step"]`), on the device; None while that is `steps` for every parameter.
        self.param_steps: torch.Tensor | None = None
        #: Lower-precision gradients handed over by `cast_parameters`' backward since `zero_grad`.
        self._cast_grads: list[torch.Tensor | None] | None = None
        self._zeros: dict[Any, torch.Tensor] = {}
        self._skipped: dict[tuple[bool, ...], torch.Tensor] = {}
        self._stepped: dict[tuple[bool, ...], torch.Tensor] = {}
        self._table_steps = 0
        self._first_table_steps = table_steps
        self._update = self._device_update
        self.lr_multipliers = self._multiplier_matrix(lr_multipliers)
        self.weight_decay_multipliers = self._multiplier_matrix(weight_decay_multipliers)
        self.eps_multipliers = self._multiplier_matrix(eps_multipliers)
        total = self.offsets[-1]
        self.state = {
            name: torch.zeros(self.num_members, total, dtype=first.dtype, device=first.device) for name in STATE_NAMES[self.kind]
        }
        self._repack()
        self._refresh_hparams()
        self._column_param = torch.cat(
            [torch.full((self._width(i),), i, dtype=torch.long) for i in range(len(self.params))]
        ).to(first.device)
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
        #: AdamW's decay in double precision (per element with muP's multipliers), rounded once per step.
        self._decay64 = torch.tensor([hp.weight_decay for hp in hps], dtype=torch.float64, device=device).view(-1, 1)
        if self.weight_decay_multipliers is not None:  # muP: decay per element, rounded once
            self._decay64 = self._decay64 * self.weight_decay_multipliers
            self._weight_decay = self._decay64.to(dtype)
        self._momentum = column([hp.momentum for hp in hps])
        self._nesterov = torch.tensor([hp.nesterov for hp in hps], device=device).view(-1, 1)
        self._any_decay = any(hp.weight_decay != 0 for hp in hps)
        self._any_nesterov = any(hp.nesterov for hp in hps)
        self._clip = column([hp.grad_clip if hp.grad_clip > 0 else 1.0 for hp in hps])
        self._clipping = torch.tensor([hp.grad_clip > 0 for hp in hps], device=device).view(-1, 1)
        self._any_clip = any(hp.grad_clip > 0 for hp in hps)

    @torch.no_grad()
    def _repack(self) -> None:
        """Make every parameter a view into one `[B, P]` matrix, and allocate the gradient matrix and scratch.

        The step then runs on whole matrices without copying parameters in and out, and without
        allocating (large fresh CPU allocations page-fault on every step).
        """
        self._params_flat = self.flat(self.params)
        self._grads_flat = torch.zeros_like(self._params_flat)
        for param, value in zip(self.params, self.unflat(self._params_flat)):
            param.data = value
            param.grad = None
        self._scratch = [torch.empty_like(self._params_flat) for _ in range(2)]
        # each member's gradient of each parameter, member-major: what clip_grad_norm_ takes norms of
        self._member_grads = [view[b].view(-1) for b in range(self.num_members) for view in self.unflat(self._grads_flat)]
        self._skipped, self._zeros = {}, {}

    def replaced_parameters(self) -> list[str]:
        """The names of the parameters that are no longer views into the parameter matrix: code that
        gave one new storage (`param.data = ...`) cut it off from every later step."""
        matrix = self._params_flat.untyped_storage().data_ptr()
        return [name for name, param in zip(self.names, self.params) if param.untyped_storage().data_ptr() != matrix]

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
        """Clear every gradient to None (`torch.optim`'s `set_to_none`): backward then hands each
        parameter its gradient tensor as it is, with no kernel, and `step` gathers them."""
        for param in self.params:
            param.grad = None
        self._cast_grads = None

    def _gather_gradients(self) -> tuple[bool, ...]:
        """Copy the parameters' gradients into the gradient matrix in one concatenation (zeros
        where a parameter has none, and in the alignment padding); return which ones had one.

        Gradients of another dtype (bf16 steps, `cast_parameters`) are concatenated in their own
        dtype and cast once, exactly: every bf16 value is a float32 one. A step that mixes them
        with full-precision ones (a norm's weights kept fp32) casts each low one on its own."""
        cast = self._cast_grads or [None] * len(self.params)  # a parameter left uncast has its own .grad
        grads = [low if low is not None else param.grad for low, param in zip(cast, self.params)]
        received = tuple(grad is not None for grad in grads)
        dtypes = {grad.dtype for grad in grads if grad is not None}
        dtype = dtypes.pop() if len(dtypes) == 1 else self._grads_flat.dtype
        members, pieces = self.num_members, []
        for i, grad in enumerate(grads):
            if grad is None:
                pieces.append(self._zero_block(dtype, self._width(i)))
                continue
            if grad.dtype != dtype:
                grad = grad.to(dtype)
            pieces.append(grad.reshape(members, -1))
            if self._width(i) > self.sizes[i]:
                pieces.append(self._zero_block(dtype, self._width(i) - self.sizes[i]))
        if dtype == self._grads_flat.dtype:
            torch.cat(pieces, dim=1, out=self._grads_flat)
        else:
            self._grads_flat.copy_(torch.cat(pieces, dim=1))
        return received

    def _zero_block(self, dtype: torch.dtype, columns: int) -> torch.Tensor:
        """A `[B, columns]` view of zeros in `dtype`, made once (a step dispatches no op for it)."""
        if (dtype, columns) not in self._zeros:
            if dtype not in self._zeros:
                widest = max(self._width(i) for i in range(len(self.params)))
                self._zeros[dtype] = torch.zeros(self.num_members, widest, dtype=dtype, device=self._grads_flat.device)
            self._zeros[dtype, columns] = self._zeros[dtype][:, :columns]
        return self._zeros[dtype, columns]

    def current_lrs(self) -> list[float]:
        """Each member's scheduled learning rate for its next step (before lr multipliers)."""
        return [hp.lr * hp.lr_factor(step) for hp, step in zip(self.hparams, self.steps)]

    def scheduled_lrs(self, steps: int) -> list[list[float]]:
        """Each member's scheduled learning rate at steps 0..steps-1, as `current_lrs` computes it."""
        return [[hp.lr * hp.lr_factor(step) for step in range(steps)] for hp in self.hparams]

    def _sync_step_counts(self) -> None:
        """Put the host's step counts on the device (after a checkpoint or a change of members)."""
        self._step_counts = torch.tensor(self.steps, dtype=torch.long).view(-1, 1).to(self.params[0].device)

    def _ensure_tables(self) -> None:
        """`[B, S]` float64 device tables, indexed by step count: each member's scheduled lr, and
        Adam's `1 - beta1^s` and `sqrt(1 - beta2^s)` computed in Python as torch computes them (a
        count of 0 only indexes a skipped parameter's columns, which the step puts back, so any
        finite stand-in serves there). Rebuilt, doubled, only when the steps taken reach them."""
        needed = max(self.steps) + 2  # the lr at step s and the bias correction at count s + 1
        if needed <= self._table_steps:
            return
        capacity = max(self._table_steps, self._first_table_steps, 1)
        while capacity < needed:
            capacity *= 2
        device = self.params[0].device

        def table(rows: list[list[float]]) -> torch.Tensor:
            return torch.tensor(rows, dtype=torch.float64).to(device)

        self._lr_table = table(self.scheduled_lrs(capacity))
        if self.kind != "sgd":
            self._bias1_table = table([[1 - hp.beta1**s if s else 1.0 for s in range(capacity)] for hp in self.hparams])
            self._bias2_table = table([[math.sqrt(1 - hp.beta2**s) if s else 1.0 for s in range(capacity)] for hp in self.hparams])
        self._table_steps = capacity
        self._mark_static()

    def compile_update(self, **options: Any) -> None:
        """Run the update's arithmetic as one `torch.compile(fullgraph=True, **options)` graph
        (e.g. `mode="reduce-overhead"` for CUDA graphs of inductor's kernels)."""
        self._update = compile_method(self._device_update, fullgraph=True, **options)
        self._mark_static()

    def _mark_static(self) -> None:
        """Tell a compiled update (CUDA graphs above all) that the tensors it reads and updates in
        place keep their addresses between steps, so a captured graph writes into them directly
        (tensors made later, tables grown or per-parameter counts started, are marked then)."""
        if self._update == self._device_update:
            return
        persistent = [*self.tensors(), self._step_counts, self.param_steps, *(getattr(self, n, None) for n in TABLES)]
        for tensor in persistent:
            if tensor is not None:
                torch._dynamo.mark_static_address(tensor, guard=False)

    @torch.no_grad()
    def step(self) -> None:
        """One optimizer step for every member, each with its own schedule, clipping and state;
        parameters without a gradient are left as they are (see the module doc)."""
        received = self._gather_gradients()
        for name, param in self._frozen:
            if param.grad is not None:  # torch.optim holds it and would step it from here on; the matrices do not
                raise FusionError(
                    f"parameter '{name}' was frozen when the group formed and has a gradient at step {max(self.steps) + 1} "
                    "(requires_grad turned on during training), which the fused optimizer, holding only the parameters "
                    "trainable at the start, would never apply; unfreeze it in the model factory, or train these "
                    "configurations unfused (fusion: {enabled: false})"
                )
        if not any(received):  # the schedule moves on, as LambdaLR's does; no parameter stepped
            self._keep_param_steps()
            self._step_counts += 1
            self.steps = [s + 1 for s in self.steps]
            return
        self._ensure_tables()
        if self._any_clip:
            self._clip_gradients(received)
        stepped = skipped = None
        if not all(received):
            self._keep_param_steps()
            stepped = self._stepped_params(received)
            skipped = self._skipped_columns(received)
        self._update(stepped, skipped)
        self.steps = [s + 1 for s in self.steps]

    def _device_update(self, stepped: torch.Tensor | None, skipped: torch.Tensor | None) -> None:
        """The step's arithmetic, on device tensors only: advance the step counts, read the
        schedule and bias corrections at them, update, and put the skipped columns back."""
        params, grads = self._params_flat, self._grads_flat
        kept = None if skipped is None else [t.index_select(1, skipped) for t in (params, *self.state.values())]
        lr = self._lr_table.gather(1, self._step_counts)
        self._step_counts += 1
        counts = self._count_steps(stepped)
        if self.kind == "sgd":
            self._sgd(params, grads, lr)
        else:
            self._adam(params, grads, lr, counts)
        if kept is not None:
            for matrix, columns in zip((params, *self.state.values()), kept):
                matrix.index_copy_(1, skipped, columns)

    def _clip_gradients(self, received: tuple[bool, ...]) -> None:
        """torch.nn.utils.clip_grad_norm_ per member over the parameters that have a gradient:
        the norm of the per-parameter norms; coef = max_norm / (norm + 1e-6) (as torch computes
        a float over a tensor: reciprocal, then product), clamped at 1."""
        count = len(self.params)
        views = [view for j, view in enumerate(self._member_grads) if received[j % count]]
        norms = torch.stack(torch._foreach_norm(views)).view(self.num_members, -1)
        self.last_grad_norms = torch.linalg.vector_norm(norms, dim=1, keepdim=True)
        coef = torch.clamp((self.last_grad_norms + 1e-6).reciprocal() * self._clip, max=1.0)
        self._grads_flat.mul_(torch.where(self._clipping, coef, 1.0))

    def _count_steps(self, stepped: torch.Tensor | None) -> torch.Tensor:
        """Advance the per-parameter step counts (of the `stepped` parameters; None: all); return
        the counts Adam's bias correction uses: the member's (`[B, 1]`) while every parameter has
        taken every step, else each parameter's (`[B, n]`)."""
        if self.param_steps is None:
            return self._step_counts
        if stepped is None:
            self.param_steps += 1
        else:
            self.param_steps.index_add_(1, stepped, torch.ones_like(self.param_steps).index_select(1, stepped))
        return self.param_steps

    def _at(self, table: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """A `[B, S]` table's values at `_count_steps`' counts: `[B, 1]`, or per parameter spread
        over the parameter's columns (`[B, P]`)."""
        values = table.gather(1, counts)
        return values if self.param_steps is None else values.index_select(1, self._column_param)

    def _keep_param_steps(self) -> None:
        """Start counting steps per parameter (until now each parameter's count was its member's)."""
        if self.param_steps is None:
            self.param_steps = self._step_counts.repeat(1, len(self.params))
            self._mark_static()

    def _stepped_params(self, received: tuple[bool, ...]) -> torch.Tensor:
        """The indices of the parameters with a gradient, on the device (cached per pattern)."""
        if received not in self._stepped:
            self._stepped[received] = torch.tensor([i for i, got in enumerate(received) if got]).to(self.params[0].device)
        return self._stepped[received]

    def _skipped_columns(self, received: tuple[bool, ...]) -> torch.Tensor:
        """The matrix columns of the parameters without a gradient (their padding included), on the device."""
        if received not in self._skipped:
            columns = [torch.arange(self.offsets[i], self.offsets[i + 1]) for i, got in enumerate(received) if not got]
            self._skipped[received] = torch.cat(columns).to(self.params[0].device)
        return self._skipped[received]

    def _scaled(self, values: torch.Tensor) -> torch.Tensor:
        """An lr-scaled float64 quantity (`[B, 1]` or `[B, P]`) times the lr multipliers, if any,
        rounded once to the parameters' dtype, as torch rounds its Python-float lr."""
        if self.lr_multipliers is not None:
            values = values * self.lr_multipliers
        return values.to(self.params[0].dtype)

    # `x.add(y, alpha=a)` is emulated as `torch.addcmul(x, y, a)` and `x.addcdiv(y, z, value=v)`
    # as `x.addcdiv(v * y, z)`: with [B]-shaped a and v these round exactly as torch's scalar forms.
    # The gradient matrix is consumed by the step, so weight decay is added to it in place.

    def _sgd(self, params: torch.Tensor, grads: torch.Tensor, lr: torch.Tensor) -> None:
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
        params.addcmul_(update, self._scaled(lr.neg()))

    def _adam(self, params: torch.Tensor, grads: torch.Tensor, lr: torch.Tensor, counts: torch.Tensor) -> None:
        # `-lr / (1 - beta1^s)` and `sqrt(1 - beta2^s)`, in double precision as torch computes them
        neg_step = self._scaled(lr.neg() / self._at(self._bias1_table, counts))
        correction2 = self._at(self._bias2_table, counts).to(params.dtype)
        if self.kind == "adamw" and self._any_decay:
            scaled_lr = lr if self.lr_multipliers is None else lr * self.lr_multipliers
            params.mul_((1 - scaled_lr * self._decay64).to(params.dtype))
        elif self.kind == "adam" and self._any_decay:
            grads.addcmul_(params, self._weight_decay)
        exp_avg, exp_avg_sq = self.state["exp_avg"], self.state["exp_avg_sq"]
        scaled, denom = self._scratch
        exp_avg.lerp_(grads, self._one_minus_beta1)
        exp_avg_sq.mul_(self._beta2).addcmul_(torch.mul(grads, self._one_minus_beta2, out=scaled), grads)
        torch.sqrt(exp_avg_sq, out=denom).div_(correction2).add_(self._eps)
        params.addcdiv_(torch.mul(exp_avg, neg_step, out=scaled), denom)

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
        self._sync_step_counts()
        if self.param_steps is not None:
            self.param_steps = self.param_steps[rows]
        self.num_members = len(index)
        self._table_steps = 0  # the tables are rebuilt for the members kept
        self._repack()
        self._refresh_hparams()
        self._mark_static()

    def member_param_steps(self, index: int) -> list[int]:
        """The steps member `index` took on each parameter (in `names` order)."""
        if self.param_steps is None:
            return [self.steps[index]] * len(self.params)
        return self.param_steps[index].tolist()

    def member_state(self, index: int) -> dict[str, Any]:
        """Member `index`'s state: its step and, per parameter name that has stepped (as in
        torch.optim, a parameter that never had a gradient has no state), its step count and
        state tensors."""
        steps = dict(zip(self.names, self.member_param_steps(index)))
        per_param: dict[str, dict[str, Any]] = {name: {"step": steps[name]} for name in self.names if steps[name]}
        for state_name, matrix in self.state.items():
            for name, view in zip(self.names, self.unflat(matrix)):
                if name in per_param:
                    per_param[name][state_name] = view[index].clone()
        return {"step": self.steps[index], "params": per_param}

    @torch.no_grad()
    def load_member_state(self, index: int, state: Mapping[str, Any]) -> None:
        """Member `index`'s state from `member_state`'s shape; a parameter without state starts
        fresh (no steps, zero moments), as in torch.optim. A parameter's step defaults to the
        member's where the state has moments but no count (SGD's momentum buffer)."""
        self.steps[index] = int(state["step"])
        self._step_counts[index] = self.steps[index]
        steps = []
        for name in self.names:
            own = state["params"].get(name, {})
            steps.append(int(own.get("step", self.steps[index])) if own else 0)
        if self.param_steps is not None or steps != [self.steps[index]] * len(steps):
            self._keep_param_steps()
            self.param_steps[index] = torch.tensor(steps).to(self.param_steps.device)
        for state_name, matrix in self.state.items():
            for name, view in zip(self.names, self.unflat(matrix)):
                value = state["params"].get(name, {}).get(state_name)
                view[index].copy_(value if value is not None else torch.zeros_like(view[index]))

    def cast_parameters(self, dtype: torch.dtype) -> dict[int, torch.Tensor]:
        """Every optimized parameter in `dtype` for one step, by the id of its (master) parameter.

        One cast of the whole `[B, P]` matrix instead of one per weight and use: the forward and
        backward run on views of that copy, and the step gathers their gradients into the master
        gradient matrix with one concatenation and one cast, so the update and its state stay in
        full precision."""
        return dict(zip(map(id, self.params), _CastOnce.apply(self, dtype, *self.params)))

    def _accumulate(self, grads: Sequence[torch.Tensor | None]) -> None:
        """Keep lower-precision gradients for `step` to gather; a second backward in the same step
        adds to them in the master dtype, as adding each into a zeroed master gradient would."""
        if self._cast_grads is None:
            self._cast_grads = list(grads)
            return
        master = self._grads_flat.dtype
        self._cast_grads = [
            old if new is None else new if old is None else old.to(master) + new.to(master)
            for old, new in zip(self._cast_grads, grads)
        ]

    def tensors(self) -> list[torch.Tensor]:
        """Every matrix the optimizer holds: parameters, gradients, state and scratch (for sizing)."""
        return [self._params_flat, self._grads_flat, *self.state.values(), *self._scratch]

    def state_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "steps": list(self.steps),
            "param_steps": None if self.param_steps is None else self.param_steps.cpu(),
            "state": {k: v.clone() for k, v in self.state.items()},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state["kind"] != self.kind:
            raise ValueError(f"optimizer state is for {state['kind']!r}, this optimizer is {self.kind!r}")
        self.steps = list(state["steps"])
        param_steps = state.get("param_steps")  # absent in checkpoints from before per-parameter counts
        self._sync_step_counts()
        self.param_steps = None if param_steps is None else param_steps.to(self.params[0].device, copy=True)
        for name, matrix in state["state"].items():
            self.state[name].copy_(matrix)
        self._mark_static()


class _CastOnce(torch.autograd.Function):
    """Views of one lower-precision copy of the parameter matrix, differentiable to each parameter.

    A parameter that the forward leaves unused gets no gradient (not a zero one), so its step is
    skipped exactly as in full precision."""

    @staticmethod
    def forward(ctx, optimizer: FusedOptimizer, dtype: torch.dtype, *params: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.set_materialize_grads(False)
        ctx.optimizer = optimizer
        return tuple(optimizer.unflat(optimizer._params_flat.to(dtype)))

    @staticmethod
    def backward(ctx, *grads: torch.Tensor | None):
        ctx.optimizer._accumulate(grads)
        return None, None, *(None for _ in grads)
