"""What a failed trial costs and shows: no retry of a failure that repeats before any result, and
the user's own frames on the console instead of Ray's 40-line wrapper.

Tune retries a failed trial up to `max_failures` times, whatever failed. A trial that fails before
its first report has nothing to resume from: its next attempt runs the same code on the same
config from the start, so a failure there is almost always the code's or the config's (a typo'd
key, a shape mismatch), and every retry pays for it again with a full traceback. So an attempt
that follows such a failure before the first report is the last one unless it reports: once it
reports, the trial gets its whole `max_failures` back. Tune decides a retry as the failure arrives,
before any callback hears of it, so this is set when the first failure is retried (on the public
`Trial.max_failures` Tune reads), and an attempt that fails before reporting is not retried, even
if its error differs from the first one's. A process lost (an actor killed, a node removed) is no
such failure: its error has no frames of the trial's code, and it is retried as Tune would.

Tune logs each failure with Ray's traceback, most of it Ray's own frames (`hpo.reporting.console` keeps
that record off the console). `TrialErrorCallback` prints instead the frames of the user's code,
the exception, what happens next and where the full traceback is (the trial's `error.txt`).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any, TextIO

import ray
from ray.tune import Callback

#: How Tune starts each failure it appends to a trial's error file.
_FAILURE_HEADER = re.compile(r"^Failure # \d+ \(occurred at [^)]*\)$", re.MULTILINE)
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_FRAME = re.compile(r'^\s*File "(?P<path>[^"]+)", line \d+')
#: Frames in these files are Ray's machinery and hydro-hpo's wrapper around the trainable.
_PLUMBING = (str(Path(ray.__file__).parent) + "/", str(Path(__file__).parent / "trial_output.py"))
#: Exceptions hydro-hpo raises to refuse what a trial asks for, in one line that names the cause
#: (a fused group's layer or parameter): their frames are hydro-hpo's own, not the user's.
_REFUSALS = ("fusion.layers.FusionError: ",)


def last_failure(error_text: str) -> str:
    """The newest failure in a trial's error file (Tune appends one per attempt)."""
    parts = _FAILURE_HEADER.split(_ANSI.sub("", error_text))
    return parts[-1].strip("\n")


def user_frames(traceback_text: str) -> str:
    """`traceback_text` without Ray's frames and hydro-hpo's trial wrapper: the frames of the code
    the user wrote (and the libraries it called), then the exception. Ray's header line and the
    caret lines left without their frame go too."""
    kept: list[str] = []
    keep = False
    for line in traceback_text.splitlines():
        frame = _FRAME.match(line)
        if frame is not None:
            keep = not frame.group("path").startswith(_PLUMBING)
        elif not line.startswith(" "):  # the exception (and chained exceptions' text)
            keep = not line.startswith(("ray::", "Traceback (most recent call last)"))
        if keep and line.strip():
            kept.append(line)
    return "\n".join(kept)


def raised_in_code(error_text: str) -> bool:
    """Whether the newest failure in a trial's error file is an exception the trial's code raised
    (it has frames), not its process lost: an actor killed, its node removed or out of memory, whose
    error has no traceback. Only the first kind repeats on a retry that runs the same code."""
    return any(_FRAME.match(line) for line in last_failure(error_text).splitlines())


def exception_line(traceback_text: str) -> str:
    """`KeyError: 'channels'`: the last unindented line of a traceback."""
    lines = [line for line in traceback_text.splitlines() if line.strip() and not line.startswith(" ")]
    return lines[-1].strip() if lines else ""


class TrialErrorCallback(Callback):
    """Prints each failure as the user's frames and where the full traceback is; an attempt that
    follows a failure before the first report gets no retry unless it reports (module docstring)."""

    def __init__(self, stream: TextIO | None = None, verbose: int = 2):
        self._stream, self.verbose = stream, verbose
        self._budgets: dict[str, int] = {}  # trial id -> its max_failures, while its retries are held back
        self._shown: dict[str, str] = {}  # trial id -> the last failure printed in full

    def __getstate__(self) -> dict[str, Any]:
        """Tune pickles its callbacks with the experiment state; an open stream cannot be pickled."""
        return {**self.__dict__, "_stream": None}

    @property
    def stream(self) -> TextIO:
        return self._stream or sys.stderr

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
        if trial.trial_id in self._budgets:  # it reports: its retries are its own again
            trial.max_failures = self._budgets.pop(trial.trial_id)

    def on_trial_recover(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        text = self._failure_text(trial)
        if not trial.has_reported_at_least_once and raised_in_code(text):
            self._budgets.setdefault(trial.trial_id, trial.max_failures)
            trial.max_failures = trial.num_failures  # the attempt now starting is retried only if it reports
        self._show(trial, "it runs again" + ("; a second failure before its first report is final"
                                              if not trial.has_reported_at_least_once else ""), text)

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        budget = self._budgets.pop(trial.trial_id, None)
        held_back = budget is not None and (budget < 0 or trial.num_failures <= budget)
        self._show(trial, "not retried: it failed again before its first report" if held_back else "no retries left")

    @staticmethod
    def _failure_text(trial: Any) -> str:
        written = trial.error_file  # on the driver, written as the failure arrived; copied to the run folder later
        return Path(written).read_text(errors="replace") if written and Path(written).exists() else ""

    def _show(self, trial: Any, next_step: str, text: str | None = None) -> None:
        """Print the failure in `text` (the trial's error file, read here unless the caller has it)."""
        if self.verbose < 1:
            return
        written = trial.error_file
        text = self._failure_text(trial) if text is None else text
        frames = user_frames(last_failure(text)) or "(no traceback recorded)"
        refusal = exception_line(frames).startswith(_REFUSALS)
        if refusal:
            frames = exception_line(frames)
        attempt = f"attempt {trial.num_failures}"
        where = f" (full traceback: {Path(trial.path) / Path(written).name})" if written and trial.path else ""
        if self._shown.get(trial.trial_id) == frames:
            message = f"trial {trial.trial_id} failed again with the same error ({attempt}): {exception_line(frames)}; {next_step}{where}"
        else:
            message = f"trial {trial.trial_id} failed ({attempt}); {next_step}{where}:{' ' if refusal else chr(10)}{frames}"
        self._shown[trial.trial_id] = frames
        self.stream.write(message + "\n")
        self.stream.flush()
