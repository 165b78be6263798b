"""Rebuilding a run's results from its trials' own folders: the way back when Tune's saved run
state is damaged (`hpo results RUN --rebuild`), and how a fused sweep reads its members back.

Tune writes each trial's folder as the run goes (`params.json`, `result.json`, `error.txt`,
`checkpoint_*`), and a fused sweep writes each member's the same way, with the verdict its
scheduler gave (`status.json`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hpo.reporting.results_files import MEMBERS_DIR, TrialRecord, error_line


def records_from_trial_dirs(experiment: Path, verdicts: Mapping[str, str] | None = None) -> list[TrialRecord]:
    """Every trial of a run read back from its own folder (`params.json`, `result.json`,
    `error.txt`, `checkpoint_*`), which Tune writes as the run goes: the way to rebuild the
    results of a run whose experiment state is damaged. A fused sweep's configurations are the
    member folders under `members/`, written the same way (its Tune trials are the groups), each
    with the verdict its scheduler gave when it ended (`status.json`); `verdicts` (trial id ->
    status, from an earlier results.csv) keeps those of a run's Tune trials."""
    if (experiment / MEMBERS_DIR).is_dir():
        experiment = experiment / MEMBERS_DIR
    verdicts = verdicts or {}
    records = []
    for params in sorted(experiment.glob("*/params.json")):
        folder = params.parent
        try:
            config = json.loads(params.read_text())
        except (OSError, ValueError):
            continue  # a folder whose parameters are unreadable is not a trial we can report
        metrics: dict[str, Any] = {}
        results_file = folder / "result.json"
        if results_file.exists():
            for line in results_file.read_text(errors="replace").splitlines():
                try:
                    metrics = json.loads(line)
                except ValueError:
                    break  # a torn last line: keep the last whole result
        error_file = folder / "error.txt"
        checkpoints = sorted(folder.glob("checkpoint_*"))
        trial_id = str(metrics.get("trial_id", folder.name))
        records.append(TrialRecord(
            trial_id=trial_id,
            config=config,
            metrics=metrics,
            error=error_line(error_file.read_text(errors="replace")) if error_file.exists() else "",
            error_file=str(error_file) if error_file.exists() else "",
            checkpoint=str(checkpoints[-1]) if checkpoints else "",
            status=_verdict(folder) or verdicts.get(trial_id, ""),
        ))
    return records


#: A fused member's verdict, written when its scheduler ended it (`hpo.engines.fused.members.MemberBook.end`).
STATUS_FILE = "status.json"


def _verdict(folder: Path) -> str:
    try:
        return str(json.loads((folder / STATUS_FILE).read_text())["status"])
    except (OSError, ValueError, KeyError, TypeError):
        return ""
