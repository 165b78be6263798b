"""Replay a pipeline profile to predict configurations the job has not run: iteration time, every
stage's wait windows, and what admitting guest steps costs the job.

How (as dPRO replays a profiled data-flow graph). The instruction streams come from DeepSpeed's
own schedule for the target configuration (`train_schedule`), each instruction's cost from the
profile (`CostModel`), and the streams run as one dependency graph: an instruction starts at the
later of its stage's clock (the previous instruction's end plus the dispatch gap measured before
it) and, for an exchange, the arrival of every side it meets; gloo's send and receive are a
rendezvous, so both sides start the transfer when the later one arrives and each ends when its
own side of the transfer (as profiled) is done. A stage's wait window is the time from its
arrival at an exchange to the transfer's start; its bubble, as the instrumented engine measures
it, is its time inside blocking calls (wait and transfer).

The optimizer step hides a collective the schedule does not show: DeepSpeed clips gradients by
default, so every stage all-reduces its gradient norm inside the step, and the stage that gets
there first (the last stage: it ends its backward passes first) waits for the others there. Its
profiled step is then mostly that wait, which no scaling of its own work reproduces (on the
2-core box the last stage's step took 42 ms to the first's 19 for the same parameters; with a
third of them, 50). Where the profile times the collective (`InstructionProfile.collective`),
the replay runs each stage's own work before it, waits for every stage to arrive, and runs the
collective's own time (the last arrival's) and the rest of the work after it; the engine counts
that wait as the step's compute, and so does the replay.

What scales, from the profiled configuration to another:

- micro-batches and stages: the stream itself (`train_schedule.stage_instructions`);
- micro-batch size: each layer's forward and backward time by the ratio of its cost at the
  target size to its cost at the profiled one, its cost piecewise affine (t(m) = a + b*m, at
  least 0) through the sizes the profile timed it at (`LayerProfile.timed_at`), extrapolated
  with the nearest segment; a profile without them scales in proportion, as does loading; a
  transfer is a gloo call's own cost (the loss broadcast's transfer of one number, at most the
  transfer's) and the rest in proportion to its bytes (on the 2-core box a 256 KB activation's
  send took 0.59 ms, 512 KB 0.64, 1 MB 0.79); the optimizer step, the gradient reductions,
  the loss broadcast and the gaps not at all;
- the split of layers over stages: with every layer timed on its own (`timed_at`), a pass is its
  layers' own times plus what the profiled stage spent beyond its layers' (DeepSpeed's pass
  around them, the loss, the first layer's weight gradient), which stays with the stage; else
  each layer's forward and backward time is its share of its profiled stage's (shares from the
  per-layer times recorded with module hooks, else by parameters); the optimizer step's own work
  and the reductions in proportion to the stage's parameters, transfers to the bytes at the boundary;
- a stage with no profiled counterpart (more stages than profiled) takes the first stage's
  costs for its computation and each exchange's from the stage that made it.

Guest steps (`predict_guests`): the replay runs the executor's own policy (`harvest_policy`):
with arrival signals (same host) a stage that reaches an exchange first runs whole guest steps
while they fit its plan (the `WINDOW_QUANTILE` of its last `WINDOW_HISTORY` windows) and the
neighbour has not arrived, so a step the neighbour arrives during delays the exchange; without
signals (another host) only receives and the last stage's loss broadcast are filled, with the
`SAFETY` share of the smallest recent window and no arrival check. Deterministic costs never
overrun, so the prediction replays `iterations` batches whose costs are drawn from the profile's
own batch-to-batch spread (each instruction's durations relative to its typical one, all from
one profiled batch at a time), the same draws with and without guests, and reports the median
of the paired ratios as `benchmarks/bubble_ab.py` measures it. It leaves out what a guest's step does to the job's own
kernels (memory bandwidth, caches): on a host with a free core for every waiting stage that is
small, on a shared GPU it is not.

Pure Python: no DeepSpeed, torch or Ray at replay time, milliseconds per configuration. A
profile recorded on another machine replays with a `ReplayWarning` naming what differs.

    profile = load_profile("profile.json")
    result = replay(profile, PipelineConfig(stages=2, micro_batches=16, micro_batch_size=128))
    result.iteration_s, result.bubble_s(), result.seed_windows(stage=0)
"""

