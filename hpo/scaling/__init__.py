"""muP proxy tuning: scale the model down, tune the proxy, transfer to the target.

- `ScalingConfig`: the validated `scaling:` block (target width and depth, proxy sizes or ratios, ...).
- `proxy_workload` / `target_workload`: a user's `Workload` built in muP (Microsoft's `mup`) and,
  for depth, CompleteP (`hpo.scaling._depth`: residual-branch multiplier, per-group lr and eps).
- `coord_check` / `depth_coord_check` (options: `CheckOptions`): the coordinate check over several widths (muP) or depths
  (CompleteP), with a plot and a verdict.
- `transfer_config` / `train_target` / `complete_transfer`: the proxy's best config carried to
  the target, `transfer.json`, and the optional final training of the target.
- `EagerTransferPolicy` and `EagerTransferCallback` (a `ray.tune.Callback`): train the target
  while the proxy sweep is still running.

Every name loads on first use (PEP 562): `EagerTransferCallback` needs Ray, `ScalingConfig` only
pydantic, the rest torch and mup; so the muP engine runs where Ray is not installed, and the sweep
schema (`ScalingConfig`) loads without torch.
"""

from hpo.base.lazy_names import lazy_names

_LAZY = {
    "CheckOptions": "hpo.scaling._coord_check",
    "CoordCheckReport": "hpo.scaling._coord_check",
    "coord_check": "hpo.scaling._coord_check",
    "depth_coord_check": "hpo.scaling._coord_check",
    "Decision": "hpo.scaling._eager",
    "EagerTransferPolicy": "hpo.scaling._eager",
    "depth_contract_problem": "hpo.scaling._depth",
    "MuPWorkload": "hpo.scaling._mup",
    "ScalingError": "hpo.scaling._mup",
    "mup_factors": "hpo.scaling._mup",
    "proxy_workload": "hpo.scaling._mup",
    "target_workload": "hpo.scaling._mup",
    "NON_TRANSFERABLE": "hpo.scaling._transfer",
    "TRANSFERABLE": "hpo.scaling._transfer",
    "TargetRun": "hpo.scaling._transfer",
    "TransferResult": "hpo.scaling._transfer",
    "complete_transfer": "hpo.scaling._transfer",
    "train_target": "hpo.scaling._transfer",
    "transfer_config": "hpo.scaling._transfer",
    "ScalingConfig": "hpo.scaling._config",
    "EagerTransferCallback": "hpo.scaling._callback",
}


__getattr__ = lazy_names(__name__, _LAZY)


__all__ = [
    "NON_TRANSFERABLE",
    "TRANSFERABLE",
    "CheckOptions",
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
    "depth_contract_problem",
    "depth_coord_check",
    "mup_factors",
    "proxy_workload",
    "target_workload",
    "train_target",
    "transfer_config",
]
