"""How many members fit on a device: B from a measured dry run, with a safety margin.

A dry run trains one step of a group of 1 and of 2 members of the config and measures what the
group holds: parameters, gradients (the optimizer's matrix and the tensors backward hands it)
and optimizer state (exact tensor sizes), the activations autograd saves for backward (counted
through `saved_tensors_hooks`, each storage once) and the output of an evaluation batch; on CUDA
also the allocator's peak. The difference between the two runs is the cost of one member; the
rest is fixed (shared inputs, workspace).
`B = floor((available * safety_margin - fixed) / per_member)`, where available is the device's
free memory (`torch.cuda.mem_get_info`) or, on CPU, the RAM psutil reports available.

Example::

    decision = choose_num_members(workload, config, device="cuda", max_members=128)
    groups = group_configs(configs, max_members=decision.num_members)
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from fusion.trainer import FusedTrainer
from hpo.base.workload import Workload

log = logging.getLogger(__name__)

MiB = 2**20


@dataclass(frozen=True)
class SizingDecision:
    """The chosen group size and the measurements behind it (bytes)."""

    num_members: int
    bytes_per_member: int
    fixed_bytes: int
    available_bytes: int
    safety_margin: float
    device: str
    #: "memory" when the budget set B, "max_members" when the cap did.
    limited_by: str

    def __str__(self) -> str:
        return (
            f"fusion sizing on {self.device}: B={self.num_members} "
            f"({self.bytes_per_member / MiB:.2f} MiB per member, {self.fixed_bytes / MiB:.2f} MiB fixed, "
            f"{self.available_bytes / MiB:.0f} MiB available x {self.safety_margin:.2f} margin; limited by {self.limited_by})"
        )


def available_memory(device: str | torch.device) -> int:
    """Free bytes on `device`: CUDA's free memory, or the RAM the OS reports available."""
    device = torch.device(device)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    import psutil

    return int(psutil.virtual_memory().available)


def _storage_bytes(tensor: torch.Tensor, seen: set[int]) -> int:
    try:
        storage = tensor.untyped_storage()
    except Exception:  # a wrapper tensor (e.g. batched under vmap): count its elements
        return tensor.numel() * tensor.element_size()
    if storage.data_ptr() in seen:
        return 0
    seen.add(storage.data_ptr())
    return storage.nbytes()


def _dry_run(workload: Workload, config: Mapping[str, Any], members: int, device: torch.device, **kwargs: Any) -> int:
    """Bytes a group of `members` copies of `config` holds at its peak of one step and one eval batch."""
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        baseline = torch.cuda.memory_allocated(device)
    with torch.random.fork_rng(devices=[device] if cuda else []):
        # a dry run to measure memory, not a group that trains: no differential check
        trainer = FusedTrainer(workload, [{**config, "seed": i} for i in range(members)], device=device, verify=False, **kwargs)
        seen: set[int] = set()
        held = [*trainer.model.module.state_dict().values(), *trainer.optimizer.tensors()]
        state = sum(_storage_bytes(t, seen) for t in held)
        saved = 0

        def pack(tensor: torch.Tensor) -> torch.Tensor:
            nonlocal saved
            saved += _storage_bytes(tensor, seen)
            return tensor

        inputs, targets = trainer.batches.batch(trainer.step)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            trainer.train_step(inputs, targets)
        eval_inputs, _ = trainer.workload.eval_batches(trainer.configs[0])[0]
        with torch.no_grad():
            trainer.model.eval()
            output = trainer.model(eval_inputs.to(device))
        # the gradients backward handed over, held until the step has gathered them
        grads = sum(_storage_bytes(p.grad, seen) for p in trainer.optimizer.params if p.grad is not None)
        measured = state + saved + grads + output.numel() * output.element_size()
        if cuda:
            torch.cuda.synchronize(device)
            measured = max(measured, torch.cuda.max_memory_allocated(device) - baseline)
    del trainer, output
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    return measured


def measure_member_bytes(
    workload: Workload, config: Mapping[str, Any], device: str | torch.device = "cpu", **kwargs: Any
) -> tuple[int, int]:
    """(bytes per member, fixed bytes) of `config`'s group, from dry runs with 1 and 2 members."""
    device = torch.device(device)
    one = _dry_run(workload, config, 1, device, **kwargs)
    two = _dry_run(workload, config, 2, device, **kwargs)
    per_member = max(two - one, 1)
    return per_member, max(one - per_member, 0)


def choose_num_members(
    workload: Workload,
    config: Mapping[str, Any],
    *,
    device: str | torch.device = "cpu",
    max_members: int | None = None,
    safety_margin: float = 0.7,
    available_bytes: int | None = None,
    **kwargs: Any,
) -> SizingDecision:
    """The largest B whose measured memory fits `safety_margin` of the free memory (capped at `max_members`).

    `available_bytes` overrides the device's free memory (a budget shared with other work);
    extra keyword arguments (`dtype`, `strategy`) go to `FusedTrainer`. Raises MemoryError when
    not even one member fits.
    """
    if not 0 < safety_margin <= 1:
        raise ValueError(f"safety_margin must be in (0, 1], got {safety_margin}")
    if max_members is not None and max_members < 1:
        raise ValueError(f"max_members must be at least 1, got {max_members}")
    device = torch.device(device)
    per_member, fixed = measure_member_bytes(workload, config, device, **kwargs)
    available = available_memory(device) if available_bytes is None else int(available_bytes)
    fits = int((available * safety_margin - fixed) // per_member)
    if fits < 1:
        raise MemoryError(
            f"one member needs {(per_member + fixed) / MiB:.1f} MiB but only {available * safety_margin / MiB:.1f} MiB "
            f"({safety_margin:.0%} of {available / MiB:.1f} MiB free on {device}) is available"
        )
    limited_by = "memory"
    if max_members is not None and fits > max_members:
        fits, limited_by = max_members, "max_members"
    decision = SizingDecision(fits, per_member, fixed, available, safety_margin, str(device), limited_by)
    log.info("%s", decision)
    return decision
