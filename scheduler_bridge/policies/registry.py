"""Policies by name: the one place ``hpo sim``, ``hpo job start`` and the Python API turn a name into a policy.

>>> make_policy("ces:sjf").name
'ces:sjf'
"""

from __future__ import annotations

from ..power_model import PowerModel
from .ces import CES
from .elastic import ElasticPolicy
from .lucid import Lucid
from .qssf import QSSF
from .queue import FIFO, SJF, SRTF
from .tiresias import Tiresias
from .tuning_aware import TuningAware

POLICIES = ("fifo", "sjf", "srtf", "qssf", "tiresias", "lucid", "elastic", "elastic-fixed-batch",
            "tuning-aware", "ces:<base>")
QUEUE_BASES = ("fifo", "sjf", "srtf", "qssf", "tiresias")
#: Every name ``make_policy`` accepts, ``ces:<base>`` spelled out: a command line's choices.
POLICY_NAMES = (*(p for p in POLICIES if p != "ces:<base>"), *(f"ces:{base}" for base in QUEUE_BASES))


def make_policy(name: str, *, backfill: bool | None = None, seed: int = 0,
                base: str = "fifo", checkpoint_interval: float = 60.0,
                power: PowerModel | None = None, interference=None):
    """A fresh policy by name. ``backfill`` (queue policies; None means on): a job
    may start when better-ranked ones do not fit the free GPUs.
    ``base``: the ordinary-job policy under ``tuning-aware``. ``ces:<name>``:
    CES energy saving over the queue policy ``<name>``, nodes priced by ``power``.
    ``interference``: the ``InterferenceTable`` of ``lucid`` (default: the shipped one)."""
    backfill = True if backfill is None else backfill
    if name.startswith("ces:"):
        inner = name[4:]
        if inner not in QUEUE_BASES:
            raise ValueError(f"ces base policy must be one of {', '.join(QUEUE_BASES)}; got {inner!r}")
        return CES(make_policy(inner, backfill=backfill, seed=seed), power=power)
    if name == "fifo":
        return FIFO(backfill)
    if name == "sjf":
        return SJF(backfill)
    if name == "srtf":
        return SRTF(backfill)
    if name == "qssf":
        return QSSF(backfill, seed=seed)
    if name == "tiresias":
        return Tiresias(backfill)
    if name == "lucid":
        return Lucid(interference, backfill, seed=seed)
    if name == "elastic":
        return ElasticPolicy()
    if name == "elastic-fixed-batch":
        return ElasticPolicy(fixed_batch=True)
    if name == "tuning-aware":
        if base not in QUEUE_BASES:
            raise ValueError(f"tuning-aware base policy must be one of {', '.join(QUEUE_BASES)}; got {base!r}")
        return TuningAware(make_policy(base, backfill=backfill, seed=seed), checkpoint_interval)
    raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(POLICIES)}")


def check_policy_name(name: str) -> None:
    """Raise ValueError naming the choices unless ``make_policy`` knows ``name``."""
    if name not in POLICY_NAMES:
        raise ValueError(f"unknown policy {name!r}; choose from {', '.join(POLICIES)} "
                         f"(<base>: {', '.join(QUEUE_BASES)})")
