"""Cluster side: the job and cluster model, scheduling policies (``policies``), the trace-driven
simulator (``simulation``) and the Ray placement-group allocator (``live``).

The names below are the simulator's public API; the live allocator's is ``live.client``.

Names load on first use (PEP 562), as in ``hpo``, ``fusion`` and ``pipeline_bubble``: importing a
submodule runs this file first, and every rank of a live job imports ``live.job_runner``, which
needs none of the policies. Loaded eagerly, they cost each rank scikit-learn, SciPy and pandas
(QSSF's duration predictor): 27 s of imports per rank on CI's slow box, before the job's first step.
"""

from hpo.base.lazy_names import lazy_names, public_names

_LAZY = {
    # the model both sides share
    "scheduler_bridge.app_profiles": ("AppProfile", "load_profiles"),
    "scheduler_bridge.cluster": ("ClusterSpec", "FreeGPUs", "Placement"),
    "scheduler_bridge.data_files": ("TraceError", "default_traces_dir"),
    "scheduler_bridge.interference": ("InterferenceTable",),
    "scheduler_bridge.jobs": ("ElasticSpec", "Job", "Trace", "TuningJob", "make_trace"),
    "scheduler_bridge.power_model": ("PowerModel",),
    # the policies: their interface, then each
    "scheduler_bridge.policies._base": ("LayeredPolicy", "Policy", "QueuePolicy"),
    "scheduler_bridge.policies.ces": ("CES",),
    "scheduler_bridge.policies.demand_forecast": ("DemandForecaster",),
    "scheduler_bridge.policies.duration_predictor": ("DurationPredictor",),
    "scheduler_bridge.policies.elastic": ("ElasticDecision", "ElasticJobState", "ElasticPolicy"),
    "scheduler_bridge.policies.lucid": ("Lucid",),
    "scheduler_bridge.policies.pending_queue": ("PendingQueue", "select_starts"),
    "scheduler_bridge.policies.qssf": ("QSSF",),
    "scheduler_bridge.policies.queue": ("FIFO", "SJF", "SRTF"),
    "scheduler_bridge.policies.registry": ("POLICIES", "make_policy"),
    "scheduler_bridge.policies.tiresias": ("Tiresias",),
    "scheduler_bridge.policies.tuning_aware": ("TuningAware",),
    # the simulator (the live allocator needs Ray: import scheduler_bridge.live.client)
    "scheduler_bridge.simulation.metrics": ("SimResult",),
    "scheduler_bridge.simulation.simulator": ("simulate",),
    "scheduler_bridge.simulation.synthetic": ("add_tuning_work", "random_trace"),
    "scheduler_bridge.simulation.traces": ("FORMATS", "load_helios", "load_philly", "load_pollux", "load_trace"),
}


__getattr__ = lazy_names(__name__, _LAZY)


__all__ = public_names(_LAZY)
