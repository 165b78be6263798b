"""Cluster side: job and cluster model, scheduling policies, trace simulator, Ray placement-group allocator."""

from .cluster import ClusterSpec, FreeGPUs, Placement
from .jobs import ElasticSpec, Job, Trace, TuningJob, make_trace
from .metrics import SimResult
from .pending import PendingQueue, select_starts
from .forecast import DemandForecaster
from .interference import InterferenceTable
from .policy_ces import CES
from .policy_elastic import ElasticDecision, ElasticJobState, ElasticPolicy
from .policy_lucid import Lucid
from .policy_qssf import QSSF
from .policy_queue import FIFO, SJF, SRTF, QueuePolicy
from .policy_tiresias import Tiresias
from .policy_tuning import TuningAware
from .power_model import PowerModel
from .predictor import DurationPredictor
from .app_profiles import AppProfile, load_profiles
from .simulator import POLICIES, make_policy, simulate
from .synthetic import add_tuning_work, random_trace
from .data_files import TraceError, default_traces_dir
from .traces import FORMATS, load_helios, load_philly, load_pollux, load_trace

__all__ = [
    "AppProfile", "CES", "ClusterSpec", "DemandForecaster", "DurationPredictor",
    "ElasticDecision", "ElasticJobState", "ElasticPolicy", "ElasticSpec", "FIFO", "FORMATS",
    "FreeGPUs", "InterferenceTable", "Job", "Lucid", "POLICIES", "PendingQueue", "Placement",
    "PowerModel", "QSSF", "QueuePolicy", "SJF", "SRTF", "SimResult", "Trace", "TraceError",
    "Tiresias", "TuningAware", "TuningJob", "add_tuning_work", "default_traces_dir",
    "load_helios", "load_philly", "load_pollux", "load_profiles", "load_trace", "make_policy",
    "make_trace", "random_trace", "select_starts", "simulate",
]
