"""Clocks for stage timelines: host `perf_counter` on CPU, CUDA events on GPU.

A clock hands out opaque marks while a batch runs and turns them into seconds once the batch is
over, so a CUDA clock never synchronises the device in the middle of the schedule.
"""

from __future__ import annotations

import time
from typing import Any

import torch


class HostClock:
    """Wall-clock marks; exact on CPU, where every op finishes before the host moves on."""

    device = "cpu"

    def begin_batch(self) -> Any:
        return time.perf_counter()

    def mark(self) -> Any:
        return time.perf_counter()

    def resolve(self, marks: list[Any]) -> list[float]:
        return list(marks)


class CudaClock:
    """CUDA-event marks on the current stream, anchored to the host clock at the batch start."""

    def __init__(self, device: torch.device):
        self.device = str(device)
        self._anchor_event: torch.cuda.Event | None = None
        self._anchor_host = 0.0

    def begin_batch(self) -> Any:
        torch.cuda.current_stream().synchronize()
        self._anchor_host = time.perf_counter()
        self._anchor_event = self.mark()
        return self._anchor_event

    def mark(self) -> Any:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def resolve(self, marks: list[Any]) -> list[float]:
        torch.cuda.synchronize()
        assert self._anchor_event is not None, "resolve() before begin_batch()"
        return [self._anchor_host + self._anchor_event.elapsed_time(m) / 1000.0 for m in marks]


def clock_for(device: torch.device | str) -> HostClock | CudaClock:
    device = torch.device(device)
    return CudaClock(device) if device.type == "cuda" else HostClock()
