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
- `theoretical_bubble_fraction`, `save_timelines`, `plot_gantt`: measuring and showing bubbles.

Names are imported lazily: `import pipeline_bubble` does not import DeepSpeed, and changes nothing
in the process. `deepspeed_adapter`, which every pipeline of this package imports before DeepSpeed
initialises, points torch's extension builds at this Python environment (`cpu_ops`).
"""

from hpo.base.lazy_names import lazy_names

_EXPORTS = {
    "harvest_bubbles": "pipeline_bubble.api",
    "initialize": "pipeline_bubble.api",
    "attach_guest": "pipeline_bubble.api",
    "run_guests_in_bubbles": "pipeline_bubble.api",
    "guest_results": "pipeline_bubble.api",
    "lend_bubbles": "pipeline_bubble.lending",
    "BubbleExecutor": "pipeline_bubble.executor",
    "InstrumentedPipelineEngine": "pipeline_bubble.instrumented_engine",
    "instrument": "pipeline_bubble.instrumented_engine",
    "PeerSignals": "pipeline_bubble.peer_signals",
    "GuestWork": "pipeline_bubble.guests",
    "TorchGuest": "pipeline_bubble.guests",
    "GuestGroup": "pipeline_bubble.guests",
    "workload_guest": "pipeline_bubble.guests",
    "fused_group_guest": "pipeline_bubble.fused_guest",
    "StageTimeline": "pipeline_bubble.timeline",
    "theoretical_bubble_fraction": "pipeline_bubble.timeline",
    "save_timelines": "pipeline_bubble.timeline",
    "load_timelines": "pipeline_bubble.timeline",
    "plot_gantt": "pipeline_bubble.plots",
}

__all__ = sorted(_EXPORTS)


__getattr__ = lazy_names(__name__, _EXPORTS)