from __future__ import annotations

import math
import random
import warnings
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from statistics import median
from typing import Any

from hpo.base.machine import differences
from pipeline_bubble.harvest_policy import (
    HISTORY,
    OBSERVE_EVERY,
    SAFETY,
    WINDOW_HISTORY,
    WINDOW_QUANTILE,
    is_harvestable,
    quantile,
)
from pipeline_bubble.profile import LayerProfile, PipelineConfig, PipelineProfile, ProfileError
from pipeline_bubble.timeline import COMPUTE, GUEST, WAIT, BatchRecord, Interval, StageTimeline
from pipeline_bubble.train_schedule import EXCHANGES, LOSS_BROADCAST, exchange_partners, stage_instructions

#: Instructions whose cost grows with the micro-batch size, and those set by the stage's parameters.
PER_SAMPLE = ("LoadMicroBatch", "ForwardPass", "BackwardPass", "SendActivation", "RecvActivation", "SendGrad", "RecvGrad")
PER_PARAMETER = ("ReduceTiedGrads", "ReduceGrads", "OptimizerStep")


class ReplayWarning(UserWarning):
    """A profile replayed where its timings may not hold (another machine, other software)."""


def machine_warning(profile: PipelineProfile, here: dict | None = None) -> str | None:
    """One line saying the profile was recorded on another machine and what differs; None when it was not."""
    diffs = differences(profile.machine, here)
    if not diffs:
        return None
    return (
        f"profile recorded on {profile.machine.get('host', 'another host')!r} ({profile.recorded}) on other hardware "
        f"or software than this machine's ({'; '.join(diffs)}): the predictions are for the profiled machine"
    )


# ---- costs ---------------------------------------------------------------------------------------
def piecewise_affine(points: list[tuple[float, float]], x: float) -> float:
    """y at `x` on the polyline through two or more `points` (sorted by x, distinct), extended beyond
    its ends by its first and last segments, at least 0."""
    index = next((i for i in range(1, len(points) - 1) if x < points[i][0]), len(points) - 1)
    (x0, y0), (x1, y1) = points[index - 1], points[index]
    return max(0.0, y0 + (y1 - y0) * (x - x0) / (x1 - x0))


def _size_points(layer: LayerProfile, phase: int) -> list[tuple[float, float]]:
    """`layer`'s forward (`phase` 1) or backward (2) seconds at the sizes it was timed at on its own.
    A larger batch never costs less, so a time below a smaller size's (noise) is raised to it."""
    points: list[tuple[float, float]] = []
    for at, seconds in sorted({int(entry[0]): entry[phase] for entry in layer.timed_at}.items()):
        points.append((at, max(seconds, points[-1][1]) if points else seconds))
    return points


def size_scale(layer: LayerProfile, phase: int, size: int, profiled: int) -> float:
    """How much longer `layer`'s forward (`phase` 1) or backward (2) takes at micro-batch `size`
    than at the `profiled` one: from its times at several sizes, else in proportion."""
    points = _size_points(layer, phase)
    if len(points) < 2:
        return size / profiled
    at_profiled = piecewise_affine(points, profiled)
    return piecewise_affine(points, size) / at_profiled if at_profiled > 0 else size / profiled


def split_for(config: PipelineConfig, layers: int, profiled_split: tuple[int, ...]) -> tuple[int, ...]:
    """How a job's `layers` lie over `config`'s stages in a replay of a profile that ran `profiled_split`:
    the config's own split, else the profiled one where the stage counts agree; a configuration
    that says neither raises ProfileError naming it."""
    if config.split is None:
        if config.stages != len(profiled_split):
            raise ProfileError(
                f"{config.label}: give a split of the job's {layers} layers over {config.stages} stages "
                f"(the profile ran {len(profiled_split)})"
            )
        return profiled_split
    if sum(config.split) != layers:
        raise ProfileError(f"{config.label}: the split holds {sum(config.split)} layers; the job has {layers}")
    return config.split


@dataclass(frozen=True)
class Cost:
    """What one instruction of a target configuration costs: the gap before it and its duration
    (an exchange's: its transfer; an instruction with a collective inside: its own work), and the
    key its batch-to-batch spread is drawn from. `collective`: (the work before the collective,
    the collective's own time), for the optimizer step's all-reduce of the gradient norm."""

    gap_s: float
    duration_s: float
    spread: tuple[int, str]
    collective: tuple[float, float] | None = None


