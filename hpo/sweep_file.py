"""From a sweep file to a `LoadedSweep`: parsed, validated and its trainable found, without Ray.

`hpo validate`, `hpo run --dry-run` and the first step of `hpo run` come through here, so this
module imports neither Ray nor torch; the trainable's own module may, when it is imported.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpo.errors import ConfigIssue, SweepConfigError
from hpo.search_space import describe, grid_size, trial_count
from hpo.spec import SweepSpec
from hpo.strategy import describe_scheduler, describe_searcher
from hpo.trainables import TrainableNotFound, TrainableSource, locate_trainable, resolve_trainable
from hpo.yaml_source import YamlSource


@dataclass
class LoadedSweep:
    spec: SweepSpec
    #: The imported trainable; None when the sweep was loaded without running its code.
    trainable: Any
    source: YamlSource
    located: TrainableSource | None = None

    @property
    def experiment_path(self) -> Path:
        return Path(self.spec.storage_path).resolve() / self.spec.name

    @property
    def code_folder(self) -> Path | None:
        """The sweep file's folder when the trainable's module lives under it: code Ray's workers
        cannot import unless it travels to them. None for a built-in or installed trainable."""
        folder = Path(self.source.name).resolve().parent
        module = self.located.path if self.located is not None else None
        return folder if module is not None and module.resolve().is_relative_to(folder) else None

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
    search_dir = Path(path).resolve().parent
    try:
        loaded.located = locate_trainable(spec.trainable, search_dir=search_dir)
    except TrainableNotFound as exc:
        raise loaded.fail("trainable", str(exc)) from None
    except SyntaxError as exc:
        where = f"{exc.filename}:{exc.lineno}" if exc.lineno else str(exc.filename)
        raise loaded.fail("trainable", f"the trainable's module does not parse: {exc.msg} ({where})") from None
    except Exception as exc:  # a parent package's __init__ failed while find_spec imported it
        raise loaded.fail("trainable", f"finding {spec.trainable!r} failed: {describe_exception(exc)}") from None
    if execute:
        try:
            loaded.trainable = resolve_trainable(spec.trainable, search_dir=search_dir, for_ray=for_ray)
        except TrainableNotFound as exc:
            raise loaded.fail("trainable", str(exc)) from None
        except Exception as exc:  # the module's own top-level code failed: say where, in one line
            raise loaded.fail("trainable", f"importing {loaded.located.module!r} failed: {describe_exception(exc)}") from None
    return loaded


def describe_exception(exc: BaseException) -> str:
    """`Type: message (file:line)` of an exception raised by user code, at its innermost frame."""
    if isinstance(exc, SyntaxError):
        where = f" ({exc.filename}:{exc.lineno})"
        message = exc.msg
    else:
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith("<frozen")]
        where = f" ({frames[-1].filename}:{frames[-1].lineno})" if frames else ""
        message = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {message}{where}" if message else f"{type(exc).__name__}{where}"


def describe_plan(loaded: LoadedSweep) -> str:
    """What `hpo run --dry-run` prints: the sweep as it will run, in the user's own terms, without Ray."""
    spec = loaded.spec
    lines = [f"sweep {spec.name!r}: trainable {spec.trainable}, metric {spec.metric.name} ({spec.metric.goal})"]
    trials = trial_count(spec)
    if spec.searcher_kind == "grid":
        sizes = [len(p.values) for p in spec.parameters.values() if p.distribution == "categorical"]
        passes = "once" if spec.num_samples == 1 else f"{spec.num_samples} times"
        how = f"grid of {' x '.join(map(str, sizes)) or '1'} = {grid_size(spec)} combinations, run {passes}"
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
        lines.append(f"scaling: proxy width {spec.scaling.proxy} -> target width {spec.scaling.target_width}")
    return "\n".join(lines)
