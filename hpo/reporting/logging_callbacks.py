"""The logger callbacks for a sweep's `logging:` block (`hpo.config.logging_spec`): Ray Tune's own
for TensorBoard and MLflow, the callbacks a Tune user passes to `RunConfig(callbacks=...)`, so runs
land where that user's tools already look; for W&B, `hpo.reporting.wandb_runs`, which writes the
runs Ray's callback would but does not lose their last records."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

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
        callbacks.append(_wandb_callback(spec.wandb, sweep, experiment_dir, source))
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


def _wandb_callback(spec: WandbSpec, sweep: str, experiment_dir: Path, source: Any) -> tune.Callback:
    from hpo.reporting.wandb_runs import WandbRunsCallback

    if spec.mode == "online":
        _check_wandb_login(source)
    directory = None
    if spec.dir:
        directory = Path(spec.dir).expanduser().resolve()
        directory.mkdir(parents=True, exist_ok=True)
    init = {"project": spec.project or sweep, "group": spec.group, "mode": spec.mode, "dir": directory and str(directory),
            "entity": spec.entity, "tags": spec.tags}
    # by default each run's own folder, named only when the Tuner picks it (`name-2` beside an earlier run)
    return WandbRunsCallback(init, storage=Path(experiment_dir).expanduser().resolve().parent)


def _check_wandb_login(source: Any) -> None:
    """Online runs need a W&B key: found now (W&B asks for one on a terminal), not by every trial's
    run later."""
    import wandb

    try:
        wandb.login(verify=False)
    except wandb.errors.UsageError as exc:
        key = "logging.wandb"
        line = source.line_of(key) if source is not None else None
        message = f"W&B has no API key for online runs: run `wandb login`, set WANDB_API_KEY, or set mode: offline ({exc})"
        raise SweepConfigError([ConfigIssue(key, message, line)], source.name if source is not None else None) from None
