"""Function trainables that corpus sweep files name: one correct, the others each wrong once."""

from __future__ import annotations


def train(config):
    """A Tune function trainable that declares what it reports."""
    from ray import tune

    tune.report({"score": float(config["x"])})


train.reported_metrics = ("score",)


def no_config():
    """Tune calls a trainable with the config; this one takes nothing."""


def two_required(config, data):
    """Tune passes only the config; `data` would be missing."""


def undeclared(config):
    """Reports something, but does not say what: the metric cannot be checked."""
