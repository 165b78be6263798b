"""The Tune trial of one fused group: one process, one fused model, every member's result at once.

Tune runs a fused sweep's groups, not its members (`hpo.engines.fused.members` says why). One `step` trains
one iteration of every live member and returns all their results in one Tune result
(`member_results`, as JSON); the group's own value of the sweep's metric is its best member's, which is what
Tune's metric check and the group's row in Tune's tables show.

Checkpoints are the members' own: when the sweep's checkpoint policy says so, each member's state
is written to its folder (`<experiment>/members/<id>/checkpoint_<iteration>/trial_state.pt`, the
format `hpo.base.training.TrialTrainer` reads, so a member can be resumed or deployed unfused), and the
group's Tune checkpoint only names them. A group retried after a crash is rebuilt from those
member states, so a member loses at most `checkpoint.every` iterations.
"""

from __future__ import annotations

import json
import math
import shutil
import traceback
from pathlib import Path
from typing import Any

import torch
from ray import tune

from fusion.trainer import FusedTrainer
from hpo.base.atomic_files import replace_folder_durably
from hpo.base.checkpointing import KEEP_NEWEST, checkpoint_due
from hpo.base.training import TrialTrainer
from hpo.engines.fused.members import MEMBER_ERRORS_KEY, STATUS_FILE, member_ids
from hpo.reporting.results_files import MEMBERS_DIR
from hpo.base.trial_state import save_trial_state
from hpo.base.workload import Workload

#: A group's Tune checkpoint: which member checkpoints hold its state.
MANIFEST_FILE = "members.json"


