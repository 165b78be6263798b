"""muP proxy tuning: scale the model down, tune the proxy, transfer to the target.

- `ScalingConfig`: the validated `scaling:` block (target width and depth, proxy sizes or ratios, ...).
- `proxy_workload` / `target_workload`: a user's `Workload` built in muP (Microsoft's `mup`) and,
  for depth, CompleteP (`hpo.scaling._depth`: residual-branch multiplier, per-group lr and eps).
- `coord_check` / `depth_coord_check` (options: `CheckOptions`): the coordinate check over several widths (muP) or depths
  (CompleteP), with a plot and a verdict.
- `transfer_config` / `train_target` / `train_transferred` / `complete_transfer`: the proxy's best
  config carried to the target, `transfer.json`, and the optional final training of the target.
- `EagerTransferPolicy` and `EagerTransferCallback` (a `ray.tune.Callback`): train the target
  while the proxy sweep is still running.

Every name loads on first use (PEP 562): `EagerTransferCallback` needs Ray, `ScalingConfig` only
pydantic, the rest torch and mup; so the muP engine runs where Ray is not installed, and the sweep
schema (`ScalingConfig`) loads without torch.
"""

from hpo.base.lazy_names import lazy_names, public_names

_LAZY = {
    "hpo.scaling._coord_check": ("CheckOptions", "CoordCheckReport", "coord_check", "depth_coord_check"),
    "hpo.scaling._eager": ("Decision", "EagerTransferPolicy"),
    "hpo.scaling._depth": ("depth_contract_problem",),
    "hpo.scaling._mup": ("MuPWorkload", "ScalingError", "mup_factors", "proxy_workload", "target_workload"),
    "hpo.scaling._transfer": (
        "NON_TRANSFERABLE", "TRANSFERABLE", "TargetRun", "TransferResult", "complete_transfer", "train_target",
        "train_transferred", "transfer_config",
    ),
    "hpo.scaling._config": ("ScalingConfig",),
    "hpo.scaling._callback": ("EagerTransferCallback",),
}


__getattr__ = lazy_names(__name__, _LAZY)


__all__ = public_names(_LAZY)
