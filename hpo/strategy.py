"""The searcher and trial scheduler a sweep asks for, built from Tune's public classes.

Ray is imported when a searcher or scheduler is built, not when one is described, so the dry
run and `hpo validate` name them without loading Ray.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hpo.spec import SweepSpec

if TYPE_CHECKING:
    from ray.tune.schedulers import TrialScheduler
    from ray.tune.search import BasicVariantGenerator, Searcher


def build_searcher(spec: SweepSpec) -> "Searcher | BasicVariantGenerator":
    """Optuna's TPE for tpe/optuna/bayes; Tune's variant generator for random and grid."""
    from ray.tune.search import BasicVariantGenerator, ConcurrencyLimiter

    if spec.searcher_kind == "tpe":
        import optuna
        from ray.tune.search.optuna import OptunaSearch

        # Optuna's INFO lines ("A new study created in memory") are noise beside hpo's progress
        # lines; its warnings still show.
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        sampler = optuna.samplers.TPESampler(seed=spec.seed, n_startup_trials=tpe_startup_trials(spec))
        searcher = OptunaSearch(metric=spec.metric.name, mode=spec.metric.mode, sampler=sampler)
        if spec.max_concurrent_trials:
            return ConcurrencyLimiter(searcher, max_concurrent=spec.max_concurrent_trials)
        return searcher
    return BasicVariantGenerator(random_state=spec.seed, max_concurrent=spec.max_concurrent_trials or 0)


def tpe_startup_trials(spec: SweepSpec) -> int:
    """Random trials before TPE models the results: a third of the budget, between 2 and 10."""
    return min(10, max(2, spec.num_samples // 3))


def build_scheduler(spec: SweepSpec) -> "TrialScheduler":
    """ASHA or HyperBand over training iterations; FIFO (run everything) without early_terminate."""
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler, HyperBandScheduler

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


def describe_searcher(spec: SweepSpec) -> str:
    """What `build_searcher` builds, in words."""
    if spec.searcher_kind == "tpe":
        limit = f", at most {spec.max_concurrent_trials} at once" if spec.max_concurrent_trials else ""
        return f"OptunaSearch (TPE, {tpe_startup_trials(spec)} random start-up trials{limit})"
    return f"BasicVariantGenerator ({spec.searcher_kind})"


def describe_scheduler(spec: SweepSpec) -> str:
    """What `build_scheduler` builds, in words."""
    terminate = spec.early_terminate
    if terminate is None:
        return "FIFOScheduler (every trial runs to max_iterations)"
    max_t = terminate.max_iter or spec.max_iterations
    if terminate.type == "asha":
        return f"ASHAScheduler (grace {terminate.min_iter}, max {max_t} iterations, eta {terminate.eta:g})"
    return f"HyperBandScheduler (max {max_t} iterations, eta {terminate.eta:g})"
