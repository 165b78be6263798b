"""Harvesting the idle bubbles of DeepSpeed pipeline-parallel jobs for fused tuning work.

- `harvest_bubbles(engine, guest)` / `initialize(...)`: the one call that instruments a
  `deepspeed.initialize` pipeline engine (per-stage timelines) and lends its bubbles to a guest;
- `BubbleExecutor`: runs whole guest steps in each stage's idle windows, until the neighbour
  arrives (`PeerSignals`, same host) or the window predicted for it ends (across hosts);
- `GuestWork`: the protocol a guest implements; `TorchGuest`, `workload_guest`, `GuestGroup`,
  `fused_group_guest`: ready-made guests;
- `lend_bubbles(engine)`: a pipeline job on a Ray cluster lends its bubbles to sweeps with
  `fusion.placement: bubbles` (`BubblePool`, `BubbleGroup`);
- `run_guests_in_bubbles(engine, workload, configs, ...)` / `guest_results(engine)`: train a fixed
  set of configs in a job's bubbles without Ray;
- `theoretical_bubble_fraction`, `save_timelines`, `plot_gantt`: measuring and showing bubbles;
- `profile_pipeline(job, config)` / `load_profile(path)`: a job's profile, recorded once;
  `replay(profile, config)` / `predict(...)`: another configuration's iteration, wait windows and
  guest cost, predicted without DeepSpeed or torch (`PipelineConfig`, `plot_stage_comparison`).

Names are imported lazily: `import pipeline_bubble` does not import DeepSpeed, and changes nothing
in the process. `deepspeed_adapter`, which every pipeline of this package imports before DeepSpeed
initialises, points torch's extension builds at this Python environment (`cpu_ops`).
"""

from hpo.base.lazy_names import lazy_names, public_names

_EXPORTS = {
    "pipeline_bubble.api": ("harvest_bubbles", "initialize", "attach_guest", "run_guests_in_bubbles", "guest_results"),
    "pipeline_bubble.lending": ("lend_bubbles",),
    "pipeline_bubble.executor": ("BubbleExecutor",),
    "pipeline_bubble.instrumented_engine": ("InstrumentedPipelineEngine", "instrument"),
    "pipeline_bubble.peer_signals": ("PeerSignals",),
    "pipeline_bubble.guests": ("GuestWork", "TorchGuest", "GuestGroup", "workload_guest"),
    "pipeline_bubble.fused_guest": ("fused_group_guest",),
    "pipeline_bubble.timeline": ("StageTimeline", "theoretical_bubble_fraction", "save_timelines", "load_timelines"),
    "pipeline_bubble.plots": ("plot_gantt", "plot_stage_comparison"),
    "pipeline_bubble.profile": ("PipelineConfig", "PipelineProfile", "load_profile"),
    "pipeline_bubble.replay": ("replay", "predict"),
    "pipeline_bubble.profiling": ("profile_pipeline", "MLPJob"),
}

__all__ = public_names(_EXPORTS)


__getattr__ = lazy_names(__name__, _EXPORTS)
