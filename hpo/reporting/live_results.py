"""The running sweep's results files: `results.csv` and `summary.json` rewritten whenever a trial
ends, so a crashed driver or a full disk leaves every finished row on disk."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

from hpo.reporting.results_files import record_from_trial, write_run_files
from hpo.reporting.tune_state import DAMAGED, ended_trials, newest_state


class SavedRunState:
    """Which trials Tune's newest saved run state (`experiment_state-*.json`) holds as ended: the
    trials a resumed run will not run again. The file is read again only when it changes, and the
    folder listed at most every `LIST_EVERY_S` until this run's own state file is found: Tune's
    controller steps (and asks) hundreds of times a second, and a 10,000-trial sweep's folder has
    10,000 entries. Tune saves one file per run (`experiment_state-<run start>.json`), so the first
    one written since this reader began stays the newest until the run ends."""

    LIST_EVERY_S = 0.25
    #: The file is looked at (one `stat`) at most this often: Tune's controller steps hundreds of
    #: times a second, and a stat at every step of two callbacks was the largest part of what they
    #: cost a 1000-trial sweep's driver. Rows and lines wait for the save anyway (about a second).
    CHECK_EVERY_S = 0.05

    def __init__(self, experiment: Path):
        self.experiment = experiment
        self._began_ns = time.time_ns()
        self._checked_at = -math.inf
        self._newest: Path | None = None  # the newest state file at the last listing
        self._own = False  # whether `_newest` is this run's own file: no listing is needed any more
        self._listed_at = -math.inf
        self._seen: tuple = ()  # (path, inode, mtime_ns, size) of the state file last read
        self._ended: frozenset[str] = frozenset()

    def ended(self, relist: bool = False) -> frozenset[str]:
        """`relist` looks now, and lists the folder now (unless this run's file is known): at a
        sweep's end, when Tune has just saved its last state."""
        now = time.monotonic()
        if not relist and now - self._checked_at < self.CHECK_EVERY_S:
            return self._ended
        self._checked_at = now
        if not self._own and (relist or self._newest is None or now - self._listed_at >= self.LIST_EVERY_S):
            self._newest, self._listed_at = newest_state(self.experiment), now
        newest = self._newest
        try:
            if newest:
                stat = newest.stat()
                seen = (newest, stat.st_ino, stat.st_mtime_ns, stat.st_size)
                if seen != self._seen:
                    self._seen, self._ended = seen, _ended_in(seen)
                    self._own = stat.st_mtime_ns >= self._began_ns
        except DAMAGED:
            pass  # being replaced, or damaged: read it again at the next step
        return self._ended


#: The last state file read, as (path, inode, mtime, size), and the trials it holds as ended.
_last_read: tuple[tuple, frozenset[str]] = ((), frozenset())


def _ended_in(seen: tuple) -> frozenset[str]:
    """The ended trials of the state file `seen` names, read once however many readers ask: the
    results files and the progress lines both wait for the same save, and at 10,000 trials each
    read of the file is about 90 MB. Tune replaces the file at each save, so a new save is a new
    inode or mtime."""
    global _last_read
    if _last_read[0] != seen:
        _last_read = (seen, frozenset(ended_trials(seen[0])))
    return _last_read[1]


def results_file_callback(experiment: Path, metric: str, mode: str, max_iterations: int | None) -> Any:
    """A Tune callback that rewrites `experiment/results.csv` and `summary.json` whenever a trial
    ends, so every finished trial is on disk whatever happens to the driver afterwards.

    A row says a trial ended only once Tune's saved run state says so too (every second in a sweep of
    up to 100 trials, see `hpo.tuner.tuner.Tuner._save_period`): a driver killed in between would see `--resume` run the trial again, and what
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
