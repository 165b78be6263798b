"""How long a test waits for something that must happen eventually, on the machine it runs on.

A slow-tier test waits for processes to start (a Ray worker that imports torch, a restarted group
actor, a job the allocator placed) and then checks *what* happened: the order, the state, the
numbers. Its wait only keeps a hang from lasting forever. The waits were set on a 2-core box where
a Python loop of 2 million steps takes about `REFERENCE_S`; on a box several times slower they ran
out before the awaited event and failed tests whose behaviour was right. `patience(s)` scales a
wait by how much slower this machine runs that loop now (never below 1x, at most `MOST`), so the
waits keep their meaning on any machine. Deadlines that are themselves the behaviour under test
(a latency the product promises) are not waits and must not use this.
"""

from __future__ import annotations

import functools
import time

#: Seconds a 2-million-step Python loop takes on the box the waits were set on.
REFERENCE_S = 0.15
#: The most a wait is stretched: beyond this a machine is too slow to test on, not slow.
MOST = 10.0


@functools.cache
def slowness() -> float:
    """This machine's speed against the reference box's (best of three short runs)."""
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        total = 0
        for step in range(2_000_000):
            total += step
        best = min(best, time.perf_counter() - start)
    return min(MOST, max(1.0, best / REFERENCE_S))


def patience(seconds: float) -> float:
    """`seconds` as long as it takes on this machine."""
    return seconds * slowness()