class CostModel:
    """Each instruction's cost in a target configuration, from a profile (see the module doc)."""

    def __init__(self, profile: PipelineProfile):
        self.profile = profile
        by_batch: dict[tuple[int, str], list[list[float]]] = {}
        self._gaps: dict[tuple[int, str], list[float]] = {}
        self._collective = self._collectives(profile)
        for stage in profile.stages:
            for instruction in stage.instructions:
                rows = by_batch.setdefault((stage.stage, instruction.name), [[] for _ in range(profile.batches)])
                inside = self._collective is not None and instruction.collective
                for batch, duration in enumerate(instruction.duration_s):
                    # its own work: without the collective, where a stage that came first waits
                    rows[batch].append(duration - instruction.collective[batch][1] if inside else duration)
                self._gaps.setdefault((stage.stage, instruction.name), []).extend(instruction.gap_s)
        self._typical = {key: median(v for row in rows for v in row) for key, rows in by_batch.items()}
        #: Per (profiled stage, instruction) and profiled batch: its durations over the typical one.
        #: A replayed batch draws from one profiled batch's, so what slowed a whole batch (a busy
        #: host, a cold cache) slows the replayed one alike.
        self.spread = {
            key: [[v / self._typical[key] if self._typical[key] > 0 else 1.0 for v in row] for row in rows]
            for key, rows in by_batch.items()
        }
        self._gap = {key: median(values) for key, values in self._gaps.items()}
        self._tail = [median(stage.tail_s) for stage in profile.stages]
        self._between = [median(stage.between_s) if stage.between_s else 0.0 for stage in profile.stages]
        self.layer_forward_s = self._layer_seconds("ForwardPass", "forward_s")
        self.layer_backward_s = self._layer_seconds("BackwardPass", "backward_s")
        #: What one gloo call costs whatever it carries: the loss broadcast's transfer of one number
        #: (the profile times every other transfer at one size only).
        self._call_s = min((v for (_, name), v in self._typical.items() if name == LOSS_BROADCAST), default=0.0)

    @staticmethod
    def _collectives(profile: PipelineProfile) -> dict[int, tuple[float, float]] | None:
        """Per profiled stage, the typical work before the optimizer step's collective, and the
        collective's own time (the same for all); None where a stage's profile does not time it.

        Own time: per batch the shortest any stage spent in it, the last to arrive's, who waits
        for no one (dPRO aligns the two ends of a communication op the same way)."""
        steps = [next((i for i in s.instructions if i.name == "OptimizerStep"), None) for s in profile.stages]
        if any(step is None or not step.collective for step in steps):
            return None
        own = median(min(step.collective[batch][1] for step in steps) for batch in range(profile.batches))
        return {s.stage: (median(c[0] for c in step.collective), own) for s, step in zip(profile.stages, steps)}

    def _layer_seconds(self, name: str, measured: str) -> list[float]:
        """Each layer's share of its profiled stage's typical `name` time (see the module doc)."""
        seconds = []
        for stage in self.profile.stages:
            layers = self.profile.layers[stage.layers[0] : stage.layers[1]]
            weights = [getattr(layer, measured) for layer in layers]
            if not sum(weights):
                weights = [float(layer.params) for layer in layers]
            if not sum(weights):
                weights = [1.0] * len(layers)
            total = self._typical.get((stage.stage, name), 0.0)
            seconds += [total * w / sum(weights) for w in weights]
        return seconds

    def profiled_stage(self, stage: int, stages: int) -> int:
        """The profiled stage whose costs a target stage takes: the first, the last, or a middle one."""
        profiled = self.profile.config.stages
        if stage == stages - 1:
            return profiled - 1
        return min(stage, profiled - 2)

    def _lookup(self, table: dict[tuple[int, str], Any], stage: int, name: str) -> tuple[tuple[int, str], Any]:
        """`table`'s entry for (stage, name), else that of the nearest profiled stage that has `name`."""
        if (stage, name) in table:
            return (stage, name), table[(stage, name)]
        holders = sorted((abs(s - stage), s) for s, n in table if n == name)
        if not holders:
            raise ProfileError(f"the profile has no {name} to replay it from")
        key = (holders[0][1], name)
        return key, table[key]

    def bounds(self, config: PipelineConfig) -> list[int]:
        split = self.split(config)
        bounds = [0]
        for n in split:
            bounds.append(bounds[-1] + n)
        return bounds

    def split(self, config: PipelineConfig) -> tuple[int, ...]:
        return split_for(config, len(self.profile.layers), self.profile.stage_split())

    def costs(self, config: PipelineConfig) -> list[list[Cost]]:
        """Every stage's instructions' costs in `config`, slot by slot."""
        profile = self.profile
        scale = config.micro_batch_size / profile.config.micro_batch_size
        bounds = self.bounds(config)
        profiled_bounds = [s.layers[0] for s in profile.stages] + [profile.stages[-1].layers[1]]
        out = []
        for stage in range(config.stages):
            source = self.profiled_stage(stage, config.stages)
            first, stop = bounds[stage], bounds[stage + 1]
            params = sum(layer.params for layer in profile.layers[first:stop])
            costs = []
            for instruction in stage_instructions(config.micro_batches, config.stages, stage):
                name = instruction.name
                key, typical = self._lookup(self._typical, source, name)
                collective = None
                if name in ("ForwardPass", "BackwardPass"):
                    duration = self._pass_s(name, key[0], first, stop, config.micro_batch_size)
                elif name in EXCHANGES:
                    # an exchange's bytes: the activation at the boundary it crosses, here and where profiled
                    after = name in ("SendActivation", "RecvGrad")
                    boundary = bounds[stage + 1] if after else bounds[stage]
                    profiled = profiled_bounds[key[0] + 1] if after else profiled_bounds[key[0]]
                    call = min(typical, self._call_s)
                    duration = call + (typical - call) * scale * self._bytes_ratio(boundary, profiled)
                elif name in PER_SAMPLE:
                    duration = typical * scale
                elif name in PER_PARAMETER:
                    held = profile.stages[key[0]].params
                    duration = typical * (params / held if held else 1.0)
                    if name == "OptimizerStep" and self._collective is not None:
                        before, own = self._collective[key[0]]
                        collective = (before * (params / held if held else 1.0), own)
                else:
                    duration = typical
                _, gap = self._lookup(self._gap, source, name)
                costs.append(Cost(gap, duration, key, collective))
            out.append(costs)
        return out

    def _pass_s(self, name: str, source: int, first: int, stop: int, size: int) -> float:
        """A forward or backward pass (`name`) over layers [first, stop) at micro-batch `size`, on a
        stage that takes profiled stage `source`'s costs.

        With every layer timed on its own at several sizes: the layers' own times, plus what the
        profiled stage spent beyond its layers' own times (DeepSpeed's pass around them, the loss on
        the last stage, the first layer's weight gradient, which no hook of that layer sees), which
        stays with the stage whichever layers it holds and grows with the size as its layers do.
        A share of the profiled stage's time per layer, as the layers are moved, would carry that
        part along with them. Without those times: each layer's share (see the module doc)."""
        phase = 1 if name == "ForwardPass" else 2
        layers = self.profile.layers
        curves = [_size_points(layer, phase) for layer in layers]
        profiled = self.profile.config.micro_batch_size
        if any(len(points) < 2 for points in curves):
            seconds = self.layer_forward_s if phase == 1 else self.layer_backward_s
            return self._layers_at(seconds, phase, first, stop, size)
        own = range(*self.profile.stages[source].layers)
        own_profiled = sum(piecewise_affine(curves[i], profiled) for i in own)
        own_size = sum(piecewise_affine(curves[i], size) for i in own)
        beyond = self._typical.get((source, name), 0.0) - own_profiled
        grows = own_size / own_profiled if own_profiled > 0 else size / profiled
        return max(0.0, beyond * grows + sum(piecewise_affine(curves[i], size) for i in range(first, stop)))

    def _layers_at(self, seconds: list[float], phase: int, first: int, stop: int, size: int) -> float:
        """Layers [first, stop)'s profiled `seconds` (forward or backward, by `phase`) at micro-batch `size`."""
        profiled = self.profile.config.micro_batch_size
        layers = self.profile.layers
        return sum(seconds[i] * size_scale(layers[i], phase, size, profiled) for i in range(first, stop))

    def _bytes_ratio(self, boundary: int, profiled: int) -> float:
        layers = self.profile.layers
        if not 0 < boundary <= len(layers) or not 0 < profiled <= len(layers):
            return 1.0
        here, there = layers[boundary - 1].output_bytes, layers[profiled - 1].output_bytes
        return here / there if here and there else 1.0

    def graph(self, config: PipelineConfig) -> "_Graph":
        """`config`'s instruction streams with their costs, ready to run."""
        profiled = [self.profiled_stage(s, config.stages) for s in range(config.stages)]
        return _Graph(config, self.costs(config), [self._tail[p] for p in profiled], [self._between[p] for p in profiled])


