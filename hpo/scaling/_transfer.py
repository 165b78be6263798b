"""Carrying the proxy's best configuration to the target, and (optionally) training the target.

Under muP (Tensor Programs V, table 1) the optimisation hyperparameters and the init and
multiplier scales transfer across width; under CompleteP (Dey et al. 2025) the same ones transfer
across depth; regularisation does not. The proxy and the target share their bases (muP's base
shapes, CompleteP's base depth), so transferred values apply to the target unchanged: the only
edits are `width` and the workload's depth key. Everything else is sorted into transferred, flagged (re-tune on a small target sweep),
kept (architecture and run settings) and unknown (carried, but nothing says it transfers).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpo.base.workload import Workload
from hpo.scaling._depth import depth_description

if TYPE_CHECKING:
    from hpo.scaling._config import ScalingConfig

#: The trained target's folder beside `transfer.json`.
TARGET_CHECKPOINT_DIR = "target_checkpoint"

#: Told of each iteration of the target as it ends: (iteration, iterations planned, its result).
OnIteration = Callable[[int, int, Mapping[str, Any]], None]

#: Keys muP transfers from proxy to target (Tensor Programs V, table 1: optimisation, init, multipliers).
TRANSFERABLE: frozenset[str] = frozenset(
    {
        "lr", "optimizer", "beta1", "beta2", "momentum", "nesterov",
        "lr_schedule", "warmup_steps", "schedule_steps", "lr_gamma", "min_lr_ratio",
        "init_std", "readout_zero_init", "output_mult", "emb_mult", "attn_mult", "attn_scale", "residual_mult",
    }
)  # fmt: skip

#: Keys carried unchanged but flagged, with the reason: re-tune them on a small target sweep.
NON_TRANSFERABLE: Mapping[str, str] = {
    "weight_decay": "regularisation does not transfer under muP (Tensor Programs V, table 1); re-tune on the target",
    "dropout": "regularisation does not transfer under muP (Tensor Programs V, table 1); re-tune on the target",
    "batch_size": "muP transfers across width; batch size transfers only empirically: re-tune or keep fixed",
    "grad_clip": "the global gradient norm grows with width, so a clipping threshold does not transfer; re-tune",
    "eps": "mup does not width-scale Adam's eps (depth scaling does, for the residual blocks); fine only while eps is far below the gradient scale",
}

#: Architecture and run settings: carried unchanged, not hyperparameters muP speaks about (`width`
#: and the depth key only where that dimension is not scaled).
KEPT: frozenset[str] = frozenset(
    {"width", "n_layer", "depth", "head_dim", "n_head", "block_size", "seq_len", "seed", "data_seed", "steps_per_iteration"}
)


@dataclass
class TargetRun:
    """The target trained with the transferred config: its metric and per-iteration history."""

    config: dict[str, Any]
    metric: str
    mode: str
    value: float  # the metric at the last iteration
    best: float  # the best value over iterations
    iterations: int
    seconds: float
    diverged: bool
    history: list[dict[str, Any]] = field(default_factory=list)
    #: The folder holding the trained target (`hpo.base.training`'s checkpoint format); None if it diverged.
    checkpoint: str | None = None


@dataclass
class TransferResult:
    """The best proxy config, the target config built from it, and what did not transfer."""

    proxy_config: dict[str, Any]
    target_config: dict[str, Any]
    transferred: list[str]
    flagged: dict[str, str]
    kept: list[str]
    unknown: dict[str, str]
    proxy_width: int | None
    target_width: int | None
    base_width: int | None
    metric: str | None = None
    proxy_metric: float | None = None
    target_run: TargetRun | None = None
    proxy_depth: int | None = None
    target_depth: int | None = None
    base_depth: int | None = None
    #: What scaled and how: per dimension ("width", "depth") its sizes, base, rule and factors.
    scaled: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def write_json(self, path: str | os.PathLike[str]) -> Path:
        """Write `transfer.json` (into `path` if it is a directory) and return the file's path."""
        path = Path(path)
        if path.is_dir() or path.suffix != ".json":
            path.mkdir(parents=True, exist_ok=True)
            path = path / "transfer.json"
        path.write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True, default=_json_default) + "\n")
        return path


