"""`ScalingConfig`: the `scaling:` block of a sweep, validated once at the edge."""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict, Field, model_validator


class ScalingConfig(BaseModel):
    """Tune a small proxy of the model (narrower, shallower, or both) and transfer the result.

    Width (muP): exactly one of `proxy_width` and `ratio` sets the proxy's width
    (`ratio = target_width / proxy_width`). Depth (Depth-muP / CompleteP): exactly one of
    `proxy_depth` and `depth_ratio` sets its number of residual blocks; `depth_alpha` is the
    exponent of the residual-branch multiplier (L / base_depth)**-depth_alpha: 0.5 is Depth-muP
    (Tensor Programs VI), 1 is CompleteP (Dey et al. 2025). Either dimension may be left out: a
    depth-only proxy keeps the model's width.

    The bases are where scaling is the identity. muP's base width defaults to the target's, so in
    width the target is the user's own model (muP is then standard parametrisation there). The
    base depth defaults to the proxy's, as CompleteP scales up from the depth where it was tuned:
    the proxy's blocks are the user's own, and the target's residual branches are multiplied by
    (target_depth / proxy_depth)**-alpha. On the char-GPT benchmark that target both trains better
    and keeps the proxy's optimum, where the depth-8 model with unscaled branches does neither
    (`benchmarks/mup_transfer.py --depth`); `base_depth: <target_depth>` trains the user's model
    unchanged instead.

    Example::

        ScalingConfig(target_width=1024, ratio=8)            # proxy width 128
        ScalingConfig(target_width=1024, proxy_width=128, eager_transfer=0.5)
        ScalingConfig(target_width=256, ratio=4, target_depth=8, proxy_depth=2)   # width and depth
        ScalingConfig(target_depth=16, depth_ratio=4)        # depth only: 4 blocks, same width
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    target_width: int | None = Field(default=None, gt=0, description="Width of the model you want to train.")
    proxy_width: int | None = Field(default=None, gt=0, description="Width of the tuned proxy.")
    ratio: float | None = Field(default=None, gt=1, description="target_width / proxy_width.")
    base_width: int | None = Field(
        default=None, gt=0, description="muP base width (where muP equals standard parametrisation); default target_width."
    )
    target_depth: int | None = Field(default=None, gt=0, description="Residual blocks of the model you want to train.")
    proxy_depth: int | None = Field(default=None, gt=0, description="Residual blocks of the tuned proxy.")
    depth_ratio: float | None = Field(default=None, gt=1, description="target_depth / proxy_depth.")
    base_depth: int | None = Field(
        default=None, gt=0, description="Depth where the depth scaling is the identity; default the proxy's depth."
    )
    depth_alpha: float = Field(
        default=1.0, ge=0.5, le=1.0, description="Residual branches x (depth/base_depth)**-alpha: 0.5 Depth-muP, 1 CompleteP."
    )
    readout: str = Field(default="readout", min_length=1, description="Module name of the output layer.")
    eager_transfer: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description="Start training the target once this fraction of the proxy trials has finished.",
    )
    final_training: bool = Field(default=False, description="Train the target with the transferred config after the sweep.")
    target_iterations: int | None = Field(
        default=None, gt=0, description="Training iterations of the target run; default: the sweep's max iterations."
    )
    target_cpus: float = Field(default=1.0, ge=0, description="CPUs reserved for the eager target run.")
    target_gpus: float = Field(default=0.0, ge=0, description="GPUs reserved for the eager target run.")
    coord_check: bool = Field(default=False, description="Run muP's coordinate check before tuning; stop if it fails.")
    coord_check_tolerance: float = Field(
        default=0.25, gt=0, description="Largest |slope| of log2(activation size) against log2(width) or log2(depth)."
    )

    @model_validator(mode="after")
    def _one_proxy_size(self) -> "ScalingConfig":
        if self.target_width is None and self.target_depth is None:
            raise ValueError(
                "scaling needs target_width (a narrower muP proxy), target_depth (a shallower CompleteP proxy) "
                "or both, e.g. {target_width: 1024, ratio: 8}"
            )
        _check_dimension("width", self.target_width, self.proxy_width, self.ratio, self.base_width, "ratio")
        _check_dimension("depth", self.target_depth, self.proxy_depth, self.depth_ratio, self.base_depth, "depth_ratio")
        return self

    def iterations_of_target(self, max_iterations: int) -> int:
        """How long the target trains, eagerly or after the sweep: `target_iterations`, else the
        sweep's `max_iterations`."""
        return self.target_iterations or max_iterations

    @property
    def scales_width(self) -> bool:
        return self.target_width is not None

    @property
    def scales_depth(self) -> bool:
        return self.target_depth is not None

    @property
    def proxy(self) -> int | None:
        """The proxy width, from `proxy_width` or `target_width / ratio`; None when width is not scaled."""
        return _proxy_size(self.target_width, self.proxy_width, self.ratio)

    @property
    def base(self) -> int | None:
        """muP's base width: `base_width`, or the target width; None when width is not scaled."""
        return self.base_width if self.base_width is not None else self.target_width

    @property
    def depth_proxy(self) -> int | None:
        """The proxy depth, from `proxy_depth` or `target_depth / depth_ratio`; None when depth is not scaled."""
        return _proxy_size(self.target_depth, self.proxy_depth, self.depth_ratio)

    @property
    def depth_base(self) -> int | None:
        """The depth where depth scaling is the identity: `base_depth`, or the proxy's depth."""
        return self.base_depth if self.base_depth is not None else self.depth_proxy

    def searched_size_problems(self, parameters: Iterable[str], depth_key: str | None) -> dict[str, str]:
        """Parameters the scaling sets itself (`width`, the workload's depth key), which a sweep may
        not search or fix: {key: the one-line problem}."""
        owners = {}
        if self.scales_width:
            owners["width"] = "proxy_width/ratio"
        if self.scales_depth and depth_key:
            owners[depth_key] = "proxy_depth/depth_ratio"
        return {
            key: f"with scaling, {key} is set by scaling.{owner}: remove {key!r} from the parameters"
            for key, owner in owners.items()
            if key in parameters
        }

    def describe(self) -> str:
        """One line for `hpo run --dry-run`: what shrinks, from what to what."""
        parts = []
        if self.scales_width:
            parts.append(f"proxy width {self.proxy} -> target width {self.target_width}")
        if self.scales_depth:
            rule = "CompleteP" if self.depth_alpha == 1 else "Depth-muP" if self.depth_alpha == 0.5 else "depth scaling"
            parts.append(
                f"proxy depth {self.depth_proxy} -> target depth {self.target_depth} ({rule}, alpha {self.depth_alpha:g}, "
                f"base depth {self.depth_base})"
            )
        return "; ".join(parts)


