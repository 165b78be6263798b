"""Horizontal fusion of tuning trials: B configurations of one architecture trained as one model.

Small trials leave a GPU launch-bound; stacking B members along a leading dimension lets one
kernel do the work of B (HFTA, MLSys'21; Hydro, OSDI'23).

- `FusedTrainer`: `TrialTrainer`'s shape for a group (per-member metrics, removal, checkpoints).
- `group_configs` / `check_fusible` / `FUSIBLE_KEYS`: which configs may share a group.
- `choose_num_members`: B from a measured dry run and the device's free memory.
- `fuse_models` / `FusedModel`: the fused model alone; `FusedOptimizer`: the fused optimizer.
- `FusionError`: a model or config group that cannot be fused (names the layer or key), including
  a model whose members could see each other once fused (`fusion.independence`).

Names load on first use (PEP 562): `fusion.broker`, whose actor every fused member trial looks up,
must import without torch, and importing a submodule runs this file first.
"""

from hpo.base.lazy_names import lazy_names

_LAZY = {
    "FUSIBLE_KEYS": "fusion.grouping",
    "MULTIPLIER_KEYS": "fusion.grouping",
    "check_fusible": "fusion.grouping",
    "group_configs": "fusion.grouping",
    "structural_signature": "fusion.grouping",
    "FusionError": "fusion.layers",
    "FusedModel": "fusion.model",
    "fuse_models": "fusion.model",
    "FusedOptimizer": "fusion.optim",
    "SizingDecision": "fusion.sizing",
    "choose_num_members": "fusion.sizing",
    "measure_member_bytes": "fusion.sizing",
    "FUSED_CHECKPOINT_FILE": "fusion.trainer",
    "FusedTrainer": "fusion.trainer",
}


__getattr__ = lazy_names(__name__, _LAZY)


__all__ = sorted(_LAZY)
