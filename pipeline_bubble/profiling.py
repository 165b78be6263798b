"""Profile a DeepSpeed pipeline job once, and measure configurations to hold the replay against.

`profile_pipeline(job, config)` starts the job's stages as real processes (`launch`, gloo),
trains a few batches of `config` on the instrumented engine (its existing hooks time every
schedule instruction and the loss broadcast on the host's and the device's clock), then a couple
more with module hooks on every layer (forward and backward time, output bytes), times each
stage's layers on their own at `SIZE_FACTORS` of the micro-batch size with the same hooks (how
their cost grows with the batch, which is not in proportion), and returns the `PipelineProfile`. `measure(job, runs)` trains several configurations in the same processes,
batch by batch in turn (so a busy host slows them alike), with guests in the bubbles where a
configuration admits them, optionally seeded with the replay's predicted windows.

A job is anything with the `PipelineJob` methods; `MLPJob` is the bubble benchmark's model. The
stages are built by grouping the job's layers by the configuration's `split` (one
`nn.Sequential` per stage, DeepSpeed's uniform partition over those), so any split of the same
layers can be profiled, replayed and measured.

    job = MLPJob(width=1024, blocks=4)
    profile = profile_pipeline(job, PipelineConfig(stages=2, micro_batches=4, micro_batch_size=128))
    profile.save("profile.json")
"""

from __future__ import annotations

import importlib
import os
import sys
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from statistics import median
from typing import Any, Protocol

import torch
from torch import nn

from hpo.base.exceptions import describe_exception
from pipeline_bubble.accuracy import Measured
from pipeline_bubble.clocks import clock_for
from pipeline_bubble.guests import teacher_guest
from pipeline_bubble.launch import launch
from pipeline_bubble.profile import LayerProfile, PipelineConfig, PipelineProfile, build_profile
from pipeline_bubble.timeline import StageTimeline


