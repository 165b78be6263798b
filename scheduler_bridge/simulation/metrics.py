"""Metrics of a run: JCT, queueing delay, makespan, utilisation, deadline hits,
finish-time fairness; per-job table and summary dict.

Energy (``power_model.energy_summary``): powered node-hours, kWh and the
utilisation of powered-on GPUs; without CES every node is on throughout.

Finish-time fairness is Themis' rho = JCT / (run time alone on the job's
requested GPUs); rho = 1 means the shared cluster cost the job nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ..jobs import Trace
from ..power_model import energy_summary
from .run_log import RunLog


@dataclass
class SimResult:
    policy: str
    trace: Trace
    num_gpus: int
    log: RunLog
    wall_s: float
    deadline: float | None = None
    params: dict = field(default_factory=dict)

    def jobs_frame(self) -> pd.DataFrame:
        """One row per job: submit, start, finish, jct, queue, gpus, duration, rho, restarts."""
        t = self.trace.jobs
        df = pd.DataFrame({
            "job_id": [j.job_id for j in t], "name": [j.name for j in t],
            "vc": [j.vc for j in t], "gpus": [j.gpus for j in t],
            "submit": [j.submit for j in t], "duration": [j.duration for j in t],
            "start": self.log.first_start, "finish": self.log.finish,
            "restarts": self.log.restarts,
        })
        df["jct"] = df.finish - df.submit
        df["queue"] = df.start - df.submit
        df["rho"] = df.jct / df.duration.clip(lower=1.0)
        return df

    def utilization_series(self) -> tuple[np.ndarray, np.ndarray]:
        """(times, fraction of GPUs busy from that time on)."""
        return (np.frombuffer(self.log.util_t) if not isinstance(self.log.util_t, np.ndarray)
                else self.log.util_t,
                np.asarray(self.log.util_busy, dtype=float) / self.num_gpus)

    def summary(self) -> dict:
        df = self.jobs_frame()
        done = df[df.finish.notna()]
        t, u = self.utilization_series()
        makespan = float(done.finish.max()) if len(done) else 0.0
        if len(t) > 1 and makespan > 0:
            dt = np.diff(np.append(t, makespan).clip(max=makespan))
            utilization = float(np.sum(u * np.clip(dt, 0, None)) / makespan)
        else:
            utilization = 0.0
        q = lambda s, p: float(np.percentile(s, p)) if len(s) else math.nan  # noqa: E731
        out = {
            "policy": self.policy, "trace": self.trace.source, "gpus": self.num_gpus,
            "jobs": len(df), "completed": int(len(done)),
            "avg_jct": float(done.jct.mean()) if len(done) else math.nan,
            "p50_jct": q(done.jct, 50), "p99_jct": q(done.jct, 99),
            "avg_queue": float(done.queue.mean()) if len(done) else math.nan,
            "p999_queue": q(done.queue, 99.9),
            "makespan": makespan, "utilization": utilization,
            "avg_rho": float(done.rho.mean()) if len(done) else math.nan,
            "max_rho": float(done.rho.max()) if len(done) else math.nan,
            "wall_s": self.wall_s,
        }
        if self.deadline is not None:
            out["deadline"] = self.deadline
            out["completed_by_deadline"] = int((done.finish <= self.deadline).sum())
        gpn = self.params.get("gpus_per_node") or self.num_gpus
        out.update(energy_summary(t, self.log.util_busy, self.log.power_t, self.log.power_on,
                                  num_nodes=math.ceil(self.num_gpus / gpn), gpus=self.num_gpus,
                                  end=makespan, model=self.log.power_model))
        out.update(self.log.extra)
        out.update(self.params)
        return out

    def to_csv(self, path) -> None:
        self.jobs_frame().to_csv(path, index=False)
