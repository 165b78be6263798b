"""From a sweep's description to a `hpo.Tuner`: a YAML sweep file's spec (`build_tuner`, the path
`hpo run FILE` takes) or `tune.run`'s arguments (`hpo.run`).

The spec's W&B-style parameters map exactly onto Ray Tune domains. Two traps are handled here:
Tune's `randint` upper bound is exclusive while W&B's `int_uniform` max is inclusive, and W&B's
`log_uniform` takes natural-log exponents while `log_uniform_values` takes the values themselves.
Its searcher and trial scheduler are built from Tune's public classes. Loading and describing the
file (`load_sweep`, `describe_plan`) live in `hpo.config.sweep_file`, which imports no Ray; they are
re-exported here for callers of this module.

Example::

    import hpo
    from ray import tune
    result = hpo.run("mlp_digits", config={"lr": tune.loguniform(1e-4, 1e-1)},
                     metric="val_loss", mode="min", num_samples=8)
    print(result.best_config)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Union

from ray import tune
from ray.tune.schedulers import ASHAScheduler, FIFOScheduler, HyperBandScheduler, TrialScheduler
from ray.tune.search import BasicVariantGenerator, Searcher
from ray.tune.stopper import Stopper

from hpo.tuner.run_folders import latest_run
from hpo.tuner.tuner import Trainable, Tuner, grid_size
from hpo.base.checkpointing import KEEP_NEWEST
from hpo.config.logging_spec import as_logging_spec
from hpo.reporting.logging_callbacks import logger_callbacks
from hpo.reporting.console import quiet_tune, report
from hpo.reporting.progress import ProgressCallback
from hpo.reporting.sweep_result import SweepResult
from hpo.config.spec import CheckpointPolicy, FusionConfig, ParameterSpec, SweepSpec
from hpo.config.sweep_file import LoadedSweep, describe_plan, load_sweep
from hpo.reporting.trial_errors import TrialErrorCallback
from hpo.reporting.trial_output import quiet_ray_on_workers

__all__ = ["LoadedSweep", "build_tuner", "describe_plan", "load_sweep", "run", "sweep_run_config"]


def to_tune_domain(param: ParameterSpec, grid: bool = False) -> Any:
    """The Tune domain of one W&B-style parameter (bounds and log scales as the section above says)."""
    kind = param.distribution
    if kind == "constant":
        return param.value
    if kind == "categorical":
        return tune.grid_search(list(param.values)) if grid else tune.choice(list(param.values))
    if kind == "int_uniform":
        return tune.randint(int(param.min), int(param.max) + 1)
    if kind == "uniform":
        return tune.uniform(param.min, param.max)
    if kind == "q_uniform":
        return tune.quniform(param.min, param.max, param.q)
    if kind == "log_uniform":
        return tune.loguniform(math.exp(param.min), math.exp(param.max))
    if kind == "log_uniform_values":
        return tune.loguniform(param.min, param.max)
    if kind == "q_log_uniform_values":
        return tune.qloguniform(param.min, param.max, param.q)
    if kind == "normal":
        return tune.randn(param.mu, param.sigma)
    if kind == "q_normal":
        return tune.qrandn(param.mu, param.sigma, param.q)
    raise ValueError(f"unsupported distribution {kind!r}")  # unreachable: SweepSpec validates names


def param_space(spec: SweepSpec) -> dict[str, Any]:
    """The Tune `param_space` of a sweep."""
    grid = spec.searcher_kind == "grid"
    return {key: to_tune_domain(param, grid=grid) for key, param in spec.parameters.items()}


def build_searcher(spec: SweepSpec) -> Searcher | BasicVariantGenerator:
    """Optuna's TPE for tpe/optuna/bayes; Tune's variant generator for random and grid.

    TPE's searcher carries no concurrency limit: `max_concurrent_trials` reaches Tune in the
    TuneConfig, and Tune puts it on the searcher of unfused trials (a `ConcurrencyLimiter`); a fused
    engine replaces it by its group slots. So the limit is the engine's, which knows the mode."""
    if spec.searcher_kind == "tpe":
        import optuna  # only a TPE sweep pays for importing Optuna
        from ray.tune.search.optuna import OptunaSearch

        # Optuna's INFO lines ("A new study created in memory") are noise beside hpo's progress
        # lines; its warnings still show.
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        sampler = optuna.samplers.TPESampler(seed=spec.seed, n_startup_trials=spec.tpe_startup_trials)
        return OptunaSearch(metric=spec.metric.name, mode=spec.metric.mode, sampler=sampler)
    return BasicVariantGenerator(random_state=spec.seed, max_concurrent=spec.max_concurrent_trials or 0)


