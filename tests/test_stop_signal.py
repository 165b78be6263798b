"""Ctrl-C and SIGTERM during a sweep are recorded and passed on to Tune (as SIGUSR1, on which Tune
stops as on Ctrl-C), so the sweep knows it was stopped even where every trial made so far had ended;
a second one, or one before Tune listens, ends the driver at once; afterwards each signal does what
it did before."""

from __future__ import annotations

import os
import signal
import threading
from contextlib import contextmanager

import pytest

from hpo.tuner.stop_signal import TUNE_SIGINT_ENV, stop_signals


@contextmanager
def tune_listening():
    """What Tune's fit installs once its loop begins: a SIGUSR1 handler that asks it to stop."""
    asked = threading.Event()
    previous = signal.signal(signal.SIGUSR1, lambda signum, frame: asked.set())
    try:
        yield asked
    finally:
        signal.signal(signal.SIGUSR1, previous)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_stop_signal_is_recorded_and_asks_tune_to_stop_and_a_second_one_ends_the_driver(signum):
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    with stop_signals() as stop, tune_listening() as tune_stops:
        assert os.environ[TUNE_SIGINT_ENV] == "1" and not stop.received
        os.kill(os.getpid(), signum)
        assert tune_stops.wait(5) and stop.received and stop.signum == signum
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    assert {s: signal.getsignal(s) for s in before} == before
    assert TUNE_SIGINT_ENV not in os.environ


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_stop_before_tune_listens_is_passed_on_once_it_does(signum):
    # SIGUSR1 with no handler would end the process (exit 138) with nothing said, and a
    # KeyboardInterrupt raised wherever the driver is can be swallowed, and the stop lost
    with stop_signals() as stop:
        os.kill(os.getpid(), signum)
        assert stop.received
        with tune_listening() as tune_stops:
            assert tune_stops.wait(5)


def test_a_stop_the_sweep_never_listened_for_is_only_recorded():
    with stop_signals() as stop:
        os.kill(os.getpid(), signal.SIGTERM)
    assert stop.received  # and this process, where SIGUSR1 ends it, lives on


def test_a_user_who_switched_tunes_ctrl_c_handling_off_keeps_ctrl_c_as_it_was(monkeypatch):
    monkeypatch.setenv(TUNE_SIGINT_ENV, "1")
    with stop_signals(), tune_listening() as tune_stops:
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    assert not tune_stops.is_set()


def test_outside_the_main_thread_no_handler_is_installed():
    seen = []

    def sweep() -> None:
        with stop_signals() as stop:
            seen.append(stop.received)

    thread = threading.Thread(target=sweep)
    thread.start()
    thread.join()
    assert seen == [False] and signal.getsignal(signal.SIGINT) is signal.default_int_handler
