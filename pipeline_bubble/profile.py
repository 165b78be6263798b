"""A profile of one DeepSpeed pipeline configuration: every stage's instructions, timed batch by batch, as JSON.

What a profile holds, per stage and per schedule instruction (its slot in the stage's stream,
`train_schedule.stage_instructions`), for every profiled batch after the warm-up one:

- `duration_s`: for a computing instruction the time it ran; for an exchange (sends and
  receives of activations and gradients, the loss broadcast) the time from the moment the last
  side arrived to its end, i.e. the transfer itself, without the wait;
- `blocked_s` (exchanges): the whole call, wait and transfer, as the stage saw it;
- `gap_s`: the host time before it, since the previous instruction ended (dispatch, Python);
- `waits_on`: the (stage, slot)s it meets (an exchange) or nothing (it waits only for its own
  stage's previous instruction); `late`: per batch, the stage that arrived last;
- `host` and `device`: its [start, end] on the host's clock and the device's (CUDA events on a
  GPU, the same clock on a CPU), seconds since the profiled batch began on its earliest stage;
- `collective` (the optimizer step): where inside it the stages all-reduce their gradient norm
  (DeepSpeed clips gradients by default), a collective the schedule does not show: the stage
  that reaches it first waits there for the others, so its step lasts as long as theirs.

Exchanges are aligned across stages on the clocks of one host (`time.perf_counter` is one
clock for every process of a Linux host), as dPRO aligns the two ends of a communication op.
The profile also keeps the job's layers (their parameters, output bytes and measured forward
and backward times), so the replayer can move layers between stages, and the machine's
`hpo.base.machine.fingerprint`, so that replaying it elsewhere warns. Each layer's `timed_at`
holds its forward and backward times at several micro-batch sizes (the profiled one, half and
double), because a layer's cost is not proportional to its batch (a fixed part: dispatch,
kernel launches, caches); a profile without them (recorded before they were) still reads, and
the replayer then scales in proportion.

Nothing here imports torch or DeepSpeed: `pipeline_bubble.profiling` records a profile,
`pipeline_bubble.replay` predicts from one.
"""

from __future__ import annotations

import datetime
import json
import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from statistics import median
from typing import Any

from hpo.base.machine import fingerprint
from pipeline_bubble.timeline import GUEST, StageTimeline, kept_batches
from pipeline_bubble.train_schedule import exchange_partners, stage_instructions

FORMAT = "hydro-hpo pipeline profile"
VERSION = 1


