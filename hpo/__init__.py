"""hydro-hpo: hyperparameter tuning on Ray Tune with muP proxies, fused trials and pipeline bubbles.

Public entry points: `hpo.run` (like `tune.run`), `hpo.Tuner` (like `ray.tune.Tuner`), the YAML
schema `SweepSpec`, the `Workload` interface for model factories, `FusionConfig` and
`ScalingConfig`.

Every name loads on first use (PEP 562): the engines' pure-PyTorch modules (`hpo.base.workload`,
`hpo.base.hparams`, `hpo.scaling`) import where Ray is not installed, such as a GPU box running the
benchmarks, and the modules that must not import torch (`hpo --help`, `hpo validate`, fused member
trials) import `hpo` without paying for torch or Ray.

Importing `hpo` changes nothing in the process: an engine (`fusion`, `pipeline_bubble`,
`scheduler_bridge`) runs this file whenever it imports the base. Looking up one of the names below
sets Ray's loopback-only switch first (`hpo.base.ray_runtime`): they lead to a local Ray
(`Tuner.fit`, `run`), and Ray reads the switch when it is first imported.
"""

from hpo.base.lazy_names import lazy_names, public_names

_LAZY = {
    "hpo.base.workload": ("Workload", "DatasetWorkload"),
    "hpo.tuner.tuner": ("Tuner",),
    "hpo.tuner.sweep": ("run",),
    "hpo.config.errors": ("SweepConfigError",),
    "hpo.reporting.sweep_result": ("SweepResult",),
    "hpo.config.spec": ("SweepSpec", "FusionConfig"),
    "hpo.scaling._config": ("ScalingConfig",),
}


_lazy_getattr = lazy_names(__name__, _LAZY)


def __getattr__(name: str):
    if name in __all__:
        import hpo.base.ray_runtime  # noqa: F401  the loopback-only switch, before these modules import ray
    return _lazy_getattr(name)


__all__ = public_names(_LAZY)
