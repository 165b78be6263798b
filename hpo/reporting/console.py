"""What `hpo run` and `hpo.run` print around a sweep: Tune's own console output kept off, and the
report at its end (the table, the best configuration, the files, and what went wrong).

Both print the same: `hpo.reporting.progress.ProgressCallback`'s lines while the sweep runs,
`hpo.reporting.trial_errors.TrialErrorCallback`'s for a failed trial, then `report`. Tune's status tables,
its per-failure Ray tracebacks, its "Trials did not complete" line, its warnings about how often it
saves the experiment state, and Optuna's warning that a resumed trial reported an iteration again
(Optuna keeps the first value) would bury those lines, so `quiet_tune` keeps them off.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

#: What Tune logs for each failed trial (with Ray's traceback); `TrialErrorCallback` says it shorter.
_TRIAL_FAILED = "Trial task failed for trial"
#: Tune's last line when trials errored; the report's summary line says it with the first error.
_TRIALS_INCOMPLETE = "Trials did not complete"
_LOGGERS = ("ray", "ray.tune", "ray.train")
_REPEATED_REPORT = r"The reported value is ignored because this `step=\d+` is already reported"


def _said_elsewhere(record: logging.LogRecord) -> bool:
    message = str(record.msg)
    return not (message.startswith(_TRIAL_FAILED) or message.startswith(_TRIALS_INCOMPLETE))


def quiet_tune() -> Callable[[], None]:
    """Keep Tune's console output to errors hydro-hpo does not report itself; returns what puts
    everything back (`hpo run` keeps it for the process, `hpo.run` for its sweep)."""
    env = {"TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S": "0", "RAY_AIR_NEW_OUTPUT": "0"}
    saved_env = {name: os.environ.get(name) for name in env}
    for name, value in env.items():
        os.environ.setdefault(name, value)
    levels = {name: logging.getLogger(name).level for name in _LOGGERS}
    for name in _LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    loggers = [logging.getLogger("ray.tune.execution.tune_controller"), logging.getLogger("ray.tune.tune")]
    filtered = [logger for logger in loggers if _said_elsewhere not in logger.filters]  # not an outer quiet's
    for logger in filtered:
        logger.addFilter(_said_elsewhere)
    caught = warnings.catch_warnings()
    caught.__enter__()
    warnings.filterwarnings("ignore", message=_REPEATED_REPORT)

    def restore() -> None:
        caught.__exit__(None, None, None)
        for logger in filtered:
            logger.removeFilter(_said_elsewhere)
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)
        for name, value in saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value

    return restore


#: A configuration longer than this is printed one key a line.
ONE_LINE_CONFIG = 100


def config_text(config: dict[str, Any]) -> str:
    """The configuration as JSON: on the line itself when short, else indented below it. Keys and
    values read as the user wrote them (`"ß": 1`, not `"\\u00df": 1`)."""
    short = json.dumps(config, default=str, ensure_ascii=False)
    return short if len(short) <= ONE_LINE_CONFIG else "\n" + json.dumps(config, indent=2, default=str, ensure_ascii=False)


#: What `report` found: every trial ran; the sweep was stopped first; trials errored; no finished
#: trial reported the metric (`hpo run` turns each into its exit status).
OK, INTERRUPTED, ERRORED, NO_RESULT = "ok", "interrupted", "errored", "no result"


def report(result: Any, resume: str, out: TextIO | None = None, err: TextIO | None = None) -> str:
    """Print the table, the best configuration, the engines' extras and the files, then one line
    for what went wrong, if anything (`resume`: the command that continues the sweep); returns
    OK, INTERRUPTED, ERRORED or NO_RESULT."""
    from hpo.reporting.results_files import metric_value  # pandas: only once there is a result

    out, err = out or sys.stdout, err or sys.stderr
    print(file=out)
    print(result.summary_table(), file=out)
    try:
        best = result.best_result
    except RuntimeError:
        best = None
    if best is not None:
        print(f"Best configuration ({result.metric} = {metric_value(best.metrics, result.metric):.4g}): {config_text(result.best_config)}", file=out)
        if result.best_checkpoint:
            print(f"best checkpoint: {result.best_checkpoint}", file=out)
    for label, value in result.extras.items():
        print(f"{label}: {value}", file=out)
    paths = result.paths
    print(f"results: {paths['results']}", file=out)
    plot = paths.get("plot")
    run = Path(paths["results"]).parent
    if plot is None:
        print(f"plot:    none: no trial reported {result.metric!r}", file=out)
    elif any(run.rglob("events.out.tfevents.*")):  # Tune's TensorBoard logger wrote the curves too
        print(f"plot:    {plot} (or: tensorboard --logdir {run})", file=out)
    else:
        print(f"plot:    {plot}", file=out)
    errored = result.error_records()
    if result.interrupted:
        print(f"error: the sweep was interrupted before every trial ended; what finished is kept in "
              f"{paths['results']}; continue it with: {resume}", file=err)
        return INTERRUPTED
    if errored:
        first = errored[0]
        where = f" (error file: {first.error_file})" if first.error_file else ""
        print(f"error: {len(errored)} of {len(result)} trials errored; first: {first.error}{where}", file=err)
        return ERRORED
    if best is None:
        print(f"error: no finished trial reported {result.metric!r}; see the status column in {paths['results']}", file=err)
        return NO_RESULT
    if line := target_error(result.target):
        print(line, file=err)
        return ERRORED
    return OK


def target_error(target: dict[str, Any] | None) -> str:
    """The line for a scaled sweep's target that diverged or raised ('' when it did not): an
    error of the sweep, whose tuned config is kept in transfer.json."""
    if not target or not target.get("error"):
        return ""
    return f"error: {target['error']}; the transferred config is kept in {target.get('transfer', 'transfer.json')}"


def target_lines(target: dict[str, Any]) -> list[str]:
    """What `hpo run` printed of a scaled sweep's target, from `summary.json`'s `target`, for `hpo results`."""
    if target.get("reason"):
        return [f"target: not trained: {target['reason']}"]
    lines = []
    if target.get("value") is not None:
        lines.append(f"target: {target['metric']} = {target['value']:.4g} after {target['iterations']} iterations")
    if target.get("checkpoint"):
        lines.append(f"target checkpoint: {target['checkpoint']}")
    lines.append(f"transferred target config: {target.get('config')}")
    if target.get("flagged"):
        lines.append(f"re-tune on the target (does not transfer): {target['flagged']}")
    if target.get("transfer"):
        lines.append(f"transfer: {target['transfer']}")
    return lines
