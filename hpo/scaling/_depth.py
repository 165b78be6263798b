"""Depth scaling (Depth-muP, CompleteP): the residual-branch multiplier and the hidden layers' factors.

A model of L residual blocks trains like its base of L_base blocks, with the same optimal
learning rate, when (Dey et al. 2025, "Don't be lazy: CompleteP enables compute-efficient deep
transformers", table 1; its reference code EleutherAI/nanoGPT-mup, branch `completep`,
`model.py`: `Block.residual_scaling` and `GPT.configure_optimizers`):

- every residual branch is multiplied by (L / L_base)**-alpha: `x = x + m * branch(x)`;
- the hidden parameters, every parameter inside the residual blocks (weights, biases and
  LayerNorms alike), train under Adam/AdamW with lr x (L / L_base)**(alpha - 1) and Adam eps x
  (L / L_base)**-alpha, so eps stays below their updates as those shrink;
- the embeddings, the final norm and the readout keep their learning rate and eps;
- weight decay keeps its value (nanoGPT-mup's `completep` gives hidden weights
  `weight_decay / width_lr_scaling`, with no depth factor); it does not transfer anyway.

alpha = 1 is CompleteP. alpha = 0.5 is Depth-muP (Tensor Programs VI: branch multiplier
1/sqrt(L), Adam lr x 1/sqrt(L), SGD lr unchanged). For SGD, which CompleteP does not treat, the
hidden lr is x (L / L_base)**(2 alpha - 1): a hidden weight's gradient carries the branch
multiplier, so this keeps each block's update at the size the Adam rule gives it, and it is
Depth-muP's constant SGD learning rate at alpha = 0.5.

The width rules (muP, `hpo.scaling._mup`) multiply with these: a hidden matrix under Adam gets
lr x base_width/width x (L / L_base)**(alpha - 1), as in nanoGPT-mup's `completep`. Adam's eps is
scaled by depth only: `mup` does not scale it by width, and width-only sweeps keep their numbers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch import nn

from hpo.base.workload import RESIDUAL_MULT, Workload

if TYPE_CHECKING:
    from hpo.scaling._config import ScalingConfig

#: Adam-type optimizers: lr exponent alpha - 1, eps exponent -alpha. SGD: lr exponent 2 alpha - 1.
ADAM_OPTIMIZERS = ("adam", "adamw")


def residual_multiplier(depth: int, base_depth: int, alpha: float) -> float:
    """The factor on every residual branch: (depth / base_depth)**-alpha (1 at the base depth)."""
    return (depth / base_depth) ** -alpha


def hidden_lr_factor(depth: int, base_depth: int, alpha: float, optimizer: str) -> float:
    """The hidden parameters' learning-rate factor: Adam (L/L_base)**(alpha-1), SGD (L/L_base)**(2 alpha-1)."""
    if optimizer in ADAM_OPTIMIZERS:
        return (depth / base_depth) ** (alpha - 1)
    if optimizer == "sgd":
        return (depth / base_depth) ** (2 * alpha - 1)
    raise ValueError(f"optimizer {optimizer!r} has no depth-scaling rule here; expected 'sgd', 'adam' or 'adamw'")


def hidden_eps_factor(depth: int, base_depth: int, alpha: float) -> float:
    """The hidden parameters' Adam eps factor, (L/L_base)**-alpha."""
    return (depth / base_depth) ** -alpha


def hidden_parameters(model: nn.Module, residual_blocks: str) -> list[str]:
    """Names of the parameters inside the residual blocks (`Workload.residual_blocks`)."""
    prefix = f"{residual_blocks}."
    return [name for name, _ in model.named_parameters() if name.startswith(prefix)]


def depth_contract_problem(workload: Workload) -> str | None:
    """Why `workload` cannot be scaled in depth, in one line; None when it declares the contract."""
    key = getattr(workload, "depth_key", None)
    if isinstance(key, str) and key:
        return None
    if key is not None:
        return (
            f"workload {getattr(workload, 'name', type(workload).__name__)!r}: depth_key must name the config key "
            f"that sets its number of residual blocks (a string such as 'n_layer'), got {key!r}"
        )
    return (
        f"workload {getattr(workload, 'name', type(workload).__name__)!r} has no depth contract, so it cannot be "
        "scaled in depth: declare `depth_key` (the config key that sets its number of residual blocks), keep the "
        f"blocks under `residual_blocks` and multiply each residual branch by config[{RESIDUAL_MULT!r}] "
        "(docs/workload_guide.md, 'Depth')"
    )


def depth_description(depth_key: str, proxy: int, target: int, base: int, alpha: float) -> dict[str, Any]:
    """What depth scaling did to the proxy and the target, for `transfer.json`."""

    def at(depth: int) -> dict[str, float]:
        return {
            "depth": depth,
            RESIDUAL_MULT: residual_multiplier(depth, base, alpha),
            "hidden_adam_lr_factor": hidden_lr_factor(depth, base, alpha, "adam"),
            "hidden_sgd_lr_factor": hidden_lr_factor(depth, base, alpha, "sgd"),
            "hidden_adam_eps_factor": hidden_eps_factor(depth, base, alpha),
        }

    name = {1.0: "CompleteP (Dey et al. 2025)", 0.5: "Depth-muP (Tensor Programs VI)"}.get(float(alpha), "depth scaling")
    return {
        "key": depth_key,
        "proxy": proxy,
        "target": target,
        "base": base,
        "alpha": alpha,
        "parametrization": name,
        "rule": (
            f"{RESIDUAL_MULT} x (L/{base})^-{alpha:g} on every residual branch; parameters inside the residual "
            f"blocks: Adam lr x (L/{base})^({alpha:g}-1), Adam eps x (L/{base})^-{alpha:g}, SGD lr x "
            f"(L/{base})^(2*{alpha:g}-1); embeddings, final norm and readout unchanged"
        ),
        "proxy_factors": at(proxy),
        "target_factors": at(target),
    }


def depth_settings(scaling: "ScalingConfig", target: bool) -> dict[str, Any]:
    """`MuPWorkload`'s depth arguments for the proxy (or the target) of `scaling`; none without depth."""
    if not scaling.scales_depth:
        return {}
    return {
        "depth": scaling.target_depth if target else scaling.depth_proxy,
        "base_depth": scaling.depth_base,
        "depth_alpha": scaling.depth_alpha,
    }
