"""hydro-hpo: hyperparameter tuning on Ray Tune with muP proxies, fused trials and pipeline bubbles.

Public entry points: `hpo.run` (like `tune.run`), `hpo.Tuner` (like `ray.tune.Tuner`), the YAML
schema `SweepSpec`, the `Workload` interface for model factories, and `FusionConfig`.
"""

from hpo.api import Tuner, run
from hpo.errors import SweepConfigError
from hpo.results import SweepResult
from hpo.spec import FusionConfig, SweepSpec
from hpo.workload import Workload

__all__ = ["FusionConfig", "SweepConfigError", "SweepResult", "SweepSpec", "Tuner", "Workload", "run"]
