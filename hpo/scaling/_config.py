"""`ScalingConfig`: the `scaling:` block of a sweep, validated once at the edge."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


class ScalingConfig(BaseModel):
    """Tune a narrow muP proxy of the model and transfer the result to the target width.

    Exactly one of `proxy_width` and `ratio` sets the proxy (`ratio = target_width / proxy_width`).
    muP's base shapes default to the target width, so the target trains in ordinary
    parametrisation and transferred hyperparameters apply to it unchanged.

    Example::

        ScalingConfig(target_width=1024, ratio=8)            # proxy width 128
        ScalingConfig(target_width=1024, proxy_width=128, eager_transfer=0.5)
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    target_width: int = Field(gt=0, description="Width of the model you want to train.")
    proxy_width: int | None = Field(default=None, gt=0, description="Width of the tuned proxy.")
    ratio: float | None = Field(default=None, gt=1, description="target_width / proxy_width.")
    base_width: int | None = Field(
        default=None, gt=0, description="muP base width (where muP equals standard parametrisation); default target_width."
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
        default=0.25, gt=0, description="Largest |slope| of log2(activation size) against log2(width)."
    )

    @model_validator(mode="after")
    def _one_proxy_size(self) -> "ScalingConfig":
        if (self.proxy_width is None) == (self.ratio is None):
            raise ValueError(
                "scaling needs exactly one of 'proxy_width' (e.g. proxy_width: 128) and 'ratio' "
                f"(e.g. ratio: 8); got proxy_width={self.proxy_width}, ratio={self.ratio}"
            )
        if self.ratio is not None:
            proxy = self.target_width / self.ratio
            if abs(proxy - round(proxy)) > 1e-9:
                raise ValueError(
                    f"scaling.ratio {self.ratio} does not divide target_width {self.target_width} "
                    f"(gives proxy width {proxy:g}); pick a ratio that does, or give proxy_width"
                )
        if self.proxy >= self.target_width:
            raise ValueError(
                f"scaling.proxy_width ({self.proxy}) must be smaller than target_width ({self.target_width}); "
                "without a narrower proxy there is nothing to scale: drop the scaling block"
            )
        return self

    @property
    def proxy(self) -> int:
        """The proxy width, from `proxy_width` or `target_width / ratio`."""
        if self.proxy_width is not None:
            return self.proxy_width
        return int(round(self.target_width / self.ratio))

    @property
    def base(self) -> int:
        """muP's base width: `base_width`, or the target width."""
        return self.base_width if self.base_width is not None else self.target_width
