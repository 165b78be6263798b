"""The optimizer hyperparameters every engine understands, read once from a trial's config.

The plain trainer hands them to PyTorch's optimizers; the fused trainer turns each into a
[B]-shaped tensor. Keeping the names, defaults and the LR schedule in one place is what makes a
fused member train exactly like the same config trained alone.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Literal

import torch

if TYPE_CHECKING:
    from hpo.base.workload import Workload

OPTIMIZERS = ("sgd", "adam", "adamw")
SCHEDULES = ("constant", "cosine", "step")


@dataclass(frozen=True)
class OptimHParams:
    """Optimizer, schedule and clipping settings of one trial (config keys of the same name)."""

    optimizer: Literal["sgd", "adam", "adamw"] = "adam"
    lr: float = 1e-3
    momentum: float = 0.0
    nesterov: bool = False
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0
    #: Maximum global gradient norm; 0 turns clipping off.
    grad_clip: float = 0.0
    lr_schedule: Literal["constant", "cosine", "step"] = "constant"
    warmup_steps: int = 0
    #: Length of the cosine schedule, or the period of the step schedule, in optimizer steps.
    schedule_steps: int = 1000
    lr_gamma: float = 0.1
    #: Cosine decays to `min_lr_ratio * lr`.
    min_lr_ratio: float = 0.0

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> "OptimHParams":
        """Pick the optimizer keys out of a trial config, converting types and checking names."""
        values: dict[str, Any] = {}
        for field in fields(cls):
            if field.name in config:
                values[field.name] = _coerce(field.name, getattr(cls, field.name), config[field.name])
        hp = cls(**values)
        if hp.optimizer not in OPTIMIZERS:
            raise ValueError(f"config key 'optimizer' is {hp.optimizer!r}; expected one of {OPTIMIZERS}")
        if hp.lr_schedule not in SCHEDULES:
            raise ValueError(f"config key 'lr_schedule' is {hp.lr_schedule!r}; expected one of {SCHEDULES}")
        if hp.lr <= 0:
            raise ValueError(f"config key 'lr' must be positive, got {hp.lr}")
        hp._check_ranges()
        return hp

    def _check_ranges(self) -> None:
        """Refuse the values `torch.optim` refuses for this optimizer, naming the config key: the
        fused optimizer reads every key as a number and would train with them (beta2 = 1 divides
        by zero; a negative decay grows the weights) where the same config alone fails."""
        if self.weight_decay < 0:
            raise ValueError(f"config key 'weight_decay' must be at least 0, got {self.weight_decay}")
        if self.optimizer == "sgd":
            if self.momentum < 0:
                raise ValueError(f"config key 'momentum' must be at least 0, got {self.momentum}")
            if self.nesterov and self.momentum == 0:
                raise ValueError("config key 'nesterov' is true, which needs momentum > 0 (torch.optim.SGD refuses it otherwise)")
            return
        if self.eps < 0:
            raise ValueError(f"config key 'eps' must be at least 0, got {self.eps}")
        for key in ("beta1", "beta2"):
            if not 0 <= getattr(self, key) < 1:
                raise ValueError(f"config key {key!r} must be in [0, 1), got {getattr(self, key)}")

    @classmethod
    def keys(cls) -> frozenset[str]:
        return frozenset(f.name for f in fields(cls))

    def lr_factor(self, step: int) -> float:
        """Multiplier of `lr` at optimizer step `step` (0-based): linear warm-up, then the schedule."""
        if self.warmup_steps > 0 and step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        after = step - self.warmup_steps
        if self.lr_schedule == "cosine":
            progress = min(after / max(self.schedule_steps, 1), 1.0)
            cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
            return self.min_lr_ratio + (1.0 - self.min_lr_ratio) * cosine
        if self.lr_schedule == "step":
            return self.lr_gamma ** (after // max(self.schedule_steps, 1))
        return 1.0


def _coerce(key: str, default: Any, raw: Any) -> Any:
    """Convert a config value to the type of the field's default (YAML and samplers give floats)."""
    if isinstance(default, bool):
        if isinstance(raw, str) and raw.lower() in ("true", "false"):
            return raw.lower() == "true"
        if isinstance(raw, (bool, int)):
            return bool(raw)
        raise ValueError(f"config key {key!r} must be a boolean, got {raw!r}")
    try:
        return type(default)(raw)
    except (TypeError, ValueError):
        raise ValueError(f"config key {key!r} must be a {type(default).__name__}, got {raw!r}") from None


def build_torch_optimizer(
    named_params: Iterable[tuple[str, torch.nn.Parameter]],
    hp: OptimHParams,
    lr_multipliers: Mapping[str, float] | None = None,
    weight_decay_multipliers: Mapping[str, float] | None = None,
    eps_multipliers: Mapping[str, float] | None = None,
) -> torch.optim.Optimizer:
    """PyTorch's own optimizer for one unfused trial (the reference the fused optimizers match).

    Parameters with lr, weight-decay or Adam-eps multipliers (muP, depth scaling) go into their
    own parameter group; LambdaLR schedules scale every group's initial lr by the same factor, so
    the multipliers survive the schedule. SGD has no eps, so its eps multipliers are ignored.
    """
    lr_scales, wd_scales, eps_scales = lr_multipliers or {}, weight_decay_multipliers or {}, eps_multipliers or {}
    groups: dict[tuple[float, float, float], list[torch.nn.Parameter]] = {}
    for name, param in named_params:
        key = (float(lr_scales.get(name, 1.0)), float(wd_scales.get(name, 1.0)), float(eps_scales.get(name, 1.0)))
        groups.setdefault(key, []).append(param)
    params = [
        {"params": group, "lr": hp.lr * lr_scale, "weight_decay": hp.weight_decay * wd_scale}
        | ({} if hp.optimizer == "sgd" else {"eps": hp.eps * eps_scale})
        for (lr_scale, wd_scale, eps_scale), group in groups.items()
    ]
    if hp.optimizer == "sgd":
        return torch.optim.SGD(
            params, lr=hp.lr, momentum=hp.momentum, nesterov=hp.nesterov, weight_decay=hp.weight_decay
        )
    cls = torch.optim.Adam if hp.optimizer == "adam" else torch.optim.AdamW
    return cls(params, lr=hp.lr, betas=(hp.beta1, hp.beta2), eps=hp.eps, weight_decay=hp.weight_decay)


def workload_optimizer(workload: "Workload", model: torch.nn.Module, hp: OptimHParams) -> torch.optim.Optimizer:
    """The optimizer a trial of `workload` trains `model` with, its muP and depth factors included."""
    return build_torch_optimizer(
        model.named_parameters(),
        hp,
        workload.lr_multipliers(model, hp.optimizer),
        workload.weight_decay_multipliers(model, hp.optimizer),
        workload.eps_multipliers(model, hp.optimizer),
    )
