"""What a sweep hands back: the best configuration, one row per configuration, a plot.

Every row has the same shape whoever builds it: the finished sweep (Ray's `ResultGrid`), the
running sweep (`ResultsFileCallback` rewrites `results.csv` each time a trial ends, so a crashed
driver or a full disk leaves every finished row on disk), or a damaged run rebuilt from its
trials' own folders (`rows_from_trial_dirs`). Files are replaced atomically (a temporary file,
then a rename): a reader sees the old file or the new one, never half of one.

`SweepResult` wraps the `ResultGrid` (still reachable as `.result_grid`) and offers its API
(`get_best_result`, `errors`, `num_errors`, `len`, iteration), so plain, fused and proxy sweeps
report the same way. The best trial is never one that errored or did not report the metric.
"""

from __future__ import annotations

import json
import math
import numbers
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pandas as pd

from hpo.base.atomic_files import write_all_atomically, write_atomically
from hpo.tune_state import DAMAGED, ended_trials, newest_state, trial_configs

RESULTS_FILE = "results.csv"
SUMMARY_FILE = "summary.json"
PLOT_FILE = "curves.png"
#: Under a fused sweep's experiment folder: one folder per configuration (`hpo.fused_members`).
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
    row.update({f"config/{key}": value for key, value in record.config.items()})
    value = metrics.get(metric)
    row[metric] = value if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan
    row["iterations"] = int(metrics.get("training_iteration", 0))
    row["status"] = status_of(record, max_iterations)
    for key, item in metrics.items():
        if key not in TUNE_METADATA and key != metric and key not in row and not isinstance(item, (dict, list)):
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


def scoped_value(values: Sequence[Any], scope: str, mode: str) -> float | None:
    """One trial's measure from its reported values, in order, by `scope` (see `SCOPES`); the
    values that are not finite numbers are left out; None when none is."""
    if scope not in SCOPES:
        raise ValueError(f"scope must be one of {', '.join(SCOPES)}, got {scope!r}")
    finite = [float(v) for v in values if isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)]
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
    return [record.metrics.get(metric)]


def best_record(
    records: Sequence[TrialRecord], metric: str, mode: str, max_iterations: int | None, scope: str = "last"
) -> TrialRecord | None:
    """The best finished trial by `metric` (by default its last reported value; see `SCOPES`);
    errored, diverged, running and metric-less trials never qualify."""
    candidates = []
    for record in records:
        if status_of(record, max_iterations) not in FINISHED:
            continue
        value = scoped_value(history_of(record, metric) if scope != "last" else [record.metrics.get(metric)], scope, mode)
        if value is not None:
            candidates.append((value, record))
    if not candidates:
        return None
    pick = min if mode == "min" else max
    return pick(candidates, key=lambda pair: pair[0])[1]


def write_run_files(
    directory: Path, records: Sequence[TrialRecord], metric: str, mode: str, max_iterations: int | None
) -> pd.DataFrame:
    """`results.csv` (one row per trial) and `summary.json` (metric, counts, the best trial),
    replaced together atomically; returns the rows."""
    frame = rows_frame([record_row(r, metric, max_iterations) for r in records], metric, mode)
    best = best_record(records, metric, mode, max_iterations)
    summary = {
        "metric": metric,
        "mode": mode,
        "max_iterations": max_iterations,
        "trials": len(records),
        "errored": int((frame["status"] == "error").sum()) if len(frame) else 0,
        "best": None if best is None else {
            "trial_id": best.trial_id, "config": dict(best.config), "value": best.metrics.get(metric),
            "checkpoint": best.checkpoint,
        },
    }
    text = json.dumps(summary, indent=2, default=str) + "\n"
    write_all_atomically({
        directory / RESULTS_FILE: lambda temporary: frame.to_csv(temporary, index=False),
        directory / SUMMARY_FILE: text,
    })
    return frame


# -- sources --------------------------------------------------------------------------------------


def ended(result: Any) -> bool:
    """Whether Tune ended this trial (or a fused sweep its member): it errored, or its last result
    carries Tune's `done`. A sweep stopped by Ctrl-C, or by its time budget, returns from `fit`
    with such trials short."""
    return result.error is not None or bool((result.metrics or {}).get("done"))


