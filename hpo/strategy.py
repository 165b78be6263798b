"""The searcher and trial scheduler a sweep asks for, built from Tune's public classes."""

from __future__ import annotations

from ray.tune.schedulers import ASHAScheduler, FIFOScheduler, HyperBandScheduler, TrialScheduler
from ray.tune.search import BasicVariantGenerator, ConcurrencyLimiter, Searcher
from ray.tune.search.optuna import OptunaSearch

from hpo.spec import SweepSpec


def build_searcher(spec: SweepSpec) -> Searcher | BasicVariantGenerator:
    """Optuna's TPE for tpe/optuna/bayes; Tune's variant generator for random and grid."""
    if spec.searcher_kind == "tpe":
        import optuna

        sampler = optuna.samplers.TPESampler(seed=spec.seed, n_startup_trials=min(10, max(2, spec.num_samples // 3)))
        searcher = OptunaSearch(metric=spec.metric.name, mode=spec.metric.mode, sampler=sampler)
        if spec.max_concurrent_trials:
            return ConcurrencyLimiter(searcher, max_concurrent=spec.max_concurrent_trials)
        return searcher
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
