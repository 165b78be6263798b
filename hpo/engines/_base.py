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
from typing import TYPE_CHECKING, Any, TypeVar

from ray import tune

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


class SweepEngine(abc.ABC):
    """How one mode runs a sweep in Tune; the `hpo.Tuner` composes one and asks it what differs.

    The `Tuner` calls `start` first, once Ray is up: what it starts is what the other calls hand to
    Tune, and the actors it returns live as long as the sweep's result. Then `trainable`,
    `param_space`, `tune_config` and `run_config` build Tune's `Tuner`, and `result` turns Tune's
    grid into the sweep's result. An engine never asks which mode it is in; it is one.
    """

    @abc.abstractmethod
    def start(self, experiment: Path) -> list[Any]:
        """Start what the mode needs before Tune runs; the actors returned live as long as the result."""

    @abc.abstractmethod
    def trainable(self) -> Any:
        """The trainable Tune runs, with its per-trial resources."""

    @abc.abstractmethod
    def param_space(self) -> dict[str, Any]:
        """The search space Tune is given."""

    @abc.abstractmethod
    def tune_config(self, tune_config: tune.TuneConfig) -> tune.TuneConfig:
        """The sweep's TuneConfig as this mode hands it to Tune (searcher, scheduler, concurrency)."""

    @abc.abstractmethod
    def run_config(self, run_config: tune.RunConfig) -> tune.RunConfig:
        """The sweep's RunConfig with the mode's callbacks (results files, relays) and checkpointing."""

    @abc.abstractmethod
    def result(self, grid: tune.ResultGrid) -> SweepResult:
        """Tune's grid as the sweep's result: one result per configuration."""


T = TypeVar("T")


def started(engine: SweepEngine, built: T | None, what: str) -> T:
    """What `engine.start` built (`what` it does, for the message): Tune's pieces need Ray up and
    the run's folder, so asking for them first is the caller's mistake, said as such."""
    if built is None:
        raise RuntimeError(f"{type(engine).__name__}.start(experiment) {what}; call it first")
    return built


def workload_tune_config(tune_config: tune.TuneConfig) -> tune.TuneConfig:
    """hydro-hpo's own trainables (a `Workload`'s trial, a fused group, a relay) reset cleanly, so a
    trial process (and its torch import) serves trial after trial instead of starting anew each time."""
    return tune_config if tune_config.reuse_actors else replace(tune_config, reuse_actors=True)


def workload_run_config(run_config: tune.RunConfig, max_iterations: int) -> tune.RunConfig:
    """A `Workload` trains until `max_iterations` unless the run config says when to stop."""
    return run_config if run_config.stop is not None else replace(run_config, stop={"training_iteration": max_iterations})