def transfer_config(
    best_proxy_config: Mapping[str, Any],
    scaling: "ScalingConfig",
    *,
    depth_key: str | None = None,
    metric: str | None = None,
    proxy_metric: float | None = None,
) -> TransferResult:
    """The target config for `best_proxy_config`: every value carried unchanged, `width` (and the
    workload's `depth_key`) set to the target's, and each key sorted by whether it transfers.

    Example::

        result = transfer_config({"lr": 0.01, "weight_decay": 0.1, "width": 128},
                                 ScalingConfig(target_width=1024, ratio=8))
        result.target_config   # {"lr": 0.01, "weight_decay": 0.1, "width": 1024}
        result.flagged         # {"weight_decay": "regularisation does not transfer ..."}
        transfer_config({"lr": 0.01}, ScalingConfig(target_depth=16, proxy_depth=4), depth_key="n_layer")
        # target_config {"lr": 0.01, "n_layer": 16}
    """
    proxy, target = dict(best_proxy_config), dict(best_proxy_config)
    sizes: dict[str, tuple[int, int]] = {}
    if scaling.scales_width:
        sizes["width"] = (scaling.proxy, scaling.target_width)
    if scaling.scales_depth:
        if depth_key is None:
            raise ValueError("scaling.target_depth needs the workload's depth_key to set the target's depth")
        sizes[depth_key] = (scaling.depth_proxy, scaling.target_depth)
    for key, (proxy_size, target_size) in sizes.items():
        if key in proxy and int(proxy[key]) != proxy_size:
            raise ValueError(
                f"best_proxy_config has {key} {proxy[key]}, but scaling.{'proxy' if key == 'width' else 'depth_proxy'} is "
                f"{proxy_size}: "
                "is this a proxy trial's config?"
            )
        proxy[key], target[key] = proxy_size, target_size
    transferred, kept, flagged, unknown = [], [], {}, {}
    for key in sorted(best_proxy_config):
        if key in sizes:
            continue
        if key in TRANSFERABLE:
            transferred.append(key)
        elif key in NON_TRANSFERABLE:
            flagged[key] = NON_TRANSFERABLE[key]
        elif key in KEPT:
            kept.append(key)
        else:
            unknown[key] = "not a known muP hyperparameter: carried unchanged, transfer not guaranteed"
    return TransferResult(
        proxy_config=proxy,
        target_config=target,
        transferred=transferred,
        flagged=flagged,
        kept=kept,
        unknown=unknown,
        proxy_width=scaling.proxy,
        target_width=scaling.target_width,
        base_width=scaling.base,
        metric=metric,
        proxy_metric=proxy_metric,
        proxy_depth=scaling.depth_proxy,
        target_depth=scaling.target_depth,
        base_depth=scaling.depth_base,
        scaled=_scaled(scaling, depth_key),
    )


def _scaled(scaling: "ScalingConfig", depth_key: str | None) -> dict[str, Any]:
    """`transfer.json`'s account of each scaled dimension: sizes, base, the rule and its factors."""
    scaled: dict[str, Any] = {}
    if scaling.scales_width:
        scaled["width"] = {
            "proxy": scaling.proxy,
            "target": scaling.target_width,
            "base": scaling.base,
            "parametrization": "muP (Tensor Programs V), Microsoft's mup",
            "rule": (
                "readout becomes mup.MuReadout (output x base/width); matrix-like parameters: Adam lr x base/width, "
                "weight decay x width/base, init variance x base/width; SGD per mup.MuSGD; Adam eps unchanged"
            ),
            "proxy_width_mult": scaling.proxy / scaling.base,
            "target_width_mult": scaling.target_width / scaling.base,
        }
    if scaling.scales_depth:
        scaled["depth"] = depth_description(
            depth_key, scaling.depth_proxy, scaling.target_depth, scaling.depth_base, scaling.depth_alpha
        )
    return scaled


