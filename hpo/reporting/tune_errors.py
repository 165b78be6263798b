"""Tune's exceptions read for what the user must do: a full disk (`storage_full`), a sweep Tune
stopped because a trial's result lacked the sweep's metric (`unreported_metric`), or one stopped
because MLflow refused what a trial logged (`mlflow_refusal`).

Tune wraps and re-raises what went wrong, and says some of it only in its messages, so the cause is
sought along the exception's chain, and the missing metric in Tune's message. Imports no Ray: the
`hpo` command reads these before it knows whether a sweep ran.
"""

from __future__ import annotations

import ast
import errno
import re
from collections.abc import Iterator, Mapping
from typing import Any


def causes(exc: BaseException | None) -> Iterator[BaseException]:
    """`exc`, then what it was raised from or while handling, and so on (Tune wraps and re-raises)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def storage_full(exc: BaseException | None) -> OSError | None:
    """The out-of-space OSError (ENOSPC, EDQUOT) that `exc` is or was caused by, if any."""
    return next((e for e in causes(exc) if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT)), None)


def mlflow_refusal(exc: BaseException | None) -> str | None:
    """MLflow's first line when `exc` is, or was caused by, its refusal of something a trial logged
    (a metric or parameter name it does not take: `acc@1`): Ray's MLflow callback raises it inside
    Tune's controller, which stops the sweep. Read by the type's name: this module imports no MLflow."""
    for cause in causes(exc):
        kind = type(cause)
        if kind.__name__ == "MlflowException" and kind.__module__.startswith("mlflow"):
            lines = str(getattr(cause, "message", cause)).strip().splitlines()
            return lines[0] if lines else kind.__name__
    return None


#: What Tune's strict metric check raises in its controller, which stops the whole sweep.
_TUNE_MISSING_METRIC = re.compile(r"did not include the specified metric\(s\) `[^`]*`.*?Result: (\{.*?\})$", re.S | re.M)


def unreported_metric(exc: BaseException) -> str | None:
    """When Tune stopped the sweep because a trial's result lacked the sweep's metric: what that
    result held instead ('' when it cannot be read), so the user sees the name they meant."""
    for cause in causes(exc):
        match = _TUNE_MISSING_METRIC.search(str(cause))
        if match is None:
            continue
        try:
            result = ast.literal_eval(match.group(1))
        except (ValueError, SyntaxError):
            return ""
        return ", ".join(own_keys(result))
    return None


def own_keys(result: Mapping[str, Any]) -> list[str]:
    """The keys of a trial's result that the trainable reported, not those Tune adds (its
    counters and times, `done`, `trial_id`, the config): the names to show a user who named
    another (a metric, a `stop` key)."""
    from ray.tune.result import AUTO_RESULT_KEYS

    tune_keys = {*AUTO_RESULT_KEYS, "done", "trial_id", "config"}
    return [k for k in result if k not in tune_keys and not k.startswith("config/")]
