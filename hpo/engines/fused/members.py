"""The members of a fused sweep as the driver keeps them: one record, folder and results row per
configuration, although Tune runs one trial per fused group.

Tune's controller costs a process per running trial and processes every result; a member that was
its own Tune trial cost a Ray worker (about 1 s of CPU and 195 MB) and a trip through the
controller per iteration. Here Tune runs the *groups* (`hpo.engines.fused.group_trial`), and the members
live in the driver:

- `MemberTrial` is what Tune's searchers, schedulers and logger callbacks are handed for a member:
  it has the attributes they read of a `Trial` (`trial_id`, `config`, `status`, `last_result`;
  the loggers' `local_path`, `experiment_dir_name`, `evaluated_params` and its name), so ASHA,
  HyperBand and median stopping decide for each member, and TensorBoard, MLflow and W&B log one
  run per member, exactly as for an unfused trial.
- `MemberBook` writes each member's folder under `<experiment>/members/<member_id>/` as Tune writes
  a trial's: `params.json`, `result.json` (one line per iteration) and the member's own
  checkpoints (written by the group), plus `status.json` once the member has ended. A resumed
  sweep reads the folders back, so a member that ended is not trained again.
- A member's `status.json` is also the one message from the driver to its group: the driver
  writes it (atomically) when the user's scheduler stops the member, before Tune lets the group
  train again, and the group drops every member that has one before each iteration. (So a fused
  sweep's storage path must be a filesystem its groups see, as for the members' checkpoints.)
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from hpo.base.atomic_files import write_atomically
from hpo.engines.stop_thresholds import TUNE_COUNTERS
from hpo.reporting.rebuild import STATUS_FILE, records_from_trial_dirs
from hpo.reporting.results_files import MEMBERS_DIR, TrialRecord
from hpo.reporting.sweep_result import SweepResult


def member_ids(group_trial_id: str, size: int) -> list[str]:
    """The ids of a group's members: stable across retries and resumes of the group's trial."""
    return [f"{group_trial_id}_m{index:03d}" for index in range(size)]


def group_of(member_id: str) -> str:
    return member_id.rsplit("_m", 1)[0]


#: The key of a group's result that names the members whose configurations failed to build
#: (`hpo.engines.fused.group_trial`), each with its traceback.
MEMBER_ERRORS_KEY = "member_errors"

#: A group trial's folder in the experiment is `group_<trial id>`.
GROUP_DIR_PREFIX = "group_"


class FusedGroups(list):
    """Every group's member ids; printed as the groups' sizes, which is what a user checks."""

    @classmethod
    def of(cls, member_ids: Iterable[str]) -> "FusedGroups":
        groups: dict[str, list[str]] = {}
        for member_id in sorted(member_ids):
            groups.setdefault(group_of(member_id), []).append(member_id)
        return cls(groups.values())

    def __str__(self) -> str:
        sizes = [len(group) for group in self]
        if not sizes:
            return "none"
        if len(set(sizes)) == 1:
            return f"{len(sizes)} of {sizes[0]} member{'s' if sizes[0] > 1 else ''}{' each' if len(sizes) > 1 else ''}"
        return f"{len(sizes)}, of {', '.join(map(str, sizes[:-1]))} and {sizes[-1]} members"


class MemberTrial:
    """A member as Tune's searchers, schedulers and logger callbacks see a trial."""

    PENDING, RUNNING, PAUSED, TERMINATED, ERROR = "PENDING", "RUNNING", "PAUSED", "TERMINATED", "ERROR"

    def __init__(self, trial_id: str, config: Mapping[str, Any], group_id: str, folder: Path, trainable_name: str):
        self.trial_id = trial_id
        self.config = dict(config)
        self.group_id = group_id
        # What Tune's logger callbacks read: a TensorBoard run, an MLflow or W&B run per member,
        # named, filed and grouped as an unfused trial's would be.
        self.local_path = self.path = str(folder)
        self.experiment_dir_name = folder.parent.parent.name
        self.evaluated_params = dict(config)
        self.trial_name = f"{trainable_name}_{trial_id}"
        self.checkpoint = None  # the member's checkpoints are its group's to write, not the loggers' to upload
        # A member is RUNNING as soon as its group exists: schedulers only ever pause, resume and
        # stop it; when its group's trial runs is Tune's concern.
        self.status = self.RUNNING
        self.last_result: dict[str, Any] = {}
        self.ended: str | None = None
        self.is_saving = False  # read by HyperBand; a member's checkpoint is written by its group

    def __repr__(self) -> str:
        return f"MemberTrial({self.trial_id}, {self.status})"

    def __str__(self) -> str:
        """The run name MLflow and W&B show, as `str(trial)` is for a Tune trial."""
        return self.trial_name

    def init_local_path(self) -> None:
        """TensorBoard's logger asks a trial to create its folder; a member's exists from the start."""

    @property
    def live(self) -> bool:
        return self.ended is None

    @property
    def end_is_saved(self) -> bool:
        """A member's end is in its status file before anyone hears of it: a resumed sweep never
        trains it again (the progress line may print it at once)."""
        return self.ended is not None


