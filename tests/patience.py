"""How long a test waits for something that must happen eventually, on the machine it runs on.

A slow-tier test waits for processes to start (a Ray worker that imports torch, a restarted group
actor, a job the allocator placed) and then checks *what* happened: the order, the state, the
numbers. Its wait only keeps a hang from lasting forever. The waits were set on an ordinary 2-core
box; on a box several times slower they ran out before the awaited event and failed tests whose
behaviour was right. `patience(s)` scales a wait by how much slower this machine is now (never
below 1x, at most `MOST`), so the waits keep their meaning on any machine. Deadlines that are
themselves the behaviour under test (a latency the product promises) are not waits and must not
use this.

Slowness is measured two ways, and the worse one counts, because a box can be slow in either: a
busy CPU shows in a pure Python loop; a box whose new processes are slow does not. CI's box was
the second kind: its loop ran faster than the reference, while a Ray actor took 30-300 s to start,
because every page a new process touches cost about 44 us there (first touch of 1 GiB: 12.5 s,
against well under a second on an ordinary box). So the probe also starts a fresh interpreter that
imports a few standard modules, which is what every awaited worker does first.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time

#: Seconds a 400,000-step Python loop takes on the box the waits were set on.
REFERENCE_S = 0.03
#: Seconds a fresh interpreter running `SPAWN_PROBE` takes on an ordinary 2-core box (CPython 3.11
#: starts in about 15 ms there, and these imports add about 30 ms).
SPAWN_REFERENCE_S = 0.05
SPAWN_PROBE = "import asyncio, decimal, email.parser, json, logging, subprocess"
#: The most a wait is stretched: beyond this a machine is too slow to test on, not slow.
MOST = 10.0
#: How long a measured speed holds. A shared box's speed drifts with its neighbours' load (seen
#: here: the same loop 0.15 s, then 0.33 s a second later, and 0.85 s an hour before).
REMEASURE_S = 60.0

_measured: tuple[float, float] | None = None  # (when, slowness)


def slowness() -> float:
    """This machine's speed against the reference box's, now: the worse of a CPU-bound loop and a
    process start, each the mean of a few runs, so a momentary fast spell does not stand for the
    minutes a wait lasts."""
    global _measured
    now = time.monotonic()
    if _measured is None or now - _measured[0] > REMEASURE_S:
        ratio = max(statistics.mean(_loop_s() for _ in range(5)) / REFERENCE_S,
                    statistics.mean(_spawn_s() for _ in range(3)) / SPAWN_REFERENCE_S)
        _measured = (now, min(MOST, max(1.0, ratio)))
    return _measured[1]


def _loop_s() -> float:
    start = time.perf_counter()
    total = 0
    for step in range(400_000):
        total += step
    return time.perf_counter() - start


def _spawn_s() -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", SPAWN_PROBE], check=True)
    return time.perf_counter() - start


def patience(seconds: float) -> float:
    """`seconds` as long as it takes on this machine now."""
    return seconds * slowness()