def _proxy_size(target: int | None, proxy: int | None, ratio: float | None) -> int | None:
    if target is None:
        return None
    return proxy if proxy is not None else int(round(target / ratio))


def _check_dimension(
    dimension: str, target: int | None, proxy: int | None, ratio: float | None, base: int | None, ratio_key: str
) -> None:
    """One dimension's keys: none without its target, else exactly one proxy size, smaller than the target."""
    given = {f"proxy_{dimension}": proxy, ratio_key: ratio, f"base_{dimension}": base}
    if target is None:
        stray = [key for key, value in given.items() if value is not None]
        if stray:
            raise ValueError(f"scaling.{stray[0]} needs target_{dimension}: give target_{dimension} or drop {stray[0]}")
        return
    if (proxy is None) == (ratio is None):
        example = (128, 8) if dimension == "width" else (2, 4)
        raise ValueError(
            f"scaling needs exactly one of 'proxy_{dimension}' (e.g. proxy_{dimension}: {example[0]}) and '{ratio_key}' "
            f"(e.g. {ratio_key}: {example[1]}); got proxy_{dimension}={proxy}, {ratio_key}={ratio}"
        )
    if ratio is not None:
        size = target / ratio
        if abs(size - round(size)) > 1e-9:
            raise ValueError(
                f"scaling.{ratio_key} {ratio} does not divide target_{dimension} {target} "
                f"(gives proxy {dimension} {size:g}); pick a ratio that does, or give proxy_{dimension}"
            )
    size = _proxy_size(target, proxy, ratio)
    if size >= target:
        raise ValueError(
            f"scaling.proxy_{dimension} ({size}) must be smaller than target_{dimension} ({target}); "
            f"without a smaller proxy there is nothing to scale: drop target_{dimension}"
        )
