"""The sweep file's `logging:` block: TensorBoard, MLflow and W&B through Ray Tune's own loggers
(`hpo.reporting.logging_callbacks` builds them).

A YAML sweep gets Tune's logger callbacks from three lines. The libraries are optional
(`pip install 'hydro-hpo[logging]'`): a block naming one that is missing fails validation, with its
line, before Ray starts.

Example::

    logging:
      tensorboard: true                        # event files in every trial folder
      mlflow: {tracking_uri: sqlite:///mlflow.db}
      wandb: {project: digits, mode: offline}  # runs/<sweep>/wandb/offline-run-*; `wandb sync` them later
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator

from hpo.config.errors import checked_block

#: The extra that installs every logging library.
EXTRA = "hydro-hpo[logging]"
#: The module each key of the block needs, and the package that installs it.
LIBRARIES = {"tensorboard": ("tensorboardX", "tensorboardX"), "mlflow": ("mlflow", "mlflow"), "wandb": ("wandb", "wandb")}


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
    """W&B's settings (`hpo.reporting.wandb_runs`): one W&B run per trial, grouped by sweep."""

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

    @field_validator("project", "tags")
    @classmethod
    def _as_wandb_takes_it(cls, value: Any, info: ValidationInfo) -> Any:
        """W&B's own rules for a project name ('/', '#', ':' ... refused) and tags (1 to 64
        characters): W&B applies them only inside each trial's run, where a refusal lost every run
        while the sweep went on and exited 0."""
        if value is None or importlib.util.find_spec("wandb") is None:
            return value  # a missing wandb is the block's own error (`LoggingSpec._installed`)
        import wandb

        setting = {"project": "project", "tags": "run_tags"}[info.field_name]
        try:
            wandb.Settings(**{setting: tuple(value) if isinstance(value, list) else value})
        except ValueError as exc:  # pydantic's ValidationError, W&B's Settings being a pydantic model
            errors = getattr(exc, "errors", None)
            raise ValueError(f"W&B refuses it: {errors()[0]['msg'].removeprefix('Value error, ') if errors else exc}") from None
        except wandb.errors.UsageError as exc:
            raise ValueError(f"W&B refuses it: {exc}") from None
        return value


class LoggingSpec(_Strict):
    tensorboard: bool = False
    mlflow: MLflowSpec | None = None
    wandb: WandbSpec | None = None

    def relative_to(self, folder: Path) -> LoggingSpec:
        """The block with its relative local paths (an MLflow store given as `mlruns` or
        `sqlite:///runs/mlflow.db`, W&B's `dir`) taken as relative to `folder`: a sweep file's,
        whose relative `storage_path` is relative to it too, so a run, its `--resume` and its
        tracking store stay together whichever folder `hpo` runs in."""
        mlflow, wandb = self.mlflow, self.wandb
        if mlflow is not None and mlflow.tracking_uri:
            mlflow = mlflow.model_copy(update={"tracking_uri": _local_uri_under(mlflow.tracking_uri, folder)})
        if wandb is not None and wandb.dir:
            wandb = wandb.model_copy(update={"dir": str(folder / Path(wandb.dir).expanduser())})
        return self.model_copy(update={"mlflow": mlflow, "wandb": wandb})

    @field_validator("tensorboard", "mlflow", "wandb")
    @classmethod
    def _installed(cls, value: Any, info: ValidationInfo) -> Any:
        if value:  # `tensorboard: true`, or an `mlflow:` / `wandb:` block
            _require(*LIBRARIES[info.field_name])
        return value


def _local_uri_under(uri: str, folder: Path) -> str:
    """A tracking URI naming a relative local path (a bare path: MLflow's file store; or SQLite's
    `sqlite:///relative.db`) made absolute under `folder`; any other URI as it is."""
    sqlite = "sqlite:///"
    if uri.startswith(sqlite):
        path = uri.removeprefix(sqlite)
        if path and not path.startswith("/") and not path.startswith(":memory:"):
            return sqlite + str(folder / path)
        return uri
    if ":" in uri:  # a scheme (file://, http://, databricks), or a drive
        return uri
    return str(folder / Path(uri).expanduser())


#: Nested models of the block, by key path in the sweep file (for "unknown key" suggestions).
MODELS_BY_PATH = {"logging": LoggingSpec, "logging.mlflow": MLflowSpec, "logging.wandb": WandbSpec}


def as_logging_spec(block: LoggingSpec | Mapping[str, Any]) -> LoggingSpec:
    """`hpo.run(logging={...})`: the sweep file's block as a dict, checked as the YAML block is, so a
    mistyped key fails in one line before Ray starts rather than as a logger error in every trial."""
    if isinstance(block, LoggingSpec):
        return block
    return checked_block(LoggingSpec, block, "logging")
