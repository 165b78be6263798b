"""Tiny `Workload`s that corpus sweep files name: one correct, the others each wrong once."""

from __future__ import annotations

from collections import OrderedDict

import torch
from torch import nn

from hpo.base.workload import Workload


class Tiny(Workload):
    name = "tiny"
    defaults = {"width": 8, "batch_size": 4, "depth": 1}

    def layers(self, width: int) -> "OrderedDict[str, nn.Module]":
        return OrderedDict(hidden=nn.Linear(4, width), act=nn.ReLU(), readout=nn.Linear(width, 2))

    def build_model(self, config):
        return nn.Sequential(self.layers(int(config["width"])))

    def train_batches(self, config, seed):
        generator = torch.Generator().manual_seed(seed)
        while True:
            x = torch.randn(int(config["batch_size"]), 4, generator=generator)
            yield x, (x[:, 0] > 0).long()

    def eval_batches(self, config):
        x = torch.randn(16, 4, generator=torch.Generator().manual_seed(1))
        return [(x, (x[:, 0] > 0).long())]


class HeadNamed(Tiny):
    """Its output layer is `head`, so muP finds no `readout`."""

    def layers(self, width):
        return OrderedDict(hidden=nn.Linear(4, width), act=nn.ReLU(), head=nn.Linear(width, 2))


class FixedWidth(Tiny):
    """Ignores `width`: muP has nothing to scale."""

    def build_model(self, config):
        return nn.Sequential(self.layers(16))


class BrokenFactory(Tiny):
    """Its model factory reads a key nobody gives it."""

    def build_model(self, config):
        return nn.Sequential(self.layers(int(config["hidden_size"])))


tiny = Tiny()
head_named = HeadNamed()
fixed_width = FixedWidth()
broken_factory = BrokenFactory()
