"""muP proxy tuning: scale the model down, tune the proxy, transfer to the target.

- `ScalingConfig`: the validated `scaling:` block (target width, proxy width or ratio, ...).
- `proxy_workload` / `target_workload`: a user's `Workload` built in muP (Microsoft's `mup`).
- `coord_check`: muP's coordinate check over several widths, with a plot and a verdict.
- `transfer_config` / `train_target` / `complete_transfer`: the proxy's best config carried to
  the target, `transfer.json`, and the optional final training of the target.
- `EagerTransferPolicy` and `EagerTransferCallback` (a `ray.tune.Callback`): train the target
  while the proxy sweep is still running.

Only `EagerTransferCallback` needs Ray and only `ScalingConfig` needs pydantic; both load on first
use (PEP 562), so the muP engine and its benchmark run where neither is installed.
"""

from hpo.scaling._coord_check import CoordCheckReport, coord_check
from hpo.scaling._eager import Decision, EagerTransferPolicy
from hpo.scaling._mup import MuPWorkload, ScalingError, mup_factors, proxy_workload, target_workload
from hpo.scaling._transfer import (
    NON_TRANSFERABLE,
    TRANSFERABLE,
    TargetRun,
    TransferResult,
    complete_transfer,
    train_target,
    transfer_config,
)

_LAZY = {"ScalingConfig": "hpo.scaling._config", "EagerTransferCallback": "hpo.scaling._callback"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'hpo.scaling' has no attribute {name!r}")


__all__ = [
    "NON_TRANSFERABLE",
    "TRANSFERABLE",
    "CoordCheckReport",
    "Decision",
    "EagerTransferCallback",
    "EagerTransferPolicy",
    "MuPWorkload",
    "ScalingConfig",
    "ScalingError",
    "TargetRun",
    "TransferResult",
    "complete_transfer",
    "coord_check",
    "mup_factors",
    "proxy_workload",
    "target_workload",
    "train_target",
    "transfer_config",
]
