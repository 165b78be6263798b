"""From a sweep file to a `LoadedSweep`: read, validated, its trainable found, and described, without Ray.

`hpo validate`, `hpo run --dry-run` and the first step of `hpo run` come through here, so this
module imports neither Ray nor torch; the trainable's own module may, when it is imported.

The file is parsed once into YAML nodes (`hpo.base.yaml_source.YamlSource`, which the pipeline job
files of `hpo profile pipeline` are read with too). Before anything walks or validates them, the
nodes are checked for what PyYAML accepts silently but a sweep must not: a key given twice (the
last one would win unseen), and aliases that expand past a small bound (a "billion laughs" file
would otherwise make every later walk of the data exponential) or refer to themselves. Each key
keeps its line, so every error names it.

The dry run describes the search the user wrote (inclusive bounds, grid sizes, the searcher and
scheduler `hpo.tuner.sweep` will build), never Tune's internal domains, and so needs no Ray.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from hpo.base.exceptions import describe_exception
from hpo.base.yaml_source import YamlSource
from hpo.config.errors import ConfigIssue, SweepConfigError
from hpo.config.logging_spec import LoggingSpec
from hpo.config.spec import ParameterSpec, SweepSpec, fused_placement
from hpo.config.trainable_lookup import ResolvedTrainable, TrainableNotFound, TrainableSource, locate_trainable, resolve_trainable


@dataclass
class LoadedSweep:
    spec: SweepSpec
    #: The imported trainable and what it is; None when the sweep was loaded without running its code.
    trainable: ResolvedTrainable | None
    source: YamlSource
    located: TrainableSource | None = None

    @property
    def folder(self) -> Path:
        """The sweep file's folder, against which its relative paths are read."""
        return Path(self.source.name).resolve().parent

    @property
    def storage(self) -> str:
        """Where the sweep's runs are stored: a relative `storage_path` is relative to the sweep file's
        folder, not to where `hpo` runs, so `hpo run --resume` and `hpo results` find the run from any
        folder (a URI such as `s3://bucket/runs` is Tune's to read)."""
        if "://" in self.spec.storage_path:
            return self.spec.storage_path
        return str(self.folder.joinpath(Path(self.spec.storage_path).expanduser()).resolve())

    @property
    def logging(self) -> LoggingSpec | None:
        """The `logging:` block, its relative paths (an MLflow store, W&B's `dir`) relative to the
        sweep file's folder, as `storage_path` is."""
        if self.spec.logging is None:
            return None
        return self.spec.logging.relative_to(self.folder)

    @property
    def experiment_path(self) -> Path:
        return Path(self.storage) / self.spec.name

    @property
    def code_folder(self) -> Path | None:
        """The sweep file's folder when the trainable's module was imported from it: code Ray's
        workers cannot import unless it travels to them. None for a built-in or installed
        trainable, even one that lies below the folder (a sweep file in the home that holds the
        user's checkout would otherwise ship the whole home)."""
        return self.located.code_folder if self.located is not None else None

    def issue(self, path: str, message: str) -> ConfigIssue:
        """A problem at `path` of this sweep file, with its line."""
        return ConfigIssue(path, message, self.source.line_of(path))

    def fail(self, path: str, message: str) -> SweepConfigError:
        return SweepConfigError([self.issue(path, message)], self.source.name)


def load_sweep(path: str | Path, execute: bool = True, for_ray: bool = True) -> LoadedSweep:
    """Parse, validate and resolve a sweep file; every problem is a `SweepConfigError` with a line.

    The trainable's module is found and parsed first, without running it; with `execute` it is
    then imported, which runs its top-level code (a sweep file names code to run). `for_ray`
    prepares a module beside the sweep file to travel to Ray's workers.
    """
    source = YamlSource.from_file(path)
    spec = SweepSpec.from_source(source)
    loaded = LoadedSweep(spec, None, source)
    try:
        loaded.located = locate_trainable(spec.trainable, search_dir=loaded.folder)
    except TrainableNotFound as exc:
        raise loaded.fail("trainable", str(exc)) from None
    except SyntaxError as exc:
        where = f"{exc.filename}:{exc.lineno}" if exc.lineno else str(exc.filename)
        raise loaded.fail("trainable", f"the trainable's module does not parse: {exc.msg} ({where})") from None
    except Exception as exc:  # a parent package's __init__ failed while find_spec imported it
        raise loaded.fail("trainable", f"finding {spec.trainable!r} failed: {describe_exception(exc)}") from None
    if execute:
        try:
            loaded.trainable = resolve_trainable(spec.trainable, search_dir=loaded.folder, for_ray=for_ray)
        except TrainableNotFound as exc:
            raise loaded.fail("trainable", str(exc)) from None
        except Exception as exc:  # the module's own top-level code failed: say where, in one line
            raise loaded.fail("trainable", f"importing {loaded.located.module!r} failed: {describe_exception(exc)}") from None
    return loaded


