"""A reference pipeline job trained twice in the same processes: without and with bubble harvesting.

The harness of `benchmarks/bubble_harvest.py` and of the acceptance tests (tests/test_pipeline_bubble.py,
tests/test_bubble_sweep.py); no part of the library. Each rank builds two DeepSpeed pipeline engines
from the same seed (an MLP with dropout, so any leak into the global RNG would show), both
instrumented, the second with a `BubbleExecutor`. The engines train batch by batch in turn, in
ABBA order, so a busy host slows both alike and neither always runs first; each engine keeps its
own global-RNG stream, swapped in around its batches, exactly as if it ran alone. The main job
is bit-identical when both engines' losses, final parameters and RNG states match.

Example (what the benchmark does for one point)::

    results = launch(run_rank, 2, ABSpec(stages=2, micro_batches=4))
    report = summarize_ab(results)
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from importlib import import_module
from tempfile import mkdtemp
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hpo.base.trial_state import PrivateRNG
from pipeline_bubble.harvest_policy import SAFETY, WINDOW_QUANTILE
from pipeline_bubble.profile import PipelineConfig
from pipeline_bubble.profiling import MLPJob, init_distributed
from pipeline_bubble.profiling import build_engine as build_job_engine
from pipeline_bubble.guests import GuestWork, teacher_guest, workload_guest
from pipeline_bubble.accuracy import paired_slowdown
from pipeline_bubble.timeline import GUEST, WAIT, StageTimeline, batch_times, summarize

GuestFactory = Callable[[int, torch.device], GuestWork]


@dataclass
class ABSpec:
    """The main job and the harvest settings of one A/B run."""

    stages: int = 2
    micro_batches: int = 4
    micro_batch_size: int = 32
    width: int = 256
    layers_per_stage: int = 2
    dropout: float = 0.1
    batches: int = 8
    seed: int = 0
    device: str = "cpu"
    #: Builds each stage's guest: `guest_factory(stage, device)`; None trains `synthetic_guest`.
    guest_factory: GuestFactory | None = None
    #: Instead of a factory, go through the sweep's API: these configs of `sweep_workload`
    #: ("module:attribute") via `run_guests_in_bubbles`, one fused group per stage.
    sweep_configs: list[dict[str, Any]] | None = None
    sweep_workload: str = "hpo.examples.mlp_digits:workload"
    checkpoint_dir: str | None = None
    memory_cap_bytes: int | None = None
    #: Stop harvesting (evict the guest) after this many batches; None: never.
    evict_after: int | None = None
    #: `BubbleExecutor` settings of the harvested run (see there).
    safety: float = SAFETY
    window_quantile: float = WINDOW_QUANTILE


# ---- the main job -----------------------------------------------------------------------------
def main_job(spec: ABSpec) -> tuple[MLPJob, PipelineConfig]:
    """The bubble benchmark's job (`layers_per_stage` blocks per stage, the head on the last) and its configuration."""
    job = MLPJob(width=spec.width, blocks=spec.stages * spec.layers_per_stage, dropout=spec.dropout, seed=spec.seed)
    return job, PipelineConfig(spec.stages, spec.micro_batches, spec.micro_batch_size)


def build_engine(spec: ABSpec):
    """`deepspeed.initialize` of the reference pipeline job, seeded by `spec.seed`."""
    engine, _ = build_job_engine(*main_job(spec))
    return engine


def main_job_batches(spec: ABSpec, device: torch.device) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    job, _ = main_job(spec)
    return job.batches(spec.micro_batch_size, device)


