"""What the driver keeps of a trial that finished: its results, not the windows it was averaged in.

For every number a trial reports, Tune's driver keeps a running analysis (`Trial.metric_analysis`:
its last, min, max, mean and the means of its last 5 and 10 values) and the two windows of recent
values it updates those means from (`Trial.metric_n_steps`, a deque per window per number). The
windows serve only the trial's next result; once a trial has finished they are dead weight, about
18 KB of the 60-odd KB a finished trial of three reports costs the driver, for as long as the sweep
runs. A 10,000-trial sweep held 180 MB of them.

The analysis stays (`ResultGrid.get_best_result` ranks by it). Only trials that finished lose their
windows, and a finished trial never reports again: Tune retries and resumes errored trials, whose
windows are kept. The saved run state is unaffected: Tune writes a trial's run metadata from text
it cached at the trial's last result, and were that text written afresh, a finished trial's empty
windows would be all it lost.
"""

from __future__ import annotations

from typing import Any

from ray.tune import Callback


class ReleaseFinishedWindows(Callback):
    """Empties a finished trial's windows of recent values (see the module docstring)."""

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        trial.metric_n_steps.clear()
