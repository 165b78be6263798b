"""Trace loaders: the shipped Philly CSV, Pollux workloads and Helios ``cluster_log.csv``.

Every loader returns a ``Trace`` (jobs sorted by submit time, starting at 0) and
raises ``TraceError`` naming the file, line and column of the first bad row.

>>> from scheduler_bridge.data_files import default_traces_dir
>>> trace = load_philly(default_traces_dir() / "pollux" / "traces" / "philly.csv")  # doctest: +SKIP
>>> len(trace)                                                                       # doctest: +SKIP
82247
"""

from __future__ import annotations

import math
from datetime import datetime, timezone
from pathlib import Path

from ..data_files import TraceError, csv_rows, read_text
from ..jobs import ElasticSpec, Job, Trace, make_trace
from ..app_profiles import load_profiles

FORMATS = ("philly", "pollux", "helios")
MAX_SECONDS = 1e9      # a job duration of ~31 years or more is a broken row, not a job
MAX_TIMESTAMP = 1e11   # seconds; year ~5100


def _rows(path: Path, required: tuple[str, ...]):
    """Yield (line_number, row dict) checking the header has ``required`` columns;
    a file with a header and no rows is an error too."""
    _, reader = csv_rows(path, read_text(path), required)
    rows = 0
    for line, row in reader:
        rows += 1
        yield line, row
    if not rows:
        raise TraceError(f"{path}:2: no job rows after the header")


def _num(path, line, row, col, *, integer=False, minimum=None, maximum=None):
    raw = row.get(col)
    try:
        val = float(raw)
        if not math.isfinite(val):
            raise ValueError
        if integer:
            if val != int(val):
                raise ValueError
            val = int(val)
    except (TypeError, ValueError):
        kind = "an integer" if integer else "a number"
        raise TraceError(f"{path}:{line}: column {col!r} = {raw!r} is not {kind}") from None
    if minimum is not None and val < minimum:
        raise TraceError(f"{path}:{line}: column {col!r} = {raw!r} must be >= {minimum}")
    if maximum is not None and val > maximum:
        raise TraceError(f"{path}:{line}: column {col!r} = {raw!r} must be <= {maximum:g}")
    return val


def _unique(path, line, row, col, seen: dict[tuple[str, str], int]) -> None:
    """Refuse a job id that an earlier row already gave: a file pasted into itself, or two logs
    joined, would otherwise replay those jobs twice and write two rows of one name to --csv. Ids
    are per cluster where a ``cluster`` column says which (Helios' ``all_cluster_log.csv`` joins
    its clusters' logs so)."""
    key = (row.get("cluster", ""), row[col])
    if key in seen:
        where = f" of cluster {key[0]!r}" if key[0] else ""
        raise TraceError(f"{path}:{line}: column {col!r} = {key[1]!r} is the id of the job{where} at line "
                         f"{seen[key]} too; every job needs its own")
    seen[key] = line


def _time(path, line, row, col) -> float:
    raw = (row.get(col) or "").strip()
    try:
        val = float(raw)
    except ValueError:
        pass
    else:
        if not (math.isfinite(val) and 0 <= val <= MAX_TIMESTAMP):
            raise TraceError(f"{path}:{line}: column {col!r} = {raw!r} must be seconds in "
                             f"[0, {MAX_TIMESTAMP:g}]")
        return val
    try:
        when = datetime.fromisoformat(raw)
        if when.tzinfo is None:  # trace dates carry no zone: read them as UTC, on every machine
            when = when.replace(tzinfo=timezone.utc)
        val = when.timestamp()
    except ValueError:
        raise TraceError(f"{path}:{line}: column {col!r} = {raw!r} is neither seconds "
                         "nor a date like 2017-10-09 07:01:55") from None
    if val < 0:
        raise TraceError(f"{path}:{line}: column {col!r} = {raw!r} is before 1970")
    return val


def load_philly(path) -> Trace:
    """Pollux's Philly-derived CSV: ``timestamp,duration,num_gpus,gpu_time,cluster``."""
    jobs = []
    for line, row in _rows(path, ("timestamp", "duration", "num_gpus", "cluster")):
        jobs.append(Job(job_id=line, submit=_time(path, line, row, "timestamp"),
                        gpus=_num(path, line, row, "num_gpus", integer=True, minimum=1),
                        duration=_num(path, line, row, "duration", minimum=0, maximum=MAX_SECONDS),
                        vc=row["cluster"], name=f"philly-{line}"))
    return make_trace(jobs, source=str(path))


