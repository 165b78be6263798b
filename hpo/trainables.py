"""Finding the trainable a sweep names: `package.module:attribute` or a built-in example name."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from ray import cloudpickle

from hpo.workload import Workload

BUILTIN = {
    "mlp_digits": "hpo.examples.mlp_digits:workload",
    "char_gpt": "hpo.examples.char_gpt:workload",
}


class TrainableNotFound(LookupError):
    pass


def resolve_trainable(reference: str, search_dir: str | Path | None = None) -> Workload | Callable[..., Any]:
    """Import what `reference` names. `search_dir` (the sweep file's folder) is importable too."""
    target = BUILTIN.get(reference, reference)
    module_name, sep, attribute = target.partition(":")
    if not sep or not module_name or not attribute:
        raise TrainableNotFound(
            f"{reference!r} is neither a built-in example ({', '.join(BUILTIN)}) nor 'package.module:function'"
        )
    if search_dir is not None and str(search_dir) not in sys.path:
        sys.path.append(str(search_dir))
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise TrainableNotFound(f"cannot import module {module_name!r}: {exc}") from None
    _ship_by_value_if_local(module, search_dir)
    try:
        trainable = getattr(module, attribute)
    except AttributeError:
        raise TrainableNotFound(f"module {module_name!r} has no attribute {attribute!r}") from None
    if not (isinstance(trainable, Workload) or callable(trainable)):
        raise TrainableNotFound(f"{reference!r} is neither a Workload nor a callable trainable")
    return trainable


def _ship_by_value_if_local(module: ModuleType, search_dir: str | Path | None) -> None:
    """A module next to the sweep file is not importable on Ray workers: pickle its code instead."""
    origin = getattr(module, "__file__", None)
    if search_dir is None or origin is None:
        return
    if Path(origin).resolve().is_relative_to(Path(search_dir).resolve()):
        cloudpickle.register_pickle_by_value(module)


def reported_metrics(trainable: Workload | Callable[..., Any]) -> frozenset[str] | None:
    """The metrics a trainable is known to report, or None when it does not say.

    Workloads report what `hpo.training.TrialTrainer` reports; a function trainable may declare
    `reported_metrics = (...)` to get the same up-front check.
    """
    if isinstance(trainable, Workload):
        names = {f"val_{key}" for key in trainable.eval_metric_names}
        return frozenset(names | {"train_loss", "step", "training_iteration"})
    declared = getattr(trainable, "reported_metrics", None)
    return frozenset(declared) | {"training_iteration"} if declared else None
