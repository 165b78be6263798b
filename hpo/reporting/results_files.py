"""A sweep's rows and its results files: one row per configuration, the same shape whoever builds
it (the finished sweep's `SweepResult`, the running sweep's `hpo.reporting.live_results`, a damaged
run rebuilt by `hpo.reporting.rebuild`), written as `results.csv` and `summary.json`.

Files are replaced atomically (`hpo.base.atomic_files`): a reader sees the old file or the new one,
never half of one. The best configuration is never one that errored or did not report the metric.
"""

from __future__ import annotations

import json
import math
import numbers
import os
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pandas as pd

from hpo.base.atomic_files import write_all_atomically

RESULTS_FILE = "results.csv"
SUMMARY_FILE = "summary.json"
PLOT_FILE = "curves.png"
#: Under a fused sweep's experiment folder: one folder per configuration (`hpo.engines.fused.members`).
MEMBERS_DIR = "members"
#: Tune's bookkeeping in every result: not metrics a user compares trials by.
TUNE_METADATA = frozenset({
    "config", "date", "hostname", "node_ip", "pid", "timestamp", "time_since_restore", "time_this_iter_s",
    "iterations_since_restore", "checkpoint_dir_name", "done", "should_checkpoint", "trial_id",
    "experiment_tag", "experiment_id",
})
#: Row statuses that are final outcomes a best configuration may come from.
FINISHED = ("completed", "early_stopped")
#: How a trial's reported values make the one it is ranked by, as `ResultGrid.get_best_result`'s
#: `scope`: the last, the mean, the mean of the last 5 or 10, or the best of all.
SCOPES = ("last", "avg", "last-5-avg", "last-10-avg", "all")


@dataclass
class TrialRecord:
    """One trial as any source knows it: enough for a row."""

    trial_id: str
    config: Mapping[str, Any]
    metrics: Mapping[str, Any]
    error: str = ""
    error_file: str = ""
    checkpoint: str = ""
    running: bool = False
    history: Any = field(default=None, repr=False)
    #: How the trial ended, when that was decided as it ended (a fused member's `status.json`, a
    #: row of an earlier results.csv); otherwise `status_of` tells it from the record.
    status: str = ""


def is_number(value: Any) -> bool:
    """A reported value trials can be ranked by: a real number, numpy's scalars (`np.float32`, which
    is no Python float, and `np.int64`) included, but not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def metric_value(result: Mapping[str, Any], metric: str) -> Any:
    """`metric` in a trial's result as Tune reads it: the key itself, or a `/`-separated path into
    nested results (`val/loss` is `{"val": {"loss": ...}}`, as in Tune's dataframes, schedulers and
    `get_best_result`); None where it is neither."""
    if metric in result:
        return result[metric]
    value: Any = result
    for part in metric.split("/"):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value


def flattened(result: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """`{"a": {"b": 1}}` as `[("a/b", 1)]`: nested results and configs as Tune's dataframes (and
    W&B's charts) name them."""
    items: list[tuple[str, Any]] = []
    for key, value in result.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            items.extend(flattened(value, f"{name}/"))
        else:
            items.append((name, value))
    return items


def error_line(error: BaseException | str | None) -> str:
    """The user's exception (`ValueError: ...`), which Ray puts last under its own wrapper lines."""
    if not error:
        return ""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[-1] if lines else type(error).__name__


#: A row's error when its trial ended without a single result (`status_of`).
NO_RESULT = "ended without a single result"


def status_of(record: TrialRecord, max_iterations: int | None) -> str:
    """How a trial ended, by one rule whoever asks (the live sweep, its end, `hpo results --rebuild`):
    `error` if it failed, or ended without a single result (nothing to rank it by: Tune stopped the
    sweep at a result without its metric, or the function returned before reporting); `diverged`;
    `running` if it had not ended; the verdict recorded when it ended, if one was (`status`);
    `early_stopped` if it reported fewer than `max_iterations` (given when a scheduler, stopper or
    time budget could stop it); else `completed`."""
    if record.error:
        return "error"
    if record.metrics.get("diverged"):
        return "diverged"
    if record.running:
        return "running"
    if record.status:
        return record.status
    if not record.metrics.get("training_iteration"):
        return "error"
    if max_iterations is not None and record.metrics.get("training_iteration", 0) < max_iterations:
        return "early_stopped"
    return "completed"


