"""Cluster side: the job and cluster model, scheduling policies (``policies``), the trace-driven
simulator (``simulation``) and the Ray placement-group allocator (``live``).

The names below are the simulator's public API; the live allocator's is ``live.client``.

Names load on first use (PEP 562), as in ``hpo``, ``fusion`` and ``pipeline_bubble``: importing a
submodule runs this file first, and every rank of a live job imports ``live.job_runner``, which
needs none of the policies. Loaded eagerly, they cost each rank scikit-learn, SciPy and pandas
(QSSF's duration predictor): 27 s of imports per rank on CI's slow box, before the job's first step.
"""

from hpo.base.lazy_names import lazy_names

_LAZY = {
    # the model both sides share
    "AppProfile": "scheduler_bridge.app_profiles",
    "load_profiles": "scheduler_bridge.app_profiles",
    "ClusterSpec": "scheduler_bridge.cluster",
    "FreeGPUs": "scheduler_bridge.cluster",
    "Placement": "scheduler_bridge.cluster",
    "TraceError": "scheduler_bridge.data_files",
    "default_traces_dir": "scheduler_bridge.data_files",
    "InterferenceTable": "scheduler_bridge.interference",
    "ElasticSpec": "scheduler_bridge.jobs",
    "Job": "scheduler_bridge.jobs",
    "Trace": "scheduler_bridge.jobs",
    "TuningJob": "scheduler_bridge.jobs",
    "make_trace": "scheduler_bridge.jobs",
    "PowerModel": "scheduler_bridge.power_model",
    # the policies: their interface, then each
    "LayeredPolicy": "scheduler_bridge.policies._base",
    "Policy": "scheduler_bridge.policies._base",
    "QueuePolicy": "scheduler_bridge.policies._base",
    "CES": "scheduler_bridge.policies.ces",
    "DemandForecaster": "scheduler_bridge.policies.demand_forecast",
    "DurationPredictor": "scheduler_bridge.policies.duration_predictor",
    "ElasticDecision": "scheduler_bridge.policies.elastic",
    "ElasticJobState": "scheduler_bridge.policies.elastic",
    "ElasticPolicy": "scheduler_bridge.policies.elastic",
    "Lucid": "scheduler_bridge.policies.lucid",
    "PendingQueue": "scheduler_bridge.policies.pending_queue",
    "select_starts": "scheduler_bridge.policies.pending_queue",
    "QSSF": "scheduler_bridge.policies.qssf",
    "FIFO": "scheduler_bridge.policies.queue",
    "SJF": "scheduler_bridge.policies.queue",
    "SRTF": "scheduler_bridge.policies.queue",
    "POLICIES": "scheduler_bridge.policies.registry",
    "make_policy": "scheduler_bridge.policies.registry",
    "Tiresias": "scheduler_bridge.policies.tiresias",
    "TuningAware": "scheduler_bridge.policies.tuning_aware",
    # the simulator (the live allocator needs Ray: import scheduler_bridge.live.client)
    "SimResult": "scheduler_bridge.simulation.metrics",
    "simulate": "scheduler_bridge.simulation.simulator",
    "add_tuning_work": "scheduler_bridge.simulation.synthetic",
    "random_trace": "scheduler_bridge.simulation.synthetic",
    "FORMATS": "scheduler_bridge.simulation.traces",
    "load_helios": "scheduler_bridge.simulation.traces",
    "load_philly": "scheduler_bridge.simulation.traces",
    "load_pollux": "scheduler_bridge.simulation.traces",
    "load_trace": "scheduler_bridge.simulation.traces",
}


__getattr__ = lazy_names(__name__, _LAZY)


__all__ = sorted(_LAZY)
