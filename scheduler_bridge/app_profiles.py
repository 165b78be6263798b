"""Measured application profiles (Pollux, OSDI'21) and the goodput model built on them.

For each application ``traces/<app>/`` holds step times measured per placement
and local batch size, and per global batch size the gradient statistics
(``grad_sqr``, ``grad_var``) of every epoch. Goodput = throughput x statistical
efficiency, in *progress* units (iterations at the initial batch size) per second:

    gain(B)  = (var + sqr) / (var / (B / B0) + sqr)        # statistical efficiency
    goodput  = gain(B) / (step_time + accum_steps * (step_time - sync_time))

A job finishes after ``max_epochs`` epochs of progress. Epoch counts and the
yolov3 local-batch limit are those of the Pollux artifact (petuum/adaptdl,
``simulator/applications.py``); the data is Apache-2.0, see the traces README.

>>> apps = load_profiles(default_traces_dir() / "pollux" / "traces")   # doctest: +SKIP
>>> apps["cifar10"].best_batch(gpus=4, gpus_per_node=4, epoch=0)        # doctest: +SKIP
"""

from __future__ import annotations

import glob
import math
import os
from functools import lru_cache
from pathlib import Path

import numpy as np

from .data_files import TraceError, csv_rows, default_traces_dir, read_text

# name -> (max_epochs, max_local_bsz or None, max_gpus or None), from the Pollux artifact.
APP_SETTINGS = {
    "bert": (2, None, None),
    "cifar10": (100, None, None),
    "ncf": (10, None, 1),
    "imagenet": (90, None, None),
    "deepspeech2": (80, None, None),
    "yolov3": (50, 8, None),
}
MAX_GPUS = 64


def _read(path: Path, cols: tuple[str, ...]) -> dict[str, np.ndarray]:
    _, reader = csv_rows(path, read_text(path), cols)
    data = {c: [] for c in cols}
    for line, row in reader:
        for c in cols:
            try:
                data[c].append(float(row[c]))
            except (TypeError, ValueError):
                raise TraceError(f"{path}:{line}: column {c!r} = {row[c]!r} "
                                 "is not a number") from None
    return {c: np.asarray(v) for c, v in data.items()}


