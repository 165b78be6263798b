"""How long a test waits for something that must happen eventually, on the machine it runs on.

A slow-tier test waits for processes to start (a Ray worker that imports torch, a restarted group
actor, a job the allocator placed) and then checks *what* happened: the order, the state, the
numbers. Its wait only keeps a hang from lasting forever. The waits were set on a 2-core box where
a Python loop of 400,000 steps takes about `REFERENCE_S`; on a box several times slower they ran
out before the awaited event and failed tests whose behaviour was right. `patience(s)` scales a
wait by how much slower this machine runs that loop now (never below 1x, at most `MOST`), so the
waits keep their meaning on any machine. Deadlines that are themselves the behaviour under test
(a latency the product promises) are not waits and must not use this.
"""

from __future__ import annotations

import statistics
import time

#: Seconds a 400,000-step Python loop takes on the box the waits were set on.
REFERENCE_S = 0.03
#: The most a wait is stretched: beyond this a machine is too slow to test on, not slow.
MOST = 10.0
#: How long a measured speed holds. A shared box's speed drifts with its neighbours' load (seen
#: here: the same loop 0.15 s, then 0.33 s a second later, and 0.85 s an hour before).
REMEASURE_S = 60.0

_measured: tuple[float, float] | None = None  # (when, slowness)


def slowness() -> float:
    """This machine's speed against the reference box's, now: the mean of five short runs, so a
    momentary fast spell does not stand for the minutes a wait lasts."""
    global _measured
    now = time.monotonic()
    if _measured is None or now - _measured[0] > REMEASURE_S:
        runs = []
        for _ in range(5):
            start = time.perf_counter()
            total = 0
            for step in range(400_000):
                total += step
            runs.append(time.perf_counter() - start)
        _measured = (now, min(MOST, max(1.0, statistics.mean(runs) / REFERENCE_S)))
    return _measured[1]


def patience(seconds: float) -> float:
    """`seconds` as long as it takes on this machine now."""
    return seconds * slowness()
