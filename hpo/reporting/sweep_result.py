"""What a sweep hands back: the best configuration, one row per configuration, files and a plot.

`SweepResult` wraps Ray's `ResultGrid` (still reachable as `.result_grid`) and offers its API
(`get_best_result`, `errors`, `num_errors`, `len`, iteration), so plain, fused and proxy sweeps
report the same way.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import replace
from functools import cached_property
from pathlib import Path
from typing import Any, TypeVar

import pandas as pd

from hpo.base.atomic_files import write_atomically
from hpo.base.figures import subplots
from hpo.reporting.results_files import (
    PLOT_FILE,
    RESULTS_FILE,
    SUMMARY_FILE,
    TrialRecord,
    best_record,
    ended,
    record_from_result,
    record_row,
    rows_frame,
    summary_table,
    write_run_files,
)
from hpo.reporting.tune_state import DAMAGED, ended_trials, newest_state, trial_configs


T = TypeVar("T")


def saved_configs(experiment: Path, trial_ids: set[str]) -> dict[str, dict[str, Any]]:
    """The configs of `trial_ids` in Tune's newest saved run state (empty if there is none or it is damaged)."""
    return _from_saved_state(experiment, lambda state: trial_configs(state, trial_ids), {})


def saved_ended_trials(experiment: Path) -> frozenset[str]:
    """The trials Tune's newest saved run state holds as ended (none if there is none or it is damaged)."""
    return _from_saved_state(experiment, lambda state: frozenset(ended_trials(state)), frozenset())


def _from_saved_state(experiment: Path, read: Callable[[Path], T], empty: T) -> T:
    """`read` of Tune's newest saved run state, or `empty` where there is none or it is damaged."""
    newest = newest_state(experiment)
    try:
        return read(newest) if newest else empty
    except DAMAGED:
        return empty


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
        #: With muP scaling: the folder of the trained target (`hpo.engines.scaled.finish`), if trained.
        self.target_checkpoint: str | None = None
        #: With muP scaling: the target as `summary.json` records it (`hpo.engines.scaled.target_summary`).
        self.target: dict[str, Any] | None = None
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

    def stopped_early(self, tune_ended: Collection[str] = ()) -> None:
        """Mark the sweep as interrupted: a row whose trial (or fused member) had not ended says
        `running` (`tune_ended`: the trial ids Tune's saved state holds as ended, see `ended`)."""
        self.interrupted = True
        for record, result in zip(self.records, self.results):
            record.running = not ended(result, tune_ended)

    def out_of_time(self, budget_s: float, planned: float) -> None:
        """The sweep's time budget ran out: a trial it cut short (its last result is not Tune's
        `done`) or never started did not fail and did not complete, so its row says
        `early_stopped` (0 iterations where it never reported), not `error` or `completed`. The
        report says how many of the `planned` trials (`inf`: no end but the budget) never reported,
        counting those Tune never created (a concurrency limit makes them one at a time), which
        have no row."""
        cut = [r for r in self.records if not r.error and not r.running and not r.status and not r.metrics.get("done")]
        for record in cut:
            record.status = "early_stopped"
        never_created = max(0, int(planned) - len(self.records)) if math.isfinite(planned) else 0
        unreported = sum(1 for r in cut if not r.metrics.get("training_iteration")) + never_created
        if cut or never_created:
            self.extras["time_budget_s"] = (
                f"{budget_s:g} s ran out: of {len(self.records) + never_created} trials, {len(cut) + never_created - unreported} "
                f"were cut short and {unreported} never reported (their rows, where Tune made one, say early_stopped)")

    @property
    def num_terminated(self) -> int:
        return sum(1 for record in self.records if not record.error and not record.running)

    def get_best_result(
        self, metric: str | None = None, mode: str | None = None, scope: str = "last", filter_nan_and_inf: bool = True,
    ) -> Any:
        """The `ray.tune.Result` of the best finished trial, as `ResultGrid.get_best_result`: by its
        last reported metric, or by `scope` ('avg', 'last-5-avg', 'last-10-avg', or 'all': its best
        value); an infinite value ranks only with `filter_nan_and_inf=False`, a NaN never. Errored
        and unfinished trials never count; RuntimeError when no trial qualifies."""
        best = best_record(self.records, metric or self.metric, mode or self.mode, self.max_iterations, scope,
                           filter_nan_and_inf)
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
        write_run_files(directory, self.records, self.metric, self.mode, self.max_iterations, self.target)
        self.paths = {"results": directory / RESULTS_FILE, "summary": directory / SUMMARY_FILE, "plot": None}
        if self._histories or self.curves:  # a run where nothing reported the metric has nothing to plot
            self.paths["plot"] = directory / PLOT_FILE
            write_atomically(self.paths["plot"], self.plot)
        return self.paths

    @cached_property
    def _histories(self) -> list[tuple[Any, Any, Any]]:
        """Each trial that reported the metric at least once, as (result, iterations, values):
        read from the trials' histories once, since `write` asks before `figure` draws them."""
        found = []
        for result in self.results:
            history = result.metrics_dataframe
            if history is not None and self.metric in history and history[self.metric].notna().any():
                found.append((result, _as_floats(history["training_iteration"]), _as_floats(history[self.metric])))
        return found

    def plot(self, path: str | Path) -> None:
        """Write `figure` as a PNG."""
        self.figure().savefig(path, dpi=100, format="png")

    def figure(self) -> Any:
        """Every trial's metric against training iteration, the best trial highlighted, and the
        `curves` (a muP sweep's target) beside them. The axis is logarithmic when positive values
        span more than two decades, so one diverging trial does not flatten the others. The other
        trials are one line collection and the legend has a fixed corner: a line per trial, and the
        legend's search for the emptiest corner among all of them, took 17 of a 1000-trial sweep's
        20 s of plotting on the loaded 2-core box (3 s now, matplotlib's import included).

        The figure is not pyplot's (`hpo.base.figures`)."""
        import numpy as np
        from matplotlib.collections import LineCollection

        try:
            best_path = self.best_result.path
        except RuntimeError:
            best_path = None
        figure, axes = subplots(figsize=(8, 5))
        values: list[np.ndarray] = []
        others = []
        for result, iterations, metric in self._histories:
            values.append(metric[np.isfinite(metric)])
            if result.path != best_path:
                others.append(np.column_stack([iterations, metric]))
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
