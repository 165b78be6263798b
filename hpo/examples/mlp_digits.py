"""An MLP classifier on scikit-learn's bundled handwritten digits (1,797 8x8 images, 10 classes).

The model factory takes `width` (hidden units), `depth` (hidden layers) and `dropout`; its output
layer is named `readout`, which is how hydro-hpo's muP scaling finds the layer to replace.
muP knobs (config keys, defaults = the plain model): `output_mult` and `init_std`.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator, Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from hpo.base.workload import Batch, Workload
from hpo.examples.model_from_config import build_from_config

NUM_FEATURES = 64
NUM_CLASSES = 10


class MLP(nn.Module):
    def __init__(
        self, width: int, depth: int = 2, dropout: float = 0.0, output_mult: float = 1.0, init_std: float | None = None
    ):
        super().__init__()
        layers: list[nn.Module] = [nn.Linear(NUM_FEATURES, width), nn.ReLU()]
        for _ in range(depth - 1):
            layers += [nn.Linear(width, width), nn.ReLU()]
        if dropout > 0:
            layers.append(nn.Dropout(dropout))
        self.body = nn.Sequential(*layers)
        self.readout = nn.Linear(width, NUM_CLASSES)
        # --- muP: output multiplier and init scale (transferable hyperparameters) ---
        self.output_mult = output_mult
        if init_std is not None:  # under hpo.scaling it is redrawn with mup.init's width rules
            for layer in self.modules():
                if isinstance(layer, nn.Linear):
                    nn.init.normal_(layer.weight, std=init_std)
                    nn.init.zeros_(layer.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (N, 64) -> (N, 10)
        return self.output_mult * self.readout(self.body(x))


@lru_cache(maxsize=1)
def load_digits_split() -> tuple[Batch, Batch]:
    """Standardised digits, split 80/20 with a fixed permutation (the same for every trial)."""
    features, labels = _digits_arrays()
    x = torch.tensor(features, dtype=torch.float32)
    y = torch.tensor(labels, dtype=torch.long)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    x, y = x[order], y[order]
    cut = int(0.8 * len(x))
    mean, std = x[:cut].mean(dim=0), x[:cut].std(dim=0).clamp_min(1e-3)
    x = (x - mean) / std
    return (x[:cut], y[:cut]), (x[cut:], y[cut:])


def _digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """The digits as scikit-learn ships them, read from its bundled file without importing it.

    Importing `sklearn.datasets` costs a trial process over a second (scipy and the estimator
    stack), several times the whole first epoch; the data are one small CSV in the package. If a
    scikit-learn release moves that file, its own loader is used.
    """
    spec = importlib.util.find_spec("sklearn")
    bundled = Path(spec.submodule_search_locations[0]) / "datasets" / "data" / "digits.csv.gz" if spec else None
    if bundled is not None and bundled.is_file():
        table = np.loadtxt(bundled, delimiter=",")
        return table[:, :-1], table[:, -1].astype(np.int64)
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise ImportError("the mlp_digits example loads scikit-learn's digits: pip install 'hydro-hpo[examples]'") from None
    data = load_digits()
    return data.data, data.target


class DigitsMLP(Workload):
    name = "mlp_digits"
    metric = "val_loss"
    defaults = {
        "width": 64,
        "depth": 2,
        "dropout": 0.0,
        "output_mult": 1.0,
        "init_std": None,
        "batch_size": 64,
        "optimizer": "adam",
        "lr": 1e-3,
    }
    steps_per_iteration = 22  # about one epoch at batch size 64

    def build_model(self, config: Mapping[str, Any]) -> nn.Module:
        return build_from_config(MLP, config)

    def train_batches(self, config: Mapping[str, Any], seed: int) -> Iterator[Batch]:
        (x, y), _ = load_digits_split()
        batch_size = int(config["batch_size"])
        generator = torch.Generator().manual_seed(seed)
        while True:
            order = torch.randperm(len(x), generator=generator)
            for start in range(0, len(x) - batch_size + 1, batch_size):
                index = order[start : start + batch_size]
                yield x[index], y[index]

    def eval_batches(self, config: Mapping[str, Any]) -> list[Batch]:
        _, validation = load_digits_split()
        return [validation]


workload = DigitsMLP()
