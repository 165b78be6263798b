"""An instrumented DeepSpeed `PipelineEngine` that records each stage's compute and wait intervals.

How it is injected. `instrument(engine)` re-classes the engine `deepspeed.initialize` returned
to `InstrumentedPipelineEngine` (`deepspeed_adapter.adopt`: no constructor state of its own, only
the recorder and executor attached here). The subclass changes two things:

- `run_instruction`: every schedule instruction and the loss broadcast (the last stage waits
  there) is timed; `deepspeed_adapter.HookedPipelineEngine` routes them here, so the private
  DeepSpeed names stay in that one module;
- `train_batch`: opens and closes one batch record around DeepSpeed's own `train_batch`.

Every blocking instruction also goes through the engine's `PeerSignals`: the stage announces
that it has arrived there and learns when the other side of the exchange arrives (same host).
Connecting them is a collective, so `instrument` must be called on every rank.

Before every blocking instruction whose other side signals its arrival, the attached
`BubbleExecutor` (if any) may run guest steps; where it does not (another host), only before
receives and the last stage's loss broadcast (see `harvest_policy.HARVESTABLE`).

Example::

    engine, *_ = deepspeed.initialize(model=pipe_module, optimizer=opt, config=ds_config)
    engine = instrument(engine, BubbleExecutor(guest, checkpoint_path="guest.pt"))
    for _ in range(steps):
        engine.train_batch(data_iter)
    save_timelines([engine.bubble_recorder.timeline], "stage0.json")
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import torch
import torch.distributed as dist

from pipeline_bubble.clocks import clock_for
from pipeline_bubble.deepspeed_adapter import HookedPipelineEngine, PipelineEngine, adopt
from pipeline_bubble.executor import BubbleExecutor
from pipeline_bubble.harvest_policy import is_harvestable
from pipeline_bubble.peer_signals import PeerSignals
from pipeline_bubble.timeline import COMPUTE, WAIT, BatchRecord, Interval, StageTimeline

class StageRecorder:
    """Collects one stage's intervals batch by batch into a `StageTimeline`."""

    def __init__(self, stage: int, stages: int, micro_batches: int, clock):
        self.clock = clock
        self.timeline = StageTimeline(stage, stages, micro_batches, clock.device)
        self.active = False
        self._slot = 0
        self._pending: list[tuple[str, str, tuple[Any, float], tuple[Any, float], int, tuple[Any, Any] | None]] = []
        self._collective: tuple[Any, Any] | None = None
        self._start: Any = None

    def begin_batch(self) -> None:
        self._slot = 0
        self._pending = []
        self._collective = None
        self._start = self.clock.begin_batch()
        self.active = True

    def next_slot(self) -> int:
        self._slot += 1
        return self._slot - 1

    def mark(self) -> tuple[Any, float]:
        """The device clock's mark and the host's time: a profile keeps both (on CPU they are one clock)."""
        return self.clock.mark(), time.perf_counter()

    def record_collective(self, start: Any, end: Any) -> None:
        """The device clock's marks around a collective inside the running instruction, which `record` then takes."""
        self._collective = (start, end)

    def record(self, name: str, category: str, start: tuple[Any, float], end: tuple[Any, float], slot: int) -> None:
        self._pending.append((name, category, start, end, slot, self._collective))
        self._collective = None

    def end_batch(self) -> None:
        end = self.clock.mark()
        marks = [self._start, end] + [m[0] for p in self._pending for m in (p[2], p[3])]
        inner = [p[5] for p in self._pending if p[5] is not None]
        times = self.clock.resolve(marks + [m for pair in inner for m in pair])
        inner_times = iter(times[len(marks) :])
        intervals = []
        for i, (name, category, begin, finish, slot, collective) in enumerate(self._pending):
            interval = Interval(name, category, times[2 + 2 * i], times[3 + 2 * i], slot, host_start=begin[1], host_end=finish[1])
            if collective is not None:
                interval.collective_start, interval.collective_end = next(inner_times), next(inner_times)
            intervals.append(interval)
        self.timeline.batches.append(BatchRecord(len(self.timeline.batches), times[0], times[1], intervals))
        self.active = False


class InstrumentedPipelineEngine(HookedPipelineEngine):
    """`PipelineEngine` that times every instruction and lends its waits to a `BubbleExecutor`."""

    bubble_recorder: StageRecorder
    bubble_executor: BubbleExecutor | None
    peer_signals: PeerSignals

    def attach_executor(self, executor: BubbleExecutor | None) -> None:
        """Let `executor` fill this stage's waits from the next batch on (None: only record)."""
        self.bubble_executor = executor
        if executor is not None:
            executor.start(self.device, host=self.peer_signals)

    def train_batch(self, data_iter=None):
        self.bubble_recorder.begin_batch()
        if self.bubble_executor is not None:
            self.bubble_executor.begin_batch()
        try:
            return super().train_batch(data_iter)
        finally:
            self.bubble_recorder.end_batch()
            if self.bubble_executor is not None:
                self.bubble_executor.end_batch()

    def run_instruction(self, run: Callable[[], Any], name: str, blocking: bool) -> Any:
        category = WAIT if blocking else COMPUTE
        recorder = self.bubble_recorder
        if not recorder.active:  # eval_batch and anything else outside train_batch
            return run()
        slot = recorder.next_slot()
        arrival = self.peer_signals.enter(name) if category == WAIT else None
        executor = self.bubble_executor if category == WAIT else None
        fillable = arrival is not None or is_harvestable(name, self.stage_id, self.num_stages)
        harvested = executor.harvest(slot, recorder, arrival) if executor is not None and fillable else 0.0
        begin, host_begin = recorder.mark(), time.perf_counter()
        with self.peer_signals.blocked() if category == WAIT else nullcontext():
            result = run()
        host_end, end = time.perf_counter(), recorder.mark()
        recorder.record(name, category, begin, end, slot)
        if executor is not None:
            executor.observe(slot, harvested, host_end - host_begin, fillable=fillable, arrival=arrival)
        return result

    def run_collective(self, run: Callable[[], Any]) -> Any:
        if not self.bubble_recorder.active:
            return run()
        begin = self.bubble_recorder.clock.mark()
        result = run()
        self.bubble_recorder.record_collective(begin, self.bubble_recorder.clock.mark())
        return result


def instrument(engine: PipelineEngine, executor: BubbleExecutor | None = None) -> InstrumentedPipelineEngine:
    """Make `engine` (as returned by `deepspeed.initialize`) record its bubbles, optionally filling them.

    Call on every rank (connecting the stages' `PeerSignals` is a collective), before the first
    `train_batch`. Returns the same object, now an `InstrumentedPipelineEngine`.
    """
    engine = adopt(engine, InstrumentedPipelineEngine)
    engine.bubble_recorder = StageRecorder(
        engine.stage_id, engine.num_stages, engine.micro_batches, clock_for(engine.device)
    )
    if not hasattr(engine, "peer_signals"):
        staged = torch.device(engine.device).type == "cuda" and dist.get_backend() == "gloo"
        engine.peer_signals = PeerSignals(engine, synchronize_cuda=staged)
    engine.attach_executor(executor)
    return engine
