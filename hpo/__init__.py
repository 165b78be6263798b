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

from hpo.base.lazy_names import lazy_names

_LAZY = {
    "Workload": "hpo.base.workload",
    "DatasetWorkload": "hpo.base.workload",
    "Tuner": "hpo.tuner.tuner",
    "run": "hpo.tuner.sweep",
    "SweepConfigError": "hpo.config.errors",
    "SweepResult": "hpo.reporting.sweep_result",
    "SweepSpec": "hpo.config.spec",
    "FusionConfig": "hpo.config.spec",
    "ScalingConfig": "hpo.scaling._config",
}


_lazy_getattr = lazy_names(__name__, _LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        import hpo.base.ray_runtime  # noqa: F401  the loopback-only switch, before these modules import ray
    return _lazy_getattr(name)


__all__ = ["DatasetWorkload", "FusionConfig", "ScalingConfig", "SweepConfigError", "SweepResult", "SweepSpec", "Tuner", "Workload", "run"]
