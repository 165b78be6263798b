"""The sweep file's `logging:` block: TensorBoard, MLflow and W&B through Ray Tune's own loggers.

A Tune user already passes `TBXLoggerCallback`, `MLflowLoggerCallback` or `WandbLoggerCallback`
to `RunConfig(callbacks=...)`; a YAML sweep gets the same callbacks from three lines, so runs land
where that user's tools already look. The libraries are optional (`pip install 'hydro-hpo[logging]'`):
a block naming one that is missing fails validation, with its line, before Ray starts.

Example::

    logging:
      tensorboard: true                        # event files in every trial folder
      mlflow: {tracking_uri: sqlite:///mlflow.db}
      wandb: {project: digits, mode: offline}  # runs/<sweep>/wandb/offline-run-*; `wandb sync` them later
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from hpo.config.errors import ConfigIssue, SweepConfigError
from hpo.base.scoped_environ import scoped_environ

if TYPE_CHECKING:  # the spec imports this module, and the spec loads where Ray is not installed
    from ray import tune

#: The extra that installs every logging library.
EXTRA = "hydro-hpo[logging]"


def _require(module: str, package: str) -> None:
    """A missing library is a config error of the key that asked for it, not an ImportError in Ray."""
    if importlib.util.find_spec(module) is None:
        raise ValueError(f"needs the {package} package, which is not installed: pip install '{EXTRA}'")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class MLflowSpec(_Strict):
    """`MLflowLoggerCallback`'s settings: one MLflow run per trial, in one experiment per sweep."""

    tracking_uri: str | None = None
    #: Defaults to the sweep's name.
    experiment_name: str | None = None
    tags: dict[str, str] | None = None
    #: Copy each trial's folder (checkpoints included) into the run's artifacts.
    save_artifact: bool = False


class WandbSpec(_Strict):
    """`WandbLoggerCallback`'s settings: one W&B run per trial, grouped by sweep."""

    #: Defaults to the sweep's name.
    project: str | None = None
    entity: str | None = None
    group: str | None = None
    mode: Literal["online", "offline", "disabled"] = "online"
    tags: list[str] | None = None
    #: Where W&B writes its `wandb/` folder of runs; by default the sweep's folder. (Not the trial
    #: folders: Tune copies those to storage at checkpoints, and a run W&B finishes after the last
    #: copy would stay behind in Ray's session directory.)
    dir: str | None = None


class LoggingSpec(_Strict):
    tensorboard: bool = False
    mlflow: MLflowSpec | None = None
    wandb: WandbSpec | None = None

    @field_validator("tensorboard")
    @classmethod
    def _tensorboard_installed(cls, enabled: bool) -> bool:
        if enabled:
            _require("tensorboardX", "tensorboardX")
        return enabled

    @field_validator("mlflow")
    @classmethod
    def _mlflow_installed(cls, spec: MLflowSpec | None) -> MLflowSpec | None:
        if spec is not None:
            _require("mlflow", "mlflow")
        return spec

    @field_validator("wandb")
    @classmethod
    def _wandb_installed(cls, spec: WandbSpec | None) -> WandbSpec | None:
        if spec is not None:
            _require("wandb", "wandb")
        return spec


#: Nested models of the block, by key path in the sweep file (for "unknown key" suggestions).
MODELS_BY_PATH = {"logging": LoggingSpec, "logging.mlflow": MLflowSpec, "logging.wandb": WandbSpec}


def as_logging_spec(block: LoggingSpec | Mapping[str, Any]) -> LoggingSpec:
    """`hpo.run(logging={...})`: the sweep file's block as a dict, checked as the YAML block is, so a
    mistyped key fails in one line before Ray starts rather than as a logger error in every trial."""
    if isinstance(block, LoggingSpec):
        return block
    try:
        return LoggingSpec.model_validate(dict(block))
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(["logging", *map(str, error["loc"])])
        raise ValueError(f"{where}: {error['msg'].removeprefix('Value error, ')}") from None


def logger_callbacks(
    spec: LoggingSpec | None, sweep: str, experiment_dir: Path, source: Any = None
) -> list[tune.Callback]:
    """Ray Tune's logger callbacks for the `logging:` block of sweep `sweep`, stored in `experiment_dir`.

    `source` (the sweep's `YamlSource`) lets a tracking store that MLflow refuses be reported with
    its line, before any trial starts, instead of as a traceback from inside Tune.
    """
    if spec is None:
        return []
    callbacks: list[tune.Callback] = []
    if spec.tensorboard:
        from ray.tune.logger import TBXLoggerCallback

        callbacks.append(TBXLoggerCallback())
    if spec.mlflow is not None:
        callbacks.append(_mlflow_callback(spec.mlflow, sweep, source))
    if spec.wandb is not None:
        callbacks.append(_wandb_callback(spec.wandb, sweep, experiment_dir))
    return callbacks


def _mlflow_callback(spec: MLflowSpec, sweep: str, source: Any) -> tune.Callback:
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient
    from ray.air.integrations.mlflow import MLflowLoggerCallback

    try:
        MlflowClient(tracking_uri=spec.tracking_uri).search_experiments(max_results=1)
    except MlflowException as exc:
        key = "logging.mlflow.tracking_uri"
        line = source.line_of(key) if source is not None else None
        message = f"MLflow cannot use tracking store {spec.tracking_uri!r}: {exc.message.splitlines()[0]}"
        raise SweepConfigError([ConfigIssue(key, message, line)], source.name if source is not None else None) from None
    return MLflowLoggerCallback(
        tracking_uri=spec.tracking_uri,
        experiment_name=spec.experiment_name or sweep,
        tags=spec.tags,
        save_artifact=spec.save_artifact,
    )


def _wandb_callback(spec: WandbSpec, sweep: str, experiment_dir: Path) -> tune.Callback:
    from ray.air.integrations.wandb import WandbLoggerCallback

    class QuietAtExitWandbLoggerCallback(WandbLoggerCallback):
        """Ray's finaliser calls `ray.is_initialized()` even at interpreter exit, when `ray` is
        gone, and prints a traceback after every CLI sweep; by then the logging actors ended with
        the sweep (`on_experiment_end`) or with Ray."""

        def __del__(self) -> None:
            if not sys.is_finalizing():
                super().__del__()

        def setup(self, *args: Any, **kwargs: Any) -> None:
            """Ray asks for an API key here unless W&B's own switch says offline. The logging
            actors get the mode through `wandb.init` below, so the switch is set only while Ray
            checks: the process's environment is the user's again afterwards."""
            with scoped_environ({"WANDB_MODE": spec.mode} if spec.mode != "online" else {}):
                super().setup(*args, **kwargs)

    directory = Path(spec.dir or experiment_dir).expanduser().resolve()
    directory.mkdir(parents=True, exist_ok=True)
    init = {key: value for key, value in {"entity": spec.entity, "tags": spec.tags}.items() if value}
    return QuietAtExitWandbLoggerCallback(project=spec.project or sweep, group=spec.group, mode=spec.mode, dir=str(directory), **init)
