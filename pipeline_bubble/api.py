"""The calls a user (or the sweep) makes: make a DeepSpeed pipeline job's bubbles available, fill them.

A pipeline job opts in with one call, either in place of `deepspeed.initialize`::

    engine, optimizer, _, _ = pipeline_bubble.initialize(model=pipe_module, optimizer=opt, config=ds_config)

or on the engine it already has::

    engine = pipeline_bubble.harvest_bubbles(engine)

Either way the engine records its per-stage timeline (`engine.bubble_recorder.timeline`) and
accepts a guest. A job that knows its tuning configs calls `run_guests_in_bubbles(engine,
workload, configs, checkpoint_dir=...)` on every rank; each stage trains its share of the configs
in its bubbles and `guest_results(engine)` reports them per trial. A job on a Ray cluster can
instead lend its bubbles to running sweeps (`pipeline_bubble.lending.lend_bubbles`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pipeline_bubble.executor import SAFETY, BubbleExecutor
from pipeline_bubble.fused_guest import FusedGroupGuest
from pipeline_bubble.guests import GuestGroup, GuestWork, workload_guest
from pipeline_bubble.instrumented_engine import InstrumentedPipelineEngine, instrument
from pipeline_bubble.profile import PipelineConfig, PipelineProfile

logger = logging.getLogger(__name__)


def harvest_bubbles(
    engine,
    guest: GuestWork | None = None,
    *,
    memory_cap_bytes: int | None = None,
    checkpoint_path: str | Path | None = None,
    checkpoint_every: int = 100,
    safety: float = SAFETY,
    profile: PipelineProfile | None = None,
) -> InstrumentedPipelineEngine:
    """Instrument a `PipelineEngine` from `deepspeed.initialize` and, if given, let `guest` fill its bubbles.

    Call on every rank before the first `train_batch`. A guest can also be attached later with
    `attach_guest`. With the job's `profile` (`profile_pipeline`, `hpo profile pipeline`) the
    guest starts from the windows the replay predicts for this engine's configuration instead of
    learning them first (`predicted_windows`). Returns the same engine object.
    """
    executor = None
    if guest is not None:
        executor = BubbleExecutor(
            guest,
            memory_cap_bytes=memory_cap_bytes,
            checkpoint_path=checkpoint_path,
            checkpoint_every=checkpoint_every,
            safety=safety,
        )
        if profile is not None:
            executor.seed_windows(predicted_windows(engine, profile))
    return instrument(engine, executor)


def predicted_windows(engine, profile: PipelineProfile) -> dict[int, float]:
    """This rank's stage's idle seconds before each exchange, by slot, replayed from `profile` for the
    engine's own stages, micro-batches and micro-batch size (the profile's split of layers)."""
    from pipeline_bubble.replay import replay

    if engine.num_stages != profile.config.stages:
        raise ValueError(f"the profile is of {profile.config.stages} stages; this engine has {engine.num_stages}")
    config = PipelineConfig(engine.num_stages, engine.micro_batches, engine.train_micro_batch_size_per_gpu())
    return replay(profile, config).seed_windows(engine.stage_id)


def initialize(*, guest: GuestWork | None = None, bubble_options: Mapping[str, Any] | None = None, **deepspeed_kwargs):
    """`deepspeed.initialize(**deepspeed_kwargs)` whose engine records and lends its bubbles.

    Returns what `deepspeed.initialize` returns, the engine instrumented (`harvest_bubbles`).
    """
    import deepspeed

    engine, optimizer, loader, scheduler = deepspeed.initialize(**deepspeed_kwargs)
    return harvest_bubbles(engine, guest, **dict(bubble_options or {})), optimizer, loader, scheduler


def attach_guest(engine: InstrumentedPipelineEngine, executor: BubbleExecutor) -> None:
    """Give an instrumented engine a (new) guest; the previous one is evicted (checkpointed) first."""
    if engine.bubble_executor is not None:
        engine.bubble_executor.evict()
    engine.attach_executor(executor)


def run_guests_in_bubbles(
    engine: InstrumentedPipelineEngine,
    workload: Any,
    configs: Sequence[Mapping[str, Any]],
    *,
    checkpoint_dir: str | Path,
    trial_ids: Sequence[Any] | None = None,
    memory_cap_bytes: int | None = None,
    profile: PipelineProfile | None = None,
) -> BubbleExecutor:
    """Train tuning `configs` of `workload` (a `hpo.base.workload.Workload`) inside this rank's bubbles.

    Call on every rank of the pipeline job with the same arguments, after `harvest_bubbles`.
    Stage s trains configs[s::num_stages]: as one `fusion.FusedTrainer` group when they fuse,
    else one after another (`GuestGroup`), checkpointing to `checkpoint_dir/stage<s>.pt` and
    resuming from there. The job then trains as usual; `guest_results(engine)` gives the rows,
    each with its `trial_id` (default: the config's index in `configs`). With the job's `profile`,
    the guests start from the predicted windows (see `harvest_bubbles`).
    """
    stage, stages = engine.stage_id, engine.num_stages
    ids = list(trial_ids) if trial_ids is not None else list(range(len(configs)))
    if len(ids) != len(configs):
        raise ValueError(f"trial_ids has {len(ids)} ids for {len(configs)} configs")
    executor = BubbleExecutor(
        _stage_guest(workload, list(configs[stage::stages]), ids[stage::stages], engine.device),
        memory_cap_bytes=memory_cap_bytes,
        checkpoint_path=Path(checkpoint_dir) / f"stage{stage}.pt",
    )
    if profile is not None:
        executor.seed_windows(predicted_windows(engine, profile))
    attach_guest(engine, executor)
    return executor


def _stage_guest(workload: Any, configs: list[Mapping[str, Any]], ids: list[Any], device) -> GuestWork | None:
    """One fused group for a stage's configs when `fusion` can fuse them, else one guest per config in turn."""
    if not configs:
        return None
    if len(configs) > 1:
        try:
            from pipeline_bubble.fused_guest import fused_group_guest

            return fused_group_guest(workload, configs, member_ids=ids, device=device)
        except (ImportError, ValueError) as error:  # no fusion/, or configs it cannot fuse (FusionError)
            logger.info("bubble guests: training %d configs unfused (%s)", len(configs), error)
    members = [workload_guest(workload, config, device=device) for config in configs]
    for member, trial_id in zip(members, ids):
        member.member_id = trial_id
    return members[0] if len(members) == 1 else GuestGroup(members)


def guest_results(engine: InstrumentedPipelineEngine) -> list[dict[str, Any]]:
    """One row per config this rank trained in its bubbles: the config, its steps, its val metrics."""
    executor = engine.bubble_executor
    if executor is None or executor.guest is None:
        return []
    guest = executor.guest
    if isinstance(guest, FusedGroupGuest):
        return [
            {"trial_id": trial_id, "config": config, "steps": guest.steps, **metrics}
            for trial_id, config, metrics in zip(guest.member_ids, guest.config, guest.evaluate())
        ]
    members = guest.members if isinstance(guest, GuestGroup) else [guest]
    return [{"trial_id": m.member_id, "config": m.config, "steps": m.steps, **m.evaluate()} for m in members]
