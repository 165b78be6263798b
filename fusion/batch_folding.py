"""The stacked path's layout: the members folded into the batch dimension of the user's code.

The user's `forward` code (its own modules, `nn.Sequential`, `nn.Transformer*` layers) runs once
on one batch of B*N samples, member-major: member b's samples are rows b*N .. b*N+N-1 of every
batch dimension. So code that reads shapes, indexes positions or builds tensors from them
(`b, t, c = x.size()`, `torch.arange(t)`, `out[:, -1]`, `h_n[-1]`, `x.view(x.size(0), -1)`,
a causal mask from `t`) computes what it computes unfused, and pooling, dropout, flattening and
`scaled_dot_product_attention` run on the layouts they expect. Only the layers that hold weights
(`fusion.layers`, `fusion.stacked_attention`, `fusion.stacked_rnn`) see the members, as a
leading dimension: hooks unfold each such layer's inputs to `[B, *member_shape]` and fold its
outputs back.

Where a tensor entering or leaving such a layer has its batch dimension is not in the code, so
it is measured once (`measure_layouts`): member 0 runs on the example batch and on one sample
more, in train and eval mode, and the one dimension whose size grows with the batch is the
batch dimension (a multiple of it where the code merged the batch with another dimension,
batch outermost); a tensor whose shape does not change has none (a mask built from the
sequence length, positions from `torch.arange`). A layer that gets such a tensor as its main
(positional) input gets it expanded to every member. A per-member output without a batch
dimension (a position table looked up at `arange(T)`) is given one, in front, repeating each
member's value over its samples: broadcasting it against the batch (`tokens + positions`)
then gives each member its own. Code that needs it without one is caught by the checks that
follow (`fusion.model`) and takes the vmap path instead.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from fusion.independence import preserved_state
from fusion.layers import describe_error

#: How one tensor is laid out: its rank in a member's own run, and its batch dimension (None: none).
Spec = tuple[int, int | None]


class Unfoldable(Exception):
    """The model's batch dimension cannot be followed through some layer (the reason says where)."""


def map_tensors(value: Any, fn: Callable[[torch.Tensor, int], Any], counter: list[int] | None = None) -> Any:
    """`value` with every tensor t in it (nested in tuples, lists, dicts) replaced by `fn(t, i)`,
    i counting the tensors in visiting order."""
    counter = [0] if counter is None else counter
    if isinstance(value, torch.Tensor):
        counter[0] += 1
        return fn(value, counter[0] - 1)
    if isinstance(value, tuple):
        items = [map_tensors(item, fn, counter) for item in value]
        return type(value)._make(items) if hasattr(value, "_fields") else tuple(items)
    if isinstance(value, list):
        return [map_tensors(item, fn, counter) for item in value]
    if isinstance(value, dict):
        return {key: map_tensors(item, fn, counter) for key, item in value.items()}
    return value


def _shapes(value: Any) -> list[tuple[int, ...]]:
    shapes: list[tuple[int, ...]] = []
    map_tensors(value, lambda t, i: shapes.append(tuple(t.shape)))
    return shapes


@dataclass(frozen=True)
class Layout:
    """Batch dimensions of one layer call: positional inputs, keyword inputs, outputs."""

    args: tuple[Spec, ...]
    kwargs: tuple[Spec, ...]
    outputs: tuple[Spec, ...]

    def fits(self, args: tuple, kwargs: dict) -> bool:
        """Whether a call's tensors are those this layout was measured with (a layer called two
        ways, `cell(x)` then `cell(x, (h, c))`, has a layout per way)."""
        ranks: list[int] = []
        map_tensors((args, kwargs), lambda t, i: ranks.append(t.dim()))
        specs = self.args + self.kwargs
        return len(ranks) == len(specs) and all(r == rank or (dim is None and r == rank + 1) for r, (rank, dim) in zip(ranks, specs))


def _spec(small: tuple[int, ...], large: tuple[int, ...], samples: int) -> Spec:
    """The batch dimension of a tensor seen at `samples` and `samples + 1` samples."""
    if len(small) != len(large):
        raise Unfoldable(f"a tensor's rank changes with the batch size ({small} vs {large})")
    grown = [d for d, (a, b) in enumerate(zip(small, large)) if a != b]
    if not grown:
        return len(small), None
    if len(grown) == 1:
        d = grown[0]
        if small[d] % samples == 0 and large[d] % (samples + 1) == 0 and small[d] // samples == large[d] // (samples + 1):
            return len(small), d
    raise Unfoldable(f"a tensor's shape grows with the batch in a way fusion cannot follow ({small} vs {large})")


def _specs(small: list[tuple[int, ...]], large: list[tuple[int, ...]], samples: int) -> tuple[Spec, ...]:
    if len(small) != len(large):
        raise Unfoldable("a layer takes or returns a different number of tensors at another batch size")
    return tuple(_spec(a, b, samples) for a, b in zip(small, large))


