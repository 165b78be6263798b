"""A `Workload` as a Tune function trainable: what the plain engine gives Tune for each
configuration, as `fused_group_trial` is what the fused engine gives Tune for each group.

The training loop itself is the base's (`hpo.base.training.TrialTrainer`), so a configuration
trains the same here, in a fused group's unfused view and in a bubble guest; this module only
adds what Tune needs: restoring from Tune's checkpoint and reporting with the sweep's policy.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from typing import Any

import torch
from ray import tune

from hpo.base.checkpointing import checkpoint_due
from hpo.base.training import TrialTrainer
from hpo.base.workload import Workload


def workload_trainable(
    workload: Workload, max_iterations: int, threads: int = 1, checkpoint_every: int = 1, checkpoint_at_end: bool = True
) -> Callable[[dict[str, Any]], None]:
    """A Tune function trainable that trains `workload`, checkpointing as the sweep's policy says.

    A restarted trial (retry after a failure, `--resume` of a killed sweep) continues from its
    last checkpoint, so it trains again at most `checkpoint_every` iterations.
    """

    def train(config: dict[str, Any]) -> None:
        torch.set_num_threads(threads)  # trials share the machine; one thread per reserved CPU
        trainer = TrialTrainer(workload, config)
        checkpoint = tune.get_checkpoint()
        if checkpoint is not None:
            with checkpoint.as_directory() as directory:
                trainer.restore(directory)
        while trainer.iteration < max_iterations:
            metrics = trainer.train_iteration()
            if not checkpoint_due(trainer.iteration, max_iterations, checkpoint_every, checkpoint_at_end):
                tune.report(metrics)
            else:
                with tempfile.TemporaryDirectory() as directory:
                    trainer.save(directory)
                    tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(directory))
            if metrics["diverged"]:
                return

    train.__name__ = workload.name
    train.__qualname__ = workload.name
    return train
