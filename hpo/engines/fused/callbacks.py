"""The Tune callbacks of a fused sweep: each group event replayed as its members' events, and the
results files rewritten as members end. Tune's trials are the groups; these make progress, the
dashboard, the results files and the loggers count configurations."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ray.tune.logger import LoggerCallback, TBXLoggerCallback

from hpo.engines.fused.members import MemberBook, MemberTrial
from hpo.reporting.progress import ProgressCallback


def member_callbacks(book: MemberBook, callbacks: list[Any], configurations: int | None = None) -> list[Any]:
    """The Tune callbacks that replay each group event as its members' events to `callbacks`
    (the progress line, the dashboard's controller, the results files, and Tune's logger
    callbacks: TensorBoard, MLflow, W&B, a user's own), so they count, show and log
    configurations, not groups. Each member's end is announced once, whichever group event
    follows it.

    Tune adds a TensorBoard logger of its own unless it is given one, and that one would log each
    group as a run; so a `MemberTensorBoard`, which logs only members, takes the place of any
    plain `TBXLoggerCallback` and is given to Tune beside the replaying callback. Their `setup`
    hears the sweep's `configurations` as its `total_num_samples` where known (Tune's count is of
    groups: -1).
    """
    from ray.tune import Callback

    callbacks = [cb for cb in callbacks if type(cb) is not TBXLoggerCallback]
    tensorboard = _member_tensorboard()
    if tensorboard is not None:
        callbacks.append(tensorboard)

    class MemberCallbacks(Callback):
        def __init__(self) -> None:
            self.started: set[str] = set()  # members whose start the loggers heard of

        def setup(self, **info: Any) -> None:
            if configurations is not None:
                info = {**info, "total_num_samples": configurations}
            for callback in callbacks:
                callback.setup(**info)

        def _members(self) -> list[Any]:
            return list(book.members.values())

        def on_step_begin(self, iteration: int, trials: list, **info: Any) -> None:
            for callback in callbacks:
                callback.on_step_begin(iteration, self._members(), **info)

        def on_step_end(self, iteration: int, trials: list, **info: Any) -> None:
            for callback in callbacks:
                callback.on_step_end(iteration, self._members(), **info)

        def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            for member in book.group(trial.trial_id):
                if member.live:
                    self.started.add(member.trial_id)
                    for callback in callbacks:
                        callback.on_trial_start(iteration, self._members(), member, **info)

        def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
            book.record_group_result(result)  # the group's last result reaches no scheduler first
            members = self._members()
            for member in book.group(trial.trial_id):
                if member.last_result.get("training_iteration") == result.get("training_iteration"):
                    for callback in callbacks:
                        callback.on_trial_result(iteration, members, member, member.last_result, **info)
            self._announce_ended(iteration)

        def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            self._announce_ended(iteration)

        def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            self._announce_ended(iteration)

        def _announce_ended(self, iteration: int) -> None:
            ended = book.take_ended()
            members = self._members() if ended else []
            for member in ended:
                for callback in callbacks:
                    if isinstance(callback, (LoggerCallback, ProgressCallback)) and member.trial_id not in self.started:
                        continue  # ended in an earlier run of a resumed sweep: no run to close, no line to print
                    if member.ended == "error":
                        callback.on_trial_error(iteration, members, member)
                    else:
                        callback.on_trial_complete(iteration, members, member)

        def on_experiment_end(self, trials: list, **info: Any) -> None:
            for callback in callbacks:
                callback.on_experiment_end(self._members(), **info)

    return [MemberCallbacks(), *([tensorboard] if tensorboard is not None else [])]


def _member_tensorboard() -> Any:
    """Tune's TensorBoard logger for members only (None where tensorboardX is not installed, as
    Tune then adds none either): event files in each member's folder, none in the groups'."""
    class MemberTensorBoard(TBXLoggerCallback):
        def log_trial_start(self, trial: Any) -> None:
            if isinstance(trial, MemberTrial):
                super().log_trial_start(trial)

        def log_trial_result(self, iteration: int, trial: Any, result: dict) -> None:
            if isinstance(trial, MemberTrial):
                super().log_trial_result(iteration, trial, result)

        def log_trial_end(self, trial: Any, failed: bool = False) -> None:
            if isinstance(trial, MemberTrial):
                super().log_trial_end(trial, failed)

    try:
        return MemberTensorBoard()
    except ImportError:
        return None


def member_results_callback(book: MemberBook, experiment: Path, metric: str, mode: str, max_iterations: int) -> Any:
    """Rewrites `results.csv` and `summary.json` (one row per member) after each step of Tune's
    controller in which members ended (a per-member callback: see `member_callbacks`).

    Once per step, not once per member: a group's members mostly end together, and each rewrite
    reads every member's folder, so writing per member cost a sweep of N configurations N times N
    folder reads and 2N fsyncs on the driver's thread, between the groups' steps."""
    from ray.tune import Callback

    from hpo.reporting.results_files import write_run_files

    class MemberResultsCallback(Callback):
        def __init__(self) -> None:
            self.members_ended = False

        def _write(self) -> None:
            self.members_ended = False
            write_run_files(experiment, book.records(), metric, mode, max_iterations)

        def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            self.members_ended = True

        def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            self.members_ended = True

        def on_step_end(self, iteration: int, trials: list, **info: Any) -> None:
            if self.members_ended:
                self._write()

        def on_experiment_end(self, trials: list, **info: Any) -> None:
            if self.members_ended:
                self._write()

    return MemberResultsCallback()