class AppProfile:
    """One application's measured throughput and gradient statistics."""

    def __init__(self, trace_dir: Path, max_epochs=None, max_local_bsz=None, max_gpus=None):
        trace_dir = Path(trace_dir)
        self.name = trace_dir.name
        val = {}
        for p in glob.glob(os.path.join(trace_dir, "validation-*.csv")):
            bsz = int(Path(p).stem.split("-")[-1])
            val[bsz] = _read(Path(p), ("progress", "grad_sqr", "grad_var"))
        if not val:
            raise TraceError(f"{trace_dir}: no validation-<batch>.csv files")
        self.val_bsz = np.array(sorted(val))
        self.max_epochs = max_epochs or min(len(v["progress"]) for v in val.values())
        e = self.max_epochs
        self.grad_sqr = np.stack([val[b]["grad_sqr"][:e] for b in self.val_bsz])  # (nB, E)
        self.grad_var = np.stack([val[b]["grad_var"][:e] for b in self.val_bsz])
        prog = np.min(np.stack([val[b]["progress"][:e] for b in self.val_bsz]), axis=0)
        self.epoch_progress = np.concatenate([[0.0], prog])  # progress at the end of each epoch
        self.init_bsz = int(self.val_bsz[0])
        self.max_bsz = int(self.val_bsz[-1])

        pl = _read(trace_dir / "placements.csv", ("placement", "local_bsz", "step_time", "sync_time"))
        sc = _read(trace_dir / "scalability.csv",
                   ("num_nodes", "num_replicas", "local_bsz", "step_time", "sync_time"))
        self.min_local = int(pl["local_bsz"].min())
        self.max_local = int(max_local_bsz or pl["local_bsz"].max())
        self.max_gpus = int(min(max_gpus or MAX_GPUS, self.max_bsz // self.min_local))
        self._by_placement: dict[int, tuple] = {}
        groups: dict[tuple[int, int], dict[float, list]] = {}
        for pid in np.unique(pl["placement"]).astype(int):
            m = pl["placement"] == pid
            order = np.argsort(pl["local_bsz"][m])
            self._by_placement[pid] = (pl["local_bsz"][m][order], pl["step_time"][m][order],
                                       pl["sync_time"][m][order])
            digits = [int(d) for d in str(pid)]
            key = (len(digits), sum(digits))
            for lb, st, sy in zip(*self._by_placement[pid]):
                groups.setdefault(key, {}).setdefault(lb, []).append((st, sy))
        for nn, nr, lb, st, sy in zip(sc["num_nodes"], sc["num_replicas"], sc["local_bsz"],
                                      sc["step_time"], sc["sync_time"]):
            groups.setdefault((int(nn), int(nr)), {}).setdefault(lb, []).append((st, sy))
        self._by_shape = {}
        for key, d in groups.items():
            lbs = np.array(sorted(d))
            vals = np.array([np.mean(d[lb], axis=0) for lb in lbs])
            self._by_shape[key] = (lbs, vals[:, 0], vals[:, 1])

    # ---- throughput -------------------------------------------------------------
    @staticmethod
    def placement_shape(gpus: int, gpus_per_node: int) -> tuple[int, ...]:
        """GPUs per node under the cluster's placement rule (whole nodes first)."""
        if gpus <= gpus_per_node:
            return (gpus,)
        whole, rest = divmod(gpus, gpus_per_node)
        return (gpus_per_node,) * whole + ((rest,) if rest else ())

    @lru_cache(maxsize=None)
    def step_time(self, gpus: int, gpus_per_node: int, atomic_bsz: int) -> tuple[float, float]:
        """(step_time, sync_time) in seconds of one step at ``atomic_bsz`` per GPU."""
        shape = self.placement_shape(gpus, gpus_per_node)
        pid = int("".join(map(str, sorted(shape)))) if max(shape) < 10 else -1
        curve = self._by_placement.get(pid) or self._by_shape.get((len(shape), gpus))
        if curve is not None:
            lbs, st, sy = curve
            return float(np.interp(atomic_bsz, lbs, st)), float(np.interp(atomic_bsz, lbs, sy))
        # Not measured: interpolate in the replica count between the nearest measured
        # shapes with the fewest nodes per replica count.
        best: dict[int, tuple[int, int]] = {}
        for (nn, nr) in self._by_shape:
            if nr not in best or nn < best[nr][0]:
                best[nr] = (nn, nr)
        reps = sorted(best)
        lo = max([r for r in reps if r <= gpus], default=reps[0])
        hi = min([r for r in reps if r >= gpus], default=reps[-1])
        def at(r):
            lbs, st, sy = self._by_shape[best[r]]
            return np.interp(atomic_bsz, lbs, st), np.interp(atomic_bsz, lbs, sy)
        (s0, y0), (s1, y1) = at(lo), at(hi)
        w = 0.0 if hi == lo else (gpus - lo) / (hi - lo)
        return float(s0 + w * (s1 - s0)), float(y0 + w * (y1 - y0))

    # ---- statistical efficiency ---------------------------------------------------
    def grad_stats(self, batch: float, epoch: int) -> tuple[float, float]:
        e = min(epoch, self.max_epochs - 1)
        b = float(np.clip(batch, self.val_bsz[0], self.val_bsz[-1]))
        return (float(np.interp(b, self.val_bsz, self.grad_sqr[:, e])),
                float(np.interp(b, self.val_bsz, self.grad_var[:, e])))

    def efficiency(self, batch: float, epoch: int) -> float:
        """Statistical efficiency of global batch ``batch`` relative to the initial batch
        (progress per step at ``batch`` / progress per step at ``init_bsz``), per sample."""
        sqr, var = self.grad_stats(batch, epoch)
        scale = batch / self.init_bsz
        return (var + sqr) / (var / scale + sqr)

    # ---- goodput ------------------------------------------------------------------
    def batch_config(self, gpus: int, batch: int) -> tuple[int, int, int] | None:
        """(atomic_bsz, accum_steps, real_batch) for ``batch`` on ``gpus`` GPUs, or None."""
        local = math.ceil(batch / gpus - 1e-8)
        if local < self.min_local:
            return None
        accum = math.ceil(local / self.max_local - 1e-8) - 1
        atomic = math.ceil(local / (accum + 1) - 1e-8)
        return atomic, accum, gpus * atomic * (accum + 1)

    @lru_cache(maxsize=None)
    def goodput(self, gpus: int, gpus_per_node: int, batch: int, epoch: int) -> float:
        """Progress per second at ``batch`` on ``gpus`` GPUs during ``epoch``; 0 if infeasible."""
        cfg = self.batch_config(gpus, batch)
        if cfg is None:
            return 0.0
        atomic, accum, real = cfg
        step, sync = self.step_time(gpus, gpus_per_node, atomic)
        total = step + accum * (step - sync)
        return self.efficiency(real, epoch) / total

    @lru_cache(maxsize=None)
    def best_batch(self, gpus: int, gpus_per_node: int, epoch: int) -> tuple[int, float]:
        """The global batch size with the highest goodput on ``gpus`` GPUs, and that goodput."""
        lo = max(self.init_bsz, gpus * self.min_local)
        if lo > self.max_bsz:
            return 0, 0.0
        cands = set(np.unique(np.round(np.geomspace(lo, self.max_bsz, 24))).astype(int))
        cands |= {int(b) for b in self.val_bsz if lo <= b <= self.max_bsz}
        best = max(sorted(cands), key=lambda b: self.goodput(gpus, gpus_per_node, b, epoch))
        return best, self.goodput(gpus, gpus_per_node, best, epoch)

    def epoch_at(self, fraction: float) -> int:
        """The epoch a job is in once ``fraction`` (0..1) of its total progress is done:
        a live job reports how far it got, not the profile's progress units."""
        done = float(np.clip(fraction, 0.0, 1.0)) * self.epoch_progress[-1]
        return min(int(np.searchsorted(self.epoch_progress, done, side="right")) - 1, self.max_epochs - 1)

    def isolated_runtime(self, gpus: int, batch: int, gpus_per_node: int = 4) -> float:
        """Seconds to finish alone on ``gpus`` GPUs at fixed global ``batch``."""
        t = 0.0
        g = gpus
        while self.batch_config(g, batch) is None and g > 1:  # too many GPUs for this batch
            g -= 1
        for e in range(self.max_epochs):
            rate = self.goodput(g, gpus_per_node, batch, e)
            t += (self.epoch_progress[e + 1] - self.epoch_progress[e]) / rate
        return t


@lru_cache(maxsize=8)
def _load(profiles_dir: str) -> dict[str, AppProfile]:
    root = Path(profiles_dir)
    if not root.is_dir():
        raise TraceError(f"{root}: profiles folder not found (expected <app>/placements.csv ...)")
    apps = {}
    for d in sorted(root.iterdir()):
        if (d / "placements.csv").is_file():
            ep, ml, mg = APP_SETTINGS.get(d.name, (None, None, None))
            apps[d.name] = AppProfile(d, ep, ml, mg)
    if not apps:
        raise TraceError(f"{root}: no application profiles (<app>/placements.csv) found")
    return apps


def load_profiles(profiles_dir=None) -> dict[str, AppProfile]:
    """All applications under ``profiles_dir`` (default: the shipped Pollux profiles)."""
    if profiles_dir is None:
        profiles_dir = default_traces_dir() / "pollux" / "traces"
    return _load(str(Path(profiles_dir).resolve()))
