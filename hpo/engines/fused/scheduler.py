"""Scheduling a fused sweep: Tune's scheduler decides for every member, Tune runs the groups.

`GroupScheduler` is the scheduler Tune is given; it wraps the user's (FIFO, ASHA, HyperBand,
median stopping) and hands it each member's result as a `MemberTrial`'s, so early stopping works
member by member exactly as for unfused trials. What that means for the group's trial:

- a member the user's scheduler stops (or that diverged) gets its status file before Tune lets
  the group train again, so the group drops it before its next iteration;
- a member it pauses (synchronous HyperBand waits for a whole bracket) holds its group: the group
  trains only when none of its members is paused, so all members of a group stay at one
  iteration. A group whose live members are paused is paused by Tune (its checkpoint saved, its
  slot freed for the groups holding the rest of the bracket), and chosen to run again once each
  of them was resumed or stopped;
- a member whose result reaches a `stop` threshold (`hpo.engines.stop_thresholds`), or that the
  user's `Stopper` or stop function stops, ends as an unfused trial would, by its own values, not
  by the group's best member's (Tune asks the stopper first and then gives the result to no
  scheduler, so here too);
- a group with no live member left is stopped.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ray.tune.schedulers import FIFOScheduler, TrialScheduler

from hpo.engines.fused.members import MEMBER_ERRORS_KEY, MemberBook, MemberTrial
from hpo.engines.stop_thresholds import Thresholds
from hpo.reporting.results_files import error_line

logger = logging.getLogger(__name__)


class _MemberController:
    """The part of Tune's controller that schedulers call, answered for members."""

    def __init__(self, scheduler: "GroupScheduler"):
        self.scheduler = scheduler

    def get_trials(self) -> list[MemberTrial]:
        return list(self.scheduler.book.members.values())

    def get_live_trials(self) -> list[MemberTrial]:
        return [m for m in self.scheduler.book.members.values() if m.live]

    def stop_trial(self, member: MemberTrial) -> None:
        """A scheduler stops a member that is not reporting (HyperBand: a paused one)."""
        self.scheduler.inner.on_trial_remove(self, member)
        self.scheduler._end(member, "early_stopped")


class GroupScheduler(TrialScheduler):
    """See the module docstring."""

    def __init__(self, inner: TrialScheduler | None, book: MemberBook, max_iterations: int,
                 thresholds: Mapping[str, float] | None = None, metric: str | None = None, mode: str = "min",
                 stopper: Callable[[str, dict], bool] | None = None):
        super().__init__()
        self.inner = inner or FIFOScheduler()
        self.book = book
        self.max_iterations = max_iterations
        self.thresholds = Thresholds(thresholds or {}, metric, mode)
        self.stopper = stopper
        self.members = _MemberController(self)
        self.added: set[str] = set()

    def set_search_properties(self, metric: str | None, mode: str | None, **spec: Any) -> bool:
        return self.inner.set_search_properties(metric, mode, **spec)

    def on_trial_add(self, tune_controller: Any, trial: Any) -> None:
        """A group trial was created, restored or re-queued after a failure."""
        for member in self.book.add_group(trial.trial_id, trial.config["members"]):
            if member.live and member.trial_id not in self.added:
                self.added.add(member.trial_id)
                self.inner.on_trial_add(self.members, member)

    def _end(self, member: MemberTrial, status: str, error: str = "") -> None:
        self.book.end(member, status, error)

    def _record(self, result: dict) -> list[tuple[MemberTrial, dict]]:
        """The group's result per member; a member whose configuration failed to build in the
        group's process (`member_errors`) fails alone, as its unfused trial would."""
        for member_id, error in json.loads(result.get(MEMBER_ERRORS_KEY) or "{}").items():
            member = self.book.members.get(member_id)
            if member is not None and member.live:
                self.inner.on_trial_error(self.members, member)
                self._end(member, "error", error)
        return self.book.record_group_result(result)

    def on_trial_result(self, tune_controller: Any, trial: Any, result: dict) -> str:
        for member, member_result in self._record(result):
            if member_result.get("diverged"):
                self.inner.on_trial_complete(self.members, member, member_result)
                self._end(member, "diverged")
                continue
            if self.thresholds.reached(member_result) or (self.stopper is not None and self.stopper(member.trial_id, member_result)):
                self.inner.on_trial_complete(self.members, member, member_result)
                self._end(member, self._ended_at(member_result))
                continue
            decision = self.inner.on_trial_result(self.members, member, member_result)
            if decision == TrialScheduler.STOP:
                self.inner.on_trial_complete(self.members, member, member_result)
                self._end(member, "early_stopped")
            elif decision == TrialScheduler.PAUSE:
                member.status = MemberTrial.PAUSED
            else:
                member.status = MemberTrial.RUNNING
        self._resume_unpaused()
        live = [m for m in self.book.group(trial.trial_id) if m.live]
        if not live:
            return TrialScheduler.STOP
        if any(m.status == MemberTrial.PAUSED for m in live):
            return TrialScheduler.PAUSE
        return TrialScheduler.CONTINUE

    def _resume_unpaused(self) -> None:
        """Members the user's scheduler wants running again (HyperBand, once a bracket is decided)."""
        while True:
            member = self.inner.choose_trial_to_run(self.members)
            if member is None or member.status != MemberTrial.PAUSED:
                return
            member.status = MemberTrial.RUNNING

    def on_trial_complete(self, tune_controller: Any, trial: Any, result: dict) -> None:
        """The group's trial ended: by Tune's stop condition (its last result is `result`) or
        because no member was left."""
        self._record(result or {})
        for member in self.book.group(trial.trial_id):
            if not member.live:
                continue
            status = "diverged" if member.last_result.get("diverged") else self._ended_at(member.last_result)
            self.inner.on_trial_complete(self.members, member, member.last_result)
            self._end(member, status)

    def _ended_at(self, result: dict) -> str:
        """A member that ends at `result` (not diverged): `completed` at `max_iterations`, else `early_stopped`."""
        return "completed" if result.get("training_iteration", 0) >= self.max_iterations else "early_stopped"

    def on_trial_error(self, tune_controller: Any, trial: Any) -> None:
        """Every retry of a group reaches here; only a group out of retries ends its members."""
        if trial.should_recover():
            return
        error_file = getattr(trial, "error_file", None) or ""
        error = Path(error_file).read_text(errors="replace") if error_file and Path(error_file).exists() else ""
        for member in self.book.group(trial.trial_id):
            if member.live:
                self.inner.on_trial_error(self.members, member)
                self._end(member, "error", error or "the fused group failed")
        logger.info("fused group %s failed: %s", trial.trial_id, error_line(error))

    def on_trial_remove(self, tune_controller: Any, trial: Any) -> None:
        """A paused or pending group was stopped (a time budget, a stopper)."""
        for member in self.book.group(trial.trial_id):
            if member.live:
                self.inner.on_trial_remove(self.members, member)
                self._end(member, "early_stopped")

    def choose_trial_to_run(self, tune_controller: Any) -> Any:
        """A new group first; else a paused group none of whose live members is still paused."""
        trials = tune_controller.get_trials()
        for trial in trials:
            if trial.status == "PENDING":
                return trial
        for trial in trials:
            if trial.status == "PAUSED" and not any(
                m.live and m.status == MemberTrial.PAUSED for m in self.book.group(trial.trial_id)
            ):
                return trial
        return None

    def debug_string(self) -> str:
        return f"Fused groups; members scheduled by: {self.inner.debug_string()}"
