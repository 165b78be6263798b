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

from hpo.base.lazy_names import lazy_names, public_names

_LAZY = {
    "fusion.grouping": ("FUSIBLE_KEYS", "MULTIPLIER_KEYS", "check_fusible", "group_configs", "structural_signature"),
    "fusion.layers": ("FusionError",),
    "fusion.model": ("FusedModel", "fuse_models"),
    "fusion.optim": ("FusedOptimizer",),
    "fusion.sizing": ("SizingDecision", "choose_num_members", "measure_member_bytes"),
    "fusion.trainer": ("FUSED_CHECKPOINT_FILE", "FusedTrainer"),
}


__getattr__ = lazy_names(__name__, _LAZY)


__all__ = public_names(_LAZY)
