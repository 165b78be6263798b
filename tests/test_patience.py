"""The slow tier's waits stretch with the machine: by the worse of its CPU and its process starts."""

from __future__ import annotations

import pytest

import patience


@pytest.fixture
def machine(monkeypatch):
    """set(loop_s, spawn_s): a machine whose probes take these times; nothing measured before."""
    def set_speeds(loop_s: float, spawn_s: float) -> None:
        monkeypatch.setattr(patience, "_measured", None)
        monkeypatch.setattr(patience, "_loop_s", lambda: loop_s)
        monkeypatch.setattr(patience, "_spawn_s", lambda: spawn_s)
    return set_speeds


def test_a_machine_as_fast_as_the_reference_or_faster_waits_as_written(machine):
    machine(patience.REFERENCE_S / 4, patience.SPAWN_REFERENCE_S / 2)
    assert patience.patience(60) == 60


def test_slow_process_starts_stretch_the_waits_even_when_the_cpu_is_fast(machine):
    # CI's box: its loop ran 4x faster than the reference, its new processes 4x slower
    machine(patience.REFERENCE_S / 4, patience.SPAWN_REFERENCE_S * 4)
    assert patience.patience(60) == pytest.approx(240)


def test_a_busy_cpu_stretches_the_waits_and_no_wait_grows_past_the_most(machine):
    machine(patience.REFERENCE_S * 3, patience.SPAWN_REFERENCE_S)
    assert patience.patience(10) == pytest.approx(30)
    machine(patience.REFERENCE_S * 100, patience.SPAWN_REFERENCE_S * 100)
    assert patience.patience(10) == pytest.approx(10 * patience.MOST)


def test_the_spawn_probe_starts_a_real_interpreter():
    assert patience._spawn_s() > 0.005
