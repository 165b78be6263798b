"""The sweep specification: the YAML file (W&B Sweeps shape plus Tune blocks), validated once.

Everything downstream receives a `SweepSpec`, never raw dictionaries, so a typo is caught here
with its key path and line number instead of deep inside Ray.

Example::

    spec = load_sweep("configs/quickstart.yaml", execute=False).spec   # hpo.config.sweep_file
    spec.parameters["lr"].distribution   # 'log_uniform_values'
"""

from __future__ import annotations

import difflib
import math
import re
from pathlib import Path
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from hpo.config.errors import ConfigIssue, SweepConfigError
from hpo.config.logging_spec import MODELS_BY_PATH as LOGGING_MODELS, LoggingSpec
from hpo.scaling._config import ScalingConfig

METHODS = ("random", "grid", "tpe", "optuna", "bayes")
DISTRIBUTIONS = (
    "constant",
    "categorical",
    "int_uniform",
    "uniform",
    "q_uniform",
    "log_uniform",
    "log_uniform_values",
    "q_log_uniform_values",
    "normal",
    "q_normal",
)
CONTINUOUS = frozenset(DISTRIBUTIONS) - {"constant", "categorical", "int_uniform"}
#: Ray Tune's and Optuna's names of the same distributions, read as the distribution they name here.
#: Each means exactly what its target does: Ray's `loguniform(lower, upper)` and Optuna's
#: `suggest_float(log=True)` take the values themselves (W&B's `log_uniform` takes their natural
#: logs), and Optuna's `suggest_int` includes its upper bound, as `int_uniform`'s max does.
DISTRIBUTION_ALIASES = {
    "loguniform": "log_uniform_values",  # tune.loguniform; Optuna's suggest_loguniform
    "qloguniform": "q_log_uniform_values",  # tune.qloguniform
    "quniform": "q_uniform",  # tune.quniform
    "randn": "normal",  # tune.randn(mean, sd)
    "qrandn": "q_normal",  # tune.qrandn
    "choice": "categorical",  # tune.choice
    "float": "uniform",  # Optuna's suggest_float
    "int": "int_uniform",  # Optuna's suggest_int: high is inclusive
    "discrete_uniform": "q_uniform",  # Optuna's suggest_discrete_uniform
}
#: Names another tool uses for something no distribution here means: refused, with what to write.
REFUSED_DISTRIBUTIONS = {
    "randint": "Ray's randint excludes its upper bound; write distribution: int_uniform, whose max is "
               "inclusive (max = Ray's upper - 1)",
    "qrandint": "write distribution: int_uniform (max inclusive), or list the values: values: [...]",
    "lograndint": "list the integers to try: values: [...], or use log_uniform_values and round in your code",
    "qlograndint": "list the integers to try: values: [...]",
    "grid_search": "write values: [...] and method: grid",
    "sample_from": "a sweep file holds no code; compute the value in the trainable from the config",
    "q_log_uniform": "W&B's q_log_uniform (quantised natural-log exponents) is not supported; write "
                     "distribution: q_log_uniform_values with the values themselves",
    "inv_log_uniform": "not supported; write distribution: log_uniform_values with the values themselves",
    "inv_log_uniform_values": "not supported; write distribution: log_uniform_values",
    "beta": "not supported; write uniform, normal or values: [...]",
    "q_beta": "not supported; write q_uniform or values: [...]",
    "log_normal": "not supported; write normal, or log_uniform_values for a positive value over decades",
    "q_log_normal": "not supported; write q_normal or q_log_uniform_values",
}
#: `log_uniform` whose exponents span less than this factor (exp(max) / exp(min)) searches almost
#: one value: bounds written as the values themselves, meant for `log_uniform_values`.
NARROW_LOG_RANGE = 1.1
#: Largest whole number a float holds exactly: `int_uniform` bounds beyond it change when read.
MAX_EXACT_INT = 2**53
#: Distributions Optuna's TPE cannot sample as written: Ray's OptunaSearch refuses a normal once
#: the sweep has started, and drops a log scale's q with only a warning.
TPE_REFUSES = {
    "normal": "Optuna's TPE cannot sample a normal distribution; use method: random, or uniform with min and max",
    "q_normal": "Optuna's TPE cannot sample a normal distribution; use method: random, or q_uniform with min and max",
    "q_log_uniform_values": "Optuna's TPE cannot step a log scale (it would drop q and draw any float); "
                            "use method: random, or list the values: values: [...]",
}
DEFAULT_MAX_ITERATIONS = 10
#: Checkpoint every 4th iteration (and the last) unless told otherwise. Tune's driver persists each
#: checkpoint in turn, 10-26 ms each on a 2-core box (benchmarks/results/sweep_overhead_*.json):
#: on small proxies whose iterations take tens of milliseconds, checkpointing every iteration made
#: a 64-trial sweep 2.2x slower than plain Tune. A crash then costs a trial at most 4 iterations.
DEFAULT_CHECKPOINT_EVERY = 4
#: A sweep name becomes one folder under `storage_path`: a single path component that cannot
#: climb out of it (`..`, `/`), hide (`.x`) or read as an option (`-x`).
SAFE_NAME = re.compile(r"\w[\w.-]{0,99}")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class MetricSpec(_Strict):
    name: str
    goal: Literal["minimize", "maximize"] = "minimize"

    @property
    def mode(self) -> str:
        return "min" if self.goal == "minimize" else "max"