class MemberBook:
    """Every member of one fused sweep, kept by the driver (see the module docstring)."""

    def __init__(self, experiment: Path, trainable_name: str):
        self.folder = experiment / MEMBERS_DIR
        self.trainable_name = trainable_name
        self.members: dict[str, MemberTrial] = {}
        self._groups: dict[str, list[MemberTrial]] = {}
        self._ended: list[MemberTrial] = []  # ended since `take_ended` last handed them out

    def add_group(self, group_id: str, configs: list[Mapping[str, Any]]) -> list[MemberTrial]:
        """The members of a group trial Tune just added (or restored)."""
        members = []
        for member_id, config in zip(member_ids(group_id, len(configs)), configs):
            member = self.members.get(member_id)
            if member is None:
                folder = self.folder / member_id
                member = self.members[member_id] = MemberTrial(member_id, config, group_id, folder, self.trainable_name)
                self._groups.setdefault(group_id, []).append(member)
                folder.mkdir(parents=True, exist_ok=True)
                # A resumed sweep's member goes on from what its folder holds.
                member.last_result = _last_result(folder)
                status = folder / STATUS_FILE
                if status.exists():
                    member.ended = json.loads(status.read_text())["status"]
                    member.status = MemberTrial.ERROR if member.ended == "error" else MemberTrial.TERMINATED
                    self._ended.append(member)
                elif not (folder / "params.json").exists():
                    text = json.dumps(member.config, default=str)
                    write_atomically(folder / "params.json", text)
            members.append(member)
        return members

    def group(self, group_id: str) -> list[MemberTrial]:
        return list(self._groups.get(group_id, []))

    def take_ended(self) -> list[MemberTrial]:
        """The members that ended (or were found ended on resume) since the last call, each
        handed out once: announcing ends costs what ended, not a walk over every member per result."""
        ended, self._ended = self._ended, []
        return ended

    def record_result(self, member: MemberTrial, result: Mapping[str, Any]) -> dict[str, Any]:
        """Append one iteration of `member` to its `result.json`; returns the result as Tune's
        schedulers and searchers expect it."""
        full = {**result, "trial_id": member.trial_id, "config": member.config}
        member.last_result = full
        with open(self.folder / member.trial_id / "result.json", "a") as handle:
            handle.write(json.dumps(full, default=str) + "\n")
        return full

    def record_group_result(self, result: Mapping[str, Any]) -> list[tuple[MemberTrial, dict[str, Any]]]:
        """Each live member's result in a group's `result`, written to its folder, the first time
        it is seen: the scheduler records it, or, for the result Tune's stop condition ends the
        group on (which Tune gives no scheduler), the callbacks that log it. A group retried from
        its checkpoint trains again the iterations since; their results are not new.

        Tune's own counters (`time_total_s`, ...) are the group trial's, the same for each of its
        members: a member's result carries them as an unfused trial's does, so a scheduler or a
        stopper timed by one (MedianStoppingRule's default `time_total_s`) reads it."""
        counters = {key: result[key] for key in TUNE_COUNTERS if key in result}
        recorded = []
        for member_result in json.loads(result.get("member_results") or "[]"):
            member = self.members.get(member_result["member_id"])
            if member is None or not member.live:
                continue
            if member_result["training_iteration"] <= member.last_result.get("training_iteration", 0):
                continue
            recorded.append((member, self.record_result(member, {**counters, **member_result})))
        return recorded

    def end(self, member: MemberTrial, status: str, error: str = "") -> None:
        """`member` ended (`status`: completed, early_stopped, diverged or error); its status file
        makes that survive a resume, and the group's error, if it failed, goes where Tune puts a
        trial's (`error.txt`)."""
        if member.ended is not None:
            return
        member.ended = status
        member.status = MemberTrial.ERROR if status == "error" else MemberTrial.TERMINATED
        self._ended.append(member)
        folder = self.folder / member.trial_id
        if error:
            write_atomically(folder / "error.txt", error)
        _write_status(folder, status)

    def end_cut_short(self, groups: Iterable[str]) -> None:
        """Every member of `groups` (whose Tune trials ended) that had not ended is `early_stopped`:
        Tune stopped its group without telling the scheduler (a time budget, a stopper's
        `stop_all`). Read from the folders, as a resumed sweep's members are known only there."""
        groups = set(groups)
        if not groups or not self.folder.is_dir():
            return
        for folder in sorted(self.folder.iterdir()):
            if group_of(folder.name) not in groups or (folder / STATUS_FILE).exists():
                continue
            member = self.members.get(folder.name)
            if member is not None:
                self.end(member, "early_stopped")
            else:
                _write_status(folder, "early_stopped")

    def records(self, groups: Iterable[str] | None = None) -> list[TrialRecord]:
        """One record per member of `groups` (default: the groups Tune has added), read back from
        the member folders. A driver killed just after a group was suggested can leave folders of
        a group Tune's saved state never held; a resumed sweep suggests those configurations again."""
        known = set(groups) if groups is not None else {m.group_id for m in self.members.values()}
        records = [r for r in records_from_trial_dirs(self.folder) if group_of(r.trial_id) in known]
        for record in records:
            member = self.members.get(record.trial_id)
            record.running = member is not None and member.ended is None
        return records

    def result(self, grid: Any, metric: str, mode: str, iterations: int | None, groups: Iterable[str] | None = None) -> SweepResult:
        """The sweep's result over every member of `groups`: each a `ray.tune.Result` (see
        `member_result`) with its row as its folders hold it, the verdict its scheduler gave included.
        The group list is read from the same folders: a resumed sweep's groups were formed by the
        scheduler Tune restored with its state, never added to this book."""
        records = self.records(groups)
        results = [member_result(record, self.folder / record.trial_id) for record in records]
        result = SweepResult(grid, metric, mode, iterations, results=results, records=records)
        result.extras["fused_groups"] = FusedGroups.of(record.trial_id for record in records)
        return result


