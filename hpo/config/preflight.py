"""Checks a sweep must pass before Ray starts, so that no mistake surfaces as a traceback (or a
silent hang) inside a Ray worker. `hpo validate` and `hpo run` both call `preflight`.

Two tiers. Static checks read only the sweep file and the trainable's source: the module parses,
a function takes a config, the machine (or the `--address` cluster) has the resources a trial
asks for. With the trainable imported (its code runs), the rest: the engine it needs, the
metric it reports, the search-space keys and optimizer names a `Workload` reads, and for muP
scaling the model built at two widths.

Problems raise one `SweepConfigError` listing each with its file, line and key; what cannot be
checked comes back as warnings.
"""

from __future__ import annotations

import ast
import glob
import inspect
import math
import os
import sys
import textwrap
import warnings
from collections.abc import Callable
from typing import Any

from hpo.base.ray_runtime import BadClusterAddress, UnreachableCluster
from hpo.config.errors import ConfigIssue, SweepConfigError
from hpo.scaling._config import ScalingConfig
from hpo.config.sweep_file import LoadedSweep, describe_exception
from hpo.config.trainable_lookup import TrainableSource

#: Config keys the trial trainer itself reads (`hpo.base.training.TrialTrainer`, `fusion.model`), and
#: the Workload contract's `width` and `batch_size`, beyond the optimizer's (`OptimHParams`).
TRAINER_KEYS = frozenset({"width", "batch_size", "seed", "data_seed", "steps_per_iteration"})
#: Keys `hpo.scaling.MuPWorkload` reads when it builds a muP model.
MUP_KEYS = frozenset({"init_std", "readout_zero_init"})


def preflight(loaded: LoadedSweep, address: str | None = None) -> list[ConfigIssue]:
    """Every check that applies to `loaded`; returns warnings, raises `SweepConfigError` on problems.

    A sweep loaded without running its code (`trainable` is None) gets the static checks only.
    """
    issues: list[ConfigIssue] = []
    notes: list[ConfigIssue] = []
    issues += check_resources(loaded, address)
    notes += check_log_uniform_bounds(loaded)
    trainable = loaded.trainable
    if trainable is None:
        issues += _static_signature(loaded)
    elif trainable.is_workload:
        issues += check_metric(loaded, notes)
        issues += check_workload_keys(loaded, notes)
        if not issues and loaded.spec.scaling is not None:
            issues += check_scaling(loaded, notes)
    else:
        issues += check_function(loaded)
        issues += check_metric(loaded, notes)
    if issues:
        raise SweepConfigError(issues, loaded.source.name)
    return notes


# -- the search space --------------------------------------------------------------------------


def check_log_uniform_bounds(loaded: LoadedSweep) -> list[ConfigIssue]:
    """`log_uniform` takes natural-log exponents, as W&B's does; Ray's and Optuna's log-uniform take
    the values. Bounds written as values (min 0.0001, max 0.05) pass every check and search
    exp(0.0001) = 1.0 to exp(0.05) = 1.05, so they are flagged before Ray starts."""
    notes = []
    for key, param in loaded.spec.parameters.items():
        if param.log_bounds_look_like_values:
            notes.append(loaded.issue(f"parameters.{key}.distribution", (
                f"warning: log_uniform takes natural-log exponents (as in W&B): min {param.min:g} and max "
                f"{param.max:g} search {key} from exp({param.min:g}) = {math.exp(param.min):.4g} to "
                f"exp({param.max:g}) = {math.exp(param.max):.4g}; to search {param.min:g} to {param.max:g}, "
                "write distribution: log_uniform_values"
            )))
    return notes


# -- the trainable ---------------------------------------------------------------------------


def check_function(loaded: LoadedSweep) -> list[ConfigIssue]:
    """A Tune function trainable is called with the trial's config as its one argument, and only
    a `Workload` can be fused or scaled (its model factory, data and loss are kept apart)."""
    issues = []
    problem = _call_problem(loaded.trainable.obj)
    if problem:
        issues.append(loaded.issue("trainable", problem))
    for block in ("fusion", "scaling"):
        if getattr(loaded.spec, block) is not None:
            issues.append(loaded.issue(block, (
                f"{block} needs a Workload trainable (model factory, data and loss kept apart), but "
                f"{loaded.spec.trainable!r} is a function; remove the {block} block or wrap the model in an "
                "hpo.Workload: docs/workload_guide.md shows how, from a Tune function (hpo.DatasetWorkload takes your model, "
                "Dataset and loss)"
            )))
    return issues


def _call_problem(function: Callable[..., Any]) -> str | None:
    """Why Tune cannot call `function(config)`, as Tune itself decides (a single positional bind)."""
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return None  # a builtin or C callable: nothing to check
    try:
        signature.bind({})
    except TypeError:
        return (
            f"the function must take the trial's config as its one argument, e.g. def train(config): ...; "
            f"it is {getattr(function, '__name__', 'trainable')}{signature}"
        )
    return None