class ParameterSpec(_Strict):
    """One hyperparameter, W&B style. The distribution is inferred when left out, as W&B does."""

    value: Any = None
    values: list[Any] | None = None
    distribution: str | None = None
    min: float | None = None
    max: float | None = None
    q: float | None = None
    mu: float | None = None
    sigma: float | None = None

    @model_validator(mode="before")
    @classmethod
    def _infer_distribution(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        kind = data.get("distribution")
        if isinstance(kind, str) and kind in DISTRIBUTION_ALIASES:
            return {**data, "distribution": DISTRIBUTION_ALIASES[kind]}
        if isinstance(kind, str) and kind not in DISTRIBUTIONS:
            raise _KeyedError("distribution", unknown_distribution(kind, data.get("min"), data.get("max")))
        if kind is not None:
            return data
        if "value" in data:
            kind = "constant"
        elif "values" in data:
            kind = "categorical"
        elif "min" in data and "max" in data:
            both_int = all(isinstance(data[k], int) and not isinstance(data[k], bool) for k in ("min", "max"))
            kind = "int_uniform" if both_int else "uniform"
        elif "mu" in data or "sigma" in data:
            kind = "normal"
        else:
            return data  # unknown keys get their own error; otherwise _check_bounds says what is missing
        return {**data, "distribution": kind}

    @field_validator("min", "max", "q", "mu", "sigma")
    @classmethod
    def _finite(cls, value: float | None) -> float | None:
        if value is not None and not math.isfinite(value):
            raise ValueError(f"must be a finite number, got {value}")
        return value

    @model_validator(mode="after")
    def _check_bounds(self) -> "ParameterSpec":
        kind = self.distribution
        if kind is None:
            raise ValueError("give one of: value, values, min and max, or a distribution")
        needs = {
            "constant": ("value",),
            "categorical": ("values",),
            "normal": ("mu", "sigma"),
            "q_normal": ("mu", "sigma", "q"),
            "q_uniform": ("min", "max", "q"),
            "q_log_uniform_values": ("min", "max", "q"),
        }.get(kind, ("min", "max"))
        for key in needs:
            if getattr(self, key) is None:
                raise _KeyedError(key, f"distribution {kind!r} needs '{key}'")
        for key in sorted(self.model_fields_set - {"distribution", *needs}):
            # read by no distribution of this kind: `normal` with min would look truncated and
            # `int_uniform` with q stepped, yet Tune would draw without them
            raise _KeyedError(key, f"distribution {kind!r} does not use '{key}' (it takes {', '.join(needs)}); remove it")
        if kind == "categorical" and not self.values:
            raise _KeyedError("values", "needs at least one value")
        if self.min is not None and self.max is not None and self.min >= self.max:
            raise _KeyedError("max", f"max ({self.max}) must be greater than min ({self.min})")
        if self.min is not None and self.max is not None and not math.isfinite(self.max - self.min):
            raise _KeyedError("max", f"max - min ({self.max:g} - {self.min:g}) overflows a float; NumPy cannot draw from it")
        if kind in ("log_uniform_values", "q_log_uniform_values") and self.min is not None and self.min <= 0:
            raise _KeyedError("min", f"log bounds must be positive, got min={self.min}")
        if kind == "int_uniform" and not (float(self.min).is_integer() and float(self.max).is_integer()):
            raise _KeyedError("min", "int_uniform bounds must be whole numbers")
        if kind == "int_uniform":
            for key in ("min", "max"):  # a float holds whole numbers exactly up to 2**53; numpy draws int64
                if abs(getattr(self, key)) > MAX_EXACT_INT:
                    raise _KeyedError(key, f"int_uniform bounds must lie within ±2**53 = ±{MAX_EXACT_INT}")
        if self.sigma is not None and self.sigma <= 0:
            raise _KeyedError("sigma", f"sigma must be positive, got {self.sigma}")
        if self.q is not None and self.q <= 0:
            raise _KeyedError("q", f"q must be positive, got {self.q}")
        if self.q is not None and kind in ("q_uniform", "q_log_uniform_values"):
            for key in ("min", "max"):  # Tune's quantized domains refuse such bounds when the sweep starts
                bound = getattr(self, key)
                if not math.isclose(bound / self.q, round(bound / self.q)):
                    raise _KeyedError(
                        key,
                        f"{key} ({bound:g}) is not a multiple of q ({self.q:g}): Tune draws multiples of q "
                        f"from min to max, so both bounds must be multiples (e.g. {key}: {round(bound / self.q) * self.q:g})",
                    )
        if kind == "log_uniform" and self.max is not None and self.max > 700:
            raise _KeyedError("max", "log_uniform takes natural-log exponents; did you mean log_uniform_values?")
        if kind == "log_uniform" and self.min is not None and self.min < -700:
            # exp(min) rounds to 0 below about -745, and Tune's log-uniform refuses 0 once the sweep starts
            raise _KeyedError("min", f"log_uniform takes natural-log exponents: exp({self.min:g}) is 0 to a float; use min >= -700")
        return self

    @property
    def is_continuous(self) -> bool:
        return self.distribution in CONTINUOUS

    @property
    def log_bounds_look_like_values(self) -> bool:
        """A `log_uniform` (natural-log exponents) whose bounds read as the values themselves: both
        in (0, 1] (a learning rate), or exponents so close that the search spans almost one value."""
        if self.distribution != "log_uniform":
            return False
        both_in_unit = 0 < self.min <= 1 and 0 < self.max <= 1
        return both_in_unit or self.max - self.min < math.log(NARROW_LOG_RANGE)


class EarlyTerminateSpec(_Strict):
    type: Literal["asha", "hyperband"]
    min_iter: int = Field(1, ge=1)
    max_iter: int | None = Field(None, ge=1)
    eta: float = Field(3, gt=1)

    @model_validator(mode="after")
    def _hyperband_has_no_min_iter(self) -> "EarlyTerminateSpec":
        # W&B's hyperband is asynchronous with a grace period of min_iter; Tune's HyperBand has no
        # such setting (its smallest bracket starts at 1), so any other min_iter would go unused silently
        if self.type == "hyperband" and self.min_iter != 1:
            raise ValueError(
                f"min_iter {self.min_iter} does not go with type hyperband (Tune's HyperBand has no grace period): "
                "use type asha for early stopping that waits min_iter iterations, or drop min_iter"
            )
        return self


class ResourcesSpec(_Strict):
    cpu: float = Field(1.0, ge=0)
    gpu: float = Field(0.0, ge=0)


class FusionConfig(_Strict):
    """Train compatible configurations as one horizontally-fused model (see `fusion/`)."""

    enabled: bool = True
    max_members: int | Literal["auto"] = "auto"
    placement: Literal["device", "bubbles"] = "device"
    dtype: Literal["fp32", "bf16"] = "fp32"
    #: Check each group before it trains: a float64 copy takes a few steps beside its members'
    #: own models and must agree (`fusion.verification`); false trains unchecked.
    verify: bool = True
    #: How a group's step runs (`fusion.trainer.compile_mode`): eager ("off"), compiled by
    #: inductor, or captured into CUDA graphs ("graphs", needs a GPU); "auto" is eager on CPU.
    compile: Literal["auto", "off", "graphs", "inductor"] = "auto"

    @model_validator(mode="after")
    def _bubbles_need_a_group_size(self) -> "FusionConfig":
        if self.placement == "bubbles" and self.max_members == "auto":
            raise ValueError(
                "placement 'bubbles' needs an explicit max_members (e.g. 8): 'auto' measures the free memory "
                "of a device the sweep holds, and a bubble guest runs on a pipeline job's GPU instead"
            )
        if self.placement == "bubbles" and self.compile in ("graphs", "inductor"):
            raise ValueError(f"compile {self.compile!r} is for placement 'device'; bubble guests run their steps eagerly")
        return self

    @field_validator("max_members", mode="before")
    @classmethod
    def _auto_or_a_count(cls, value: Any) -> Any:
        # before the union's own checks, which would report each of its branches on a line of its own
        if value == "auto" or (isinstance(value, int) and not isinstance(value, bool)):
            return value
        raise ValueError(f"max_members must be 'auto' or a positive integer, got {value!r}")

    @field_validator("max_members")
    @classmethod
    def _positive(cls, value: int | str) -> int | str:
        if isinstance(value, int) and value < 1:
            raise ValueError(f"max_members must be 'auto' or a positive integer, got {value}")
        return value



def fused_placement(fusion: FusionConfig | None) -> Literal["device", "bubbles"] | None:
    """Where a sweep's fused groups train, or None for a sweep that is not fused (no `fusion:`
    block, or `enabled: false`): the one reading of the block that every question of mode asks."""
    return fusion.placement if fusion is not None and fusion.enabled else None


class CheckpointPolicy(_Strict):
    """How often a trial's state is persisted: after a crash a trial loses at most `every`
    iterations, and `at_end` keeps the final state (the one a user deploys or transfers). The
    engines apply it through `hpo.base.checkpointing.checkpoint_due`."""

    every: int = Field(DEFAULT_CHECKPOINT_EVERY, ge=1)
    at_end: bool = True


class SweepSpec(_Strict):
    name: str
    description: str = ""
    trainable: str
    method: Literal["random", "grid", "tpe", "optuna", "bayes"] = "random"
    metric: MetricSpec
    parameters: dict[str, ParameterSpec]
    early_terminate: EarlyTerminateSpec | None = None
    run_cap: int | None = Field(None, ge=1)
    max_iterations: int = Field(DEFAULT_MAX_ITERATIONS, ge=1)
    resources: ResourcesSpec = ResourcesSpec()
    max_concurrent_trials: int | None = Field(None, ge=1)
    time_budget_s: float | None = Field(None, gt=0)
    stop: dict[str, float] | None = None
    storage_path: str = "runs"
    max_failures: int = Field(1, ge=0)
    seed: int | None = Field(None, ge=0, le=2**32 - 1)  # NumPy's and Optuna's seeds
    scaling: ScalingConfig | None = None
    fusion: FusionConfig | None = None
    checkpoint: CheckpointPolicy = CheckpointPolicy()
    logging: LoggingSpec | None = None

    @field_validator("name")
    @classmethod
    def _one_path_component(cls, name: str) -> str:
        if not SAFE_NAME.fullmatch(name) or name.endswith("."):
            raise ValueError(
                f"{name!r} is not a safe folder name: the run is stored in storage_path/<name>, so use "
                "letters, digits, '_', '-' and '.', starting with a letter or digit (at most 100 characters); "
                "without a 'name' key the file name is used"
            )
        return name

    @field_validator("parameters")
    @classmethod
    def _some_parameters(cls, parameters: dict[str, ParameterSpec]) -> dict[str, ParameterSpec]:
        if not parameters:
            raise ValueError("no parameters to tune; give at least one, e.g. lr: {min: 0.0001, max: 0.1}")
        return parameters

    @model_validator(mode="after")
    def _check_method(self) -> "SweepSpec":
        if self.method == "grid":
            for key, param in self.parameters.items():
                if param.is_continuous or param.distribution == "int_uniform":
                    raise _KeyedError(
                        f"parameters.{key}.distribution",
                        f"grid search needs discrete values, but {key!r} is {param.distribution}; use 'values'",
                    )
            if self.run_cap is not None:  # W&B caps a grid at run_cap runs; Tune has no such cap
                raise _KeyedError(
                    "run_cap",
                    f"a grid runs each of its {self.grid_size} combinations once, so run_cap would not cap it; "
                    "remove run_cap, or use method: random to sample run_cap of them",
                )
        if self.searcher_kind == "tpe":
            for key, param in self.parameters.items():
                if param.distribution in TPE_REFUSES:
                    raise _KeyedError(
                        f"parameters.{key}.distribution",
                        f"method {self.method}: {param.distribution} for {key!r}: {TPE_REFUSES[param.distribution]}",
                    )
        if self.early_terminate and self.early_terminate.max_iter and self.early_terminate.max_iter > self.max_iterations:
            raise _KeyedError(
                "early_terminate.max_iter",
                f"max_iter ({self.early_terminate.max_iter}) exceeds max_iterations ({self.max_iterations})",
            )
        if self.fusion and self.fusion.compile == "graphs" and self.resources.gpu <= 0:
            raise _KeyedError(
                "fusion.compile", "compile 'graphs' captures CUDA graphs and needs a GPU; set resources.gpu or use 'inductor'"
            )
        return self

    @property
    def searcher_kind(self) -> str:
        """`bayes` and `optuna` are aliases of TPE (Optuna's sampler)."""
        return "tpe" if self.method in ("tpe", "optuna", "bayes") else self.method

    @property
    def num_samples(self) -> int:
        """Trials to sample; a grid runs every combination once (a grid with run_cap is refused)."""
        if self.method == "grid":
            return 1
        return self.run_cap or 10

    @property
    def grid_size(self) -> int:
        """Combinations in one pass of a grid sweep: the product of every `values` list's length."""
        return math.prod(len(p.values) for p in self.parameters.values() if p.distribution == "categorical")

    @property
    def trial_count(self) -> int:
        """Trials the sweep runs (at most, for a time-budgeted one): a grid repeats `num_samples` times."""
        return self.grid_size * self.num_samples if self.searcher_kind == "grid" else self.num_samples

    @property
    def tpe_startup_trials(self) -> int:
        """Random trials before TPE models the results: a third of the budget, between 2 and 10."""
        return min(10, max(2, self.num_samples // 3))

    @classmethod
    def from_source(cls, source: "LineNumbered") -> "SweepSpec":
        """The spec a parsed sweep file (`hpo.config.sweep_file.YamlSource`) holds; every error names its line."""
        data = source.data
        if not isinstance(data, dict):
            raise SweepConfigError([ConfigIssue("", "a sweep file must be a mapping of keys", 1)], source.name)
        if "name" not in data:
            data = {**data, "name": Path(source.name).stem}
        try:
            # strict: a YAML `true` or `'5'` is no count and no bound (pydantic would read them as 1 and 5)
            return cls.model_validate(data, strict=True)
        except ValidationError as exc:
            raise SweepConfigError(_issues(exc, source), source.name) from None


class LineNumbered(Protocol):
    """A parsed file that knows the line of each key path (`hpo.config.sweep_file.YamlSource`)."""

    name: str
    data: Any

    def line_of(self, path: str) -> int | None: ...


class _KeyedError(ValueError):
    """A validation error that knows which sub-key is at fault (pydantic reports the parent)."""

    def __init__(self, key: str, message: str):
        self.key = key
        super().__init__(message)


_MODELS_BY_PATH_DEPTH: dict[str, type[BaseModel]] = {
    "": SweepSpec,
    "metric": MetricSpec,
    "early_terminate": EarlyTerminateSpec,
    "resources": ResourcesSpec,
    "fusion": FusionConfig,
    "scaling": ScalingConfig,
    "checkpoint": CheckpointPolicy,
    **LOGGING_MODELS,
}


def _issues(exc: ValidationError, source: LineNumbered) -> list[ConfigIssue]:
    issues = []
    for error in exc.errors():
        loc = [str(part) for part in error["loc"]]
        message = error["msg"].removeprefix("Value error, ")
        keyed = (error.get("ctx") or {}).get("error")
        if isinstance(keyed, _KeyedError):
            loc.append(keyed.key)
            message = str(keyed)
        if error["type"] == "extra_forbidden" and (_block(loc[:-1]), loc[-1]) in WANDB_ONLY_KEYS:
            message = f"W&B's {loc[-1]!r} has no counterpart here: {WANDB_ONLY_KEYS[_block(loc[:-1]), loc[-1]]}"
        elif error["type"] == "extra_forbidden":
            message = f"unknown key {loc[-1]!r}{did_you_mean_key(loc[-1], _allowed_keys(loc[:-1]))}"
        elif error["type"] == "missing":
            message = f"required key {loc[-1]!r} is missing"
        elif error["type"] == "model_type" and len(loc) == 2 and loc[0] == "parameters":
            given = error["input"]
            if isinstance(given, list):
                advice = f"write {{values: {given!r}}} to search these values, or {{value: {given!r}}} to fix the list"
            else:
                advice = f"write {{value: {given!r}}} to fix it, or {{values: [...]}} or {{min: ..., max: ...}} to search it"
            message = f"{given!r} is not a parameter: {advice}"
        elif error["type"] == "model_type":  # a block given as one value: `fusion: true`, `early_terminate: asha`
            given, keys = error["input"], _allowed_keys(loc)
            shown = str(given).lower() if isinstance(given, bool) else repr(given)  # as YAML spells it
            write = f"{{enabled: {shown}}}" if isinstance(given, bool) and "enabled" in keys else "{key: value, ...}"
            message = f"{shown} is not a block of settings: write {write} (its keys: {', '.join(keys)})"
        elif error["type"] in SCALAR_TYPE_ERRORS:
            given = error["input"]
            message += f", got {str(given).lower() if isinstance(given, bool) else repr(given)}"
        path = ".".join(loc)
        issues.append(ConfigIssue(path, message, source.line_of(path)))
    return [issue for issue in issues if not _suggested_elsewhere(issue, issues)]


def _suggested_elsewhere(issue: ConfigIssue, issues: list[ConfigIssue]) -> bool:
    """A missing key that a misspelt key beside it is already told to be (`paramters`): one line
    says it all, where a second would send the user looking for a key they did write."""
    if not issue.message.startswith("required key"):
        return False
    parent, _, key = issue.path.rpartition(".")
    return any(
        other.path.rpartition(".")[0] == parent and other.message.endswith(f"(did you mean {key!r}?)")
        for other in issues
    )


#: Pydantic's errors for a scalar of the wrong type, to which the value given is added.
SCALAR_TYPE_ERRORS = frozenset({"int_type", "float_type", "string_type", "bool_type", "int_from_float", "list_type"})


def _block(parent: list[str]) -> str:
    """The block a key path stands in: "parameter" for any one parameter, else the dotted path."""
    return "parameter" if len(parent) == 2 and parent[0] == "parameters" else ".".join(parent)


def _allowed_keys(parent: list[str]) -> list[str]:
    block = _block(parent)
    model = ParameterSpec if block == "parameter" else _MODELS_BY_PATH_DEPTH.get(block, SweepSpec)
    return list(model.model_fields)


#: Keys of a W&B sweep file that mean nothing here, by (block, key), with what to write instead:
#: "unknown key" alone would leave a W&B user wondering whether they misspelt it.
WANDB_ONLY_KEYS: dict[tuple[str, str], str] = {
    ("", "command"): "hpo calls the trainable in its own process, with no command line; name it in 'trainable'",
    ("", "entity"): "a W&B entity goes in the logging block: logging: {wandb: {entity: ...}}",
    ("", "project"): "a W&B project goes in the logging block: logging: {wandb: {project: ...}}",
    ("parameter", "parameters"): "nested parameters are not supported; give each its own top-level name "
                                 "(e.g. optimizer_lr) and build the nested config in the trainable",
    ("metric", "target"): "a sweep here does not end at a target; stop: {<metric>: <value>} ends each trial "
                          "whose result reaches it",
    ("early_terminate", "s"): "Tune's HyperBand sets its brackets from max_iter and eta; remove s",
    ("early_terminate", "strict"): "Tune's schedulers have no strict mode; remove strict",
}


def did_you_mean(word: str, choices: Any) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""



def unknown_distribution(kind: str, low: Any = None, high: Any = None) -> str:
    """Why `kind` is refused, with the distribution it most likely means: a name another tool uses
    for something else says what to write instead; a misspelling is matched against every name
    and alias, by what it means: a log-uniform whose bounds (`low`, `high`) are values is
    `log_uniform_values`, never `log_uniform`, which would search exp(low) to exp(high)."""
    spelled = kind.strip().lower().replace("-", "_").replace(" ", "_")
    if spelled in REFUSED_DISTRIBUTIONS:
        return f"unknown distribution {kind!r}: {REFUSED_DISTRIBUTIONS[spelled]}"
    meanings = {**{name: name for name in DISTRIBUTIONS}, **DISTRIBUTION_ALIASES}
    close = difflib.get_close_matches(spelled, [*meanings, *REFUSED_DISTRIBUTIONS], n=1, cutoff=0.6)
    if close and close[0] in REFUSED_DISTRIBUTIONS:
        return f"unknown distribution {kind!r}: {REFUSED_DISTRIBUTIONS[close[0]]}"
    meant = meanings[close[0]] if close else None
    if meant == "log_uniform" and _look_like_values(low, high):
        meant = "log_uniform_values"
    hint = f" (did you mean {meant!r}?)" if meant else ""
    return f"unknown distribution {kind!r}{hint}; expected one of {', '.join(DISTRIBUTIONS)}"


def _look_like_values(low: Any, high: Any) -> bool:
    """Bounds that read as the values of a log-scale parameter (a learning rate), not its logs."""
    numbers = [v for v in (low, high) if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return len(numbers) == 2 and all(0 < v <= 1 for v in numbers)


#: Other tools' names (Ray Tune's, Optuna's, W&B's, argparse habits) for the keys of a sweep file:
#: each maps to the keys it may mean, and "did you mean" offers the first one allowed where it stands.
KEY_SYNONYMS: dict[str, tuple[str, ...]] = {
    "low": ("min",), "lower": ("min",), "minimum": ("min",), "lo": ("min",),
    "high": ("max",), "upper": ("max",), "maximum": ("max",), "hi": ("max",),
    "mean": ("mu",), "loc": ("mu",), "std": ("sigma",), "sd": ("sigma",), "stddev": ("sigma",), "scale": ("sigma",),
    "step": ("q",), "quantization": ("q",), "choices": ("values",), "options": ("values",),
    "categories": ("values",), "grid_search": ("values",), "default": ("value",),
    "dist": ("distribution",), "type": ("distribution",), "log": ("distribution",),
    "num_samples": ("run_cap",), "n_trials": ("run_cap",), "count": ("run_cap",), "max_trials": ("run_cap",),
    "search_alg": ("method",), "searcher": ("method",), "algorithm": ("method",), "sampler": ("method",),
    "search": ("method",), "scheduler": ("early_terminate",), "pruner": ("early_terminate",),
    "max_concurrent": ("max_concurrent_trials",), "concurrency": ("max_concurrent_trials",),
    "time_budget": ("time_budget_s",), "timeout": ("time_budget_s",),
    "max_t": ("max_iter", "max_iterations"), "iterations": ("max_iterations",), "epochs": ("max_iterations",),
    "training_iteration": ("max_iterations",), "grace_period": ("min_iter",), "min_t": ("min_iter",),
    "reduction_factor": ("eta",), "mode": ("goal",), "direction": ("goal",),
    "resources_per_trial": ("resources",), "cpus": ("cpu",), "num_cpus": ("cpu",), "cpus_per_trial": ("cpu",),
    "gpus": ("gpu",), "num_gpus": ("gpu",), "gpus_per_trial": ("gpu",),
    "local_dir": ("storage_path",), "storage": ("storage_path",), "output_dir": ("storage_path",),
    "config": ("parameters",), "param_space": ("parameters",), "search_space": ("parameters",),
    "params": ("parameters",), "hyperparameters": ("parameters",),
    "program": ("trainable",), "function": ("trainable",), "train_fn": ("trainable",), "run": ("trainable",),
    "max_retries": ("max_failures",), "retries": ("max_failures",),
    "random_seed": ("seed",), "random_state": ("seed",),
    "members": ("max_members",), "group_size": ("max_members",), "num_members": ("max_members",),
    "frequency": ("every",), "checkpoint_frequency": ("every",), "checkpoint_freq": ("every",),
    "checkpoint_at_end": ("at_end",),
}


def did_you_mean_key(word: str, allowed: Any) -> str:
    """" (did you mean 'min'?)" for a key written as another tool writes it (`low`), or misspelt."""
    allowed = list(allowed)
    spelled = word.strip().lower().replace("-", "_")
    meant = next((key for key in KEY_SYNONYMS.get(spelled, ()) if key in allowed), None)
    return f" (did you mean {meant!r}?)" if meant else did_you_mean(spelled, allowed)
