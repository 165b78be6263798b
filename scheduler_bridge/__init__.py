"""Cluster side: the job and cluster model, scheduling policies (``policies``), the trace-driven
simulator (``simulation``) and the Ray placement-group allocator (``live``).

The names below are the simulator's public API; the live allocator's is ``live.client``.
"""

# the model both sides share
from .app_profiles import AppProfile, load_profiles
from .cluster import ClusterSpec, FreeGPUs, Placement
from .data_files import TraceError, default_traces_dir
from .interference import InterferenceTable
from .jobs import ElasticSpec, Job, Trace, TuningJob, make_trace
from .power_model import PowerModel

# the policies
from .policies.ces import CES
from .policies.demand_forecast import DemandForecaster
from .policies.duration_predictor import DurationPredictor
from .policies.elastic import ElasticDecision, ElasticJobState, ElasticPolicy
from .policies.lucid import Lucid
from .policies.pending_queue import PendingQueue, select_starts
from .policies.qssf import QSSF
from .policies.queue import FIFO, SJF, SRTF, QueuePolicy
from .policies.registry import POLICIES, make_policy
from .policies.tiresias import Tiresias
from .policies.tuning_aware import TuningAware

# the simulator (the live allocator needs Ray: import scheduler_bridge.live.client)
from .simulation.metrics import SimResult
from .simulation.simulator import simulate
from .simulation.synthetic import add_tuning_work, random_trace
from .simulation.traces import FORMATS, load_helios, load_philly, load_pollux, load_trace

__all__ = [
    "AppProfile", "CES", "ClusterSpec", "DemandForecaster", "DurationPredictor",
    "ElasticDecision", "ElasticJobState", "ElasticPolicy", "ElasticSpec", "FIFO", "FORMATS",
    "FreeGPUs", "InterferenceTable", "Job", "Lucid", "POLICIES", "PendingQueue", "Placement",
    "PowerModel", "QSSF", "QueuePolicy", "SJF", "SRTF", "SimResult", "Trace", "TraceError",
    "Tiresias", "TuningAware", "TuningJob", "add_tuning_work", "default_traces_dir",
    "load_helios", "load_philly", "load_pollux", "load_profiles", "load_trace", "make_policy",
    "make_trace", "random_trace", "select_starts", "simulate",
]
