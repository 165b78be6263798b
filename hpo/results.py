"""What a sweep hands back: the best configuration, one row per configuration, a plot.

Wraps Ray's `ResultGrid` (still reachable as `.result_grid`) so that plain, fused and proxy
sweeps report the same way.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd
from ray.tune import ResultGrid

def _error_line(error: BaseException | None) -> str:
    """The user's exception (`ValueError: ...`), which Ray puts last under its own wrapper lines."""
    if error is None:
        return ""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[-1] if lines else type(error).__name__


class SweepResult:
    def __init__(self, result_grid: ResultGrid, metric: str, mode: str, max_iterations: int | None = None):
        self.result_grid = result_grid
        self.metric = metric
        self.mode = mode
        self.max_iterations = max_iterations
        self.extras: dict[str, Any] = {}  # engine reports (e.g. muP transfer) attach here
        self.controller: Any = None  # the sweep's `hpo:<name>` actor handle, when one ran
        self.actors: list[Any] = []  # every actor the sweep owns (controller, fusion broker)

    @property
    def experiment_path(self) -> str:
        return self.result_grid.experiment_path

    @property
    def best_result(self) -> Any:
        """The `ray.tune.Result` with the best last-reported metric among trials that reported it."""
        return self.result_grid.get_best_result(self.metric, self.mode, scope="last", filter_nan_and_inf=True)

    @property
    def best_config(self) -> dict[str, Any]:
        return dict(self.best_result.config)

    def _status(self, result: Any) -> str:
        metrics = result.metrics or {}
        if result.error is not None:
            return "error"
        if metrics.get("diverged"):
            return "diverged"
        if self.max_iterations is not None and metrics.get("training_iteration", 0) < self.max_iterations:
            return "early_stopped"
        return "completed"

    def get_dataframe(self) -> pd.DataFrame:
        """One row per configuration: trial id, `config/<key>` columns, metric, iterations, status."""
        rows = []
        for result in self.result_grid:
            metrics = result.metrics or {}
            value = metrics.get(self.metric)
            row: dict[str, Any] = {"trial_id": metrics.get("trial_id", Path(result.path).name if result.path else "")}
            row.update({f"config/{key}": value for key, value in (result.config or {}).items()})
            row[self.metric] = value if isinstance(value, (int, float)) else math.nan
            row["iterations"] = int(metrics.get("training_iteration", 0))
            row["status"] = self._status(result)
            row["error"] = _error_line(result.error)
            rows.append(row)
        frame = pd.DataFrame(rows)
        if not frame.empty:
            frame = frame.sort_values(self.metric, ascending=self.mode == "min", na_position="last", kind="stable")
        return frame.reset_index(drop=True)

    def write(self, directory: str | Path | None = None) -> dict[str, Path]:
        """Write `results.csv` and `curves.png` next to the experiment (or into `directory`)."""
        directory = Path(directory or self.experiment_path)
        directory.mkdir(parents=True, exist_ok=True)
        csv_path = directory / "results.csv"
        self.get_dataframe().to_csv(csv_path, index=False)
        plot_path = directory / "curves.png"
        self.plot(plot_path)
        return {"results": csv_path, "plot": plot_path}

    def plot(self, path: str | Path) -> None:
        """Every trial's metric against training iteration; the best trial highlighted."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        try:
            best_path = self.best_result.path
        except RuntimeError:
            best_path = None
        figure, axes = plt.subplots(figsize=(8, 5))
        for result in self.result_grid:
            history = result.metrics_dataframe
            if history is None or self.metric not in history:
                continue
            if result.path == best_path:
                continue
            axes.plot(history["training_iteration"], history[self.metric], color="0.7", linewidth=1)
        if best_path is not None:
            history = self.best_result.metrics_dataframe
            axes.plot(history["training_iteration"], history[self.metric], color="tab:red", linewidth=2.5, label="best trial")
            axes.legend()
        axes.set_xlabel("training iteration")
        axes.set_ylabel(self.metric)
        axes.set_title(f"{Path(self.experiment_path).name}: {len(self.result_grid)} trials")
        axes.grid(alpha=0.3)
        figure.tight_layout()
        figure.savefig(path, dpi=100)
        plt.close(figure)

    def summary_table(self, max_rows: int = 40) -> str:
        frame = self.get_dataframe()
        shown = frame.drop(columns=["error"]).rename(columns=lambda c: c.removeprefix("config/"))
        return shown.head(max_rows).to_string(index=False, float_format=lambda v: f"{v:.4g}")
