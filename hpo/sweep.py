"""From a YAML sweep file to a running `hpo.Tuner`: the path `hpo run FILE` takes.

Loading and checking the file (`load_sweep`, `describe_plan`) live in `hpo.sweep_file`, which
imports no Ray; they are re-exported here for callers of this module.
"""

from __future__ import annotations

from ray import tune

from hpo.api import Tuner, sweep_run_config
from hpo.logging_callbacks import logger_callbacks
from hpo.progress import ProgressCallback
from hpo.search_space import param_space
from hpo.strategy import build_scheduler, build_searcher
from hpo.sweep_file import LoadedSweep, describe_plan, load_sweep

__all__ = ["LoadedSweep", "build_tuner", "describe_plan", "load_sweep"]


def build_tuner(loaded: LoadedSweep, show_progress: bool = False) -> Tuner:
    spec = loaded.spec
    callbacks = [ProgressCallback(spec.metric.name, spec.metric.mode, spec.num_samples if spec.method != "grid" else None)]
    stop = {"training_iteration": spec.max_iterations, **(spec.stop or {})}
    return Tuner(
        loaded.trainable,
        param_space=param_space(spec),
        tune_config=tune.TuneConfig(
            metric=spec.metric.name,
            mode=spec.metric.mode,
            num_samples=spec.num_samples,
            search_alg=build_searcher(spec),
            scheduler=build_scheduler(spec),
            max_concurrent_trials=spec.max_concurrent_trials,
            time_budget_s=spec.time_budget_s,
            reuse_actors=True,
        ),
        run_config=sweep_run_config(
            spec.name, spec.storage_path, stop, spec.max_failures,
            (callbacks if show_progress else []) + logger_callbacks(spec.logging, spec.name, loaded.experiment_path, loaded.source), verbose=0,
        ),
        resources={"cpu": spec.resources.cpu, "gpu": spec.resources.gpu},
        scaling=spec.scaling,
        fusion=spec.fusion,
        checkpoint=spec.checkpoint,
        search_seed=spec.seed,
    )
