"""The interface every sweep engine implements, and what every engine is built from.

A sweep's mode (plain trials, fused groups, fused groups in pipeline bubbles, a muP proxy around
any of them) is decided once, by `hpo.engines.choice.engine_for`; the `hpo.Tuner` then asks its
engine, and only its engine, what differs between the modes. Nothing else tests the mode.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ray import tune
from ray.tune.search.sample import Domain

from hpo.config.spec import CheckpointPolicy

if TYPE_CHECKING:
    from hpo.reporting.sweep_result import SweepResult


@dataclass(frozen=True)
class SweepPlan:
    """What the user asked of a sweep, as every engine reads it: validated once, by the `Tuner`."""

    #: The trainable Tune's trials train: a `Workload` (the proxy's, in a scaled sweep) or a function.
    trainable: Any
    resources: Mapping[str, float]
    param_space: Mapping[str, Any]
    tune_config: tune.TuneConfig
    max_iterations: int
    checkpoint: CheckpointPolicy = field(default_factory=CheckpointPolicy)
    #: Iterations a trial that is not stopped early runs (None when only a function trainable knows).
    iterations: int | None = None

    @property
    def metric(self) -> str | None:
        return self.tune_config.metric

    @property
    def mode(self) -> str:
        return self.tune_config.mode or "min"


@dataclass(frozen=True)
class TuneRun:
    """What an engine hands Tune: the trainable (with its per-trial resources), the search space,
    the Tune and run configs, and the actors it started, which live as long as the sweep's result."""

    trainable: Any
    param_space: dict[str, Any]
    tune_config: tune.TuneConfig
    run_config: tune.RunConfig
    actors: list[Any] = field(default_factory=list)


class SweepEngine(abc.ABC):
    """How one mode runs a sweep in Tune; the `hpo.Tuner` composes one and asks it what differs.

    Three calls, each made once: `start`, once Ray is up, starts what the mode needs (a broker, the
    groups' book) and returns what Tune is given; `result` turns Tune's grid into the sweep's
    result; `complete`, once the Tuner has read from the grid how the sweep ended, does what the
    mode does after its trials. An engine never asks which mode it is in; it is one.
    """

    @abc.abstractmethod
    def start(self, experiment: Path, tune_config: tune.TuneConfig, run_config: tune.RunConfig) -> TuneRun:
        """Start what the mode needs in the run folder `experiment` and return what Tune runs: the
        sweep's `tune_config` and `run_config` as this mode hands them to Tune (its searcher,
        scheduler and concurrency; its callbacks and checkpointing)."""

    @abc.abstractmethod
    def result(self, grid: tune.ResultGrid) -> SweepResult:
        """Tune's grid as the sweep's result: one result per configuration."""

    def complete(self, result: SweepResult) -> None:
        """What the mode does once its trials are over, told how the sweep ended (`result.interrupted`:
        stopped before its end, which `--resume` continues): a scaled sweep's transfer and target
        run. Nothing for the other modes."""


def workload_tune_config(tune_config: tune.TuneConfig) -> tune.TuneConfig:
    """hydro-hpo's own trainables (a `Workload`'s trial, a fused group, a relay) reset cleanly, so a
    trial process (and its torch import) serves trial after trial instead of starting anew each time."""
    return tune_config if tune_config.reuse_actors else replace(tune_config, reuse_actors=True)


def workload_run_config(run_config: tune.RunConfig, max_iterations: int) -> tune.RunConfig:
    """A `Workload` trains until `max_iterations` unless the run config says when to stop."""
    return run_config if run_config.stop is not None else replace(run_config, stop={"training_iteration": max_iterations})


def space_constants(space: Mapping[str, Any]) -> dict[str, Any]:
    """What a search space fixes, at every depth: `space` without its Tune domains and grid searches.

    Tune deep-merges a searcher's suggestion into the space, so a constant inside a nested dict
    (`{"opt": {"lr": tune.uniform(...), "wd": 0.1}}`) reaches the trial beside the suggested value;
    an engine that builds configs itself merges these the same way."""
    fixed: dict[str, Any] = {}
    for key, value in space.items():
        if isinstance(value, Domain) or (isinstance(value, Mapping) and "grid_search" in value):
            continue
        fixed[key] = space_constants(value) if isinstance(value, Mapping) else value
    return fixed
