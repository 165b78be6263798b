"""Horizontal fusion of tuning trials: B configurations of one architecture trained as one model.

Small trials leave a GPU launch-bound; stacking B members along a leading dimension lets one
kernel do the work of B (HFTA, MLSys'21; Hydro, OSDI'23).

- `FusedTrainer`: `TrialTrainer`'s shape for a group (per-member metrics, removal, checkpoints).
- `group_configs` / `check_fusible` / `FUSIBLE_KEYS`: which configs may share a group.
- `choose_num_members`: B from a measured dry run and the device's free memory.
- `fuse_models` / `FusedModel`: the fused model alone; `FusedOptimizer`: the fused optimizer.
- `FusionError`: a model or config group that cannot be fused (names the layer or key), including
  a model whose members could see each other once fused (`fusion.independence`).
"""

from fusion.grouping import FUSIBLE_KEYS, MULTIPLIER_KEYS, check_fusible, group_configs, structural_signature
from fusion.layers import FusionError
from fusion.model import FusedModel, build_member, fuse_models
from fusion.optim import FusedOptimizer
from fusion.sizing import SizingDecision, choose_num_members, measure_member_bytes

from fusion.trainer import FUSED_CHECKPOINT_FILE, MEMBER_CHECKPOINT_FILE, FusedTrainer

__all__ = [
    "FUSED_CHECKPOINT_FILE",
    "FUSIBLE_KEYS",
    "MEMBER_CHECKPOINT_FILE",
    "MULTIPLIER_KEYS",
    "FusedModel",
    "FusedOptimizer",
    "FusedTrainer",
    "FusionError",
    "SizingDecision",
    "build_member",
    "check_fusible",
    "choose_num_members",
    "fuse_models",
    "group_configs",
    "measure_member_bytes",
    "structural_signature",
]