def build_scheduler(spec: SweepSpec) -> TrialScheduler:
    """ASHA or HyperBand over training iterations; FIFO (run everything) without early_terminate."""
    terminate = spec.early_terminate
    if terminate is None:
        return FIFOScheduler()
    max_t = terminate.max_iter or spec.max_iterations
    if terminate.type == "asha":
        return ASHAScheduler(
            time_attr="training_iteration",
            grace_period=terminate.min_iter,
            max_t=max_t,
            reduction_factor=terminate.eta,
        )
    return HyperBandScheduler(time_attr="training_iteration", max_t=max_t, reduction_factor=terminate.eta)


#: When a trial stops, as `tune.run` and `tune.RunConfig` take it: a dict of result thresholds, a
#: function `(trial_id, result) -> bool`, or a `tune.Stopper`.
StopCondition = Union[Mapping[str, Any], Callable[[str, dict], bool], Stopper, None]


def build_tuner(loaded: LoadedSweep, show_progress: bool = False) -> Tuner:
    """The Tuner a loaded sweep file describes (what `hpo run FILE` fits)."""
    spec = loaded.spec
    callbacks = [ProgressCallback(spec.metric.name, spec.metric.mode, spec.trial_count), TrialErrorCallback()]
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
            reuse_actors=None,  # where the trainable can be reset: the engine decides
        ),
        run_config=sweep_run_config(
            spec.name, loaded.storage, stop, spec.max_failures,
            (callbacks if show_progress else []) + logger_callbacks(loaded.logging, spec.name, loaded.experiment_path, loaded.source), verbose=0,
        ),
        resources={"cpu": spec.resources.cpu, "gpu": spec.resources.gpu},
        scaling=spec.scaling,
        fusion=spec.fusion,
        checkpoint=spec.checkpoint,
        search_seed=spec.seed,
    )


def sweep_run_config(
    name: str | None,
    storage_path: str | None,
    stop: StopCondition,
    max_failures: int,
    callbacks: Sequence[tune.Callback] | None = None,
    **options: Any,
) -> tune.RunConfig:
    """Every sweep's run config: where it is stored, when trials stop, how often a failing trial
    is retried, and the two newest checkpoints kept per trial (enough to resume either way)."""
    return tune.RunConfig(
        name=name,
        storage_path=str(Path(storage_path).resolve()) if storage_path else None,
        stop=(dict(stop) or None) if isinstance(stop, Mapping) else stop,
        callbacks=list(callbacks or []),
        failure_config=tune.FailureConfig(max_failures=max_failures),
        checkpoint_config=tune.CheckpointConfig(num_to_keep=KEEP_NEWEST),
        **options,
    )