def train_target(
    workload: Workload,
    transfer: TransferResult,
    scaling: "ScalingConfig",
    *,
    max_iterations: int,
    checkpoint_dir: str | os.PathLike[str] | None = None,
    on_iteration: OnIteration | None = None,
) -> TargetRun:
    """Train the target with `transfer.target_config` (hpo.base.training.TrialTrainer, in this process).

    `workload` is the user's workload; the target is built through `target_workload`, which is
    the user's own model when muP's base width is the target width and, if depth is scaled, the
    base depth the target's (by default its residual branches carry CompleteP's factor, which
    `transfer.json` records). The trained target is saved
    in `checkpoint_dir` (see `run_target`).
    """
    from hpo.scaling._mup import target_workload

    return run_target(
        target_workload(workload, scaling), transfer.target_config, scaling.iterations_of_target(max_iterations), checkpoint_dir,
        on_iteration,
    )


def complete_transfer(
    workload: Workload,
    scaling: "ScalingConfig",
    best_proxy_config: Mapping[str, Any],
    out_dir: str | os.PathLike[str],
    *,
    max_iterations: int,
    metric: str | None = None,
    proxy_metric: float | None = None,
) -> TransferResult:
    """After the proxy sweep: transfer, write `out_dir/transfer.json`, and with
    `scaling.final_training` train the target, save it in `out_dir/target_checkpoint`, and write
    the file again with its metric and checkpoint."""
    result = transfer_config(
        best_proxy_config, scaling, depth_key=workload.depth_key, metric=metric, proxy_metric=proxy_metric
    )
    result.write_json(out_dir)  # first, so the transfer survives a failed final training
    if scaling.final_training:
        train_transferred(workload, result, scaling, out_dir, max_iterations=max_iterations)
    return result


def train_transferred(
    workload: Workload, transfer: TransferResult, scaling: "ScalingConfig", out_dir: str | os.PathLike[str], *,
    max_iterations: int, on_iteration: OnIteration | None = None,
) -> TargetRun:
    """Train the target `transfer` holds, save it in `out_dir/target_checkpoint`, and write
    `out_dir/transfer.json` again with its run (its metric and checkpoint)."""
    transfer.target_run = train_target(
        workload, transfer, scaling, max_iterations=max_iterations, checkpoint_dir=Path(out_dir) / TARGET_CHECKPOINT_DIR,
        on_iteration=on_iteration,
    )
    transfer.write_json(out_dir)
    return transfer.target_run


def run_target(
    target: Workload, config: Mapping[str, Any], iterations: int, checkpoint_dir: str | os.PathLike[str] | None = None,
    on_iteration: OnIteration | None = None,
) -> TargetRun:
    """Train `config` on `target` for `iterations` iterations; stops early if the loss diverges.
    `on_iteration(iteration, iterations, result)` hears each iteration as it ends (a sweep's
    progress lines).

    The target is what the whole sweep was for, so unless it diverged its trained state is saved
    in `checkpoint_dir`, in a trial checkpoint's format: `TrialTrainer(target, run.config)
    .restore(run.checkpoint)` loads it (with `torch.load(weights_only=True)`).
    """
    from hpo.base.training import TrialTrainer  # imports Ray; kept off the import path of hpo.scaling

    start = time.monotonic()
    trainer = TrialTrainer(target, config)
    history = []
    while trainer.iteration < iterations:
        history.append(trainer.train_iteration())
        if on_iteration is not None:
            on_iteration(trainer.iteration, iterations, history[-1])
        if history[-1]["diverged"]:
            break
    run = summarise_target_run(trainer.config, target.metric, target.mode, history, time.monotonic() - start)
    if checkpoint_dir is not None and not run.diverged:
        Path(checkpoint_dir).mkdir(parents=True, exist_ok=True)
        trainer.save(str(checkpoint_dir))
        run.checkpoint = str(checkpoint_dir)
    return run


def summarise_target_run(
    config: Mapping[str, Any], metric: str, mode: str, history: list[dict[str, Any]], seconds: float
) -> TargetRun:
    values = [float(h[metric]) for h in history if math.isfinite(float(h[metric]))]
    pick = min if mode == "min" else max
    return TargetRun(
        config=dict(config),
        metric=metric,
        mode=mode,
        value=float(history[-1][metric]) if history else math.nan,
        best=pick(values) if values else math.nan,
        iterations=len(history),
        seconds=seconds,
        diverged=bool(history and history[-1].get("diverged", False)),
        history=list(history),
    )


def _json_default(value: Any) -> Any:
    if hasattr(value, "item"):  # numpy / torch scalars
        return value.item()
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    return str(value)