def describe_plan(loaded: LoadedSweep) -> str:
    """What `hpo run --dry-run` prints: the sweep as it will run, in the user's own terms, without Ray."""
    spec = loaded.spec
    lines = [f"sweep {spec.name!r}: trainable {spec.trainable}, metric {spec.metric.name} ({spec.metric.goal})"]
    trials = spec.trial_count
    if spec.searcher_kind == "grid":
        sizes = [len(p.values) for p in spec.parameters.values() if p.distribution == "categorical"]
        passes = "once" if spec.num_samples == 1 else f"{spec.num_samples} times"
        how = f"grid of {' x '.join(map(str, sizes)) or '1'} = {spec.grid_size} combinations, run {passes}"
    else:
        how = "run_cap" if spec.run_cap else "default; set run_cap"
        how = f"{how}{', or fewer if time_budget_s runs out' if spec.time_budget_s else ''}"
    lines.append(f"trials: {trials} ({how})")
    lines.append(f"searcher: {describe_searcher(spec)}, method {spec.method}")
    lines.append(f"scheduler: {describe_scheduler(spec)}, max_iterations: {spec.max_iterations}")
    resources = spec.resources
    lines.append(f"resources per trial: {resources.cpu:g} CPU, {resources.gpu:g} GPU; storage: {loaded.experiment_path}")
    lines.append(f"checkpoint: every {spec.checkpoint.every} iteration(s), at end: {spec.checkpoint.at_end}")
    lines.append("search space:")
    lines += [f"  {key}: {text}" for key, text in describe(spec).items()]
    if spec.fusion:
        lines.append(f"fusion: {spec.fusion.model_dump()}")
    if spec.scaling:
        lines.append(f"scaling: {spec.scaling.describe()}")
    return "\n".join(lines)


def describe(spec: SweepSpec) -> dict[str, str]:
    """A line per parameter as the user wrote it, for `hpo run --dry-run` and `hpo validate`."""
    grid = spec.searcher_kind == "grid"
    return {key: describe_parameter(param, grid) for key, param in spec.parameters.items()}


def describe_parameter(param: ParameterSpec, grid: bool = False) -> str:
    kind = param.distribution
    if kind == "constant":
        return f"constant {param.value!r}"
    if kind == "categorical":
        label = "grid over" if grid else "one of"
        return f"{label} {len(param.values)} values {param.values!r}"
    step = f" in steps of {_number(param.q)}" if param.q is not None else ""
    if kind in ("normal", "q_normal"):  # unbounded: a mean and a spread, no min or max
        return f"normal, mean {_number(param.mu)}, std {_number(param.sigma)}{step}"
    lo, hi = _number(param.min), _number(param.max)
    if kind == "int_uniform":
        return f"integer from {lo} to {hi} inclusive, uniform"
    if kind in ("uniform", "q_uniform"):
        return f"uniform from {lo} to {hi}{step}"
    if kind in ("log_uniform_values", "q_log_uniform_values"):
        return f"log-uniform from {lo} to {hi}{step}"
    return f"log-uniform from exp({lo}) = {math.exp(param.min):.4g} to exp({hi}) = {math.exp(param.max):.4g}"


def _number(value: float | None) -> str:
    """Whole numbers without a trailing `.0`, so `max: 3` reads back as 3."""
    if value is not None and float(value).is_integer():
        return str(int(value))
    return f"{value:g}"


def describe_searcher(spec: SweepSpec) -> str:
    """What `hpo.tuner.sweep.build_searcher` builds, in words, with the concurrency limit Tune puts
    on it (`max_concurrent_trials`; fused, that limit counts groups instead)."""
    if spec.searcher_kind == "tpe":
        fused = fused_placement(spec.fusion) is not None
        limit = f", at most {spec.max_concurrent_trials} at once" if spec.max_concurrent_trials and not fused else ""
        return f"OptunaSearch (TPE, {spec.tpe_startup_trials} random start-up trials{limit})"
    return f"BasicVariantGenerator ({spec.searcher_kind})"


def describe_scheduler(spec: SweepSpec) -> str:
    """What `hpo.tuner.sweep.build_scheduler` builds, in words."""
    terminate = spec.early_terminate
    if terminate is None:
        return "FIFOScheduler (every trial runs to max_iterations)"
    max_t = terminate.max_iter or spec.max_iterations
    if terminate.type == "asha":
        return f"ASHAScheduler (grace {terminate.min_iter}, max {max_t} iterations, eta {terminate.eta:g})"
    return f"HyperBandScheduler (max {max_t} iterations, eta {terminate.eta:g})"
