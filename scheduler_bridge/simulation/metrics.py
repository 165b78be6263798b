"""Metrics of a run: JCT, queueing delay, makespan, utilisation, deadline hits,
finish-time fairness; per-job table and summary dict.

Energy (``energy_summary``, priced by ``power_model.PowerModel``): powered node-hours, kWh and
the utilisation of powered-on GPUs; without CES every node is on throughout.

Finish-time fairness is Themis' rho = JCT / (run time alone on the job's
requested GPUs); rho = 1 means the shared cluster cost the job nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ..jobs import Trace
from ..power_model import PowerModel
from .run_log import RunLog


def energy_summary(util_t, util_busy, power_t, power_on, num_nodes: int, gpus: int,
                   end: float, model: PowerModel | None = None) -> dict:
    """Powered node-hours, kWh and utilisation of powered-on GPUs over [0, end].

    ``util_*``: busy GPUs from each time on; ``power_*``: nodes on or booting from
    each time on (empty: every node on throughout, the cluster without CES)."""
    model = model or PowerModel()
    t = np.asarray(util_t, dtype=float)
    b = np.asarray(util_busy, dtype=float)
    if end <= 0 or not len(t):
        return {"powered_node_hours": 0.0, "energy_kwh": 0.0, "on_utilization": 0.0,
                "powered_down_node_hours": 0.0}
    pt = np.asarray(power_t, dtype=float) if len(power_t) else np.array([0.0])
    pn = np.asarray(power_on, dtype=float) if len(power_on) else np.array([float(num_nodes)])
    grid = np.union1d(t, pt)
    grid = grid[grid < end]
    dt = np.diff(np.append(grid, end))
    busy = b[np.clip(np.searchsorted(t, grid, side="right") - 1, 0, None)]
    on = pn[np.clip(np.searchsorted(pt, grid, side="right") - 1, 0, None)]
    busy = np.where(grid < t[0], 0.0, busy)
    node_s = float(np.sum(on * dt))
    busy_s = float(np.sum(busy * dt))
    joules = float(np.sum(model.watts(on, busy, num_nodes - on) * dt))
    gpn = gpus / num_nodes
    return {"powered_node_hours": node_s / 3600,
            "powered_down_node_hours": (num_nodes * end - node_s) / 3600,
            "energy_kwh": joules / 3.6e6,
            "on_utilization": busy_s / (node_s * gpn) if node_s > 0 else 0.0}


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