def measure_layouts(
    model: nn.Module, example_input: torch.Tensor, leaves: set[int]
) -> tuple[dict[str, tuple[Layout, ...]], tuple[Spec, ...]]:
    """Each module's `Layout`s (by its first path; one per way it is called) and the model's
    output specs, measured on `model` (a member; left as it was). Raises `Unfoldable` naming the
    layer whose batch dimension cannot be followed; only the layers in `leaves` (module ids)
    must be followable."""
    paths = {}
    for path, module in model.named_modules():
        paths.setdefault(id(module), path)
    samples = example_input.shape[0]
    larger = torch.cat([example_input, example_input[-1:]])
    runs: list[tuple[dict[str, list], Any]] = []
    for training in (False, True):
        for x in (example_input, larger):
            calls: dict[str, list] = {}

            def leave(module: nn.Module, args: Any, kwargs: Any, output: Any, calls=calls) -> None:
                calls.setdefault(paths[id(module)], []).append((_shapes(args), _shapes(kwargs), _shapes(output)))

            handles = [m.register_forward_hook(leave, with_kwargs=True) for m in model.modules()]
            try:
                with preserved_state(model), torch.no_grad():
                    model.train(training)
                    output = model(x)
            except Exception as error:
                where = "the example batch" if x is example_input else "a batch one sample larger"
                raise Unfoldable(f"member 0 does not run on {where}: {describe_error(error)}") from error
            finally:
                for handle in handles:
                    handle.remove()
            runs.append((calls, output))
    layouts: dict[str, tuple[Layout, ...]] = {}
    for path in dict.fromkeys(path for calls, _ in runs for path in calls):  # called in either mode
        must = id(model.get_submodule(path)) in leaves
        try:
            found = set()
            for small, large in ((runs[0][0], runs[1][0]), (runs[2][0], runs[3][0])):
                if len(small.get(path, ())) != len(large.get(path, ())):
                    raise Unfoldable("it is called a different number of times at another batch size")
                for (a_args, a_kwargs, a_out), (b_args, b_kwargs, b_out) in zip(small.get(path, ()), large.get(path, ())):
                    found.add(Layout(_specs(a_args, b_args, samples), _specs(a_kwargs, b_kwargs, samples), _specs(a_out, b_out, samples)))
            ways = tuple(sorted(found, key=repr))
            if any(a != b and _same_call(a, b) for a in ways for b in ways):
                raise Unfoldable("its calls with the same inputs lay out the batch differently")
            layouts[path] = ways
        except Unfoldable as reason:
            if must:
                kind = type(model.get_submodule(path)).__name__
                raise Unfoldable(f"layer '{path or '<root>'}' ({kind}): {reason}") from reason
    try:
        outputs = _specs(_shapes(runs[0][1]), _shapes(runs[1][1]), samples)
    except Unfoldable as reason:
        raise Unfoldable(f"the model's output: {reason}") from reason
    return layouts, outputs


def _same_call(a: Layout, b: Layout) -> bool:
    """Whether two layouts take tensors of the same ranks (a call could not tell them apart)."""
    return [rank for rank, _ in a.args + a.kwargs] == [rank for rank, _ in b.args + b.kwargs]


class Batch:
    """The current fused forward's members and samples, shared by every layer's hooks."""

    members: int = 0
    samples: int = 0

    def fold_input(self, xs: torch.Tensor) -> torch.Tensor:
        """`[B, N, ...]` member inputs -> one `[B*N, ...]` batch."""
        self.members, self.samples = xs.shape[0], xs.shape[1]
        return xs.flatten(0, 1)

    def unfold(self, t: torch.Tensor, spec: Spec, expand: bool = True) -> torch.Tensor:
        """A folded tensor of the user's code -> `[B, *member_shape]`; one without a batch
        dimension is expanded to every member, or with `expand=False` left shared."""
        rank, dim = spec
        members = self.members
        if dim is None:
            if t.dim() == rank + 1:  # given a batch dimension by `fold` below: one row per member
                return t.unflatten(0, (members, -1))[:, 0]
            if t.dim() == rank:
                return t.unsqueeze(0).expand(members, *t.shape) if expand else t
        elif t.dim() == rank:
            if dim == 0:
                return t.unflatten(0, (members, -1))
            # per member as contiguous as the member's own tensor would be (F.linear adds its
            # bias inside the GEMM only for a contiguous input)
            unfolded = t.unflatten(dim, (members, -1)).movedim(dim, 0)
            return unfolded.contiguous() if t.is_contiguous() else unfolded
        raise RuntimeError(f"a tensor of shape {tuple(t.shape)} does not have the layout measured for this layer ({spec})")

    def fold(self, t: torch.Tensor, spec: Spec) -> torch.Tensor:
        """A fused layer's `[B, *member_shape]` output -> the folded tensor the user's code expects."""
        rank, dim = spec
        if t.dim() != rank + 1:
            raise RuntimeError(f"a fused layer returned shape {tuple(t.shape)} where members return rank {rank}")
        if dim is None:  # a batch dimension in front, each member's value on each of its samples
            return t.unsqueeze(1).expand(t.shape[0], self.samples, *t.shape[1:]).flatten(0, 1)
        moved = t.movedim(0, dim)  # (..., B, N, ...)
        if moved.shape[dim] == 1 or moved.stride(dim) == moved.stride(dim + 1) * moved.shape[dim + 1]:
            return moved.flatten(dim, dim + 1)  # a view, each member's part laid out as the fused layer left it
        return _merged_like(moved, dim, t[0])


    def others(self, t: torch.Tensor, spec: Spec | None, member: int) -> torch.Tensor:
        """Every member's part of a folded tensor but `member`'s (all of it without a batch dimension)."""
        if spec is None or spec[1] is None or t.dim() != spec[0]:
            return t
        rows = t.unflatten(spec[1], (self.members, -1))
        return torch.cat([rows.narrow(spec[1], 0, member), rows.narrow(spec[1], member + 1, self.members - member - 1)], spec[1])