def fused_group_trainable(
    workload: Workload,
    experiment: Path,
    metric: str,
    mode: str,
    max_iterations: int,
    threads: int,
    device: str,
    dtype: str,
    checkpoint_every: int,
    checkpoint_at_end: bool,
    verify: bool = True,
    compile: str = "auto",
) -> type[tune.Trainable]:
    """The Tune trainable class of a fused sweep's groups."""
    members_dir = experiment / MEMBERS_DIR
    pick = min if mode == "min" else max

    class FusedGroupTrial(tune.Trainable):
        def setup(self, config: dict[str, Any]) -> None:
            torch.set_num_threads(threads)
            configs, ids = config["members"], member_ids(self.trial_id, len(config["members"]))
            #: Members whose own configuration failed to build, with their tracebacks: the next
            #: result reports them, and the driver ends them as `error`, as each would fail alone.
            self.member_errors: dict[str, str] = {}
            try:
                self.trainer: FusedTrainer | None = self._fused(configs, ids)
            except Exception:
                self.member_errors = members_failing_alone(workload, configs, ids)
                if not self.member_errors:
                    raise  # the group's failure, not one configuration's
                kept = [(m, c) for m, c in zip(ids, configs) if m not in self.member_errors]
                self.trainer = self._fused([c for _, c in kept], [m for m, _ in kept]) if kept else None
            self.saved_at = -1  # the iteration whose member checkpoints are on disk

        def _fused(self, configs: list[dict[str, Any]], ids: list[str]) -> FusedTrainer:
            return FusedTrainer(workload, configs, member_ids=ids, device=device, dtype=dtype, verify=verify, compile=compile)

        def _errors(self) -> dict[str, str]:
            """The members that failed to build, reported once (in the first result after setup)."""
            errors, self.member_errors = self.member_errors, {}
            return {MEMBER_ERRORS_KEY: json.dumps(errors)} if errors else {}

        def reset_config(self, new_config: dict[str, Any]) -> bool:
            """Tune reuses this process for the next group (`reuse_actors`): torch stays imported."""
            self.setup(new_config)
            return True

        def _drop_stopped(self) -> list[str]:
            """Drop the members that ended (the driver wrote their status files)."""
            members = list(self.trainer.member_ids) if self.trainer else []
            gone = {m for m in members if (members_dir / m / STATUS_FILE).exists()}
            survivors = [m for m in members if m not in gone]
            if not survivors:
                self.trainer = None
            elif gone:
                self.trainer.keep_members(survivors)
            return survivors

        def step(self) -> dict[str, Any]:
            if not self._drop_stopped():
                return {metric: math.nan, "member_results": "[]", "fused_members": 0, "done": True, **self._errors()}
            trainer = self.trainer
            metrics = trainer.train_iteration()
            iteration = trainer.iteration
            if checkpoint_due(iteration, max_iterations, checkpoint_every, checkpoint_at_end):
                self._save_members()
            results = [
                {**m, "member_id": member_id, "training_iteration": iteration, "fused_members": trainer.num_members}
                for member_id, m in zip(trainer.member_ids, metrics)
            ]
            values = [r[metric] for r in results if isinstance(r.get(metric), float) and math.isfinite(r[metric])]
            return {
                metric: pick(values) if values else math.nan,
                # One JSON string, not a list: Tune's loggers take it as one opaque column.
                "member_results": json.dumps(results),
                "fused_members": trainer.num_members,
                # A group ends at max_iterations as an unfused trial's loop does, whatever `stop`
                # says: a stop function or a `time_total_s` alone had it train on past it.
                "done": iteration >= max_iterations,
                **self._errors(),
            }

        def _save_members(self) -> dict[str, str]:
            """Each live member's checkpoint at the current iteration, in its own folder."""
            trainer = self.trainer
            paths = {}
            for member_id in trainer.member_ids:
                folder = members_dir / member_id
                target = folder / f"checkpoint_{trainer.iteration:06d}"
                if self.saved_at != trainer.iteration:
                    staging = folder / f".checkpoint_{trainer.iteration:06d}.tmp"
                    shutil.rmtree(staging, ignore_errors=True)
                    staging.mkdir(parents=True)
                    save_trial_state(trainer.member_state_dict(member_id), staging)
                    replace_folder_durably(staging, target)
                    for old in sorted(folder.glob("checkpoint_*"))[:-KEEP_NEWEST]:
                        shutil.rmtree(old, ignore_errors=True)
                paths[member_id] = str(target)
            self.saved_at = trainer.iteration
            return paths

        def save_checkpoint(self, checkpoint_dir: str) -> None:
            if self.trainer is None:
                manifest = {"iteration": self.iteration, "members": {}}
            else:
                manifest = {"iteration": self.trainer.iteration, "members": self._save_members()}
            Path(checkpoint_dir, MANIFEST_FILE).write_text(json.dumps(manifest))

        def load_checkpoint(self, checkpoint_dir: str) -> None:
            manifest = json.loads(Path(checkpoint_dir, MANIFEST_FILE).read_text())
            alive = {m: p for m, p in manifest["members"].items() if m in self.trainer.member_ids} if self.trainer else {}
            if not alive:
                self.trainer = None
                return
            configs = dict(zip(self.trainer.member_ids, self.trainer.configs))
            self.trainer = FusedTrainer.from_member_checkpoints(
                workload, [configs[m] for m in alive], list(alive.values()), member_ids=list(alive), device=device, dtype=dtype,
                verify=verify, compile=compile,
            )
            self.saved_at = self.trainer.iteration
            self._drop_stopped()

    FusedGroupTrial.__name__ = FusedGroupTrial.__qualname__ = f"fused_{workload.name}"
    return FusedGroupTrial


def members_failing_alone(workload: Workload, configs: list[dict[str, Any]], ids: list[str]) -> dict[str, str]:
    """The members (by id) whose configuration fails on its own: setting up the trainer its unfused
    trial builds (`TrialTrainer`: its optimizer settings, the model factory, the optimizer) raises.
    Each with its traceback, the error its row shows."""
    failing = {}
    for member_id, config in zip(ids, configs):
        try:
            TrialTrainer(workload, config)
        except Exception:
            failing[member_id] = traceback.format_exc()
    return failing


def group_checkpoint_config(every: int, at_end: bool) -> tune.CheckpointConfig:
    """Tune checkpoints a group on the sweep's policy; the members' states go with it. It keeps as
    many group checkpoints as each member keeps checkpoint folders, so none names a deleted one."""
    return tune.CheckpointConfig(num_to_keep=KEEP_NEWEST, checkpoint_frequency=every, checkpoint_at_end=at_end)

