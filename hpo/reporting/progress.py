"""What the terminal shows while a sweep runs, instead of Tune's wide status tables.

One line per finished trial, always (a log file or CI keeps them). On a terminal, also one live
status line, redrawn in place: trials running and done, the best value so far and an ETA, so a
sweep of long trials is never silent between two finished trials.

The best so far is the final table's measure over the trials that finished: each one's last
reported value (Tune's default scope), never a running trial's mid-run value, which could go up
again and then disagree with the table. A resumed sweep counts the trials that
ended in its earlier runs, so its lines go on from where the earlier run stopped.

How much is printed follows Tune's `verbose` levels: 0 nothing, 1 the sweep's summary only (not
this callback's), 2 the lines above (what `hpo run` prints), 3 also a line per reported result.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

from ray.tune import Callback

from hpo.reporting.results_files import is_number, metric_value

#: Seconds between two redraws of the live line; Tune calls `on_step` far more often.
REFRESH_S = 0.5
_CLEAR_LINE = "\r\x1b[K"


def format_duration(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{seconds:02d}s" if minutes else f"{seconds}s"


def status_line(
    running: int, done: int, total: int | None, metric: str, best: float | None, elapsed_s: float, finished_here: int
) -> str:
    """The live line. The ETA assumes the trials left finish at the rate trials have finished in
    this run (`finished_here` in `elapsed_s`), which counts concurrency and early stopping."""
    parts = [f"{running} running", f"{done}/{total} done" if total else f"{done} done"]
    parts.append(f"best {metric}={best:.4g}" if best is not None else f"best {metric}=n/a")
    parts.append(f"elapsed {format_duration(elapsed_s)}")
    if total and finished_here and done < total:
        parts.append(f"ETA {format_duration(elapsed_s / finished_here * (total - done))}")
    return "sweep: " + ", ".join(parts)


class ProgressCallback(Callback):
    """Prints to `stream` (default: stdout); the live line only where that is a terminal, since
    carriage returns would garble a log file or a CI transcript."""

    def __init__(self, metric: str, mode: str, total: int | None = None, stream: TextIO | None = None, verbose: int = 2):
        self.metric, self.mode, self.total, self.verbose = metric, mode, total, verbose
        self._stream = stream  # None: whatever sys.stdout is when a line is written
        self.live = verbose >= 2 and self.stream.isatty()
        self.done = 0  # trials ended, in this run and the earlier runs of a resumed sweep
        self.done_here = 0  # trials ended in this run: the rate the ETA extrapolates
        self.started = time.monotonic()
        self._drawn_at = -math.inf
        self._shown = False
        self._ending: dict[str, tuple[Any, str]] = {}  # trials Tune ended, not yet in its saved state
        self._saved: Any = None  # hpo.reporting.live_results.SavedRunState, once a trial has ended
        self._counted: set[str] = set()  # trials whose end is counted
        self._scanned = 0  # trials (in Tune's order, which only appends) looked at for ends of an earlier run
        self._best: float | None = None  # the best of the finished trials' last values

    def __getstate__(self) -> dict[str, Any]:
        """Tune pickles its callbacks with the experiment state; an open terminal or log file
        cannot be pickled, and a restored sweep prints to its own stdout anyway."""
        return {**self.__dict__, "_stream": None, "_ending": {}, "_saved": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        """A restored sweep counts its trials afresh from the trials Tune restores (`_count_earlier_ends`)."""
        self.__dict__.update(state)
        self.done = self.done_here = self._scanned = 0
        self._counted, self._best = set(), None

    @property
    def stream(self) -> TextIO:
        return self._stream or sys.stdout

    def setup(self, **info: Any) -> None:
        self.started = time.monotonic()

    def best(self) -> float | None:
        """The best finished trial's measure, as the final table ranks trials (`hpo.reporting.results_files.best_record`)."""
        return self._best

    def _count_end(self, trial: Any, outcome: str, here: bool) -> None:
        """Count `trial`'s end; a finished, undiverged trial's last value joins those the best is taken from."""
        self._counted.add(trial.trial_id)
        self.done += 1
        self.done_here += here
        result = trial.last_result or {}
        value = metric_value(result, self.metric)
        if outcome == "finished" and not result.get("diverged") and _finite(value):
            value = float(value)
            if self._best is None or (value < self._best if self.mode == "min" else value > self._best):
                self._best = value

    def _count_earlier_ends(self, trials: list) -> None:
        """Trials found ended that this run never heard end ended in a resumed sweep's earlier run.
        Such a trial is ended when it joins the list, so each trial is looked at once, as it joins:
        looking at every trial at every step cost a 10,000-trial sweep's driver a pass over all of
        them hundreds of times a second."""
        fresh, self._scanned = trials[self._scanned:], len(trials)
        for trial in fresh:
            if trial.status in ("TERMINATED", "ERROR") and trial.trial_id not in self._counted and trial.trial_id not in self._ending:
                self._count_end(trial, "finished" if trial.status == "TERMINATED" else "FAILED", here=False)

    def _status(self, trials: list) -> str:
        return status_line(
            running=sum(t.status == "RUNNING" for t in trials),
            done=self.done,
            total=self.total,
            metric=self.metric,
            best=self.best(),
            elapsed_s=time.monotonic() - self.started,
            finished_here=self.done_here,
        )

    def _draw(self, trials: list) -> None:
        self.stream.write(_CLEAR_LINE + self._status(trials))
        self.stream.flush()
        self._drawn_at = time.monotonic()
        self._shown = True

    def _clear(self) -> None:
        if self._shown:
            self.stream.write(_CLEAR_LINE)
            self._shown = False

    def on_step_begin(self, iteration: int, trials: list, **info: Any) -> None:
        if self.live and time.monotonic() - self._drawn_at >= REFRESH_S:
            self._draw(trials)

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
        if self.verbose >= 3:
            self._clear()
            shown = _shown(self.metric, metric_value(result, self.metric))
            self.stream.write(f"      trial {trial.trial_id} it {result.get('training_iteration', '?')}: {shown}\n")
            self.stream.flush()

    def _line(self, trials: list, trial: Any, outcome: str) -> None:
        self._count_end(trial, outcome, here=True)
        if self.verbose < 2:
            return
        result = trial.last_result or {}
        best = self.best()
        total = f"/{self.total}" if self.total else ""
        iterations = result.get("training_iteration", 0)
        self._clear()
        best_so_far = f" (best {best:.4g})" if best is not None else ""
        shown = _shown(self.metric, metric_value(result, self.metric))
        self.stream.write(f"[{self.done:3d}{total}] trial {trial.trial_id} {outcome} after {iterations} it: {shown}{best_so_far}\n")
        self.stream.flush()
        if self.live:
            self._draw(trials)

    def target_started(self, label: str, iterations: int) -> None:
        """A scaled sweep's target is trained in the driver after the proxy sweep
        (`hpo.engines.scaled.finish`): at full size it can take longer than the whole sweep, and
        a terminal that went quiet then looked hung. Said, with each iteration (`target_line`),
        where trials' lines are."""
        if self.verbose >= 2:
            self._clear()
            self.stream.write(f"target ({label}): training the best proxy configuration for {iterations} iterations\n")
            self.stream.flush()

    def target_line(self, label: str, iteration: int, iterations: int, result: Mapping[str, Any]) -> None:
        """One iteration of the target ended (see `target_started`)."""
        if self.verbose < 2:
            return
        self._clear()
        shown = _shown(self.metric, metric_value(result, self.metric))
        self.stream.write(f"      target ({label}) it {iteration}/{iterations}: {shown}\n")
        self.stream.flush()

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._ended(trials, trial, "finished")

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._ended(trials, trial, "FAILED")

    def _ended(self, trials: list, trial: Any, outcome: str) -> None:
        """A fused sweep's member has its end on disk before it is reported (`end_is_saved`);
        a Tune trial's line waits for Tune's saved run state (`on_step_end`)."""
        if getattr(trial, "end_is_saved", False):
            self._line(trials, trial, outcome)
        else:
            self._ending[trial.trial_id] = (trial, outcome)

    def on_step_end(self, iteration: int, trials: list, **info: Any) -> None:
        """A trial's line is printed once Tune's saved run state holds its end (within a second in
        a sweep of up to 100 trials, see `hpo.tuner.tuner.Tuner._save_period`): a driver killed before that would see `--resume` run it again, and what was
        printed as finished is final."""
        self._print_saved_ends(trials)
        self._count_earlier_ends(trials)

    def _print_saved_ends(self, trials: list, relist: bool = False) -> None:
        if not self._ending:
            return
        if self._saved is None:
            from hpo.reporting.live_results import SavedRunState

            self._saved = SavedRunState(Path(next(iter(self._ending.values()))[0].path).parent)
        saved = self._saved.ended(relist)
        for trial_id in [t for t in self._ending if t in saved]:
            trial, outcome = self._ending.pop(trial_id)
            self._line(trials, trial, outcome)

    def on_experiment_end(self, trials: list, **info: Any) -> None:
        self._print_saved_ends(trials, relist=True)  # Tune saved its last state, unless the sweep failed
        self._clear()
        self.stream.flush()


def _finite(value: Any) -> bool:
    return is_number(value) and math.isfinite(value)


def _shown(metric: str, value: Any) -> str:
    return f"{metric}={value:.4g}" if _finite(value) else f"{metric}=n/a"
