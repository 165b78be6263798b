"""Per-stage timelines of a pipeline job: when each stage computed, waited, or ran guest work.

One `StageTimeline` per pipeline stage holds one `BatchRecord` per `train_batch`, each a list of
`Interval`s in seconds on a clock shared by all stages of the host (`time.perf_counter` on CPU;
on GPU the intervals come from CUDA events, anchored to the host clock at the batch start).

The bubble fraction of a stage is the share of its batch span spent waiting on its neighbours
(blocking send/recv of activations and gradients, and the wait in the loss broadcast after the
schedule). The theory for the 1F1B schedule DeepSpeed uses is (p-1)/(m+p-1), for stages that
take equal time; real stages rarely do (the first computes no input gradients, the last carries
the head and the loss), so the summary also gives the same theory for the measured stage times.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from statistics import median

COMPUTE = "compute"
WAIT = "wait"
GUEST = "guest"
_PASSES = ("ForwardPass", "BackwardPass")  # DeepSpeed's schedule instructions that compute a micro-batch


def kept_batches(count: int, block: int = 0, skip: int = 1) -> list[int]:
    """The indices of `count` recorded batches a measurement keeps: trained in blocks of `block`
    batches back to back, all but each block's first (warm-up: the stages meet again after other
    work); else all after the first `skip`."""
    if block:
        return [i for i in range(count) if i % block]
    return list(range(skip, count))


def theoretical_bubble_fraction(stages: int, micro_batches: int) -> float:
    """Idle share of each stage in a synchronous pipeline schedule (GPipe / 1F1B): (p-1)/(m+p-1)."""
    if stages < 1 or micro_batches < 1:
        raise ValueError(f"stages and micro_batches must be >= 1, got {stages}, {micro_batches}")
    return (stages - 1) / (micro_batches + stages - 1)


def stage_bubble_fractions(stage_times: list[float], micro_batches: int) -> list[float]:
    """Idle share of each stage of a 1F1B pipeline whose stage s computes `stage_times[s]` per micro-batch.

    The slowest stage sets the pace: a batch lasts m micro-batches of it, plus one of every other
    stage (the first micro-batch's way down and back, the last one's way out). Equal times give
    `theoretical_bubble_fraction`; communication and the optimizer step are left out.
    """
    slowest = max(stage_times)
    batch = micro_batches * slowest + sum(stage_times) - slowest
    return [1 - micro_batches * t / batch for t in stage_times]


@dataclass
class Interval:
    """One span of a stage's batch: a schedule instruction or one guest step."""

    name: str  # e.g. "ForwardPass", "RecvActivation", "LossBroadcast", "guest_step"
    category: str  # COMPUTE, WAIT or GUEST
    start: float
    end: float
    slot: int = -1  # position of the instruction in the stage's schedule (guest steps: the slot they preceded)
    #: The same span on the host's clock (`time.perf_counter`); `start`/`end` are the device's (CUDA
    #: events on a GPU). None where only one clock was read.
    host_start: float | None = None
    host_end: float | None = None
    #: The span of a collective hidden inside this instruction (the optimizer step's all-reduce of
    #: the gradient norm over the stages), on the device's clock; None where it has none.
    collective_start: float | None = None
    collective_end: float | None = None

    @property
    def duration(self) -> float:
        return self.end - self.start


@dataclass
class BatchRecord:
    index: int
    start: float
    end: float
    intervals: list[Interval] = field(default_factory=list)

    @property
    def span(self) -> float:
        return self.end - self.start

    def total(self, category: str) -> float:
        return sum(i.duration for i in self.intervals if i.category == category)

    def bubble_fraction(self) -> float:
        """Share of the batch spent waiting on neighbours, including what guests harvested of it."""
        idle = self.total(WAIT) + self.total(GUEST)
        return idle / self.span if self.span > 0 else 0.0


@dataclass
class StageTimeline:
    stage: int
    stages: int
    micro_batches: int
    device: str
    batches: list[BatchRecord] = field(default_factory=list)

    def measured(self, skip: int = 1) -> list[BatchRecord]:
        """The batches after the first `skip` (warm-up: buffer allocation, shape exchange, profiling)."""
        return self.batches[skip:] if len(self.batches) > skip else list(self.batches)

    def bubble_fraction(self, skip: int = 1) -> float:
        batches = self.measured(skip)
        span = sum(b.span for b in batches)
        idle = sum(b.total(WAIT) + b.total(GUEST) for b in batches)
        return idle / span if span > 0 else 0.0

    def micro_batch_compute(self, skip: int = 1) -> float:
        """Mean forward plus backward time of one micro-batch on this stage."""
        batches = self.measured(skip)
        passes = sum(i.duration for b in batches for i in b.intervals if i.name in _PASSES)
        return passes / (len(batches) * self.micro_batches) if batches else 0.0

    def median_batch_time(self, skip: int = 1) -> float:
        return median(b.span for b in self.measured(skip))

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "StageTimeline":
        batches = [
            BatchRecord(
                index=b["index"], start=b["start"], end=b["end"], intervals=[Interval(**i) for i in b["intervals"]]
            )
            for b in data["batches"]
        ]
        return cls(data["stage"], data["stages"], data["micro_batches"], data["device"], batches)


def batch_times(timelines: list[StageTimeline], skip: int = 1) -> list[float]:
    """Per batch after the first `skip`, the slowest stage's time: the job's iteration time batch by batch."""
    return [max(spans) for spans in zip(*([b.span for b in t.measured(skip)] for t in timelines))]


def save_timelines(timelines: list[StageTimeline], path: str | Path) -> None:
    """Write the per-stage timelines as one JSON document `{"stages": [...]}`, with the bubble summary."""
    timelines = sorted(timelines, key=lambda t: t.stage)
    summary = summarize(timelines)
    Path(path).write_text(json.dumps({"summary": summary, "stages": [t.to_dict() for t in timelines]}, indent=1))


def load_timelines(path: str | Path) -> list[StageTimeline]:
    return [StageTimeline.from_dict(s) for s in json.loads(Path(path).read_text())["stages"]]


def summarize(timelines: list[StageTimeline], skip: int = 1) -> dict:
    """Measured bubble fraction per stage and on average, next to the theoretical one."""
    first = timelines[0]
    per_stage = {t.stage: t.bubble_fraction(skip) for t in timelines}
    stage_times = [t.micro_batch_compute(skip) for t in timelines]
    measured_stages = stage_bubble_fractions(stage_times, first.micro_batches) if all(stage_times) else None
    return {
        "stages": first.stages,
        "micro_batches": first.micro_batches,
        "device": first.device,
        "theory_fraction": theoretical_bubble_fraction(first.stages, first.micro_batches),
        # The same theory for the stages' measured forward + backward times (None if unmeasured).
        "theory_fraction_measured_stages": sum(measured_stages) / len(measured_stages) if measured_stages else None,
        "measured_fraction": sum(per_stage.values()) / len(per_stage),
        "measured_fraction_per_stage": per_stage,
        "median_batch_time_s": max(t.median_batch_time(skip) for t in timelines),
    }