class PipelineJob(Protocol):
    """A pipeline job the profiler can build at any configuration.

    `layers()` builds the model as the list of layers the pipeline runs in order (the same
    initialisation for the same seed); `default_split(stages)` says how many of them each stage
    holds unless a configuration says otherwise; `describe()` is what a profile records about it.
    """

    seed: int

    def layers(self) -> list[nn.Module]: ...

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor: ...

    def optimizer(self, parameters) -> torch.optim.Optimizer: ...

    def batches(self, micro_batch_size: int, device: torch.device) -> Iterator[tuple[torch.Tensor, torch.Tensor]]: ...

    def default_split(self, stages: int) -> tuple[int, ...]: ...

    def describe(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class MLPJob:
    """The bubble benchmark's job: `blocks` x (Linear(width), ReLU, Dropout), a 10-way head, cross-entropy, AdamW."""

    width: int = 1024
    blocks: int = 4
    dropout: float = 0.1
    lr: float = 1e-3
    seed: int = 0

    def layers(self) -> list[nn.Module]:
        layers: list[nn.Module] = []
        for _ in range(self.blocks):
            layers += [nn.Linear(self.width, self.width), nn.ReLU(), nn.Dropout(self.dropout)]
        return layers + [nn.Linear(self.width, 10)]

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(outputs, targets)

    def optimizer(self, parameters) -> torch.optim.Optimizer:
        return torch.optim.AdamW(parameters, lr=self.lr)

    def batches(self, micro_batch_size: int, device: torch.device) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        generator = torch.Generator().manual_seed(self.seed + 1)
        while True:
            x = torch.randn(micro_batch_size, self.width, generator=generator)
            y = torch.randint(0, 10, (micro_batch_size,), generator=generator)
            yield x.to(device), y.to(device)

    def default_split(self, stages: int) -> tuple[int, ...]:
        """The blocks as evenly as they go (earlier stages take the extra ones), the head on the last stage."""
        if stages > self.blocks:
            raise ValueError(f"{self.blocks} blocks cannot fill {stages} stages")
        per, extra = divmod(self.blocks, stages)
        split = [3 * (per + (1 if s < extra else 0)) for s in range(stages)]
        split[-1] += 1
        return tuple(split)

    def describe(self) -> dict[str, Any]:
        return {"job": f"{__name__}:{type(self).__name__}", "options": asdict(self)}


def load_job(spec: Mapping[str, Any], where: str, search_dirs: Sequence[str | Path] = ()) -> PipelineJob:
    """The job `spec` names (`{"job": "module:attribute", "options": {...}}`, as `describe()` and a job
    file give it), built; a bad one raises ValueError naming `where` and the key.

    A module in one of `search_dirs` (the job file's folder) is importable, as a sweep file's
    trainable beside it is, here and in the ranks `launch` spawns (they start with this sys.path)."""
    name, options = spec.get("job", ""), spec.get("options") or {}
    module, _, attribute = str(name).partition(":")
    for folder in search_dirs:
        if str(folder) not in sys.path:
            sys.path.append(str(folder))
    try:
        factory = getattr(importlib.import_module(module), attribute)
    except (ImportError, AttributeError, ValueError) as error:
        raise ValueError(f"{where}: job: cannot import {name!r} ({error})") from None
    except Exception as error:  # the module's own code failed (a SyntaxError included)
        raise ValueError(f"{where}: job: importing {module!r} failed: {describe_exception(error)}") from None
    try:
        job = factory(**options)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{where}: options: {error}") from None
    except Exception as error:
        raise ValueError(f"{where}: options: building {name} failed: {describe_exception(error)}") from None
    missing = [m for m in ("layers", "loss", "optimizer", "batches", "default_split", "describe") if not callable(getattr(job, m, None))]
    if missing:
        raise ValueError(f"{where}: job: {name} lacks {', '.join(missing)} (see pipeline_bubble.profiling.PipelineJob)")
    return job


def init_distributed(device: str) -> None:
    """Join this rank's gloo process group; on CUDA every stage shares GPU 0 (see `launch`)."""
    import deepspeed

    if device.startswith("cuda"):
        from pipeline_bubble.deepspeed_adapter import stage_cuda_on_host

        stage_cuda_on_host()
        # DeepSpeed binds a CUDA device to the default group, after which torch builds every
        # new_group by splitting it, which gloo cannot do; staged gloo needs no bound device.
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        torch.distributed.init_process_group("gloo", init_method="env://", rank=rank, world_size=world)
    deepspeed.init_distributed(dist_backend="gloo")


def build_engine(job: PipelineJob, config: PipelineConfig):
    """`deepspeed.initialize` of `job`'s layers grouped by `config.split` (else the job's), seeded by `job.seed`.

    Returns the engine and this rank's stage (the `nn.Sequential` of its layers).
    """
    import deepspeed
    from deepspeed.pipe import PipelineModule

    torch.manual_seed(job.seed)
    layers = job.layers()
    split = config.split or job.default_split(config.stages)
    if sum(split) != len(layers):
        raise ValueError(f"split {list(split)} holds {sum(split)} layers; the job has {len(layers)}")
    groups, first = [], 0
    for count in split:
        groups.append(nn.Sequential(*layers[first : first + count]))
        first += count
    module = PipelineModule(layers=groups, num_stages=config.stages, loss_fn=job.loss, partition_method="uniform")
    optimizer = job.optimizer(module.parameters())
    ds_config = {
        "train_batch_size": config.micro_batch_size * config.micro_batches,
        "train_micro_batch_size_per_gpu": config.micro_batch_size,
        "steps_per_print": 10**9,
    }
    engine, *_ = deepspeed.initialize(model=module, optimizer=optimizer, config=ds_config)
    return engine, groups[engine.stage_id]


class LayerTimer:
    """Times every layer of one stage, forward and backward, with module hooks (the device's clock).

    The first layer of a stage whose input needs no gradient reports its backward when its
    output's gradient is ready (PyTorch fires the hook then); its weight gradient's time is in
    the stage's `BackwardPass` all the same, which is what the replayer splits by these times.
    """

    def __init__(self, stage: nn.Sequential, device: torch.device | str):
        self.stage = stage
        self.clock = clock_for(device)
        self.marks: list[tuple[int, str, Any]] = []
        self.output_bytes = [0] * len(stage)
        self.example: torch.Tensor | None = None  # the stage's last input
        self._handles: list[Any] = []

    def __enter__(self) -> "LayerTimer":
        self.clock.begin_batch()
        self._handles.append(self.stage.register_forward_pre_hook(lambda m, a: setattr(self, "example", a[0] if a else None)))
        for index, layer in enumerate(self.stage):
            self._handles += [
                layer.register_forward_pre_hook(lambda m, a, i=index: self._mark(i, "f0")),
                layer.register_forward_hook(lambda m, a, out, i=index: self._output(i, out)),
                layer.register_full_backward_pre_hook(lambda m, g, i=index: self._mark(i, "b0")),
                layer.register_full_backward_hook(lambda m, gi, go, i=index: self._mark(i, "b1")),
            ]
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def _mark(self, index: int, phase: str) -> None:
        self.marks.append((index, phase, self.clock.mark()))

    def _output(self, index: int, output: Any) -> None:
        self._mark(index, "f1")
        tensor = output[0] if isinstance(output, (tuple, list)) else output
        if torch.is_tensor(tensor):
            self.output_bytes[index] = tensor.numel() * tensor.element_size()

    def layer_seconds(self) -> list[tuple[float, float]]:
        """Each layer's mean forward and backward seconds per micro-batch."""
        times = self.clock.resolve([m[2] for m in self.marks])
        open_: dict[tuple[int, str], float] = {}
        totals = [[0.0, 0.0, 0, 0] for _ in self.stage]
        for (index, phase, _), at in zip(self.marks, times):
            if phase in ("f0", "b0"):
                open_[(index, phase[0])] = at
            elif (index, phase[0]) in open_:
                which = 0 if phase == "f1" else 1
                totals[index][which] += at - open_.pop((index, phase[0]))
                totals[index][2 + which] += 1
        return [(f / max(nf, 1), b / max(nb, 1)) for f, b, nf, nb in totals]


#: The micro-batch sizes, relative to the profiled one, each stage's layers are also timed at.
SIZE_FACTORS = (0.5, 1.0, 2.0)


def time_at_sizes(stage: nn.Sequential, example: torch.Tensor, sizes: list[int], *, repeats: int = 5) -> list[list[list[float]]]:
    """Per layer of `stage`, [size, forward s, backward s] at each of `sizes`: the stage run on its own,
    forward on random inputs shaped like `example` and backward from a random output gradient,
    timed by a `LayerTimer`; [] per layer where the stage's input or output is not one
    floating-point tensor (the replayer then scales in proportion). The sizes take turns,
    `repeats` rounds after one warm-up each, and each time is the median of its rounds, so a
    busy host slows every size alike and a stall does not bend the fit."""
    device = example.device
    if not example.is_floating_point():
        return [[] for _ in stage]
    needs_grad = example.requires_grad  # the first stage's input needs none: its first layer computes no input gradient

    def step(size: int) -> bool:
        stage.zero_grad(set_to_none=True)
        inputs = torch.randn((size, *example.shape[1:]), dtype=example.dtype, device=device, requires_grad=needs_grad)
        outputs = stage(inputs)
        if not torch.is_tensor(outputs) or not outputs.requires_grad:
            return False
        outputs.backward(torch.randn_like(outputs))
        return True

    if not all(step(size) for size in sizes):  # warm-up: allocations at every size
        return [[] for _ in stage]
    rounds: dict[int, list[list[tuple[float, float]]]] = {size: [] for size in sizes}
    for _ in range(repeats):
        for size in sizes:
            timer = LayerTimer(stage, device)
            with timer:
                step(size)
            rounds[size].append(timer.layer_seconds())
    stage.zero_grad(set_to_none=True)
    return [
        [[size, median(r[index][0] for r in rounds[size]), median(r[index][1] for r in rounds[size])] for size in sizes]
        for index in range(len(stage))
    ]


# ---- profiling ---------------------------------------------------------------------------------------
@dataclass
class _ProfileRun:
    job: Any
    config: PipelineConfig
    batches: int
    layer_batches: int
    device: str


def _profiled_stage(engine, stage: nn.Sequential, data, config: PipelineConfig, layer_batches: int) -> dict[str, Any]:
    """This rank's part of a profile, once `engine` has trained the profiled batches: its timeline so
    far, then its layers timed over `layer_batches` more batches and on their own at `SIZE_FACTORS`."""
    timeline = engine.bubble_recorder.timeline.to_dict()
    timer = LayerTimer(stage, engine.device)
    with timer, warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Full backward hook is firing")  # the stage's first layer, see LayerTimer
        for _ in range(layer_batches):
            engine.train_batch(data)
        seconds = timer.layer_seconds()
        sizes = sorted({max(1, round(config.micro_batch_size * factor)) for factor in SIZE_FACTORS})
        timed = time_at_sizes(stage, timer.example, sizes) if timer.example is not None else [[] for _ in stage]
    layers = [
        asdict(LayerProfile(type(layer).__name__, sum(p.numel() for p in layer.parameters()), out, f, b, at))
        for layer, out, (f, b), at in zip(stage, timer.output_bytes, seconds, timed)
    ]
    return {"stage": engine.stage_id, "timeline": timeline, "layers": layers}


def _profile_rank(rank: int, world_size: int, run: _ProfileRun) -> dict[str, Any]:
    from pipeline_bubble.instrumented_engine import instrument

    init_distributed(run.device)
    engine, stage = build_engine(run.job, run.config)
    engine = instrument(engine)
    data = run.job.batches(run.config.micro_batch_size, engine.device)
    for _ in range(run.batches):
        engine.train_batch(data)
    return _profiled_stage(engine, stage, data, run.config, run.layer_batches)


def _profile_from(results: list[dict[str, Any]], config: PipelineConfig, job: PipelineJob, block: int = 0) -> PipelineProfile:
    results = sorted(results, key=lambda r: r["stage"])
    timelines = [StageTimeline.from_dict(r["timeline"]) for r in results]
    layers = [LayerProfile(**layer) for r in results for layer in r["layers"]]
    return build_profile(timelines, config, layers, job=job.describe(), block=block)


def _profiled(config: PipelineConfig, job: PipelineJob) -> PipelineConfig:
    """`config` as a profile records it: the split it ran spelled out, no guests."""
    return replace(config, split=config.split or job.default_split(config.stages), guest_step_s=None)


def profile_pipeline(
    job: PipelineJob,
    config: PipelineConfig,
    *,
    batches: int = 8,
    layer_batches: int = 2,
    device: str = "cpu",
    log_dir: str | Path | None = None,
    timeout_s: float = 900,
) -> PipelineProfile:
    """Run `config` of `job` for `batches` batches (the first is warm-up) and return its profile."""
    config = _profiled(config, job)
    run = _ProfileRun(job, config, batches, layer_batches, device)
    results = launch(_profile_rank, config.stages, run, timeout_s=timeout_s, log_dir=log_dir, same_device=device.startswith("cuda"))
    return _profile_from(results, config, job)


# ---- measuring ---------------------------------------------------------------------------------------
@dataclass
class MeasureRun:
    """One configuration to measure; `seed`: per stage, the predicted idle seconds per slot the
    executor starts with (`Replay.seed_windows`), None for an executor that learns from scratch."""

    config: PipelineConfig
    seed: list[dict[int, float]] | None = None


@dataclass
class _MeasureRequest:
    job: Any
    runs: list[MeasureRun]
    block: int
    rounds: int
    device: str
    profile_steps: int = 8
    #: A configuration profiled in the same processes, a block before every measured block.
    profile: PipelineConfig | None = None
    layer_batches: int = 2


def calibrated_guest(step_s: float, seed: int, device: torch.device) -> tuple[Any, float]:
    """A `teacher_guest` whose step takes about `step_s` here (its batch sized to fit), and its measured step."""
    batch, measured = 64, 0.0
    synchronize = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    for _ in range(3):
        guest = teacher_guest(seed, batch=batch, device=device)
        guest.step()  # allocations and caches
        synchronize()
        begin = time.perf_counter()
        for _ in range(5):
            guest.step()
        synchronize()
        measured = (time.perf_counter() - begin) / 5
        if abs(measured - step_s) < 0.1 * step_s:
            break
        batch = max(1, round(batch * step_s / measured))
    return teacher_guest(seed, batch=batch, device=device), measured


def _measure_rank(rank: int, world_size: int, request: _MeasureRequest) -> dict[str, Any]:
    from pipeline_bubble.executor import BubbleExecutor
    from pipeline_bubble.instrumented_engine import instrument

    init_distributed(request.device)
    engines, executors, data = [], [], []
    for run in request.runs:
        engine, _ = build_engine(request.job, run.config)
        executor = None
        if run.config.guest_step_s is not None:
            guest, _ = calibrated_guest(run.config.guest_step_s, 1000 + engine.stage_id, engine.device)
            executor = BubbleExecutor(guest, profile_steps=request.profile_steps)
            if run.seed is not None:
                executor.seed_windows(run.seed[engine.stage_id])
        engines.append(instrument(engine, executor))
        executors.append(executor)
        data.append(request.job.batches(run.config.micro_batch_size, engine.device))
    profiled = None
    if request.profile is not None:
        engine, stage = build_engine(request.job, request.profile)
        profiled = (instrument(engine), stage, request.job.batches(request.profile.micro_batch_size, engine.device))
    for round_ in range(request.rounds):
        order = range(len(engines)) if round_ % 2 == 0 else reversed(range(len(engines)))  # ABBA: no order bias
        for index in order:
            for engine, batches in ([(profiled[0], profiled[2])] if profiled else []) + [(engines[index], data[index])]:
                for _ in range(request.block):  # back to back, as the job runs
                    engine.train_batch(batches)
    return {
        "stage": engines[0].stage_id,
        "profile": _profiled_stage(*profiled, request.profile, request.layer_batches) if profiled else None,
        "runs": [
            {
                "timeline": engine.bubble_recorder.timeline.to_dict(),
                "guest_step_s": executor.step_time_s if executor is not None else None,
                "overruns": executor.stats.overruns if executor is not None else 0,
            }
            for engine, executor in zip(engines, executors)
        ],
    }


def measure(
    job: PipelineJob,
    runs: list[MeasureRun],
    *,
    block: int = 6,
    rounds: int = 2,
    device: str = "cpu",
    log_dir: str | Path | None = None,
    timeout_s: float = 1800,
) -> list[Measured]:
    """Train every run's configuration (all with the same number of stages) in the same processes
    and return what each measured, in the order given.

    Each configuration trains `block` batches back to back, as a job does (its stages settle into
    the steady state a replay predicts), then the next; `rounds` times, in turn forward and
    backward (ABBA), so a busy host slows them alike. The first batch of every block is warm-up.
    """
    return _measured(_launch_measure(_MeasureRequest(job, runs, block, rounds, device), log_dir, timeout_s), runs, block)


def profile_and_measure(
    job: PipelineJob,
    config: PipelineConfig,
    runs: list[MeasureRun],
    *,
    block: int = 6,
    rounds: int = 2,
    layer_batches: int = 2,
    device: str = "cpu",
    log_dir: str | Path | None = None,
    timeout_s: float = 1800,
) -> tuple[PipelineProfile, list[Measured]]:
    """Profile `config` of `job` in the processes that measure `runs` (as `measure` does), and return the
    profile and what each run measured.

    Why in the same processes. A profile recorded apart carries the host's state of its own minute:
    on a shared 2-core host the profiled configuration's batches took 13% longer (median) in the
    measurement that followed its profile, every instruction's compute and every configuration
    alike, which no replay of that profile can know. So the profiled configuration trains a block
    before every measured block, on its own engine (its batches are not the measured run's), its
    profile holds all those blocks, each block's first left out, and then its layers are timed as
    `profile_pipeline` times them.
    """
    profiled = _profiled(config, job)
    if any(run.config.stages != profiled.stages for run in runs):
        raise ValueError(f"the profiled configuration has {profiled.stages} stages; every run measured with it needs as many")
    request = _MeasureRequest(job, runs, block, rounds, device, profile=profiled, layer_batches=layer_batches)
    results = _launch_measure(request, log_dir, timeout_s)
    return _profile_from([r["profile"] for r in results], profiled, job, block=block), _measured(results, runs, block)


def _launch_measure(request: _MeasureRequest, log_dir: str | Path | None, timeout_s: float) -> list[dict[str, Any]]:
    stages = {run.config.stages for run in request.runs}
    if len(stages) != 1:
        raise ValueError(f"runs measured together need one stage count, got {sorted(stages)}")
    if request.block < 2 or request.rounds < 1:
        raise ValueError(f"needs block >= 2 (the first batch is warm-up) and rounds >= 1, got {request.block}, {request.rounds}")
    device = request.device
    return sorted(
        launch(_measure_rank, stages.pop(), request, timeout_s=timeout_s, log_dir=log_dir, same_device=device.startswith("cuda")),
        key=lambda r: r["stage"],
    )


def _measured(results: list[dict[str, Any]], runs: list[MeasureRun], block: int) -> list[Measured]:
    measured = []
    for index, run in enumerate(runs):
        per_stage = [r["runs"][index] for r in results]
        measured.append(
            Measured(
                run.config,
                [StageTimeline.from_dict(s["timeline"]) for s in per_stage],
                seeded=run.seed is not None,
                guest_step_s=[s["guest_step_s"] for s in per_stage],
                overruns=sum(s["overruns"] for s in per_stage),
                block=block,
            )
        )
    return measured