def _static_signature(loaded: LoadedSweep) -> list[ConfigIssue]:
    """The `def` of a function trainable, checked from its source without running it."""
    located = loaded.located
    definition = _top_level_def(located)
    if definition is None:
        return []
    args = definition.args
    positional = args.posonlyargs + args.args
    required_after_first = len(positional) - len(args.defaults) > 1
    required_keywords = any(default is None for default in args.kw_defaults)
    if (positional or args.vararg) and not required_after_first and not required_keywords:
        return []
    where = f"{located.path}:{definition.lineno}"
    return [loaded.issue("trainable", (
        f"{located.attribute}() must take the trial's config as its one argument, e.g. "
        f"def {located.attribute}(config): ... ({where})"
    ))]


def _top_level_def(located: TrainableSource | None) -> ast.FunctionDef | None:
    if located is None or located.tree is None:
        return None
    for node in located.tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == located.attribute:
            return node
    return None


def check_metric(loaded: LoadedSweep, notes: list[ConfigIssue]) -> list[ConfigIssue]:
    """The sweep's metric must be one the trainable reports; say so when that cannot be known."""
    metric = loaded.spec.metric.name
    known = loaded.trainable.reported_metrics
    if known is None:
        notes.append(loaded.issue("metric.name", (
            f"warning: cannot check that {loaded.spec.trainable!r} reports {metric!r}; declare it on the "
            f"function, e.g. {loaded.located.attribute}.reported_metrics = ({metric!r},)"
        )))
        return []
    if metric not in known:
        return [loaded.issue("metric.name", f"the trainable never reports {metric!r}; it reports {', '.join(sorted(known))}")]
    return []


# -- a Workload's config keys ----------------------------------------------------------------


def check_workload_keys(loaded: LoadedSweep, notes: list[ConfigIssue]) -> list[ConfigIssue]:
    """Every search-space key is one the workload or hpo's trainer reads, and the optimizer and
    schedule names are ones the trainer builds (a Workload trains with hpo's optimizers).

    A workload reads its `defaults` and any key its own code names (`config["key"]`,
    `config.get("key")`); when its source cannot be read, an unknown key is only a warning.
    """
    from hpo.base.hparams import OPTIMIZERS, SCHEDULES, OptimHParams
    from hpo.config.spec import did_you_mean

    workload = loaded.trainable.obj
    spec = loaded.spec
    in_code = keys_named_by(workload)
    readable = OptimHParams.keys() | TRAINER_KEYS | set(workload.defaults) | (in_code or set())
    if spec.scaling is not None:
        readable |= MUP_KEYS
    issues = []
    for key in spec.parameters:
        if key not in readable:
            message = (
                f"workload {workload.name!r} never reads {key!r}{did_you_mean(key, readable)}; it reads "
                f"{', '.join(sorted(set(workload.defaults) | (in_code or set())))} and hpo's trainer reads "
                f"{', '.join(sorted(OptimHParams.keys() | TRAINER_KEYS))}"
            )
            if in_code is None:
                notes.append(loaded.issue(f"parameters.{key}", f"warning: {message} (its source could not be read)"))
            else:
                issues.append(loaded.issue(f"parameters.{key}", message))
    for key, allowed in (("optimizer", OPTIMIZERS), ("lr_schedule", SCHEDULES)):
        param = spec.parameters.get(key)
        if param is None:
            continue
        choices = [param.value] if param.distribution == "constant" else list(param.values or [])
        for choice in choices:
            if choice not in allowed:
                issues.append(loaded.issue(f"parameters.{key}", (
                    f"{key} {choice!r} is not one hpo's trainer builds for a Workload; expected one of "
                    f"{', '.join(allowed)}"
                )))
    return issues


def keys_named_by(workload: Any) -> set[str] | None:
    """String keys the code of `workload` subscripts or `.get`s, found by parsing its source
    (nothing runs): its class and user-written bases, and for a `DatasetWorkload` the module of the
    user's model factory, whose code (and the model classes beside it) is what reads the config;
    None when some source is not available."""
    from hpo.base.workload import DatasetWorkload, Workload

    sources: list[Any] = [
        klass for klass in type(workload).__mro__
        if klass not in (object, Workload) and klass.__module__ not in ("abc", "builtins")
    ]
    if isinstance(workload, DatasetWorkload):
        module = inspect.getmodule(workload.model_factory)
        if module is None:
            return None
        sources.append(module)
    keys: set[str] = set()
    for source in sources:
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(source)))
        except (OSError, TypeError, SyntaxError):
            return None
        for node in ast.walk(tree):
            if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
                key = node.slice.value
            elif (
                isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("get", "pop", "setdefault") and node.args
                and isinstance(node.args[0], ast.Constant)
            ):
                key = node.args[0].value
            else:
                continue
            if isinstance(key, str):
                keys.add(key)
    return keys


