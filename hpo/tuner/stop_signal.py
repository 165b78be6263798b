"""SIGTERM stops a sweep as Ctrl-C does: Tune saves its state, the finished trials are kept, and
`--resume` goes on.

Batch systems (Slurm's preemption, Kubernetes, `ray job stop`) end a job with SIGTERM. Ray's
driver answers SIGTERM with its C++ failure handler, which prints raw stack addresses and aborts
(exit 134) in the middle of whatever Tune was writing. Tune stops gracefully on SIGINT and on
SIGUSR1 (`ray.tune.tune._setup_signal_catching`), so while a sweep runs SIGTERM is passed on to
Tune as SIGUSR1. It must be installed after Ray has started, whose start installs its handler.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def sigterm_stops_the_sweep() -> Iterator[None]:
    """While the block runs (a Tune fit), SIGTERM asks Tune to stop as Ctrl-C does; afterwards
    SIGTERM does what it did before, or the default (end the process) where that was Ray's handler,
    which Python cannot put back."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "SIGUSR1"):
        yield  # signal handlers belong to the main thread (and Windows has no SIGUSR1)
        return
    previous = signal.getsignal(signal.SIGTERM)

    def stop(signum: int, frame: object) -> None:
        os.kill(os.getpid(), signal.SIGUSR1)

    signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