def parameter_digest(engine) -> str:
    digest = hashlib.sha256()
    for name, param in sorted(engine.module.state_dict().items()):
        digest.update(name.encode())
        digest.update(param.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


# ---- a guest that needs nothing but torch ---------------------------------------------------
def synthetic_guest(stage: int, device: torch.device, **options):
    """`teacher_guest` as a `GuestFactory`: a small MLP learning a random linear teacher, no data files."""
    return teacher_guest(stage, device=device, **options)


def digits_guest(stage: int, device: torch.device):
    """One `hpo.examples.mlp_digits` config as an unfused guest (needs scikit-learn for the data)."""
    from hpo.examples.mlp_digits import workload

    return workload_guest(workload, {"lr": 3e-3, "width": 64, "seed": stage, "data_seed": stage}, device=device)


def fused_digits_guest(stage: int, device: torch.device):
    """Four learning rates of `hpo.examples.mlp_digits` as one fused group."""
    from hpo.examples.mlp_digits import workload
    from pipeline_bubble.fused_guest import fused_group_guest

    configs = [{"lr": lr, "width": 32, "seed": stage} for lr in (1e-3, 2e-3, 3e-3, 5e-3)]
    return fused_group_guest(workload, configs, device=device, seed=stage)


# ---- one rank of the A/B run ------------------------------------------------------------------
def run_rank(rank: int, world_size: int, spec: ABSpec) -> dict[str, Any]:
    """One rank: train the baseline and the harvested engine in turn; return timelines and checks."""
    from pipeline_bubble.api import attach_guest, guest_results, harvest_bubbles, run_guests_in_bubbles
    from pipeline_bubble.executor import BubbleExecutor
    from pipeline_bubble.instrumented_engine import instrument

    init_distributed(spec.device)
    baseline = instrument(build_engine(spec))
    harvested = harvest_bubbles(build_engine(spec))  # the one call a user makes
    stage = harvested.stage_id
    if spec.sweep_configs is not None:
        module, attribute = spec.sweep_workload.split(":")
        workload = getattr(import_module(module), attribute)
        executor = run_guests_in_bubbles(
            harvested,
            workload,
            spec.sweep_configs,
            checkpoint_dir=spec.checkpoint_dir or mkdtemp(),
            memory_cap_bytes=spec.memory_cap_bytes,
        )
    else:
        factory = spec.guest_factory or synthetic_guest
        checkpoint = Path(spec.checkpoint_dir) / f"stage{stage}.pt" if spec.checkpoint_dir else None
        executor = BubbleExecutor(
            factory(stage, harvested.device),
            checkpoint_path=checkpoint,
            memory_cap_bytes=spec.memory_cap_bytes,
            safety=spec.safety,
            window_quantile=spec.window_quantile,
        )
        attach_guest(harvested, executor)

    runs = {
        name: (engine, PrivateRNG(spec.seed + 2, engine.device))
        for name, engine in [("baseline", baseline), ("harvested", harvested)]
    }
    trials: list[dict[str, Any]] = []
    data = {name: main_job_batches(spec, baseline.device) for name in runs}
    losses: dict[str, list[float]] = {name: [] for name in runs}
    for batch in range(spec.batches):
        if spec.evict_after is not None and batch == spec.evict_after:
            trials = guest_results(harvested)
            executor.request_evict()  # as a signal handler would: honoured before the next guest step
        order = list(runs.items()) if batch % 2 == 0 else list(runs.items())[::-1]  # ABBA: no order bias
        for name, (engine, rng) in order:
            with rng.active():
                losses[name].append(float(engine.train_batch(data[name])))
    trials = trials or guest_results(harvested)
    return {
        "stage": stage,
        "losses": losses,
        "digests": {name: parameter_digest(engine) for name, (engine, _) in runs.items()},
        "rng_equal": all(map(torch.equal, runs["baseline"][1].state_dict(), runs["harvested"][1].state_dict())),
        "timelines": {name: engine.bubble_recorder.timeline.to_dict() for name, (engine, _) in runs.items()},
        "guest_losses": executor.stats.losses,
        "trials": trials,  # per-trial rows (`guest_results`), taken before any eviction
        "harvest": {
            "steps": executor.stats.steps,
            "samples": executor.stats.samples,
            "guest_seconds": executor.stats.guest_seconds,
            "overruns": executor.stats.overruns,
            "signalled_slots": executor.signalled_slots,
            "no_core": executor.stats.no_core,
            "step_time_s": executor.step_time_s,
            "refused": executor.refused,
        },
    }


def summarize_ab(results: list[dict[str, Any]], skip: int = 1) -> dict[str, Any]:
    """One benchmark row from the ranks' results (`skip` first batches are warm-up)."""
    base = [StageTimeline.from_dict(r["timelines"]["baseline"]) for r in results]
    harv = [StageTimeline.from_dict(r["timelines"]["harvested"]) for r in results]
    base_summary, harv_summary = summarize(base, skip), summarize(harv, skip)
    from pipeline_bubble.harvest_policy import is_harvestable

    bubble = sum(b.total(WAIT) for t in base for b in t.measured(skip))
    harvestable = sum(
        i.duration
        for t, r in zip(base, results)
        for b in t.measured(skip)
        for i in b.intervals
        if i.category == WAIT
        and (i.slot in r["harvest"]["signalled_slots"] or is_harvestable(i.name, t.stage, t.stages))
    )
    guest = sum(b.total(GUEST) for t in harv for b in t.measured(skip))
    wall = sum(b.span for b in harv[0].measured(skip))
    samples_per_step = [r["harvest"]["samples"] / max(r["harvest"]["steps"], 1) for r in results]
    guest_steps = sum(
        sum(1 for b in t.measured(skip) for i in b.intervals if i.category == GUEST) for t in harv
    )
    first = base[0]
    return {
        "stages": first.stages,
        "micro_batches": first.micro_batches,
        "device": first.device,
        "theory_fraction": base_summary["theory_fraction"],
        "theory_fraction_measured_stages": base_summary["theory_fraction_measured_stages"],
        "measured_fraction": base_summary["measured_fraction"],
        "measured_fraction_per_stage": base_summary["measured_fraction_per_stage"],
        "batch_time_s": base_summary["median_batch_time_s"],
        "batch_time_harvested_s": harv_summary["median_batch_time_s"],
        "slowdown": paired_slowdown(batch_times(harv, skip), batch_times(base, skip)),
        "harvested_fraction": guest / bubble if bubble > 0 else 0.0,
        # Share of the bubble in waits a guest may fill (all with arrival signals; else receives).
        "harvestable_fraction": harvestable / bubble if bubble > 0 else 0.0,
        "guest_samples_per_s": guest_steps * (sum(samples_per_step) / len(samples_per_step)) / wall if wall else 0.0,
        "guest_steps": sum(r["harvest"]["steps"] for r in results),
        "guest_step_time_s": [r["harvest"]["step_time_s"] for r in results],
        "overruns": sum(r["harvest"]["overruns"] for r in results),
        "main_job_bit_identical": all(
            r["losses"]["baseline"] == r["losses"]["harvested"]
            and r["digests"]["baseline"] == r["digests"]["harvested"]
            and r["rng_equal"]
            for r in results
        ),
    }