def load_helios(path, *, skip_cpu_jobs: bool = True) -> Trace:
    """Helios ``cluster_log.csv``: ``job_id,user,vc,gpu_num,...,submit_time,...,duration``.
    CPU-only jobs (``gpu_num`` 0) are skipped unless ``skip_cpu_jobs`` is False."""
    jobs = []
    cols = ("job_id", "user", "vc", "gpu_num", "submit_time", "duration")
    seen: dict[tuple[str, str], int] = {}
    for line, row in _rows(path, cols):
        _unique(path, line, row, "job_id", seen)
        gpus = _num(path, line, row, "gpu_num", integer=True, minimum=0)
        if gpus == 0:
            if skip_cpu_jobs:
                continue
            raise TraceError(f"{path}:{line}: column 'gpu_num' = 0 (CPU job)")
        jobs.append(Job(job_id=line, submit=_time(path, line, row, "submit_time"), gpus=gpus,
                        duration=_num(path, line, row, "duration", minimum=0, maximum=MAX_SECONDS),
                        user=row["user"], vc=row["vc"], name=row["job_id"]))
    if not jobs:
        raise TraceError(f"{path}: no GPU jobs (every row has gpu_num 0, and CPU jobs are skipped)")
    return make_trace(jobs, source=str(path))


def pollux_profiles_dir(path, profiles_dir=None) -> Path:
    """Where a Pollux workload's application profiles are read: ``profiles_dir``, else the
    ``../traces`` folder beside the workload's folder, as the shipped workloads have it."""
    return Path(profiles_dir) if profiles_dir else Path(path).parent.parent / "traces"


def load_pollux(path, profiles_dir=None) -> Trace:
    """A Pollux workload CSV: ``name,time,application,num_replicas,batch_size``.
    Jobs become elastic jobs; with ``profiles_dir`` (default: ``../traces`` beside
    the workload folder) their ``duration`` is the isolated run time at the
    requested GPUs and batch size, computed from the measured profiles."""
    path = Path(path)
    profiles_dir = pollux_profiles_dir(path, profiles_dir)
    apps = load_profiles(profiles_dir)
    jobs = []
    seen: dict[tuple[str, str], int] = {}
    for line, row in _rows(path, ("name", "time", "application", "num_replicas", "batch_size")):
        _unique(path, line, row, "name", seen)
        app = row["application"]
        if app not in apps:
            raise TraceError(f"{path}:{line}: column 'application' = {app!r} has no profile "
                             f"in {profiles_dir} (known: {sorted(apps)})")
        gpus = _num(path, line, row, "num_replicas", integer=True, minimum=1)
        prof = apps[app]
        bsz = _num(path, line, row, "batch_size", integer=True, minimum=1)
        if not prof.min_local <= bsz <= prof.max_bsz:
            # no step time or gradient statistics were measured there; below min_local the job
            # cannot run even on one GPU (its duration would be infinite)
            raise TraceError(f"{path}:{line}: column 'batch_size' = {row['batch_size']!r} is outside "
                             f"the batches {app}'s profile measured ({prof.min_local} to {prof.max_bsz})")
        spec = ElasticSpec(app, bsz, 1, prof.max_gpus)
        submit = _num(path, line, row, "time", minimum=0, maximum=MAX_TIMESTAMP)
        jobs.append(Job(job_id=line, submit=submit, gpus=gpus,
                        duration=prof.isolated_runtime(gpus, bsz), name=row["name"],
                        vc=app, elastic=spec))
    return make_trace(jobs, source=str(path))


def load_trace(path, fmt: str, profiles_dir=None) -> Trace:
    """Dispatch on ``fmt`` (one of ``FORMATS``)."""
    if fmt == "philly":
        return load_philly(path)
    if fmt == "helios":
        return load_helios(path)
    if fmt == "pollux":
        return load_pollux(path, profiles_dir)
    raise TraceError(f"unknown trace format {fmt!r}; choose one of {', '.join(FORMATS)}")