def record_row(record: TrialRecord, metric: str, max_iterations: int | None) -> dict[str, Any]:
    """The row of one trial: id, `config/<key>` columns, the target metric, every other reported
    metric, iterations, status, checkpoint path, error line and error file."""
    metrics = record.metrics
    row: dict[str, Any] = {"trial_id": record.trial_id}
    row.update({f"config/{key}": value for key, value in flattened(record.config)})
    value = metric_value(metrics, metric)
    row[metric] = float(value) if is_number(value) else math.nan
    row["iterations"] = int(metrics.get("training_iteration", 0))
    row["status"] = status_of(record, max_iterations)
    for key, item in flattened(metrics):
        if key.split("/", 1)[0] not in TUNE_METADATA and key != metric and key not in row and not isinstance(item, list):
            row[key] = item
    row["checkpoint"] = record.checkpoint
    row["error"] = record.error or (NO_RESULT if row["status"] == "error" else "")
    row["error_file"] = record.error_file
    return row


def rows_frame(rows: Sequence[Mapping[str, Any]], metric: str, mode: str) -> pd.DataFrame:
    """Rows sorted best first (trials without the metric last).

    A column of integers stays integer where some rows lack it (an interrupted sweep's trial
    that Tune created but never started has no configuration yet): pandas would make the whole
    column float, and results.csv would read `32.0` in every row until the sweep is resumed."""
    frame = pd.DataFrame(list(rows))
    for column in frame.columns:
        present = [row[column] for row in rows if row.get(column) is not None]
        if 0 < len(present) < len(rows) and all(isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in present):
            frame[column] = frame[column].astype("Int64")
    if not frame.empty:
        frame = frame.sort_values(metric, ascending=mode == "min", na_position="last", kind="stable")
    return frame.reset_index(drop=True)


def scoped_value(values: Sequence[Any], scope: str, mode: str, filter_nan_and_inf: bool = True) -> float | None:
    """One trial's measure from its reported values, in order, by `scope` (see `SCOPES`); the
    values that are not finite numbers are left out (infinities are kept without
    `filter_nan_and_inf`, as `ResultGrid.get_best_result` keeps them; NaN ranks nowhere); None
    when none is left."""
    if scope not in SCOPES:
        raise ValueError(f"scope must be one of {', '.join(SCOPES)}, got {scope!r}")
    finite = [float(v) for v in values
              if is_number(v) and (math.isfinite(v) if filter_nan_and_inf else not math.isnan(v))]
    if not finite:
        return None
    if scope == "last":
        return finite[-1]
    if scope == "all":
        return min(finite) if mode == "min" else max(finite)
    window = {"avg": len(finite), "last-5-avg": 5, "last-10-avg": 10}[scope]
    return sum(finite[-window:]) / len(finite[-window:])


def history_of(record: TrialRecord, metric: str) -> list[Any]:
    """Every value of `metric` the trial reported (its last alone when no history is at hand)."""
    frame = getattr(record.history, "metrics_dataframe", None)
    if frame is not None and metric in frame:
        return list(frame[metric])
    return [metric_value(record.metrics, metric)]


def best_record(
    records: Sequence[TrialRecord], metric: str, mode: str, max_iterations: int | None, scope: str = "last",
    filter_nan_and_inf: bool = True,
) -> TrialRecord | None:
    """The best finished trial by `metric` (by default its last reported value; see `SCOPES` and
    `scoped_value`); errored, diverged, running and metric-less trials never qualify."""
    candidates = []
    for record in records:
        if status_of(record, max_iterations) not in FINISHED:
            continue
        values = history_of(record, metric) if scope != "last" else [metric_value(record.metrics, metric)]
        value = scoped_value(values, scope, mode, filter_nan_and_inf)
        if value is not None:
            candidates.append((value, record))
    if not candidates:
        return None
    pick = min if mode == "min" else max
    return pick(candidates, key=lambda pair: pair[0])[1]


