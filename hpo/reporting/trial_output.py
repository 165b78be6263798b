"""What a trial prints, prefixed with the trial's id: `(train pid=1234) [trial 968ea990_00003] ...`.

Ray prefixes a worker's output with the trainable's name and the worker's pid. With
`reuse_actors=True` one worker serves trial after trial (a fused sweep's group slots always do), so
the pid does not say which trial printed a line. `with_trial_output` wraps a Tune trainable so that,
for the duration of each trial, the worker's `sys.stdout` and `sys.stderr` prefix every line with
the trial's id (the id the progress lines show), and put back what was there when the trial
returns or raises; the next trial on that worker gets its own prefix.

The wrapper also keeps a worker that Ray ends from printing its exit as an ignored exception
(`quiet_exit_in_finalizers`), from the moment the worker loads the trainable: Ray also ends the
workers of trials still starting when a sweep stops early. The same wrapper quiets Ray's own
logger on the workers when the driver asks for it
(`quiet_ray_on_workers`, which `hpo run` calls): Ray Tune's INFO lines, such as "Checkpoint
successfully created at ..." after every checkpoint, then stay off the terminal among the user's
prints. Set inside the trial, not through a `worker_process_setup_hook`, which needs a runtime env
and so starts every worker through Ray's runtime-env agent.

This module imports only the standard library at load time (`hpo.cli` imports it) and travels to
the workers by value, so a function trainable's workers need no hydro-hpo installed.
"""

from __future__ import annotations

import functools
import inspect
import logging
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TextIO

#: The level Ray's logger gets on the workers while a trial runs; None leaves it as it is.
_worker_ray_log_level: str | None = None


def quiet_ray_on_workers(level: str | None = "WARNING") -> None:
    """Trainables wrapped from now on set Ray's logger on their workers to `level` while a trial
    runs. `hpo run` asks for it (its console is the user's view of the sweep); `hpo.run` in a
    notebook leaves Ray's logging as the user configured it."""
    global _worker_ray_log_level
    _worker_ray_log_level = level


def trial_prefix(trial_id: str) -> str:
    return f"[trial {trial_id}] "


