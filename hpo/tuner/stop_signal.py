"""Ctrl-C and SIGTERM stop a sweep: Tune saves its state, the finished trials are kept, and
`--resume` goes on; the sweep knows it was stopped, even where every trial Tune had made had ended.

Tune returns from a stop as if the sweep were done, and keeps the fact to itself (a local event in
`ray.tune.tune`). Reading it back from the trials misses the stop that lands between two trials:
with a concurrency limit, or in a fused sweep whose next group Tune had not made yet, every trial
made so far has ended, and the sweep looked complete (exit 0, the rest never trained). So the
signals are caught here: Tune's own Ctrl-C handler is switched off (`TUNE_DISABLE_SIGINT_HANDLER`,
documented among Tune's environment variables) and a stop signal is recorded, then passed on to
Tune as SIGUSR1, on which Tune stops exactly as on Ctrl-C (`ray.tune.tune._setup_signal_catching`).

SIGTERM matters too: batch systems (Slurm's preemption, Kubernetes, `ray job stop`) end a job with
it, and Ray's driver answers it with its C++ failure handler, which prints raw stack addresses and
aborts (exit 134) in the middle of whatever Tune was writing. The handlers must be installed after
Ray has started, whose start installs its own.

A stop that arrives before Tune listens (its fit is still importing and setting up) is passed on
the moment Tune installs its handler, and Tune stops at its first step. Raising KeyboardInterrupt
there instead, as Python's own handler would, can be swallowed: a handler runs wherever the main
thread is, and an exception raised in a weakref callback or `__del__` is printed and dropped, so
the stop was lost and the sweep ran on, once holding the import lock it had been taking, which
later deadlocked the driver against the thread that imports matplotlib meanwhile.

A second stop signal while Tune stops raises KeyboardInterrupt wherever the driver is, as a second
Ctrl-C does in Tune: the user wants out now.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from hpo.base.scoped_environ import scoped_environ

#: Tune's documented switch for its own SIGINT handler; SIGUSR1 it always catches.
TUNE_SIGINT_ENV = "TUNE_DISABLE_SIGINT_HANDLER"


class StopRequest:
    """Whether a stop signal arrived while the sweep ran (`received`), and which (`signum`)."""

    #: How often a stop that came before Tune listened looks again whether it listens now.
    LISTEN_POLL_S = 0.05

    def __init__(self) -> None:
        self.signum: int | None = None
        #: Whether the signals were watched (not in a thread other than the main one, where Python
        #: cannot install handlers and Tune does not either).
        self.watched = False
        #: SIGUSR1's handler before Tune's fit installed its own: while it is still there, Tune is
        #: not listening (its loop has not begun), and SIGUSR1 would end the process unhandled.
        self._before_tune = signal.getsignal(signal.SIGUSR1) if hasattr(signal, "SIGUSR1") else None
        self._ended = threading.Event()

    @property
    def received(self) -> bool:
        return self.signum is not None

    def _handle(self, signum: int, frame: object) -> None:
        if self.received:
            raise KeyboardInterrupt  # a second stop: out now
        self.signum = signum
        if self._tune_listens():
            os.kill(os.getpid(), signal.SIGUSR1)
        else:
            threading.Thread(target=self._pass_on_when_tune_listens, name="hpo-pending-stop", daemon=True).start()

    def _tune_listens(self) -> bool:
        return signal.getsignal(signal.SIGUSR1) is not self._before_tune

    def _pass_on_when_tune_listens(self) -> None:
        while not self._ended.wait(self.LISTEN_POLL_S):
            if self._tune_listens():
                os.kill(os.getpid(), signal.SIGUSR1)
                return


@contextmanager
def stop_signals() -> Iterator[StopRequest]:
    """While the block runs (a Tune fit), Ctrl-C and SIGTERM ask Tune to stop and are recorded in
    the `StopRequest` yielded; afterwards each signal does what it did before, or the default where
    that was Ray's handler, which Python cannot put back."""
    request = StopRequest()
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "SIGUSR1"):
        yield request  # signal handlers belong to the main thread (and Windows has no SIGUSR1)
        return
    # a user who switched Tune's Ctrl-C handling off wants Ctrl-C to end the driver at once
    caught = (signal.SIGTERM,) if os.environ.get(TUNE_SIGINT_ENV, "0") not in ("", "0") else (signal.SIGINT, signal.SIGTERM)
    previous = {signum: signal.getsignal(signum) for signum in caught}
    for signum in previous:
        signal.signal(signum, request._handle)
    request.watched = True
    try:
        with scoped_environ({TUNE_SIGINT_ENV: "1"}):
            yield request
    finally:
        request._ended.set()
        for signum, handler in previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