def write_run_files(
    directory: Path, records: Sequence[TrialRecord], metric: str, mode: str, max_iterations: int | None,
    target: Mapping[str, Any] | None = None,
) -> pd.DataFrame:
    """`results.csv` (one row per trial) and `summary.json` (metric, counts, the best trial, and for
    a scaled sweep its `target`: see `hpo.engines.scaled.target_summary`), replaced together
    atomically; returns the rows."""
    frame = rows_frame([record_row(r, metric, max_iterations) for r in records], metric, mode)
    best = best_record(records, metric, mode, max_iterations)
    value = None if best is None else metric_value(best.metrics, metric)
    summary = {
        "metric": metric,
        "mode": mode,
        "max_iterations": max_iterations,
        "trials": len(records),
        "errored": int((frame["status"] == "error").sum()) if len(frame) else 0,
        "best": None if best is None else {
            "trial_id": best.trial_id, "config": dict(best.config), "value": float(value) if is_number(value) else value,
            "checkpoint": best.checkpoint,
        },
    }
    if target is not None:
        summary["target"] = dict(target)
    text = json.dumps(summary, indent=2, default=str) + "\n"
    write_all_atomically({
        directory / RESULTS_FILE: lambda temporary: frame.to_csv(temporary, index=False),
        directory / SUMMARY_FILE: text,
    })
    return frame


# -- sources --------------------------------------------------------------------------------------


def ended(result: Any, tune_ended: Collection[str] = ()) -> bool:
    """Whether Tune ended this trial (or a fused sweep its member): it errored, its last result
    carries Tune's `done`, or Tune's saved run state holds it as ended (`tune_ended`, trial ids:
    HyperBand stops a trial it had paused, whose last result never carries `done`). A sweep
    stopped by Ctrl-C, or by its time budget, returns from `fit` with such trials short."""
    return (result.error is not None or bool((result.metrics or {}).get("done"))
            or result_trial_id(result) in tune_ended)


def result_trial_id(result: Any) -> str:
    """A `ray.tune.Result`'s trial id: the one it reported, else its folder's name."""
    return str((result.metrics or {}).get("trial_id", Path(result.path).name if result.path else ""))


def record_from_result(result: Any) -> TrialRecord:
    """A trial of a finished sweep (`ray.tune.Result`)."""
    path = Path(result.path) if result.path else None
    error_file = path / "error.txt" if path is not None else None
    metrics = result.metrics or {}
    return TrialRecord(
        trial_id=result_trial_id(result),
        config=result.config or {},
        metrics=metrics,
        error=error_line(result.error),
        error_file=str(error_file) if result.error is not None and error_file and error_file.exists() else "",
        checkpoint=result.checkpoint.path if result.checkpoint is not None else "",
        history=result,
    )


def record_from_trial(trial: Any, status: str | None = None) -> TrialRecord:
    """A trial of a running sweep, as Tune's callbacks see it (or with `status` in place of
    Tune's: see `results_file_callback`)."""
    status = status or trial.status
    error_file = getattr(trial, "error_file", None) or ""
    errored = status == "ERROR"
    error = ""
    if errored:
        error = "the trial failed"
        if error_file and os.path.exists(error_file):
            error = error_line(Path(error_file).read_text(errors="replace")) or error
    checkpoint = getattr(trial, "checkpoint", None)
    return TrialRecord(
        trial_id=trial.trial_id,
        config=trial.config or {},
        metrics=trial.last_result or {},
        error=error,
        error_file=str(error_file) if errored else "",
        checkpoint=checkpoint.path if checkpoint is not None else "",
        running=status in ("RUNNING", "PENDING", "PAUSED"),
    )


def read_summary(path: Path) -> dict[str, Any]:
    """A run's summary.json; ValueError naming the file when it is not one `write_run_files` wrote."""
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: damaged ({exc})") from None
    best = summary.get("best") if isinstance(summary, dict) else None
    if not isinstance(summary, dict) or not isinstance(summary.get("metric"), str) or not (
        best is None or (isinstance(best, dict) and isinstance(best.get("value"), (int, float)) and "config" in best)
    ):
        raise ValueError(f"{path}: damaged (not a run summary)")
    return summary


def names_reported_without(records: Sequence[TrialRecord], metric: str) -> str:
    """The names the trials reported when none reported `metric`; '' when one did, or when none
    reported anything (a run whose every trial failed at once is rebuilt as it is)."""
    if any(metric_value(record.metrics, metric) is not None for record in records):
        return ""
    names = {key for record in records for key, _ in flattened(record.metrics) if key.split("/", 1)[0] not in TUNE_METADATA}
    return ", ".join(sorted(names))


def summary_table(frame: pd.DataFrame, metric: str, max_rows: int = 40) -> str:
    """The console table: configuration, the metric, iterations and status of each trial."""
    columns = [c for c in frame.columns if c.startswith("config/")] + [metric, "iterations", "status"]
    shown = frame[[c for c in columns if c in frame]].rename(columns=lambda c: c.removeprefix("config/"))
    return shown.head(max_rows).to_string(index=False, float_format=lambda v: f"{v:.4g}")
