"""From a YAML sweep file to a running `hpo.Tuner`: the path `hpo run FILE` takes."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ray import tune

from hpo.api import Tuner, sweep_run_config
from hpo.logging_callbacks import logger_callbacks
from hpo.progress import ProgressCallback
from hpo.errors import ConfigIssue, SweepConfigError
from hpo.search_space import param_space
from hpo.spec import SweepSpec
from hpo.strategy import build_scheduler, build_searcher
from hpo.trainables import TrainableNotFound, reported_metrics, resolve_trainable
from hpo.yaml_source import YamlSource


@dataclass
class LoadedSweep:
    spec: SweepSpec
    trainable: Any
    source: YamlSource

    @property
    def experiment_path(self) -> Path:
        return Path(self.spec.storage_path).resolve() / self.spec.name


def load_sweep(path: str | Path) -> LoadedSweep:
    """Parse, validate and resolve a sweep file; every problem is a `SweepConfigError` with a line."""
    source = YamlSource.from_file(path)
    spec = SweepSpec.from_source(source)
    try:
        trainable = resolve_trainable(spec.trainable, search_dir=Path(path).resolve().parent)
    except TrainableNotFound as exc:
        raise SweepConfigError([ConfigIssue("trainable", str(exc), source.line_of("trainable"))], source.name) from None
    known = reported_metrics(trainable)
    if known is not None and spec.metric.name not in known:
        message = f"the trainable never reports {spec.metric.name!r}; it reports {', '.join(sorted(known))}"
        raise SweepConfigError([ConfigIssue("metric.name", message, source.line_of("metric.name"))], source.name)
    return LoadedSweep(spec, trainable, source)


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
        ),
        run_config=sweep_run_config(
            spec.name, spec.storage_path, stop, spec.max_failures,
            (callbacks if show_progress else []) + logger_callbacks(spec.logging, spec.name, loaded.experiment_path, loaded.source), verbose=0,
        ),
        resources={"cpu": spec.resources.cpu, "gpu": spec.resources.gpu},
        scaling=spec.scaling,
        fusion=spec.fusion,
    )


def describe_plan(loaded: LoadedSweep) -> str:
    """What `hpo run --dry-run` prints: the resolved space, searcher and scheduler, without Ray."""
    from hpo.search_space import describe

    spec = loaded.spec
    lines = [f"sweep {spec.name!r}: trainable {spec.trainable}, metric {spec.metric.name} ({spec.metric.goal})"]
    lines.append(f"searcher: {type(build_searcher(spec)).__name__} (method {spec.method}), samples: {spec.num_samples}")
    scheduler = build_scheduler(spec)
    lines.append(f"scheduler: {type(scheduler).__name__}, max_iterations: {spec.max_iterations}")
    lines.append(f"resources per trial: {spec.resources.model_dump()}, storage: {loaded.experiment_path}")
    lines.append("search space:")
    lines += [f"  {key}: {text}" for key, text in describe(param_space(spec)).items()]
    if spec.fusion:
        lines.append(f"fusion: {spec.fusion.model_dump()}")
    if spec.scaling:
        lines.append(f"scaling: proxy width {spec.scaling.proxy} -> target width {spec.scaling.target_width}")
    return "\n".join(lines)
