"""Which configurations can train together in one fused group.

The rule: a config key is *fusible* (may differ between members of one group) when it is

- an optimizer hyperparameter (`OptimHParams.keys()`), except `optimizer` itself, whose state
  differs in kind (SGD momentum vs Adam moments);
- `seed` (each member is built with its own seed before fusion);
- a muP multiplier or init scale (`MULTIPLIER_KEYS`): members are built separately, so init
  scales differ freely, and multipliers that differ become per-member buffers of the fused model.

Every other key is *structural* and must be equal within a group: `width`, `depth`, other
architecture keys, `batch_size` and `data_seed` (members share input batches), `dropout`,
`steps_per_iteration`. Keys a config leaves out count with the workload's default, so compare
resolved configs (`workload.resolve`).

Example::

    groups = group_configs([{"lr": 1e-3, "width": 64}, {"lr": 3e-3, "width": 64}, {"lr": 1e-3, "width": 128}])
    # [[0, 1], [2]]
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from fusion.layers import FusionError
from hpo.base.hparams import OptimHParams

#: muP's transferable keys that are neither optimizer settings nor structure (hpo.scaling.TRANSFERABLE
#: minus the optimizer keys); a test keeps the two lists in step.
MULTIPLIER_KEYS: frozenset[str] = frozenset(
    {"init_std", "output_mult", "emb_mult", "attn_mult", "attn_scale", "readout_zero_init", "residual_mult"}
)

FUSIBLE_KEYS: frozenset[str] = (OptimHParams.keys() - {"optimizer"}) | {"seed"} | MULTIPLIER_KEYS


def _comparable(value: Any) -> Any:
    """64 and 64.0 (YAML, samplers) are the same structure; everything else compares by repr."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return repr(value)


def structural_signature(config: Mapping[str, Any], fusible_keys: Iterable[str] = FUSIBLE_KEYS) -> tuple:
    """The part of `config` that must be equal for two configs to share a fused group."""
    fusible = frozenset(fusible_keys)
    return tuple(sorted((key, _comparable(value)) for key, value in config.items() if key not in fusible))


def check_fusible(configs: Sequence[Mapping[str, Any]], fusible_keys: Iterable[str] = FUSIBLE_KEYS) -> None:
    """Raise FusionError naming the first structural key on which the configs disagree."""
    fusible = frozenset(fusible_keys)
    first = configs[0]
    for i, config in enumerate(configs[1:], start=1):
        for key in sorted((set(first) | set(config)) - fusible):
            if _comparable(first.get(key)) != _comparable(config.get(key)):
                raise FusionError(
                    f"config {i} differs from config 0 in structural key {key!r} "
                    f"({config.get(key)!r} vs {first.get(key)!r}); fusible keys: {sorted(fusible)}"
                )


def group_configs(
    configs: Sequence[Mapping[str, Any]],
    max_members: int | None = None,
    fusible_keys: Iterable[str] = FUSIBLE_KEYS,
) -> list[list[int]]:
    """Indices of `configs` split into fusible groups of at most `max_members`, in first-seen order."""
    if max_members is not None and max_members < 1:
        raise ValueError(f"max_members must be at least 1, got {max_members}")
    fusible = frozenset(fusible_keys)
    by_signature: dict[tuple, list[int]] = {}
    for index, config in enumerate(configs):
        by_signature.setdefault(structural_signature(config, fusible), []).append(index)
    groups: list[list[int]] = []
    for members in by_signature.values():
        size = max_members or len(members)
        groups.extend(members[start : start + size] for start in range(0, len(members), size))
    return groups
