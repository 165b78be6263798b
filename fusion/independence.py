"""The member-independence check: a fused model is accepted only if its members cannot see each other.

Comparing a fused model with its members on one batch (the probe) misses code that mixes members
only in training mode (a parameter-free "subtract the batch mean" layer) and mixing that a
probe's tolerance hides. The property fusion promises is stronger and can be checked exactly:
change member i's input and parameters, and every other member's outputs and gradients stay
bit-for-bit the same. The check runs in train and eval mode, with every random draw (dropout)
seeded identically in both runs, and leaves the model as it found it (parameters, buffers such as
BatchNorm's running statistics, the global RNG state, the train/eval mode).

When it fails, a second run with forward hooks finds the first module call (in completion order,
so the innermost) whose other-member inputs were unchanged but whose other-member outputs were
not: that module mixes members. Hooks cannot look inside `torch.func.vmap`, so on the vmap path
the message names the model's root module.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from fusion.layers import FusionError

#: Seed for every random draw of the check (dropout masks), the same in both runs it compares.
_SEED = 20240611


def output_tensors(value: Any) -> list[torch.Tensor]:
    """The tensors in a (nested) module output or argument list, in a fixed order."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in output_tensors(item)]
    if isinstance(value, dict):
        return [t for key in sorted(value, key=str) for t in output_tensors(value[key])]
    return []


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise-equal values, NaN equal to NaN (a member that diverged must stay diverged alike)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.is_floating_point() or a.is_complex():
        return bool(torch.equal(a, b) or ((a == b) | (a.isnan() & b.isnan())).all())
    return bool(torch.equal(a, b))


def _others(t: torch.Tensor, member: int) -> torch.Tensor:
    """Every member's slice but `member`'s; a tensor without a member dimension is everyone's."""
    if t.dim() == 0:
        return t
    return torch.cat([t[:member], t[member + 1 :]])


def _perturbed_input(x: torch.Tensor, member: int) -> torch.Tensor:
    """`x` with member `member`'s slice changed, staying a valid input (token ids stay in range)."""
    x = x.clone()
    if x.dtype == torch.bool:
        x[member] = ~x[member]
    elif x.is_floating_point():
        generator = torch.Generator(device=x.device).manual_seed(_SEED)
        x[member] += torch.randn(x[member].shape, generator=generator, dtype=x.dtype, device=x.device) * 0.5
    else:
        # in int64: the modulus 256 of a uint8 image (values up to 255) does not fit in uint8
        x[member] = ((x[member].long() + 1) % (int(x.max()) + 1)).to(x.dtype)
    return x


@contextmanager
def preserved_state(model: nn.Module) -> Iterator[None]:
    """Leave parameters, buffers, RNG state, train/eval mode and the modules' plain attributes as
    they were. A `forward` that keeps something as an attribute (its last activation, a call
    count) would otherwise keep what a probe run left: in member 0 only, which then "differs"
    from the other members, and on the vmap path a batched tensor that outlives its vmap."""
    saved = {name: tensor.detach().clone() for name, tensor in model.state_dict(keep_vars=True).items()}
    modes = [(module, module.training) for module in model.modules()]
    attributes = [(module, _plain_attributes(module)) for module in model.modules()]
    devices = sorted({t.device.index for t in saved.values() if t.device.type == "cuda"})
    with torch.random.fork_rng(devices=devices):
        try:
            yield
        finally:
            _load(model, saved)
            for module, training in modes:
                module.training = training
            for module, before in attributes:
                for key in _plain_attributes(module).keys() - before.keys():
                    del module.__dict__[key]
                module.__dict__.update(before)


def _plain_attributes(module: nn.Module) -> dict[str, Any]:
    """A module's own attributes but its tables (`_parameters`, hooks...) and its mode."""
    return {key: value for key, value in vars(module).items() if not key.startswith("_") and key != "training"}