class ProfileError(ValueError):
    """A profile that cannot be read or built: the message names the file and the key or value."""


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    """A finite real number (not a bool, not NaN or infinity): what every time and size in a profile is."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class PipelineConfig:
    """One configuration of a pipeline job: what the replayer predicts and the profiler measures.

    `split`: how many of the job's layers each stage holds, first stage first (None: the job's own
    split). `guest_step_s`: guest steps of this length are admitted into the bubbles (None: none).
    """

    stages: int = 2
    micro_batches: int = 4
    micro_batch_size: int = 128
    split: tuple[int, ...] | None = None
    guest_step_s: float | None = None

    def __post_init__(self) -> None:
        for name in ("stages", "micro_batches", "micro_batch_size"):
            if not _is_int(getattr(self, name)):
                raise ValueError(f"{name} must be an integer, got {getattr(self, name)!r}")
        if self.split is not None and (isinstance(self.split, (str, bytes)) or not isinstance(self.split, Sequence)
                                       or not all(_is_int(n) for n in self.split)):
            raise ValueError(f"split must be a list of layer counts, one per stage, got {self.split!r}")
        if self.guest_step_s is not None and not _is_number(self.guest_step_s):
            raise ValueError(f"guest_step_s must be a number of seconds, got {self.guest_step_s!r}")
        if self.stages < 2:
            raise ValueError(f"stages must be >= 2, got {self.stages}")
        if self.micro_batches < 1 or self.micro_batch_size < 1:
            raise ValueError(f"micro_batches and micro_batch_size must be >= 1, got {self.micro_batches}, {self.micro_batch_size}")
        if self.split is not None:
            object.__setattr__(self, "split", tuple(int(n) for n in self.split))
            if len(self.split) != self.stages or min(self.split) < 1:
                raise ValueError(f"split must give every one of the {self.stages} stages >= 1 layer, got {list(self.split)}")
        if self.guest_step_s is not None and not (0 < self.guest_step_s < math.inf):
            raise ValueError(f"guest_step_s must be > 0, got {self.guest_step_s}")

    @property
    def label(self) -> str:
        parts = [f"p={self.stages}", f"m={self.micro_batches}", f"mbs={self.micro_batch_size}"]
        if self.split is not None:
            parts.append("split=" + ":".join(map(str, self.split)))
        if self.guest_step_s is not None:
            parts.append(f"guest={self.guest_step_s * 1e3:g}ms")
        return " ".join(parts)

    def to_dict(self) -> dict:
        data = asdict(self)
        data["split"] = list(self.split) if self.split is not None else None
        return data


@dataclass
class LayerProfile:
    """One layer of the job (in the order the pipeline runs them), timed at the profiled micro-batch size.

    `timed_at`: [micro-batch size, forward seconds, backward seconds] per size it was also timed
    at on its own (smallest size first), what the replayer fits how its cost grows with the size to.
    """

    name: str
    params: int
    output_bytes: int = 0
    forward_s: float = 0.0
    backward_s: float = 0.0
    timed_at: list[list[float]] = field(default_factory=list)


@dataclass
class InstructionProfile:
    slot: int
    name: str
    micro_batch: int
    waits_on: list[list[int]]
    duration_s: list[float]
    blocked_s: list[float]
    gap_s: list[float]
    host: list[list[float]]
    device: list[list[float]]
    late: list[int] = field(default_factory=list)
    #: Per batch, for an instruction with a collective inside (the optimizer step's all-reduce of
    #: the gradient norm): [seconds from its start to the collective's, the collective's seconds].
    collective: list[list[float]] = field(default_factory=list)


@dataclass
class StageProfile:
    stage: int
    layers: list[int]  # [first, stop) of the job's layers
    params: int
    tail_s: list[float]  # from the loss broadcast's end to the end of train_batch
    between_s: list[float]  # from the end of train_batch to the next one's start (the job's own loop)
    instructions: list[InstructionProfile]


@dataclass
class PipelineProfile:
    """A profiled configuration; `job` says what ran (so it can be measured again), `machine` where."""

    config: PipelineConfig
    device: str
    job: dict[str, Any]
    machine: dict[str, Any]
    recorded: str
    batches: int
    layers: list[LayerProfile]
    stages: list[StageProfile]

    def stage_split(self) -> tuple[int, ...]:
        return tuple(s.layers[1] - s.layers[0] for s in self.stages)

    def to_dict(self) -> dict:
        data = asdict(self)
        data["config"] = self.config.to_dict()
        return {"format": FORMAT, "version": VERSION, **data}

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1))

    def summary(self) -> dict[str, Any]:
        """Median iteration time (the slowest stage's batch) and each stage's median bubble, as measured while profiling."""

        def span(stage: StageProfile, batch: int) -> float:
            return sum(i.blocked_s[batch] + i.gap_s[batch] for i in stage.instructions) + stage.tail_s[batch]

        def bubble(stage: StageProfile, batch: int) -> float:
            return sum(i.blocked_s[batch] for i in stage.instructions if i.waits_on)

        return {
            "iteration_s": median(max(span(s, b) for s in self.stages) for b in range(self.batches)),
            "bubble_s": [median(bubble(s, b) for b in range(self.batches)) for s in self.stages],
        }


def load_profile(path: str | Path) -> PipelineProfile:
    """Read a profile written by `PipelineProfile.save`; a bad file raises `ProfileError` naming it and the key."""
    path = Path(path)
    try:
        # a byte-order mark (a profile re-saved by a Windows editor) is not text, as in traces and sweep files
        data = json.loads(path.read_bytes().decode("utf-8-sig"))
    except OSError as error:
        raise ProfileError(f"{path}: cannot read ({error.strerror or error})") from None
    except json.JSONDecodeError as error:
        raise ProfileError(f"{path}:{error.lineno}: not JSON ({error.msg})") from None
    except UnicodeDecodeError as error:  # a binary file, or a profile saved in another encoding
        raise ProfileError(f"{path}: not a pipeline profile (byte 0x{error.object[error.start]:02x} at offset "
                           f"{error.start} is not UTF-8 text)") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ProfileError(f"{path}: not a pipeline profile (no \"format\": \"{FORMAT}\")")
    if data.get("version") != VERSION:
        raise ProfileError(f"{path}: profile version {data.get('version')!r}; this hydro-hpo reads version {VERSION}")
    _check_values(data, path)
    config = config_from_dict(data["config"], f"{path}: config")
    layers = [LayerProfile(**layer) for layer in data["layers"]]
    stages = [StageProfile(**{**s, "instructions": [InstructionProfile(**i) for i in s["instructions"]]}) for s in data["stages"]]
    profile = PipelineProfile(config, data["device"], data["job"], data["machine"], data["recorded"], data["batches"], layers, stages)
    _check_consistent(profile, path)
    return profile


def _check_values(data: Mapping[str, Any], path: Path) -> None:
    """Every key of a profile read from `path` present, known and of its type, and every time a
    finite number >= 0: a hand-edited or damaged file fails here naming the key and the value,
    not as a traceback (or a NaN prediction) deep in the replay."""

    def fail(where: str, message: str) -> None:
        raise ProfileError(f"{path}: {where}: {message}")

    def shown(value: Any) -> str:
        text = repr(value)
        return text if len(text) <= 60 else text[:57] + "..."

    def record(value: Any, cls: type, where: str, extra: tuple[str, ...] = ()) -> None:
        if not isinstance(value, Mapping):
            fail(where, f"a mapping of {', '.join(f.name for f in fields(cls))} expected, got {shown(value)}")
        known = [f.name for f in fields(cls)]
        unknown = sorted(set(value) - set(known) - set(extra), key=str)
        if unknown:
            fail(where, f"unknown key {unknown[0]!r}; known: {', '.join(known)}")
        required = [f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING]
        missing = [name for name in required if name not in value]
        if missing:
            fail(where, f"missing key {missing[0]!r}")

    def listed(value: Any, where: str, length: int | None = None, what: str = "values") -> list:
        if not isinstance(value, list):
            fail(where, f"a list expected, got {shown(value)}")
        if length is not None and len(value) != length:
            fail(where, f"{len(value)} {what} for {length} batches")
        return value

    def integer(value: Any, where: str, least: int = 0) -> None:
        if not _is_int(value) or value < least:
            fail(where, f"{shown(value)} is not an integer >= {least}")

    def seconds(values: Any, where: str, length: int | None = None, what: str = "values", signed: bool = False) -> None:
        for index, value in enumerate(listed(values, where, length, what)):
            if not _is_number(value) or (value < 0 and not signed):
                fail(f"{where}[{index}]", f"{shown(value)} is not a number{'' if signed else ' >= 0'} (seconds)")

    def pairs(values: Any, where: str, length: int | None, signed: bool = False) -> None:
        for index, pair in enumerate(listed(values, where, length)):
            if not isinstance(pair, list) or len(pair) != 2:
                fail(f"{where}[{index}]", f"{shown(pair)} is not a pair [start, end]")
            seconds(pair, f"{where}[{index}]", signed=signed)

    record(data, PipelineProfile, "(top level)", extra=("format", "version"))
    for key in ("job", "machine"):
        if not isinstance(data[key], Mapping):
            fail(key, f"a mapping expected, got {shown(data[key])}")
    for key in ("device", "recorded"):
        if not isinstance(data[key], str):
            fail(key, f"a string expected, got {shown(data[key])}")
    if not isinstance(data["config"], Mapping):
        fail("config", f"a mapping of {', '.join(f.name for f in fields(PipelineConfig))} expected, got {shown(data['config'])}")
    integer(data["batches"], "batches", least=1)
    batches = data["batches"]
    for index, layer in enumerate(listed(data["layers"], "layers")):
        where = f"layers[{index}]"
        record(layer, LayerProfile, where)
        if not isinstance(layer["name"], str):
            fail(f"{where}.name", f"a string expected, got {shown(layer['name'])}")
        for key in ("params", "output_bytes"):
            if key in layer:
                integer(layer[key], f"{where}.{key}")
        for key in ("forward_s", "backward_s"):
            if key in layer and (not _is_number(layer[key]) or layer[key] < 0):
                fail(f"{where}.{key}", f"{shown(layer[key])} is not a number >= 0 (seconds)")
        listed(layer.get("timed_at", []), f"{where}.timed_at")  # its entries: `_check_consistent`
    stop = 0
    for index, stage in enumerate(listed(data["stages"], "stages")):
        where = f"stages[{index}]"
        record(stage, StageProfile, where)
        if stage["stage"] != index or not _is_int(stage["stage"]):
            fail(f"{where}.stage", f"{shown(stage['stage'])}: the stages are listed in order, so {index} expected")
        bounds = stage["layers"]
        if not isinstance(bounds, list) or len(bounds) != 2 or not all(_is_int(b) for b in bounds) \
                or bounds[0] != stop or not stop < bounds[1] <= len(data["layers"]):
            fail(f"{where}.layers", f"{shown(bounds)} is not [first, stop) of its layers: first = {stop} (where the "
                 f"stage before ends), first < stop <= {len(data['layers'])} (the layers listed)")
        stop = bounds[1]
        integer(stage["params"], f"{where}.params")
        seconds(stage["tail_s"], f"{where}.tail_s", batches, "tails")
        seconds(stage["between_s"], f"{where}.between_s")
        for slot, instruction in enumerate(listed(stage["instructions"], f"{where}.instructions")):
            at = f"{where}.instructions[{slot}]"
            record(instruction, InstructionProfile, at)
            if instruction["slot"] != slot or not _is_int(instruction["slot"]):
                fail(f"{at}.slot", f"{shown(instruction['slot'])}: the instructions are listed in order, so {slot} expected")
            if not isinstance(instruction["name"], str):
                fail(f"{at}.name", f"a string expected, got {shown(instruction['name'])}")
            integer(instruction["micro_batch"], f"{at}.micro_batch", least=-1)
            for key in ("duration_s", "blocked_s", "gap_s"):
                seconds(instruction[key], f"{at}.{key}", batches, key.removesuffix("_s").replace("_", " ") + "s")
            for key in ("host", "device"):
                pairs(instruction[key], f"{at}.{key}", batches, signed=True)
            for other in listed(instruction["waits_on"], f"{at}.waits_on"):
                if not isinstance(other, list) or len(other) != 2 or not all(_is_int(v) and v >= 0 for v in other):
                    fail(f"{at}.waits_on", f"{shown(other)} is not a [stage, slot] it meets")
            for late in listed(instruction.get("late", []), f"{at}.late"):
                integer(late, f"{at}.late")
            if instruction.get("collective"):
                pairs(instruction["collective"], f"{at}.collective", batches)


def _check_consistent(profile: PipelineProfile, where: Any) -> None:
    config = profile.config
    if len(profile.stages) != config.stages:
        raise ProfileError(f"{where}: stages: {len(profile.stages)} recorded for config.stages = {config.stages}")
    for stage in profile.stages:
        expected = [i.name for i in stage_instructions(config.micro_batches, config.stages, stage.stage)]
        names = [i.name for i in stage.instructions]
        if names != expected:
            raise ProfileError(
                f"{where}: stages[{stage.stage}].instructions: recorded {len(names)} instructions that are not "
                f"DeepSpeed's TrainSchedule for p={config.stages} m={config.micro_batches} ({len(expected)} expected)"
            )
        for instruction in stage.instructions:
            if len(instruction.duration_s) != profile.batches:
                raise ProfileError(f"{where}: stages[{stage.stage}].instructions[{instruction.slot}]: "
                                   f"{len(instruction.duration_s)} durations for {profile.batches} batches")
    for index, layer in enumerate(profile.layers):
        for at, entry in enumerate(layer.timed_at):
            if not isinstance(entry, (list, tuple)) or len(entry) != 3 or not all(_is_number(v) for v in entry) \
                    or not entry[0] > 0 or min(entry[1:]) < 0:
                raise ProfileError(f"{where}: layers[{index}].timed_at[{at}]: {entry!r} is not [micro-batch size > 0, "
                                   "forward seconds >= 0, backward seconds >= 0]")
    if profile.stages[-1].layers[1] != len(profile.layers):
        raise ProfileError(f"{where}: layers: {len(profile.layers)} layers, the stages hold {profile.stages[-1].layers[1]}")
    if config.split is not None and config.split != profile.stage_split():
        raise ProfileError(f"{where}: config.split: {list(config.split)}, but the stages hold {list(profile.stage_split())} "
                           "of the layers")


def build_profile(
    timelines: list[StageTimeline],
    config: PipelineConfig,
    layers: list[LayerProfile],
    *,
    job: dict[str, Any],
    skip: int = 1,
    block: int = 0,
    machine: dict[str, Any] | None = None,
) -> PipelineProfile:
    """The profile of `timelines` (one per stage, recorded by the instrumented engine while the job ran
    `config` without guests), the first `skip` batches left out (warm-up: buffers and shapes); or,
    for a job trained in blocks of `block` batches between other work (as `profiling.measure`
    trains every configuration), each block's first (`timeline.kept_batches`)."""
    timelines = sorted(timelines, key=lambda t: t.stage)
    streams = [stage_instructions(config.micro_batches, config.stages, s) for s in range(config.stages)]
    partners = exchange_partners(streams)
    if len(timelines) != config.stages:
        raise ProfileError(f"{len(timelines)} stage timelines for {config.stages} stages")
    recorded_count = min(len(t.batches) for t in timelines)
    kept = kept_batches(recorded_count, block, skip)
    batches = len(kept)
    if batches < 1:
        left_out = f"in blocks of {block}, each block's first left out" if block else f"the first {skip} left out"
        raise ProfileError(f"no batch to profile: {recorded_count} recorded per stage, {left_out}")
    records = [[t.batches[i] for t in timelines] for i in kept]
    spans = []  # [batch][stage] -> the stage's instruction intervals, checked against the schedule
    for b, per_stage in enumerate(records):
        spans.append([])
        for stage, record in enumerate(per_stage):
            intervals = [i for i in record.intervals if i.category != GUEST]
            names = [i.name for i in intervals]
            if names != [i.name for i in streams[stage]]:
                raise ProfileError(
                    f"stage {stage}, batch {kept[b]}: the recorded instructions are not DeepSpeed's TrainSchedule "
                    f"for p={config.stages} m={config.micro_batches}: {names[:6]}..."
                )
            spans[-1].append(intervals)
    if config.split is None:
        raise ProfileError("build_profile needs the split the job ran (config.split)")
    split = config.split
    bounds = [0]
    for n in split:
        bounds.append(bounds[-1] + n)
    stages = []
    for stage in range(config.stages):
        instructions = []
        for slot, instruction in enumerate(streams[stage]):
            others = partners.get((stage, slot), [])
            row = InstructionProfile(slot, instruction.name, instruction.micro_batch, [list(o) for o in others], [], [], [], [], [])
            for b in range(batches):
                origin = min(r.start for r in records[b])
                host_origin = min(_host(r.intervals[0], 0) - (r.intervals[0].start - r.start) for r in records[b])
                own = spans[b][stage][slot]
                previous_end = spans[b][stage][slot - 1].end if slot else records[b][stage].start
                row.gap_s.append(max(0.0, own.start - previous_end))
                row.blocked_s.append(own.duration)
                row.host.append([_host(own, 0) - host_origin, _host(own, 1) - host_origin])
                row.device.append([own.start - origin, own.end - origin])
                if own.collective_start is not None and own.collective_end is not None:
                    row.collective.append([own.collective_start - own.start, own.collective_end - own.collective_start])
                if others:
                    arrivals = {stage: own.start, **{o[0]: spans[b][o[0]][o[1]].start for o in others}}
                    last = max(arrivals, key=arrivals.get)
                    row.late.append(last)
                    row.duration_s.append(min(own.duration, max(0.0, own.end - arrivals[last])))
                else:
                    row.duration_s.append(own.duration)
            if len(row.collective) != batches:  # timed in some batches only: not a collective to replay
                row.collective = []
            instructions.append(row)
        tail = [records[b][stage].end - spans[b][stage][-1].end for b in range(batches)]
        recorded = timelines[stage].batches
        # the job's own loop between two batches it trains back to back (never across blocks)
        pairs = set(kept)
        between = [recorded[i + 1].start - recorded[i].end for i in kept if i + 1 in pairs]
        first, stop = bounds[stage], bounds[stage + 1]
        params = sum(layer.params for layer in layers[first:stop])
        stages.append(StageProfile(stage, [first, stop], params, tail, between, instructions))
    profile = PipelineProfile(
        config,
        timelines[0].device,
        job,
        machine if machine is not None else fingerprint(),
        datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        batches,
        layers,
        stages,
    )
    _check_consistent(profile, "profile")
    return profile


def _host(interval, end: int) -> float:
    value = interval.host_end if end else interval.host_start
    if value is None:
        return interval.end if end else interval.start
    return value


def config_from_dict(data: dict[str, Any], where: str) -> PipelineConfig:
    """A `PipelineConfig` from a mapping (a file's entry); unknown keys and bad values name `where`."""
    known = {f.name for f in fields(PipelineConfig)}
    if not isinstance(data, Mapping):
        raise ProfileError(f"{where}: a mapping of {', '.join(sorted(known))} expected, got {data!r}")
    unknown = sorted(set(data) - known, key=str)
    if unknown:
        raise ProfileError(f"{where}: unknown key {unknown[0]!r}; known: {', '.join(sorted(known))}")
    try:
        return PipelineConfig(**data)
    except (TypeError, ValueError) as error:
        raise ProfileError(f"{where}: {error}") from None
