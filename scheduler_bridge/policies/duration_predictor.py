"""Online job-duration predictor for QSSF: a gradient-boosted regressor refit as
jobs finish, blended with a running history mean per (user, VC, GPUs) key.

Features of a job (known at submit): VC, log2 GPUs, submit hour, and history
statistics of its key and its VC (mean log duration, log count) as of the last
refit. The history part is an exponential moving average of the key's log
durations (``ema``), updated at every finish: on Philly, recent jobs of the same
(VC, GPUs) predict a job far better than the all-time mean (Spearman 0.69 vs 0.45). Because the history features only change at refits, predictions between
refits are a function of (key, hour), cached per refit: the model is called once
per refit for all known keys (plus once per new key), never once per job.
Target: log(duration). Refits happen after ``first_fit`` finished jobs, then each
time the number of finished jobs grows by ``refit_growth`` x (at least
``refit_min`` jobs), on the most recent ``max_train`` jobs.

>>> p = DurationPredictor(); p.reset()
>>> p.predict(user="", vc="a", gpus=1, hour=3)   # nothing learnt yet: the default
3600.0
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np
from threadpoolctl import threadpool_limits


FEATURES = ("vc", "log2_gpus", "submit_hour", "key_mean_log_s", "key_log_count",
            "vc_mean_log_s", "vc_log_count")


class DurationPredictor:
    def __init__(self, seed: int = 0, first_fit: int = 200, refit_growth: float = 0.5,
                 refit_min: int = 1000, max_train: int = 10000, history_weight: float = 0.7,
                 ema: float = 0.3, default: float = 3600.0, max_iter: int = 40):
        self.seed, self.first_fit, self.refit_growth = seed, first_fit, refit_growth
        self.refit_min, self.max_train, self.history_weight = refit_min, max_train, history_weight
        self.default, self.max_iter, self.ema = default, max_iter, ema
        self.reset()

    def reset(self) -> None:
        self.model = None
        self.n_fits = 0
        self._next_fit = self.first_fit
        self._X: deque = deque(maxlen=self.max_train)
        self._y: deque = deque(maxlen=self.max_train)
        self._key_sum: dict = {}     # key -> [sum log d, count], updated at every finish
        self._vc_sum: dict = {}
        self._key_ema: dict = {}     # key -> EMA of log duration, updated at every finish
        self._frozen_key: dict = {}  # snapshots used as model features, updated at refits
        self._frozen_vc: dict = {}
        self._vc_code: dict = {}
        self._cache: dict = {}
        self._glob = [0.0, 0]

    # ---- features ---------------------------------------------------------------
    def _features(self, user, vc, gpus, hours) -> np.ndarray:
        ks, kc = self._frozen_key.get((user, vc, gpus), (-1.0, 0))  # -1: no history
        vs, vn = self._frozen_vc.get(vc, (-1.0, 0))
        code = self._vc_code.setdefault(vc, len(self._vc_code)) % 250
        rows = [[code, math.log2(gpus), h, ks, math.log1p(kc), vs, math.log1p(vn)] for h in hours]
        return np.asarray(rows, dtype=float)

    def features(self, user: str, vc: str, gpus: int, hour: int) -> np.ndarray:
        """The model's feature row for a job submitted now (store it; train on it)."""
        return self._features(user, vc, gpus, [hour])[0]

    # ---- prediction -------------------------------------------------------------
    def _model_log(self, user, vc, gpus, hour) -> float:
        key = (user, vc, gpus)
        if key not in self._cache:
            with threadpool_limits(1):  # tiny batches: OpenMP start-up costs more than it saves
                self._cache[key] = self.model.predict(self._features(user, vc, gpus, range(24)))
        return float(self._cache[key][hour])

    def predict(self, user: str, vc: str, gpus: int, hour: int) -> float:
        """Predicted duration in seconds."""
        hist_log = self._key_ema.get((user, vc, gpus))
        if self.model is None:
            if hist_log is None:
                v = self._vc_sum.get(vc)
                if v and v[1] >= 3:
                    hist_log = v[0] / v[1]
                elif self._glob[1]:
                    hist_log = self._glob[0] / self._glob[1]
                else:
                    return self.default
            return math.exp(hist_log)
        m = self._model_log(user, vc, gpus, hour)
        if hist_log is not None:
            m = self.history_weight * hist_log + (1 - self.history_weight) * m
        return math.exp(m)

    # ---- learning ---------------------------------------------------------------
    def observe(self, features: np.ndarray, user: str, vc: str, gpus: int, duration: float) -> bool:
        """Record a finished job; refit when due. Returns True if the model changed."""
        y = math.log(max(duration, 1.0))
        self._X.append(features)
        self._y.append(y)
        for d, k in ((self._key_sum, (user, vc, gpus)), (self._vc_sum, vc)):
            s = d.setdefault(k, [0.0, 0])
            s[0] += y
            s[1] += 1
        k = (user, vc, gpus)
        prev = self._key_ema.get(k)
        self._key_ema[k] = y if prev is None else (1 - self.ema) * prev + self.ema * y
        self._glob[0] += y
        self._glob[1] += 1
        if self._glob[1] < self._next_fit:
            return False
        self._fit()
        n = self._glob[1]
        self._next_fit = n + max(self.refit_min, int(self.refit_growth * n))
        return True

    def _fit(self) -> None:
        # scikit-learn loads at the first fit (after `first_fit` finished jobs), not with QSSF: the
        # live allocator imports every policy, and a restarted allocator would pay 2-25 s for it
        from sklearn.ensemble import HistGradientBoostingRegressor

        X, y = np.asarray(self._X), np.asarray(self._y)
        model = HistGradientBoostingRegressor(
            max_iter=self.max_iter, learning_rate=0.1, max_leaf_nodes=31,
            categorical_features=[0], random_state=self.seed)
        with threadpool_limits(1):  # deterministic and cheap on a shared box
            model.fit(X, y)
        self.model = model
        self.n_fits += 1
        self._frozen_key = {k: (s / c, c) for k, (s, c) in self._key_sum.items()}
        self._frozen_vc = {k: (s / c, c) for k, (s, c) in self._vc_sum.items()}
        keys = list(self._key_sum)
        rows = np.concatenate([self._features(u, v, g, range(24)) for u, v, g in keys])
        with threadpool_limits(1):
            pred = model.predict(rows).reshape(len(keys), 24)
        self._cache = dict(zip(keys, pred))
        self._median = np.median(X, axis=0)

    def explain(self, user: str, vc: str, gpus: int, hour: int) -> dict:
        """Why a job gets its predicted duration: the history term, the model term,
        the feature values and, per feature, how much the model's log-duration drops
        when that feature is replaced by its training median (a local attribution)."""
        key = (user, vc, gpus)
        out = {"predicted_s": self.predict(user, vc, gpus, hour),
               "history_log_s": self._key_ema.get(key), "history_weight": self.history_weight}
        if self.model is None:
            out["source"] = "history only (model not fitted yet)"
            return out
        x = self._features(user, vc, gpus, [hour])
        probes = np.repeat(x, len(FEATURES) + 1, axis=0)
        for i in range(len(FEATURES)):
            probes[i + 1, i] = self._median[i]
        with threadpool_limits(1):
            pred = self.model.predict(probes)
        out["source"] = "history and model" if out["history_log_s"] is not None else "model"
        out["model_log_s"] = float(pred[0])
        out["features"] = dict(zip(FEATURES, map(float, x[0])))
        out["contributions_log_s"] = {f: float(pred[0] - pred[i + 1]) for i, f in enumerate(FEATURES)}
        return out