# ---- the guest policy ------------------------------------------------------------------------------
class GuestPolicy:
    """The bubble executor's decisions, replayed: how many whole guest steps a stage runs before an exchange.

    `signals`: the stages share a host and signal their arrivals (closed loop); else open loop.
    `seed`: windows the executor starts with (`Replay.seed_windows`), as a seeded executor does.
    """

    def __init__(self, step_s: float, stages: int, *, signals: bool = True, seed: dict[tuple[int, int], float] | None = None):
        self.step_s, self.stages, self.signals = step_s, stages, signals
        self.windows: dict[tuple[int, int], deque[float]] = {}
        for key, window in (seed or {}).items():
            self.windows[key] = deque([window], maxlen=WINDOW_HISTORY if signals else HISTORY)
        self.iteration = 0
        self._seeded = bool(seed)

    def begin_iteration(self) -> None:
        self.iteration += 1

    @property
    def observing(self) -> bool:
        """Open loop: this batch runs no guest and measures the windows (warm-up and re-observation)."""
        if self.signals:
            return False
        batch = self.iteration - 1  # as the executor counts them, from 0
        initial = not self._seeded and batch <= HISTORY
        return initial or (batch > 0 and batch % OBSERVE_EVERY == 0)

    def steps(self, stage: int, slot: int, name: str, entered: float, arrival: float) -> int:
        """Guest steps run at (stage, slot), reached at `entered`, the other side arriving at `arrival`."""
        if not self.signals and (self.observing or not is_harvestable(name, stage, self.stages)):
            return 0
        history = self.windows.get((stage, slot))
        if not history:
            return 0
        if self.signals:
            # as the executor steps: while one more fits the plan and the neighbour has not arrived,
            # counted at once (a step of a microsecond in a window of 10 ms is 10,000 steps)
            plan, step = quantile(history, WINDOW_QUANTILE), self.step_s
            fit = int(plan // step)
            while fit > 0 and fit * step > plan:  # floating-point division may round up
                fit -= 1
            while (fit + 1) * step <= plan:
                fit += 1
            if entered >= arrival:
                return 0
            until = max(1, math.ceil((arrival - entered) / step))  # the first step count that reaches the arrival
            while until > 1 and entered + (until - 1) * step >= arrival:
                until -= 1
            while entered + until * step < arrival:
                until += 1
            return min(fit, until)
        return int(min(history) * SAFETY // self.step_s)

    def observe(self, stage: int, slot: int, window: float) -> None:
        if self.signals or self.observing:
            self.windows.setdefault((stage, slot), deque(maxlen=WINDOW_HISTORY if self.signals else HISTORY)).append(window)


# ---- the replay --------------------------------------------------------------------------------------
#: Batches replayed back to back before one is reported: the stages start a batch when they
#: finished the last (the loss broadcast releases the last stage first), which takes a batch or
#: two to settle into the steady state a measurement sees.
SETTLE = 3


@dataclass
class Window:
    """One wait of one stage: from its arrival at an exchange (`start_s`, on the replay's clock)
    for `idle_s` until the transfer starts, `blocked_s` in the call in all; `neighbour`: the stage
    it waited on (itself when it came last)."""

    stage: int
    slot: int
    name: str
    start_s: float
    idle_s: float
    blocked_s: float
    neighbour: int
    guest_steps: int = 0


@dataclass
class Replay:
    """A replayed batch of one configuration; each stage's batch runs from its start to its end."""

    config: PipelineConfig
    timelines: list[StageTimeline]
    windows: list[Window]
    next_starts: list[float]
    warnings: list[str] = field(default_factory=list)

    @property
    def iteration_s(self) -> float:
        """The slowest stage's batch, as a measurement over batches counts the iteration."""
        return max(t.batches[0].span for t in self.timelines)

    def bubble_s(self) -> list[float]:
        """Each stage's time in blocking calls and guest steps, as the instrumented engine counts its bubble."""
        return [t.batches[0].total(WAIT) + t.batches[0].total(GUEST) for t in self.timelines]

    def bubble_fraction(self) -> list[float]:
        return [bubble / t.batches[0].span for bubble, t in zip(self.bubble_s(), self.timelines)]

    def seed_windows(self, stage: int) -> dict[int, float]:
        """The idle seconds before each of `stage`'s exchanges, by slot: what `BubbleExecutor.seed_windows` takes."""
        return {w.slot: w.idle_s for w in self.windows if w.stage == stage}

    def bubble_capacity_gpu_s(self) -> float:
        """Idle device-seconds per iteration over all stages: the room this job's bubbles offer guests."""
        return sum(w.idle_s for w in self.windows)

    def to_dict(self) -> dict[str, Any]:
        return {
            "config": self.config.to_dict(),
            "iteration_s": self.iteration_s,
            "bubble_s": self.bubble_s(),
            "bubble_fraction": self.bubble_fraction(),
            "bubble_capacity_gpu_s": self.bubble_capacity_gpu_s(),
            "windows": [asdict(w) for w in self.windows],
            "warnings": self.warnings,
        }


def _groups(partners: dict[tuple[int, int], list[tuple[int, int]]]) -> dict[tuple[int, int], frozenset]:
    """Each blocking (stage, slot)'s exchange: every (stage, slot) that must have arrived before it resolves."""
    groups: dict[tuple[int, int], frozenset] = {}
    for key, others in partners.items():
        members = {key, *others}
        for other in others:
            members |= set(partners[other])
        groups[key] = frozenset(members)
    return groups


class _Graph:
    """A configuration's streams and exchanges with their costs, built once and run batch after batch."""

    def __init__(self, config: PipelineConfig, costs: list[list[Cost]], tails: list[float], betweens: list[float]):
        self.config = config
        self.streams = [stage_instructions(config.micro_batches, config.stages, s) for s in range(config.stages)]
        self.partners = exchange_partners(self.streams)
        self.groups = _groups(self.partners)
        self.costs, self.tails, self.betweens = costs, tails, betweens
        #: The (stage, slot)s of a collective over all stages inside an instruction (the optimizer step's).
        self.collective = [(s, slot) for s, row in enumerate(costs) for slot, cost in enumerate(row) if cost.collective]
        if len({s for s, _ in self.collective}) != len(self.collective) or len(self.collective) not in (0, config.stages):
            self.collective = []

    def run(
        self,
        draw: Callable[[tuple[int, str]], float] | None = None,
        guest: GuestPolicy | None = None,
        starts: list[float] | None = None,
        device: str = "replay",
    ) -> Replay:
        """One batch, each stage starting at `starts` (default 0); `draw(spread key)` scales each
        duration (None: typical costs)."""
        config, streams = self.config, self.streams
        stages = config.stages
        durations = [[c.duration_s * (draw(c.spread) if draw else 1.0) for c in row] for row in self.costs]
        starts = list(starts) if starts is not None else [0.0] * stages
        clock = list(starts)
        position = [0] * stages
        entered: dict[tuple[int, int], float] = {}
        resolved: dict[tuple[int, int], tuple[float, float, int, int]] = {}  # start, end, guest steps, neighbour
        intervals: list[list[Interval]] = [[] for _ in range(stages)]
        windows: list[Window] = []
        step_s = guest.step_s if guest is not None else 0.0
        if guest is not None:
            guest.begin_iteration()
        while True:
            moved = False
            for stage in range(stages):
                while position[stage] < len(streams[stage]):
                    slot = position[stage]
                    name = streams[stage][slot].name
                    ready = clock[stage] + self.costs[stage][slot].gap_s
                    key = (stage, slot)
                    if key in self.collective:
                        if key not in resolved:
                            entered.setdefault(key, ready + self._before(key, durations))
                            if any(member not in entered for member in self.collective):
                                break
                            self._resolve_collective(entered, durations, resolved)
                        start, end, _, _ = resolved[key]
                        own = self.costs[stage][slot].collective[1]  # type: ignore[index]
                        intervals[stage].append(Interval(name, COMPUTE, ready, end, slot, collective_start=entered[key],
                                                         collective_end=start + own))
                        clock[stage] = end
                        position[stage] += 1
                        moved = True
                        continue
                    if key not in self.partners:
                        end = ready + durations[stage][slot]
                        intervals[stage].append(Interval(name, COMPUTE, ready, end, slot))
                        clock[stage] = end
                        position[stage] += 1
                        moved = True
                        continue
                    entered.setdefault(key, ready)
                    if key not in resolved:
                        if any(member not in entered for member in self.groups[key]):
                            break
                        self._resolve(self.groups[key], entered, durations, resolved, guest)
                    start, end, steps, neighbour = resolved[key]
                    if steps:  # the window's guest steps back to back, as one interval (there may be thousands)
                        intervals[stage].append(Interval("guest_step", GUEST, ready, ready + steps * step_s, slot))
                    blocked_from = ready + steps * step_s
                    intervals[stage].append(Interval(name, WAIT, blocked_from, end, slot))
                    windows.append(Window(stage, slot, name, ready, max(0.0, start - ready), end - blocked_from, neighbour, steps))
                    if guest is not None:
                        arrival = max(entered[o] for o in self.partners[key])
                        guest.observe(stage, slot, max(0.0, arrival - ready))
                    clock[stage] = end
                    position[stage] += 1
                    moved = True
            if all(position[s] == len(streams[s]) for s in range(stages)):
                break
            if not moved:
                raise RuntimeError(f"{config.label}: the schedule deadlocks at positions {position}")
        ends = [clock[s] + self.tails[s] for s in range(stages)]
        timelines = [
            StageTimeline(s, stages, config.micro_batches, device, [BatchRecord(0, starts[s], ends[s], intervals[s])])
            for s in range(stages)
        ]
        return Replay(config, timelines, windows, [end + between for end, between in zip(ends, self.betweens)])

    def _before(self, key: tuple[int, int], durations: list[list[float]]) -> float:
        """The work of `key` before its collective, drawn as its whole work was."""
        cost = self.costs[key[0]][key[1]]
        assert cost.collective is not None
        drawn = durations[key[0]][key[1]] / cost.duration_s if cost.duration_s > 0 else 1.0
        return cost.collective[0] * drawn

    def _resolve_collective(self, entered, durations, resolved) -> None:
        """Every stage leaves the collective its own time after the last one reached it, then does the rest of its work."""
        latest = max(self.collective, key=lambda member: entered[member])
        start = entered[latest]
        for member in self.collective:
            cost = self.costs[member[0]][member[1]]
            assert cost.collective is not None
            after = durations[member[0]][member[1]] - self._before(member, durations)
            resolved[member] = (start, start + cost.collective[1] + after, 0, latest[0])

    def _resolve(self, group, entered, durations, resolved, guest: GuestPolicy | None) -> None:
        """Start every side of one exchange at the latest side's arrival (after any guest steps it ran)."""
        step_s = guest.step_s if guest is not None else 0.0
        steps, effective = {}, {}
        for member in group:
            arrival = max(entered[o] for o in self.partners[member])
            name = self.streams[member[0]][member[1]].name
            steps[member] = guest.steps(*member, name, entered[member], arrival) if guest is not None else 0
            effective[member] = entered[member] + steps[member] * step_s
        for member in group:
            sides = [member, *self.partners[member]]
            latest = max(sides, key=lambda side: effective[side])
            start = effective[latest]
            resolved[member] = (start, start + durations[member[0]][member[1]], steps[member], latest[0])

    def steady(self, guest: GuestPolicy | None = None, device: str = "replay") -> Replay:
        """The batch of typical costs once the stages have settled (`SETTLE` batches back to back)."""
        result = None
        for _ in range(SETTLE):
            result = self.run(guest=guest, starts=result.next_starts if result else None, device=device)
        assert result is not None
        return result


def _warn(profile: PipelineProfile) -> list[str]:
    message = machine_warning(profile)
    if message is None:
        return []
    warnings.warn(message, ReplayWarning, stacklevel=3)
    return [message]


def replay(profile: PipelineProfile, config: PipelineConfig) -> Replay:
    """The steady-state batch of `config` at typical costs, predicted from `profile`; guest steps, if
    the config admits them, are planned into the windows of the batch without them, as a seeded
    executor plans them."""
    notes = _warn(profile)
    graph = CostModel(profile).graph(config)
    device = f"replay:{profile.device}"
    result = graph.steady(device=device)
    if config.guest_step_s is not None:
        seed = {(w.stage, w.slot): w.idle_s for w in result.windows}
        result = graph.steady(guest=GuestPolicy(config.guest_step_s, config.stages, seed=seed), device=device)
    result.warnings = notes
    return result


@dataclass
class Prediction:
    """What the replay predicts for one configuration over `iterations` batches drawn from the
    profile's spread (see the module doc): medians, as a measurement over batches reports them."""

    config: PipelineConfig
    iteration_s: float
    bubble_s: list[float]  # per stage, blocking calls and guest steps
    typical: Replay  # the steady batch of typical costs: its timeline and wait windows
    iterations: int
    #: With guests admitted (`config.guest_step_s`): the iteration, the median of the paired
    #: ratios less one, each stage's guest seconds and its bubble (waits and guest steps).
    guest_iteration_s: float | None = None
    slowdown: float | None = None
    guest_s: list[float] | None = None
    guest_bubble_s: list[float] | None = None

    def to_dict(self) -> dict[str, Any]:
        data = {k: v for k, v in asdict(self).items() if k != "typical"}
        data["config"] = self.config.to_dict()
        data["windows"] = [asdict(w) for w in self.typical.windows]
        data["bubble_capacity_gpu_s"] = self.typical.bubble_capacity_gpu_s()
        data["warnings"] = self.typical.warnings
        return data


def predict(
    profile: PipelineProfile,
    config: PipelineConfig,
    *,
    iterations: int = 100,
    seed: int = 0,
    signals: bool = True,
    seeded: bool = True,
) -> Prediction:
    """Replay `config` from `profile` for `iterations` batches back to back, costs drawn from the
    profile's spread; with `config.guest_step_s`, the same draws once more with guests admitted,
    the executor's policy (`signals`: stages on one host; `seeded`: it starts from the typical
    batch's windows) carried from batch to batch."""
    notes = _warn(profile)
    model = CostModel(profile)
    graph = model.graph(config)
    device = f"replay:{profile.device}"
    typical = graph.steady(device=device)
    policy = None
    if config.guest_step_s is not None:
        windows = {(w.stage, w.slot): w.idle_s for w in typical.windows}
        policy = GuestPolicy(config.guest_step_s, config.stages, signals=signals, seed=windows if seeded else None)
        # the typical batch with its guest steps planned (deterministic costs: its windows are the same)
        typical = graph.steady(guest=GuestPolicy(config.guest_step_s, config.stages, signals=signals, seed=windows), device=device)
    typical.warnings = notes
    rng = random.Random(seed)
    plain: list[Replay] = []
    guests: list[Replay] = []
    for _ in range(SETTLE - 1 + iterations):
        drawn: list[float] = []
        batch = rng.randrange(profile.batches)

        def draw(key: tuple[int, str]) -> float:
            drawn.append(rng.choice(model.spread[key][batch]))
            return drawn[-1]

        plain.append(graph.run(draw=draw, starts=plain[-1].next_starts if plain else None))
        if policy is not None:
            again = iter(drawn)  # the same draws, in the same order, with guests
            guests.append(graph.run(draw=lambda key: next(again), guest=policy, starts=guests[-1].next_starts if guests else None))
    plain, guests = plain[SETTLE - 1 :], guests[SETTLE - 1 :]
    stages = range(config.stages)
    prediction = Prediction(
        config,
        median(r.iteration_s for r in plain),
        [median(r.bubble_s()[s] for r in plain) for s in stages],
        typical,
        iterations,
    )
    if guests:
        prediction.guest_iteration_s = median(r.iteration_s for r in guests)
        prediction.slowdown = median(g.iteration_s / p.iteration_s for g, p in zip(guests, plain)) - 1.0
        prediction.guest_s = [median(r.timelines[s].batches[0].total(GUEST) for r in guests) for s in stages]
        prediction.guest_bubble_s = [median(r.bubble_s()[s] for r in guests) for s in stages]
    return prediction
