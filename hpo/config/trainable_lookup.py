"""Finding the trainable a sweep names: `package.module:attribute` or a built-in example name.

Two steps, so that checking a sweep file need not run its code: `locate_trainable` finds the
module's file and parses it without executing anything; `resolve_trainable` imports it and decides,
once, what it is (`ResolvedTrainable`): the checks before a sweep and the choice of its engine read
that answer instead of asking again.
Nothing here imports torch or Ray unless the trainable does: `hpo validate` stays fast.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hpo.base.workload import Workload

BUILTIN = {
    "mlp_digits": "hpo.examples.mlp_digits:workload",
    "char_gpt": "hpo.examples.char_gpt:workload",
    "vit_digits": "hpo.examples.vit_digits:workload",
}


class TrainableNotFound(LookupError):
    pass


@dataclass(frozen=True)
class TrainableSource:
    """Where a trainable's code lives, found without running it."""

    module: str
    attribute: str
    #: The module's source file; None for a module without Python source (a C extension, a namespace).
    path: Path | None
    #: The parsed module, for static checks of the trainable's definition.
    tree: ast.Module | None
    #: The folder searched first (the sweep file's) when the module was found in it: code Ray's
    #: workers cannot import unless that folder travels to them (`found_in`); else None.
    code_folder: Path | None = None


def split_reference(reference: str) -> tuple[str, str]:
    """`(module, attribute)` of a trainable reference, built-in names expanded.

    A file beside the sweep file may be named as a file, `train.py:main` or `models/train.py:main`
    (how W&B's `program: train.py` and a shell name it): it is the module `train` or
    `models.train`, found in the sweep file's folder as any module is."""
    target = BUILTIN.get(reference, reference)
    module_name, sep, attribute = target.partition(":")
    if not sep or not module_name or not attribute:
        raise TrainableNotFound(
            f"{reference!r} is neither a built-in example ({', '.join(BUILTIN)}) nor 'package.module:function'"
        )
    if module_name.endswith(".py"):
        path = Path(module_name)
        if path.is_absolute() or ".." in path.parts:
            raise TrainableNotFound(
                f"{module_name!r} is a file outside the sweep file's folder: name a module on the Python path "
                "('package.module:function'), or put the file beside the sweep file"
            )
        module_name = ".".join(path.with_suffix("").parts)
    return module_name, attribute


def locate_trainable(reference: str, search_dir: str | Path | None = None) -> TrainableSource:
    """Find and parse the trainable's module without executing it.

    Raises `TrainableNotFound` for a module that does not exist and `SyntaxError` (with the
    module's file and line) for one that does not parse. A dotted module's parent packages are
    imported by `find_spec`, as Python's import system requires.
    """
    module_name, attribute = split_reference(reference)
    _make_importable(search_dir)
    try:
        spec = importlib.util.find_spec(module_name)
    except (ImportError, ValueError) as exc:
        raise TrainableNotFound(f"cannot import module {module_name!r}: {exc}") from None
    if spec is None:
        where = f" (looked in {search_dir} and the Python path)" if search_dir is not None else ""
        raise TrainableNotFound(f"cannot import module {module_name!r}: no such module{where}")
    origin = Path(spec.origin) if spec.origin and spec.origin.endswith(".py") else None
    tree = None
    if origin is not None and origin.is_file():
        tree = ast.parse(origin.read_bytes(), filename=str(origin))
    local = search_dir is not None and found_in(search_dir, module_name, origin)
    return TrainableSource(module_name, attribute, origin, tree, Path(search_dir).resolve() if local else None)


@dataclass(frozen=True)
class ResolvedTrainable:
    """A trainable and what it is, decided once: whether it is a `Workload` (which sets the checks
    a sweep gets and the engines it can run on) and the metrics it is known to report."""

    obj: "Workload | Callable[..., Any]"
    is_workload: bool
    #: The metrics it reports, or None when it does not say (a function without `reported_metrics`).
    reported_metrics: frozenset[str] | None

    @classmethod
    def of(cls, trainable: "Workload | Callable[..., Any]") -> "ResolvedTrainable":
        """What `trainable` is. Workloads report what `hpo.base.training.TrialTrainer` reports; a
        function trainable may declare `reported_metrics = (...)` to get the same up-front check."""
        if _is_workload(trainable):
            names = {f"val_{key}" for key in trainable.eval_metric_names}
            return cls(trainable, True, frozenset(names | {"train_loss", "step", "training_iteration"}))
        declared = getattr(trainable, "reported_metrics", None)
        return cls(trainable, False, frozenset(declared) | {"training_iteration"} if declared else None)


def resolve_trainable(
    reference: str, search_dir: str | Path | None = None, for_ray: bool = True
) -> ResolvedTrainable:
    """Import what `reference` names. `search_dir` (the sweep file's folder) is importable too.

    With `for_ray`, a module found in `search_dir` is registered to travel by value to Ray's
    workers, which cannot import it; a check that runs no trial passes False and imports no Ray.
    """
    module_name, attribute = split_reference(reference)
    _make_importable(search_dir)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise TrainableNotFound(f"cannot import module {module_name!r}: {exc}") from None
    if for_ray:
        _ship_by_value_if_local(module, search_dir)
    try:
        trainable = getattr(module, attribute)
    except AttributeError:
        raise TrainableNotFound(f"module {module_name!r} has no attribute {attribute!r}") from None
    if not (_is_workload(trainable) or callable(trainable)):
        raise TrainableNotFound(f"{reference!r} is neither a Workload nor a callable trainable")
    return ResolvedTrainable.of(trainable)


def _is_workload(trainable: object) -> bool:
    """`isinstance(trainable, Workload)` without importing torch for a function trainable:
    nothing can be a Workload unless `hpo.base.workload` has been imported."""
    module = sys.modules.get("hpo.base.workload")
    return module is not None and isinstance(trainable, module.Workload)


def _make_importable(search_dir: str | Path | None) -> None:
    if search_dir is not None and str(search_dir) not in sys.path:
        sys.path.append(str(search_dir))


def found_in(folder: str | Path, module: str, origin: str | Path | None) -> bool:
    """Whether `module` (whose file is `origin`) was imported from `folder` itself: a module or
    package that sits in the sweep file's folder, which Ray's workers cannot import unless it travels
    to them. A module that merely lies somewhere below it is not: a built-in example, or the user's
    installed package, when the sweep file is in a folder above their checkout (their home)."""
    if origin is None:
        return False
    root = Path(origin).resolve().parent
    if Path(origin).name == "__init__.py":
        root = root.parent
    for _ in module.split(".")[1:]:
        root = root.parent
    return root == Path(folder).resolve()


def _ship_by_value_if_local(module: ModuleType, search_dir: str | Path | None) -> None:
    """A module next to the sweep file is not importable on Ray workers: pickle its code instead."""
    if search_dir is not None and found_in(search_dir, module.__name__, getattr(module, "__file__", None)):
        from ray import cloudpickle

        cloudpickle.register_pickle_by_value(module)