class LinePrefixer:
    """A text stream that writes `prefix` at the start of every line it passes to `stream`.

    Nothing is buffered: a partial line (`print(..., end="")`, a progress bar) goes out at once with
    its prefix, and its continuation gets none, so what a crashed trial printed last is not lost.
    One lock keeps each write whole when the trainable's threads print at once.
    """

    def __init__(self, stream: TextIO, prefix: str):
        self.stream = stream
        self.prefix = prefix
        self._at_line_start = True
        self._lock = threading.Lock()

    def write(self, text: str) -> int:
        with self._lock:
            pieces = []
            for line in text.splitlines(keepends=True):
                if self._at_line_start:
                    pieces.append(self.prefix)
                pieces.append(line)
                self._at_line_start = line.endswith("\n")
            self.stream.write("".join(pieces))
        return len(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        self.stream.flush()

    def __getattr__(self, name: str) -> Any:
        """Everything else (`fileno`, `isatty`, `encoding`, `buffer`) is the underlying stream's."""
        return getattr(self.stream, name)


@contextmanager
def trial_output(trial_id: str, ray_log_level: str | None = None) -> Iterator[None]:
    """Prefix this process's stdout and stderr with `trial_id` (and set Ray's logger to
    `ray_log_level`) until the block ends, however it ends. Nested blocks (a class trainable's
    `reset_config` calling its `setup`) prefix once."""
    _quiet_exits()
    saved = sys.stdout, sys.stderr
    ray_logger = logging.getLogger("ray")
    saved_level = ray_logger.level
    prefix = trial_prefix(trial_id)
    sys.stdout, sys.stderr = (
        LinePrefixer(stream.stream if isinstance(stream, LinePrefixer) else stream, prefix) for stream in saved
    )
    if ray_log_level is not None:
        ray_logger.setLevel(ray_log_level)
    try:
        yield
    finally:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        sys.stdout, sys.stderr = saved
        ray_logger.setLevel(saved_level)


def _quiet_exits() -> None:
    if sys.unraisablehook is sys.__unraisablehook__:
        sys.unraisablehook = quiet_exit_in_finalizers


class _QuietExitsOnArrival:
    """Rides along with a wrapped trainable; unpickling it on a trial's worker installs
    `quiet_exit_in_finalizers` there.

    A trial's actor loads its class before it starts, and a sweep that stops early (Tune's metric
    check failing on the first result) has Ray end the trials still starting with SIGTERM. Installed
    only when the trial's code first ran, a worker stopped in its start-up printed "Exception ignored
    in ..." with a traceback under the sweep's one-line error. Only a Ray actor's process installs
    it; a driver unpickling its own trainable (Tune's registry) keeps Python's hook."""

    def __reduce__(self) -> tuple[Callable[[], "_QuietExitsOnArrival"], tuple[()]]:
        return _arrive, ()


def _arrive() -> _QuietExitsOnArrival:
    import ray

    if ray.is_initialized() and ray.get_runtime_context().get_actor_id() is not None:
        _quiet_exits()
    return _QuietExitsOnArrival()


def quiet_exit_in_finalizers(unraisable: Any) -> None:
    """The unraisable-exception hook of a trial's worker. Ray ends a worker it no longer needs by
    raising SystemExit in it; when that lands inside a weakref or finalizer callback, Python prints
    "Exception ignored in ..." with a traceback on the sweep's console after the sweep ended. A
    worker exiting as asked is not an error, so that one is dropped; every other unraisable
    exception is printed as Python prints it."""
    if not isinstance(unraisable.exc_value, SystemExit):
        sys.__unraisablehook__(unraisable)


#: The `tune.Trainable` methods a class trainable's code runs in: `setup` (from `__init__`), the ones
#: Tune calls (whose own log lines, such as Tune's after a checkpoint, fall inside too) and
#: `reset_config`, which a reused process runs under the next trial's id.
TRAINABLE_HOOKS = ("setup", "train", "save", "restore", "reset_config", "stop")


def with_trial_output(trainable: Any) -> Any:
    """`trainable` (a function or a `tune.Trainable` class, `tune.with_resources`' too) with every
    line its trials print prefixed by the trial's id (see the module docstring).

    Tune sees the user's trainable: a function keeps its name, signature and attributes
    (`functools.wraps`; trial names such as `train_968ea990` do not change, and `with_resources`'
    request stays), a class is subclassed under its own name.
    """
    import ray.cloudpickle

    # Ray pickles the wrapper into its workers; by value, this module needs no install there.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    level = _worker_ray_log_level
    if inspect.isclass(trainable):
        hooks = {name: _hook(getattr(trainable, name), level) for name in TRAINABLE_HOOKS}
        return type(trainable.__name__, (trainable,),
                    {**hooks, "__doc__": trainable.__doc__, "_quiet_exits_on_arrival": _QuietExitsOnArrival()})

    @functools.wraps(trainable)
    def run_trial(*args: Any, **kwargs: Any) -> Any:
        from ray import tune

        with trial_output(tune.get_context().get_trial_id(), level):
            return trainable(*args, **kwargs)

    run_trial._quiet_exits_on_arrival = _QuietExitsOnArrival()  # type: ignore[attr-defined]
    return run_trial


def _hook(method: Callable[..., Any], level: str | None) -> Callable[..., Any]:
    """A class trainable's method run under its trial's prefix (`self.trial_id`: after a reuse,
    Tune has set the next trial's before it calls `reset_config`)."""

    @functools.wraps(method)
    def run_hook(self: Any, *args: Any, **kwargs: Any) -> Any:
        with trial_output(self.trial_id, level):
            return method(self, *args, **kwargs)

    return run_hook
