"""Ray Tune's own logger callbacks (TensorBoard, MLflow, W&B) for a sweep's `logging:` block
(`hpo.config.logging_spec`): the callbacks a Tune user passes to `RunConfig(callbacks=...)`, so
runs land where that user's tools already look."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpo.base.scoped_environ import scoped_environ
from hpo.config.errors import ConfigIssue, SweepConfigError
from hpo.config.logging_spec import LoggingSpec, MLflowSpec, WandbSpec

if TYPE_CHECKING:
    from ray import tune

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
