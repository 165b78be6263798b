"""The members of a fused sweep as the driver keeps them: one record, folder and results row per
configuration, although Tune runs one trial per fused group.

Tune's controller costs a process per running trial and processes every result; a member that was
its own Tune trial cost a Ray worker (about 1 s of CPU and 195 MB) and a trip through the
controller per iteration. Here Tune runs the *groups* (`hpo.fused_group_trial`), and the members
live in the driver:

- `MemberTrial` is what Tune's searchers and schedulers are handed for a member: it has the
  attributes they read of a `Trial` (`trial_id`, `config`, `status`, `last_result`), so ASHA,
  HyperBand and median stopping decide for each member exactly as for an unfused trial.
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

from hpo.results import MEMBERS_DIR, TrialRecord, records_from_trial_dirs, write_atomically

STATUS_FILE = "status.json"


def member_ids(group_trial_id: str, size: int) -> list[str]:
    """The ids of a group's members: stable across retries and resumes of the group's trial."""
    return [f"{group_trial_id}_m{index:03d}" for index in range(size)]


def group_of(member_id: str) -> str:
    return member_id.rsplit("_m", 1)[0]


#: A group trial's folder in the experiment is `group_<trial id>`.
GROUP_DIR_PREFIX = "group_"


class MemberTrial:
    """A member as Tune's searchers and schedulers see a trial."""

    PENDING, RUNNING, PAUSED, TERMINATED, ERROR = "PENDING", "RUNNING", "PAUSED", "TERMINATED", "ERROR"

    def __init__(self, trial_id: str, config: Mapping[str, Any], group_id: str):
        self.trial_id = trial_id
        self.config = dict(config)
        self.group_id = group_id
        # A member is RUNNING as soon as its group exists: schedulers only ever pause, resume and
        # stop it; when its group's trial runs is Tune's concern.
        self.status = self.RUNNING
        self.last_result: dict[str, Any] = {}
        self.ended: str | None = None
        self.is_saving = False  # read by HyperBand; a member's checkpoint is written by its group

    def __repr__(self) -> str:
        return f"MemberTrial({self.trial_id}, {self.status})"

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

    def __init__(self, experiment: Path):
        self.folder = experiment / MEMBERS_DIR
        self.members: dict[str, MemberTrial] = {}

    def add_group(self, group_id: str, configs: list[Mapping[str, Any]]) -> list[MemberTrial]:
        """The members of a group trial Tune just added (or restored)."""
        members = []
        for member_id, config in zip(member_ids(group_id, len(configs)), configs):
            member = self.members.get(member_id)
            if member is None:
                member = self.members[member_id] = MemberTrial(member_id, config, group_id)
                folder = self.folder / member_id
                folder.mkdir(parents=True, exist_ok=True)
                # A resumed sweep's member goes on from what its folder holds.
                member.last_result = _last_result(folder)
                status = folder / STATUS_FILE
                if status.exists():
                    member.ended = json.loads(status.read_text())["status"]
                    member.status = MemberTrial.TERMINATED
                elif not (folder / "params.json").exists():
                    text = json.dumps(member.config, default=str)
                    write_atomically(folder / "params.json", lambda temporary: Path(temporary).write_text(text))
            members.append(member)
        return members

    def groups(self) -> list[list[str]]:
        """Every group's member ids, in the order the groups were formed."""
        groups: dict[str, list[str]] = {}
        for member in self.members.values():
            groups.setdefault(member.group_id, []).append(member.trial_id)
        return list(groups.values())

    def group(self, group_id: str) -> list[MemberTrial]:
        return [m for m in self.members.values() if m.group_id == group_id]

    def record_result(self, member: MemberTrial, result: Mapping[str, Any]) -> dict[str, Any]:
        """Append one iteration of `member` to its `result.json`; returns the result as Tune's
        schedulers and searchers expect it."""
        full = {**result, "trial_id": member.trial_id, "config": member.config}
        member.last_result = full
        with open(self.folder / member.trial_id / "result.json", "a") as handle:
            handle.write(json.dumps(full, default=str) + "\n")
        return full

    def end(self, member: MemberTrial, status: str, error: str = "") -> None:
        """`member` ended (`status`: completed, early_stopped, diverged or error); its status file
        makes that survive a resume, and the group's error, if it failed, goes where Tune puts a
        trial's (`error.txt`)."""
        if member.ended is not None:
            return
        member.ended = status
        member.status = MemberTrial.ERROR if status == "error" else MemberTrial.TERMINATED
        folder = self.folder / member.trial_id
        if error:
            write_atomically(folder / "error.txt", lambda temporary: Path(temporary).write_text(error))
        text = json.dumps({"status": status})
        write_atomically(folder / STATUS_FILE, lambda temporary: Path(temporary).write_text(text))

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

    def results(self, groups: Iterable[str] | None = None) -> list[Any]:
        """Every member of `groups` as a `ray.tune.Result` (see `member_result`)."""
        return [member_result(record, self.folder / record.trial_id) for record in self.records(groups)]


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
        metrics=dict(record.metrics),
        checkpoint=tune.Checkpoint.from_directory(record.checkpoint) if record.checkpoint else None,
        error=RuntimeError(record.error) if record.error else None,
        path=str(folder),
        metrics_dataframe=history,
    )
