"""Trainables that fail, for the fault tests' `hpo run` sweeps.

Every trial process imports the module its trainable lives in. These live here, away from the
test modules (which import torch, pandas and hpo: about 3 s of CPU per process on a 2-core box),
so a trial's process imports Ray Tune alone, as a user's small trainable would.
"""

from __future__ import annotations

from pathlib import Path

from ray import tune


def always_fails_for_zero(config):
    if config["x"] == 0:
        raise ValueError("x must not be zero")
    tune.report({"score": float(config["x"])})


def fails_before_reporting(config):
    """x=0 reads a key the config does not have, on every attempt; x=1 fails on its first attempt
    only (its data server did not answer), then reports; x=2 reports."""
    if config["x"] == 1:
        marker = Path(config["markers"]) / "x1_failed_once"
        if not marker.exists():
            marker.touch()
            raise ConnectionError("the data server did not answer")
    if config["x"] == 0:
        config["channels"]  # the user's typo
    tune.report({"score": float(config["x"])})
