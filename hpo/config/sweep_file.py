"""From a sweep file to a `LoadedSweep`: read, validated, its trainable found, and described, without Ray.

`hpo validate`, `hpo run --dry-run` and the first step of `hpo run` come through here, so this
module imports neither Ray nor torch; the trainable's own module may, when it is imported.

The file is parsed once into YAML nodes (`YamlSource`). Before anything walks or validates them,
the nodes are checked for what PyYAML accepts silently but a sweep must not: a key given twice (the
last one would win unseen), and aliases that expand past a small bound (a "billion laughs" file
would otherwise make every later walk of the data exponential) or refer to themselves. Each key
keeps its line, so every error names it.

The dry run describes the search the user wrote (inclusive bounds, grid sizes, the searcher and
scheduler `hpo.tuner.sweep` will build), never Tune's internal domains, and so needs no Ray.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from hpo.base.exceptions import describe_exception
from hpo.config.errors import ConfigIssue, SweepConfigError
from hpo.config.spec import ParameterSpec, SweepSpec, fused_placement
from hpo.config.trainable_lookup import ResolvedTrainable, TrainableNotFound, TrainableSource, locate_trainable, resolve_trainable

#: Values (scalars, lists and mappings) a sweep file may expand to once aliases are followed.
#: Real sweeps have a few hundred; the bound only stops alias bombs.
MAX_EXPANDED_NODES = 10_000
#: Nesting of `[...]` / `{...}`. PyYAML's scanner takes time quadratic in this depth (a file of
#: 20,000 `[` scans for minutes), so deeper files are refused before PyYAML sees them.
MAX_FLOW_DEPTH = 64
#: Sweep files are a few kilobytes; a bound on the size bounds every other walk of the file.
MAX_FILE_BYTES = 1024 * 1024


class SweepLoader(yaml.SafeLoader):
    """SafeLoader that reads `1e-3` as a float, as YAML 1.2 and every sweep author do.

    PyYAML follows YAML 1.1, where a float needs a dot (`1.0e-3`), so `values: [1e-3, 3e-3]`
    would silently become strings: categorical learning rates that sort and compare as text.
    """


SweepLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


class YamlSource:
    """A parsed YAML document plus a map from dotted key paths to 1-based line numbers."""

    def __init__(self, data: Any, lines: dict[str, int], name: str):
        self.data = data
        self.lines = lines
        self.name = name

    @classmethod
    def from_text(cls, text: str, name: str = "<string>") -> "YamlSource":
        # A SafeLoader builds no Python objects from tags (no !!python/object).
        too_deep = _line_past_flow_depth(text, MAX_FLOW_DEPTH)
        if too_deep is not None:
            message = f"malformed YAML: [ ] and {{ }} nest more than {MAX_FLOW_DEPTH} levels deep"
            raise SweepConfigError([ConfigIssue("", message, too_deep)], name)
        loader = None
        try:
            loader = SweepLoader(text)  # the reader refuses control characters here, before parsing
            node = loader.get_single_node()
            if node is not None:
                _check_expansion(node, name)
            data = loader.construct_document(node) if node is not None else None
        except yaml.reader.ReaderError as exc:
            line = text[: exc.position].count("\n") + 1
            message = f"malformed YAML: character U+{exc.character:04X} is not allowed in a YAML file ({exc.reason})"
            raise SweepConfigError([ConfigIssue("", message, line)], name) from None
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            line = mark.line + 1 if mark is not None else None
            problem = getattr(exc, "problem", None) or str(exc)
            raise SweepConfigError([ConfigIssue("", f"malformed YAML: {problem}", line)], name) from None
        except RecursionError:
            raise SweepConfigError([ConfigIssue("", "malformed YAML: nested too deeply", None)], name) from None
        finally:
            if loader is not None:
                loader.dispose()
        lines: dict[str, int] = {}
        if node is not None:
            duplicates: list[ConfigIssue] = []
            _index(node, "", lines, duplicates)
            if duplicates:
                raise SweepConfigError(duplicates, name)
        return cls(data, lines, name)

    @classmethod
    def from_file(cls, path: str | Path) -> "YamlSource":
        path = Path(path)
        if not path.is_file():
            raise SweepConfigError([ConfigIssue("", f"no such sweep file: {path}")], str(path))
        if path.stat().st_size > MAX_FILE_BYTES:
            message = f"a sweep file is at most {MAX_FILE_BYTES // 1024} KiB; this one is {path.stat().st_size // 1024} KiB"
            raise SweepConfigError([ConfigIssue("", message)], str(path))
        raw = path.read_bytes()
        try:
            text = raw.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            line = raw[: exc.start].count(b"\n") + 1
            column = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
            message = f"not UTF-8 text: byte 0x{raw[exc.start]:02x} at column {column}; save the file as UTF-8"
            raise SweepConfigError([ConfigIssue("", message, line)], str(path)) from None
        return cls.from_text(text, str(path))

    def line_of(self, path: str) -> int | None:
        """The line of `path`, or of its nearest ancestor that the file spells out."""
        while path:
            if path in self.lines:
                return self.lines[path]
            path = path.rpartition(".")[0]
        return self.lines.get("")


def _line_past_flow_depth(text: str, limit: int) -> int | None:
    """The line where flow collections first nest deeper than `limit`, or None.

    Brackets inside quoted strings and comments do not count; a bracket inside a plain scalar
    (`a[0]`) may, which only matters to a file that already nests near the limit.
    """
    depth, line, quote, comment = 0, 1, "", False
    previous = "\n"
    escaped = False
    for char in text:
        if char == "\n":  # ends a comment; a quoted scalar may go on over lines
            line, comment = line + 1, False
        elif comment:
            pass
        elif quote == '"':
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                quote = ""
        elif quote == "'":
            if char == "'":
                quote = ""
        elif char in "\"'" and previous in " \t\n[{,:-?":
            quote = char
        elif char == "#" and previous in " \t\n":
            comment = True
        elif char in "[{":
            depth += 1
            if depth > limit:
                return line
        elif char in "]}":
            depth = max(0, depth - 1)
        previous = char
    return None


def _check_expansion(root: yaml.Node, name: str) -> None:
    """Refuse self-referencing aliases and documents that expand past `MAX_EXPANDED_NODES`.

    Sizes are memoised per node, so the check itself is linear in the file, however deep the
    aliases nest.
    """
    sizes: dict[int, int] = {}
    in_progress: set[int] = set()

    def size(node: yaml.Node) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in in_progress:
            issue = ConfigIssue("", "malformed YAML: an alias refers to the value that contains it", node.start_mark.line + 1)
            raise SweepConfigError([issue], name)
        in_progress.add(key)
        if isinstance(node, yaml.MappingNode):
            total = 1 + sum(size(k) + size(v) for k, v in node.value)
        elif isinstance(node, yaml.SequenceNode):
            total = 1 + sum(size(item) for item in node.value)
        else:
            total = 1
        in_progress.discard(key)
        if total > MAX_EXPANDED_NODES:
            message = (
                f"malformed YAML: aliases expand this file to more than {MAX_EXPANDED_NODES} values; "
                "write the values out or use fewer nested aliases"
            )
            raise SweepConfigError([ConfigIssue("", message, node.start_mark.line + 1)], name)
        sizes[key] = total
        return total

    size(root)


def _index(node: yaml.Node, prefix: str, lines: dict[str, int], duplicates: list[ConfigIssue]) -> None:
    lines.setdefault(prefix, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        seen: dict[Any, int] = {}
        for key_node, value_node in node.value:
            line = key_node.start_mark.line + 1
            path = f"{prefix}.{key_node.value}" if prefix else str(key_node.value)
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                if key_node.value in seen:
                    message = f"duplicate key {key_node.value!r}: first given on line {seen[key_node.value]}, again on line {line}"
                    duplicates.append(ConfigIssue(path, message, line))
                    continue
                seen[key_node.value] = line
            lines[path] = line
            _index(value_node, path, lines, duplicates)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _index(item, f"{prefix}.{i}", lines, duplicates)


@dataclass
class LoadedSweep:
    spec: SweepSpec
    #: The imported trainable and what it is; None when the sweep was loaded without running its code.
    trainable: ResolvedTrainable | None
    source: YamlSource
    located: TrainableSource | None = None

    @property
    def storage(self) -> str:
        """Where the sweep's runs are stored: a relative `storage_path` is relative to the sweep file's
        folder, not to where `hpo` runs, so `hpo run --resume` and `hpo results` find the run from any
        folder (a URI such as `s3://bucket/runs` is Tune's to read)."""
        if "://" in self.spec.storage_path:
            return self.spec.storage_path
        return str(Path(self.source.name).resolve().parent.joinpath(Path(self.spec.storage_path).expanduser()).resolve())

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
