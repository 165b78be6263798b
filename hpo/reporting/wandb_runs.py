"""One W&B run per trial for a sweep's `logging.wandb` block, each written by a small actor on the
driver's node that lets go of the run only once W&B has written all of it.

Why not Ray's `WandbLoggerCallback`: its actor returns from `wandb.finish()` and Ray kills it at
once. With wandb 0.31, `finish()` returns before wandb-core (the actor's child process) has
written the run's last records, so the kill lost data: about one sweep in nine kept a run file
holding only its 7-byte header. Here the actor also calls `wandb.teardown()`, which returns once
wandb-core has closed its files, and the callback forgets an actor only after that call returned.
Runs are named, grouped and configured as Ray's callback does, so a Tune user finds them where
they would look.
"""

from __future__ import annotations

import logging
import numbers
import os
from pathlib import Path
from typing import Any

from ray.tune.logger import LoggerCallback

from hpo.reporting.results_files import flattened

logger = logging.getLogger(__name__)

#: Result keys that are bookkeeping, not metrics (`config` is the run's config already).
NOT_LOGGED = frozenset({"done", "should_checkpoint", "config"})
#: Result keys that describe the trial rather than measure it: W&B keeps them in the run's config.
TO_CONFIG = frozenset({"trial_id", "experiment_tag", "node_ip", "experiment_id", "hostname", "pid", "date"})


class WandbRunActor:
    """One W&B run, in its own process: W&B wants one process per run, and a Ray actor is one.

    Ray runs an actor's calls from one caller in order, so results are logged in the order Tune
    reported them and `finish` comes last."""

    def __init__(self, init: dict[str, Any], environ: dict[str, str]) -> None:
        os.environ.update(environ)
        os.environ["WANDB_START_METHOD"] = "thread"  # no forked children inside a Ray worker
        import wandb

        self._wandb = wandb
        self._run = wandb.init(**init)

    def log(self, metrics: dict[str, Any], config: dict[str, Any], step: int | None) -> None:
        if config:
            self._run.config.update(config, allow_val_change=True)
        self._run.log(metrics, step=step)

    def finish(self, exit_code: int) -> None:
        """Ends the run and returns only when W&B has written it, so the actor may then go."""
        self._run.finish(exit_code=exit_code)
        self._wandb.teardown()


class WandbRunsCallback(LoggerCallback):
    """Tune's logger callback for W&B: a run per trial, grouped by the sweep's folder name.

    `init` goes to `wandb.init` as given (project, group, mode, dir, entity, tags); the callback
    fills in the run's id, name, group and config from the trial. Without a `dir`, W&B writes in
    the folder of the run the trial belongs to, `storage / trial.experiment_dir_name`: a second
    run of a sweep's name is `name-2`, known only once the Tuner has chosen it, and `--resume`
    continues that folder. `finish_timeout_s` bounds how long the end of the sweep waits for W&B
    to finish writing (online runs upload then)."""

    def __init__(self, init: dict[str, Any], storage: str | os.PathLike | None = None, finish_timeout_s: float = 1800.0) -> None:
        self._init = dict(init)
        self._storage = storage
        self._finish_timeout_s = finish_timeout_s
        self._actors: dict[str, Any] = {}
        self._finishing: dict[Any, Any] = {}  # the `finish` call's future -> its actor, kept alive until it returns
        self._actor_class: Any = None

    def log_trial_start(self, trial: Any) -> None:
        if trial.trial_id in self._actors:
            return  # a restarted trial goes on with its run
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        if self._actor_class is None:
            here = NodeAffinitySchedulingStrategy(node_id=ray.get_runtime_context().get_node_id(), soft=False)
            self._actor_class = ray.remote(num_cpus=0, max_restarts=0, scheduling_strategy=here)(WandbRunActor)
        config = {key: value for key, value in trial.config.items() if key != "callbacks"}
        init = {
            "id": trial.trial_id,
            "name": str(trial),
            "group": trial.experiment_dir_name,
            "allow_val_change": True,
            "config": config,
            **{key: value for key, value in self._init.items() if value is not None},
        }
        if not init.get("dir") and self._storage is not None:
            run_folder = Path(self._storage) / trial.experiment_dir_name
            run_folder.mkdir(parents=True, exist_ok=True)
            init["dir"] = str(run_folder)
        environ = {key: value for key, value in os.environ.items() if key.startswith("WANDB_")}
        self._actors[trial.trial_id] = self._actor_class.remote(init, environ)

    def log_trial_result(self, iteration: int, trial: Any, result: dict) -> None:
        if trial.trial_id not in self._actors:
            self.log_trial_start(trial)
        metrics: dict[str, Any] = {}
        config: dict[str, Any] = {}
        for key, value in flattened(result):
            if key.split("/", 1)[0] in NOT_LOGGED:
                continue
            if key in TO_CONFIG:
                config[key] = value
            elif _loggable(value):
                metrics[key] = value
        self._actors[trial.trial_id].log.remote(metrics, config, result.get("training_iteration"))

    def log_trial_end(self, trial: Any, failed: bool = False) -> None:
        actor = self._actors.pop(trial.trial_id, None)
        if actor is not None:
            self._finishing[actor.finish.remote(1 if failed else 0)] = actor
        self._forget_finished(timeout=0)

    def on_experiment_end(self, trials: list, **info: Any) -> None:
        """Ends the runs of trials still going (a stopped sweep) and waits for every run to be
        written, up to `finish_timeout_s`."""
        for trial_id in list(self._actors):
            actor = self._actors.pop(trial_id)
            self._finishing[actor.finish.remote(0)] = actor
        self._forget_finished(timeout=self._finish_timeout_s)
        if self._finishing:
            logger.warning("W&B had not finished writing %d run(s) after %.0f s", len(self._finishing), self._finish_timeout_s)

    def _forget_finished(self, timeout: float) -> None:
        import ray

        if not self._finishing:
            return
        done, _ = ray.wait(list(self._finishing), num_returns=len(self._finishing), timeout=timeout)
        for future in done:
            del self._finishing[future]
            try:
                ray.get(future)
            except Exception as error:  # one run's failure is W&B's to report, not the sweep's end
                logger.warning("a W&B run did not finish cleanly: %s", error)


def _loggable(value: Any) -> bool:
    """Numbers (numpy's too) and W&B's own media objects; W&B refuses the rest."""
    if isinstance(value, numbers.Number):  # bools and numpy's scalar types among them
        return True
    if hasattr(value, "item") and getattr(value, "size", None) == 1:
        return isinstance(value.item(), numbers.Number)
    return type(value).__module__.startswith("wandb.")