def _last_result(folder: Path) -> dict[str, Any]:
    lines = (folder / "result.json").read_text().splitlines() if (folder / "result.json").exists() else []
    return json.loads(lines[-1]) if lines else {}




def member_result(record: TrialRecord, folder: Path) -> Any:
    """A member as a `ray.tune.Result`, like an unfused trial's in a `ResultGrid`: last metrics,
    latest checkpoint, error, folder and the whole history (one row per iteration)."""
    import pandas as pd
    from ray import tune

    history_file = folder / "result.json"
    lines = history_file.read_text().splitlines() if history_file.exists() else []
    by_iteration = {}  # a group retried from its checkpoint reports some iterations twice
    for line in lines:
        entry = json.loads(line)
        by_iteration[entry["training_iteration"]] = entry
    history = pd.DataFrame([by_iteration[i] for i in sorted(by_iteration)]) if by_iteration else None
    return tune.Result(
        # `done` as on a Tune trial's last result: the member ended (a sweep stopped by Ctrl-C
        # leaves the others short, and `hpo.reporting.results_files.ended` reads both kinds of row alike)
        metrics={"config": dict(record.config), **record.metrics, "done": not record.running},
        checkpoint=tune.Checkpoint.from_directory(record.checkpoint) if record.checkpoint else None,
        error=RuntimeError(record.error) if record.error else None,
        path=str(folder),
        metrics_dataframe=history,
    )


def _write_status(folder: Path, status: str) -> None:
    """A member's verdict in its folder, where a resumed sweep and `--rebuild` read it."""
    write_atomically(folder / STATUS_FILE, json.dumps({"status": status}))