def record_from_result(result: Any) -> TrialRecord:
    """A trial of a finished sweep (`ray.tune.Result`)."""
    path = Path(result.path) if result.path else None
    error_file = path / "error.txt" if path is not None else None
    metrics = result.metrics or {}
    return TrialRecord(
        trial_id=str(metrics.get("trial_id", path.name if path else "")),
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


#: A fused member's verdict, written when its scheduler ended it (`hpo.fused_members.MemberBook.end`).
STATUS_FILE = "status.json"


def _verdict(folder: Path) -> str:
    try:
        return str(json.loads((folder / STATUS_FILE).read_text())["status"])
    except (OSError, ValueError, KeyError, TypeError):
        return ""


def saved_configs(experiment: Path, trial_ids: set[str]) -> dict[str, dict[str, Any]]:
    """The configs of `trial_ids` in Tune's newest saved run state (empty if there is none or it is damaged)."""
    newest = newest_state(experiment)
    try:
        return trial_configs(newest, trial_ids) if newest else {}
    except DAMAGED:
        return {}


# -- the live file ---------------------------------------------------------------------------------


class SavedRunState:
    """Which trials Tune's newest saved run state (`experiment_state-*.json`) holds as ended: the
    trials a resumed run will not run again. The file is read again only when it changes, and the
    folder listed at most every `LIST_EVERY_S` until this run's own state file is found: Tune's
    controller steps (and asks) hundreds of times a second, and a 10,000-trial sweep's folder has
    10,000 entries. Tune saves one file per run (`experiment_state-<run start>.json`), so the first
    one written since this reader began stays the newest until the run ends."""

    LIST_EVERY_S = 0.25

    def __init__(self, experiment: Path):
        self.experiment = experiment
        self._began_ns = time.time_ns()
        self._newest: Path | None = None  # the newest state file at the last listing
        self._own = False  # whether `_newest` is this run's own file: no listing is needed any more
        self._listed_at = -math.inf
        self._seen: tuple = ()  # (path, mtime_ns) of the state file last read
        self._ended: set[str] = set()

    def ended(self, relist: bool = False) -> set[str]:
        """`relist` lists the folder now (unless this run's file is known): at a sweep's end, when
        Tune has just saved its last state."""
        now = time.monotonic()
        if not self._own and (relist or self._newest is None or now - self._listed_at >= self.LIST_EVERY_S):
            self._newest, self._listed_at = newest_state(self.experiment), now
        newest = self._newest
        try:
            seen = (newest, newest.stat().st_mtime_ns) if newest else ()
            if seen and seen != self._seen:
                self._seen, self._ended = seen, ended_trials(newest)
                self._own = seen[1] >= self._began_ns
        except DAMAGED:
            pass  # being replaced, or damaged: read it again at the next step
        return self._ended


def results_file_callback(experiment: Path, metric: str, mode: str, max_iterations: int | None) -> Any:
    """A Tune callback that rewrites `experiment/results.csv` and `summary.json` whenever a trial
    ends, so every finished trial is on disk whatever happens to the driver afterwards.

    A row says a trial ended only once Tune's saved run state says so too (every second in a sweep of
    up to 100 trials, see `hpo.api.Tuner._save_period`): a driver killed in between would see `--resume` run the trial again, and what
    results.csv holds as finished is final. Until then the row is written as running."""
    from ray.tune import Callback

    class ResultsFileCallback(Callback):
        def __init__(self) -> None:
            self.saved = SavedRunState(experiment)
            self.unsaved: set[str] = set()  # trials Tune ended whose end its saved state lacks

        def _write(self, trials: list) -> None:
            records = [record_from_trial(t, "RUNNING" if t.trial_id in self.unsaved else None) for t in trials]
            write_run_files(experiment, records, metric, mode, max_iterations)

        def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            self.unsaved.add(trial.trial_id)

        def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            self.unsaved.add(trial.trial_id)

        def on_step_end(self, iteration: int, trials: list, **info: Any) -> None:
            saved = self.unsaved & self.saved.ended() if self.unsaved else set()
            if saved:
                self.unsaved -= saved
                self._write(trials)

        def on_experiment_end(self, trials: list, **info: Any) -> None:
            self.unsaved -= self.saved.ended(relist=True)  # Tune saved its last state, unless the sweep failed
            self._write(trials)

    return ResultsFileCallback()


# -- the finished sweep ----------------------------------------------------------------------------


class SweepResult:
    """A finished sweep: `ResultGrid`'s API plus one row per configuration, files and a plot.

    Iterating, indexing and `len` go over configurations: the `ResultGrid`'s trials, or, in a
    fused sweep whose Tune trials are groups, the members' `results`.
    """

    def __init__(
        self, result_grid: Any, metric: str, mode: str, max_iterations: int | None = None,
        results: Sequence[Any] | None = None, records: Sequence[TrialRecord] | None = None,
    ):
        self.result_grid = result_grid
        self.results = list(result_grid if results is None else results)
        self.metric = metric
        self.mode = mode
        self.max_iterations = max_iterations
        self.extras: dict[str, Any] = {}  # engine reports (e.g. muP transfer) attach here
        #: Runs that are not trials, drawn beside them in the plot: label -> (iterations, values)
        #: (a muP sweep's target, trained with the transferred config).
        self.curves: dict[str, tuple[list[int], list[float]]] = {}
        self.controller: Any = None  # the sweep's `hpo:sweep:<name>` actor handle, when one ran
        self.actors: list[Any] = []  # every actor the sweep owns (controller, fusion broker)
        self.paths: dict[str, Path] = {}  # the files `write` wrote
        #: With muP scaling: the folder of the trained target (`hpo.scaled_sweep.finish`), if trained.
        self.target_checkpoint: str | None = None
        if records is None:
            self.records = [record_from_result(result) for result in self.results]
        else:  # rows read where the trials keep them (a fused sweep's member folders), one per result
            self.records = list(records)
            for record, result in zip(self.records, self.results):
                record.history = result
        if result_grid is not None and any(not record.config for record in self.records):
            # Tune's result of a trial that never reported holds no config; its saved state does.
            configs = saved_configs(Path(self.experiment_path), {r.trial_id for r in self.records if not r.config})
            for record in self.records:
                record.config = record.config or configs.get(record.trial_id, {})
        #: Stopped (Ctrl-C, SIGUSR1) before every Tune trial ended; `--resume` goes on (`stopped_early`).
        self.interrupted = False

    # ResultGrid's API
    @property
    def experiment_path(self) -> str:
        return self.result_grid.experiment_path

    def __len__(self) -> int:
        return len(self.results)

    def __iter__(self) -> Iterator[Any]:
        return iter(self.results)

    def __getitem__(self, index: int) -> Any:
        return self.results[index]

    @property
    def errors(self) -> list[BaseException]:
        return [result.error for result in self.results if result.error is not None]

    @property
    def num_errors(self) -> int:
        return len(self.errors)

    def stopped_early(self) -> None:
        """Mark the sweep as interrupted: a row whose trial (or fused member) had not ended says
        `running`."""
        self.interrupted = True
        for record, result in zip(self.records, self.results):
            record.running = not ended(result)

    @property
    def num_terminated(self) -> int:
        return sum(1 for record in self.records if not record.error and not record.running)

    def get_best_result(self, metric: str | None = None, mode: str | None = None, scope: str = "last") -> Any:
        """The `ray.tune.Result` of the best finished trial, as `ResultGrid.get_best_result`: by its
        last reported metric, or by `scope` ('avg', 'last-5-avg', 'last-10-avg', or 'all': its best
        value). Errored and unfinished trials never count; RuntimeError when no trial qualifies."""
        best = best_record(self.records, metric or self.metric, mode or self.mode, self.max_iterations, scope)
        if best is None:
            raise RuntimeError(f"no finished trial reported {metric or self.metric!r}")
        return best.history

    @property
    def best_result(self) -> Any:
        return self.get_best_result()

    @property
    def best_config(self) -> dict[str, Any]:
        return dict(self.best_result.config)

    @property
    def best_checkpoint(self) -> str:
        """Path of the best trial's latest checkpoint ('' when it saved none)."""
        best = self.best_result
        return best.checkpoint.path if best.checkpoint is not None else ""

    def error_records(self) -> list[TrialRecord]:
        return [record for record in self.records if record.error]

    def get_dataframe(self, filter_metric: str | None = None, filter_mode: str | None = None) -> pd.DataFrame:
        """One row per configuration (see `record_row`), best first: each trial's last result, or,
        as `ResultGrid.get_dataframe` does with `filter_metric` and `filter_mode` ('min' or 'max'),
        the result in which `filter_metric` was best."""
        if (filter_metric is None) != (filter_mode is None):
            raise ValueError("give both filter_metric and filter_mode, or neither")
        if filter_mode not in (None, "min", "max"):
            raise ValueError(f"filter_mode must be 'min' or 'max', got {filter_mode!r}")
        rows = []
        for record in self.records:
            row = record_row(record, self.metric, self.max_iterations)
            if filter_metric is not None:  # that result's values; the trial's outcome stays its own
                best = replace(record, metrics=_best_reported(record, filter_metric, filter_mode))
                row = {**record_row(best, self.metric, self.max_iterations), "status": row["status"]}
            rows.append(row)
        return rows_frame(rows, self.metric, self.mode)

    def write(self, directory: str | Path | None = None) -> dict[str, Path]:
        """Write `results.csv`, `summary.json` and `curves.png` next to the experiment (or into
        `directory`)."""
        directory = Path(directory or self.experiment_path)
        write_run_files(directory, self.records, self.metric, self.mode, self.max_iterations)
        self.paths = {"results": directory / RESULTS_FILE, "summary": directory / SUMMARY_FILE, "plot": None}
        if self._histories() or self.curves:  # a run where nothing reported the metric has nothing to plot
            self.paths["plot"] = directory / PLOT_FILE
            write_atomically(self.paths["plot"], self.plot)
        return self.paths

    def _histories(self) -> list[tuple[Any, Any]]:
        """Each trial's (result, history) that reported the metric at least once."""
        found = []
        for result in self.results:
            history = result.metrics_dataframe
            if history is not None and self.metric in history and history[self.metric].notna().any():
                found.append((result, history))
        return found

    def plot(self, path: str | Path) -> None:
        """Write `figure` as a PNG."""
        import matplotlib.pyplot as plt

        figure = self.figure()
        figure.savefig(path, dpi=100, format="png")
        plt.close(figure)

    def figure(self) -> Any:
        """Every trial's metric against training iteration, the best trial highlighted, and the
        `curves` (a muP sweep's target) beside them. The axis is logarithmic when positive values
        span more than two decades, so one diverging trial does not flatten the others. The other
        trials are one line collection and the legend has a fixed corner: a line per trial, and the
        legend's search for the emptiest corner among all of them, took 17 of a 1000-trial sweep's
        20 s of plotting on the loaded 2-core box (3 s now, matplotlib's import included)."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import numpy as np
        from matplotlib.collections import LineCollection

        try:
            best_path = self.best_result.path
        except RuntimeError:
            best_path = None
        figure, axes = plt.subplots(figsize=(8, 5))
        values: list[np.ndarray] = []
        others = []
        for result, history in self._histories():
            metric = _as_floats(history[self.metric])
            values.append(metric[np.isfinite(metric)])
            if result.path != best_path:
                others.append(np.column_stack([_as_floats(history["training_iteration"]), metric]))
        axes.add_collection(LineCollection(others, colors="0.7", linewidths=1))
        if best_path is not None:
            history = self.best_result.metrics_dataframe
            axes.plot(history["training_iteration"], history[self.metric], color="tab:red", linewidth=2.5, label="best trial")
        for label, (iterations, curve) in self.curves.items():
            curve = np.asarray(curve, dtype=float)
            values.append(curve[np.isfinite(curve)])
            axes.plot(iterations, curve, color="tab:blue", linewidth=2.5, linestyle="--", label=label)
        if best_path is not None or self.curves:
            axes.legend(loc="upper right")
        finite = np.concatenate(values) if values else np.empty(0)
        if finite.size and finite.min() > 0 and finite.max() / finite.min() > 100:
            axes.set_yscale("log")
        axes.autoscale_view()
        axes.set_xlabel("training iteration")
        axes.set_ylabel(self.metric)
        run = Path(self.paths["results"]).parent if self.paths else Path(self.experiment_path)
        axes.set_title(f"{run.name}: {len(self.results)} trials")
        axes.grid(alpha=0.3)
        figure.tight_layout()
        return figure

    def summary_table(self, max_rows: int = 40) -> str:
        return summary_table(self.get_dataframe(), self.metric, max_rows)


def _best_reported(record: TrialRecord, metric: str, mode: str) -> Mapping[str, Any]:
    """The trial's result in which `metric` was best (its last result when it never reported it)."""
    frame = getattr(record.history, "metrics_dataframe", None)
    values = pd.to_numeric(frame[metric], errors="coerce") if frame is not None and metric in frame else None
    if values is None or values.isna().all():
        return record.metrics
    best = values.min() if mode == "min" else values.max()
    return {**record.metrics, **frame[values == best].iloc[0].to_dict()}


def _as_floats(column: pd.Series) -> Any:
    """A history column as floats for plotting; what is not a number becomes NaN (a gap)."""
    if pd.api.types.is_numeric_dtype(column):
        return column.to_numpy(dtype=float)
    return pd.to_numeric(column, errors="coerce").to_numpy(dtype=float)


def summary_table(frame: pd.DataFrame, metric: str, max_rows: int = 40) -> str:
    """The console table: configuration, the metric, iterations and status of each trial."""
    columns = [c for c in frame.columns if c.startswith("config/")] + [metric, "iterations", "status"]
    shown = frame[[c for c in columns if c in frame]].rename(columns=lambda c: c.removeprefix("config/"))
    return shown.head(max_rows).to_string(index=False, float_format=lambda v: f"{v:.4g}")