@torch.no_grad()
def _load(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    for name, tensor in model.state_dict(keep_vars=True).items():
        tensor.copy_(state[name])


class _CallRecorder:
    """Per module call, in completion order: (path, inputs, outputs) of the other members, as
    the stacked model's folded code sees them (`StackedModel.other_members`)."""

    def __init__(self, model, member: int):
        self.model, self.member = model, member
        self.calls: list[tuple[str, list[torch.Tensor], list[torch.Tensor]]] = []
        self._inputs: list[list[torch.Tensor]] = []
        self.handles = []
        paths: dict[int, str] = {}
        for path, module in model.module.named_modules(remove_duplicate=False):
            paths.setdefault(id(module), path)
        for path, module in model.module.named_modules(remove_duplicate=False):
            # before the fused layers' own hooks unfold their inputs
            self.handles.append(module.register_forward_pre_hook(self._enter(paths[id(module)]), with_kwargs=True, prepend=True))
            self.handles.append(module.register_forward_hook(self._leave(path, paths[id(module)]), with_kwargs=True))

    def _enter(self, first_path: str):
        def hook(module: nn.Module, args: Any, kwargs: Any) -> None:
            self._inputs.append(self.model.other_members(first_path, "inputs", (args, kwargs), self.member))

        return hook

    def _leave(self, path: str, first_path: str):
        def hook(module: nn.Module, args: Any, kwargs: Any, output: Any) -> None:
            self.calls.append((path, self._inputs.pop(), self.model.other_members(first_path, "outputs", output, self.member)))

        return hook

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


def _run(model, inputs: torch.Tensor, member: int) -> tuple[list[torch.Tensor], dict[str, torch.Tensor | None]]:
    """Other members' outputs and gradients of a fixed random projection of all outputs."""
    torch.manual_seed(_SEED)
    outputs = output_tensors(model.forward_members(inputs))
    params = [(name, p) for name, p in model.module.named_parameters() if p.requires_grad]
    generator = torch.Generator().manual_seed(_SEED)
    loss = sum(
        (out * torch.randn(out.shape, generator=generator, dtype=out.dtype).to(out.device)).sum()
        for out in outputs
        if out.is_floating_point() and out.requires_grad
    )
    grads: dict[str, torch.Tensor | None] = {}
    if isinstance(loss, torch.Tensor) and params:
        values = torch.autograd.grad(loss, [p for _, p in params], allow_unused=True)
        grads = {name: None if g is None else _others(g, member) for (name, _), g in zip(params, values)}
    return [_others(out.detach(), member) for out in outputs], grads


@torch.no_grad()
def _perturb_member(model: nn.Module, member: int) -> None:
    generator = torch.Generator().manual_seed(_SEED + 1)
    for tensor in model.state_dict(keep_vars=True).values():
        if tensor.is_floating_point() and tensor.dim() > 0:
            noise = torch.randn(tensor[member].shape, generator=generator, dtype=tensor.dtype).to(tensor.device)
            tensor[member] += 0.1 * noise


def _mixing_module(model, inputs: torch.Tensor, perturbed: torch.Tensor, member: int) -> str:
    """Path and type of the innermost module whose call mixes members (see the module docstring)."""
    root = model.module
    if model.strategy != "stacked":
        return f"'<root>' ({type(root).__name__})"
    runs = []
    for x, perturb in ((inputs, False), (perturbed, True)):
        recorder = _CallRecorder(model, member)
        try:
            with preserved_state(root):
                if perturb:
                    _perturb_member(root, member)
                torch.manual_seed(_SEED)
                with torch.no_grad():
                    model.forward_members(x)
        finally:
            recorder.remove()
        runs.append(recorder.calls)
    for (path, in_a, out_a), (_, in_b, out_b) in zip(*runs):
        if all(_same(a, b) for a, b in zip(in_a, in_b)) and not all(_same(a, b) for a, b in zip(out_a, out_b)):
            return f"'{path or '<root>'}' ({type(root.get_submodule(path)).__name__})"
    return f"'<root>' ({type(root).__name__})"


def _owner(name: str) -> str:
    return name.rpartition(".")[0] or "<root>"


def check_member_independence(model, example_input: torch.Tensor, member: int = 0) -> None:
    """Raise FusionError naming the module if changing member `member` changes any other member.

    `model` is a `fusion.model.FusedModel`; `example_input` one shared batch `[N, ...]`.
    """
    members = model.num_members
    if members < 2:
        return
    inputs = example_input.unsqueeze(0).expand(members, *example_input.shape).clone()
    perturbed = _perturbed_input(inputs, member)
    with preserved_state(model.module):
        for training in (True, False):
            model.train(training)
            mode = "train" if training else "eval"
            with preserved_state(model.module):
                base_out, base_grads = _run(model, inputs, member)
            with preserved_state(model.module):
                _perturb_member(model.module, member)
                new_out, new_grads = _run(model, perturbed, member)
            if not all(_same(a, b) for a, b in zip(base_out, new_out)):
                with preserved_state(model.module):
                    model.train(training)
                    where = _mixing_module(model, inputs, perturbed, member)
                raise FusionError(
                    f"layer {where} mixes members in {mode} mode: changing member {member}'s input and "
                    f"parameters changed another member's output ({model.strategy} fusion)"
                )
            for name in base_grads:
                a, b = base_grads[name], new_grads[name]
                if (a is None) != (b is None) or (a is not None and not _same(a, b)):
                    owner = _owner(name)
                    kind = type(model.module.get_submodule(owner if owner != "<root>" else "")).__name__
                    raise FusionError(
                        f"layer '{owner}' ({kind}) mixes members in {mode} mode: changing member {member}'s input and "
                        f"parameters changed another member's gradient of '{name}' ({model.strategy} fusion)"
                    )