def check_scaling(loaded: LoadedSweep, notes: list[ConfigIssue]) -> list[ConfigIssue]:
    """muP and depth scaling: the workload has the depth contract a `target_depth` needs, and the
    proxy's model is built (at the proxy width and depth, and as shapes at the base width and
    twice it) to find the readout and show that `width` and the depth key size the model. Runs user code."""
    from hpo.scaling import ScalingError, depth_contract_problem, proxy_workload

    spec, workload = loaded.spec, loaded.trainable.obj
    if spec.scaling.scales_depth and (problem := depth_contract_problem(workload)):
        return [loaded.issue("scaling.target_depth", f"{problem}; or drop target_depth")]
    searched = spec.scaling.searched_size_problems(spec.parameters, workload.depth_key)
    if searched:
        return [loaded.issue(f"parameters.{key}", problem) for key, problem in searched.items()]
    constants = {key: p.value for key, p in spec.parameters.items() if p.distribution == "constant"}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            proxy_workload(workload, spec.scaling, config=constants)
        except ScalingError as exc:
            return [loaded.issue("scaling", " ".join(str(exc).split()))]
        except Exception as exc:  # the user's build_model failed: one line, where it failed
            return [loaded.issue("scaling", f"building the proxy model at {_proxy_sizes(spec.scaling)} failed: {describe_exception(exc)}")]
    notes += [loaded.issue("scaling", f"warning: {' '.join(str(w.message).split())}") for w in caught]
    return []


def _proxy_sizes(scaling: ScalingConfig) -> str:
    sizes = {"width": scaling.proxy, "depth": scaling.depth_proxy}
    return " and ".join(f"{dimension} {size}" for dimension, size in sizes.items() if size is not None)


# -- resources -------------------------------------------------------------------------------


def check_resources(loaded: LoadedSweep, address: str | None = None) -> list[ConfigIssue]:
    """A trial asking for more than any node has would wait for it forever (Tune only warns)."""
    target = address or os.environ.get("RAY_ADDRESS")
    if target:
        try:  # None: RAY_ADDRESS, which the refusal then names
            capacity, where = cluster_capacity(address), f"any node of the cluster at {target}"
        except (BadClusterAddress, UnreachableCluster) as exc:
            return [ConfigIssue("", str(exc))]
        except (ConnectionError, TimeoutError, RuntimeError, ValueError) as exc:
            return [ConfigIssue("", f"cannot reach the Ray cluster at {target} to check resources: {describe_exception(exc)}")]
    else:
        capacity, where = machine_capacity(), "this machine"
    spec = loaded.spec
    asks = {"resources.cpu": ("cpu", spec.resources.cpu), "resources.gpu": ("gpu", spec.resources.gpu)}
    if spec.scaling is not None and spec.scaling.eager_transfer is not None:
        asks["scaling.target_cpus"] = ("cpu", spec.scaling.target_cpus)
        asks["scaling.target_gpus"] = ("gpu", spec.scaling.target_gpus)
    return [loaded.issue(key, f"{beyond} with --address") for key, (kind, wanted) in asks.items()
            if (beyond := beyond_capacity(kind, wanted, capacity, where))]


def beyond_capacity(kind: str, wanted: float, capacity: dict[str, float], where: str) -> str | None:
    """Why a trial asking for `wanted` of `kind` ("cpu", "gpu") can never start where the largest
    node (`where`) has `capacity`, or None when it fits: the one wording of `hpo run`'s check
    before Ray starts and the `Tuner`'s once it is up."""
    if wanted <= capacity[kind]:
        return None
    unit = kind.upper() + ("s" if wanted != 1 else "")
    return (f"a trial asks for {wanted:g} {unit} but {where} has {capacity[kind]:g}; Ray would wait for "
            "them forever. Ask for less, or join a bigger cluster")


def machine_capacity() -> dict[str, float]:
    """What the embedded local Ray gets: every core (as `hpo.base.ray_runtime` sizes it) and the GPUs
    Ray would detect, found without importing torch unless it already is."""
    return {"cpu": float(os.cpu_count() or 1), "gpu": float(local_gpu_count())}


def local_gpu_count() -> int:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and not d.strip().startswith("-")])
    if "torch" in sys.modules:
        return int(sys.modules["torch"].cuda.device_count())
    return len(glob.glob("/dev/nvidia[0-9]*"))


def cluster_capacity(address: str | None) -> dict[str, float]:
    """The largest node of the Ray cluster at `address` (None: `RAY_ADDRESS`; a trial runs on one node)."""
    from hpo.base.ray_runtime import ensure_ray

    ensure_ray(address=address)
    return largest_node()


def largest_node() -> dict[str, float]:
    """The CPUs and GPUs of the largest live node of the Ray this process is connected to."""
    import ray

    nodes = [node["Resources"] for node in ray.nodes() if node.get("Alive")]
    return {
        "cpu": max((float(r.get("CPU", 0)) for r in nodes), default=0.0),
        "gpu": max((float(r.get("GPU", 0)) for r in nodes), default=0.0),
    }