def run(
    trainable: Trainable,
    config: Mapping[str, Any] | None = None,
    metric: str | None = None,
    mode: str | None = None,
    num_samples: int = 1,
    search_alg: Any = None,
    scheduler: Any = None,
    resources_per_trial: Mapping[str, float] | None = None,
    stop: StopCondition = None,
    storage_path: str | None = None,
    name: str | None = None,
    max_concurrent_trials: int | None = None,
    time_budget_s: float | None = None,
    max_failures: int = 0,
    callbacks: Sequence[tune.Callback] | None = None,
    scaling: Any = None,
    fusion: FusionConfig | Mapping[str, Any] | None = None,
    checkpoint: CheckpointPolicy | Mapping[str, Any] | None = None,
    reuse_actors: bool | None = None,
    logging: Mapping[str, Any] | None = None,
    verbose: int = 2,
    resume: bool | str = False,
) -> SweepResult:
    """`tune.run`'s common arguments, returning a `SweepResult`.

    `checkpoint` (`{"every": N, "at_end": True}`) bounds what a crash costs: a trial loses at most
    N iterations. Trial processes are reused between trials where the trainable can be reset (a
function, a `Workload`, a `tune.Trainable` class with its own `reset_config`) unless
`reuse_actors=False`.
    `logging` is a sweep file's `logging:` block as a dict (`{"tensorboard": True, "mlflow":
    {"tracking_uri": ...}, "wandb": {"project": ..., "mode": "offline"}}`): Tune's own logger
    callbacks, added to `callbacks`.

    `resume=True` continues the newest stored run of `name` under `storage_path`, as `hpo run FILE
    --resume` does (finished trials are kept, unfinished and errored ones run again); `"AUTO"`, as
    in `tune.run`, continues it where there is one and starts the sweep otherwise. Without it a
    name already on disk gets a new run folder (`name-2`).

    It prints what `hpo run` prints, by Tune's `verbose` levels: 0 nothing, 1 the report at the end
    (table, best configuration, files, what went wrong) and each failed trial's own frames, 2 (the
    default) also a line per finished trial and, on a terminal, a live status line, 3 also a line
    per reported result. Tune's own tables, tracebacks and warnings stay off the console.
    """
    if verbose not in (0, 1, 2, 3):
        raise ValueError(f"verbose must be 0, 1, 2 or 3 (as Tune's), got {verbose!r}")
    if resume not in (False, True, "AUTO"):
        raise ValueError(f"resume must be True, False or 'AUTO', got {resume!r}")
    console = [TrialErrorCallback(verbose=verbose)]
    if metric:
        console.insert(0, ProgressCallback(metric, mode or "min", trial_total(config, num_samples, search_alg), verbose=verbose))
    if logging is not None:
        experiment = Path(storage_path or "~/ray_results").expanduser().resolve() / (name or "sweep")
        callbacks = [*(callbacks or []), *logger_callbacks(as_logging_spec(logging), name or "sweep", experiment)]
    tune_config = tune.TuneConfig(
        metric=metric,
        mode=mode,
        num_samples=num_samples,
        search_alg=search_alg,
        scheduler=scheduler,
        max_concurrent_trials=max_concurrent_trials,
        time_budget_s=time_budget_s,
        reuse_actors=reuse_actors,
    )
    tuner = Tuner(
        trainable,
        param_space=config,
        tune_config=tune_config,
        run_config=sweep_run_config(name, storage_path, stop, max_failures, [*(callbacks or []), *console], verbose=0),
        resources=resources_per_trial,
        scaling=scaling,
        fusion=fusion,
        checkpoint=checkpoint,
    )
    stored = latest_run(tuner.storage, tuner.name) if resume else None
    if resume is True and stored is None:
        raise ValueError(f"resume=True: nothing to resume at {tuner.storage / tuner.name}")
    restore = quiet_tune()
    quiet_ray_on_workers("WARNING" if verbose < 3 else None)
    try:
        result = tuner.resume(str(stored)) if stored is not None else tuner.fit()
    finally:
        quiet_ray_on_workers(None)
        restore()
    if verbose >= 1 and metric:
        report(result, "hpo.run(...) with the same arguments and resume=True")
    return result


def trial_total(config: Mapping[str, Any] | None, num_samples: int, search_alg: Any = None) -> int | None:
    """How many trials `tune.run` runs: `num_samples` passes over every grid of the space (a
    searcher's `num_samples` trials); None when only the searcher knows (`num_samples=-1`)."""
    if num_samples < 0:
        return None
    if search_alg is not None and not isinstance(search_alg, BasicVariantGenerator):
        return num_samples
    return num_samples * grid_size(config or {})