def _merged_like(moved: torch.Tensor, dim: int, member: torch.Tensor) -> torch.Tensor:
    """`moved` (`[..., B, N, ...]`, B at `dim`) with B and N merged, copied into the memory order
    of one member's tensor (`member`, the batch dimension at `dim`), member-major inside the batch.

    A layer's output keeps its own memory layout in the member's run (`nn.LSTM(batch_first=True)`
    returns a transposed view), and the next layer may round by it (`F.linear` adds its bias
    inside the GEMM only for a contiguous input), so the folded tensor keeps it too."""
    order = sorted(range(member.dim()), key=lambda i: -member.stride(i))  # outermost first
    permutation: list[int] = []
    for i in order:
        permutation += [dim, dim + 1] if i == dim else [i if i < dim else i + 1]
    arranged = moved.permute(permutation).contiguous()
    at = permutation.index(dim)
    merged = arranged.flatten(at, at + 1)  # dims in `order`
    return merged.permute(sorted(range(len(order)), key=order.__getitem__))


class LayerHooks:
    """Unfolds one fused layer's inputs and folds its outputs (forward hooks; deep-copied with the model)."""

    def __init__(self, batch: Batch, layouts: tuple[Layout, ...]):
        self.batch, self.layouts = batch, layouts
        self._calls: list[Layout] = []  # the layout of each call in progress

    def _layout(self, args: tuple, kwargs: dict) -> Layout:
        for layout in self.layouts:
            if layout.fits(args, kwargs):
                return layout
        raise RuntimeError("this layer is called with tensors other than those its batch layout was measured with")

    def inputs(self, module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """Positional inputs without a batch dimension go to every member (a layer's data);
        keyword ones stay shared (masks, which the fused layers take either way)."""
        # `query is key is value` stays true. Pairs compared by `is` rather than a dict by `id()`:
        # TorchDynamo (torch 2.11) cannot trace `id()` of a tensor made inside the compiled step.
        unfolded: list[tuple[torch.Tensor, torch.Tensor]] = []

        def convert(specs: tuple[Spec, ...], expand: bool) -> Callable[[torch.Tensor, int], torch.Tensor]:
            def unfold(t: torch.Tensor, i: int) -> torch.Tensor:
                for seen, done in unfolded:
                    if seen is t:
                        return done
                done = self.batch.unfold(t, specs[i], expand)
                unfolded.append((t, done))
                return done

            return unfold

        layout = self._layout(args, kwargs)
        self._calls.append(layout)
        return map_tensors(args, convert(layout.args, True)), map_tensors(kwargs, convert(layout.kwargs, False))

    def outputs(self, module: nn.Module, args: tuple, kwargs: dict, output: Any) -> Any:
        layout = self._calls.pop()
        return map_tensors(output, lambda t, i: self.batch.fold(t, layout.outputs[i]))


def install(fused: nn.Module, layouts: Mapping[str, tuple[Layout, ...]], fused_leaves: set[int], batch: Batch) -> None:
    """Hook every fused layer (module ids in `fused_leaves`) of the fused tree to its measured layout."""
    for path, module in fused.named_modules():
        if id(module) in fused_leaves and path in layouts:
            hooks = LayerHooks(batch, layouts[path])
            module.register_forward_pre_hook(hooks.inputs, with_kwargs=True)
            module.register_forward_hook(hooks.outputs, with_kwargs=True)
        elif id(module) in fused_leaves:  # never called while measured (an unused layer)
            module.register_forward_pre_hook(_unmeasured)


def _unmeasured(module: nn.Module, args: Any) -> None:
    raise RuntimeError("this layer was not called when the batch layout was measured (train and eval mode)")
