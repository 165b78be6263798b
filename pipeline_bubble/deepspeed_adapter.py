"""Every private DeepSpeed name this project relies on, in one place, checked against the installed DeepSpeed.

DeepSpeed offers no public hook to time a pipeline schedule or to stage CUDA tensors through the
host on gloo, so bubble harvesting leans on five internals:

- `PipelineEngine._INSTRUCTION_MAP`: the base class's `_exec_schedule` dispatches every schedule
  instruction through this map, so replacing it in a subclass times each one while the schedule
  itself runs unmodified;
- `PipelineEngine._aggregate_total_loss`: where the last stage waits for the others (the loss
  broadcast), the one blocking point outside the instruction map;
- `DeepSpeedEngine.clip_fp32_gradients`: inside the optimizer step (gradient clipping is on by
  default), where every stage all-reduces its gradient norm, a wait on the other stages the
  schedule does not show (a profile times it, `run_collective`);
- re-classing the engine `deepspeed.initialize` returned (`engine.__class__`), because it builds a
  `PipelineEngine` for every `PipelineModule` and offers no way to pick the class;
- `deepspeed.comm.torch._needs_cpu_staging`: the predicate DeepSpeed's gloo path uses to copy
  Apple MPS tensors through host memory; widened to CUDA it lets all stages share one GPU.

A DeepSpeed release may rename any of them. Rather than fail deep inside a training step, importing
this module checks them all (`verify_hooks`) and names each one that is missing together with the
supported versions (`SUPPORTED`, the same range `pyproject.toml` pins for the `bubbles` extra).
Nothing else in the project may touch a private DeepSpeed name.

Every DeepSpeed pipeline of this package imports this module before DeepSpeed initialises, so
importing it also points torch's extension builds at this Python environment (`cpu_ops`): the CPU
op DeepSpeed builds on its first `init_distributed` lands there, not in the user's shared cache.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch

from pipeline_bubble.cpu_ops import use_environment_extensions_dir
# The loss broadcast is no schedule instruction; it is recorded under this name.
from pipeline_bubble.train_schedule import EXCHANGES, LOSS_BROADCAST

#: The DeepSpeed releases these hooks were checked on (`_needs_cpu_staging` first appears in 0.19.6).
SUPPORTED = ">=0.19.6,<0.20"
#: Schedule instructions that block on a neighbour stage (gloo send/recv are rendezvous: both sides wait).
BLOCKING_INSTRUCTIONS = tuple(EXCHANGES)


@dataclass(frozen=True)
class Hook:
    """One DeepSpeed name this project depends on: `module` imported, then `attribute` (dotted) looked up."""

    module: str
    attribute: str

    @property
    def name(self) -> str:
        return f"{self.module}.{self.attribute}"


_ENGINE = "deepspeed.runtime.pipe.engine"
_SCHEDULE = "deepspeed.runtime.pipe.schedule"
#: What instrumenting a pipeline engine needs.
ENGINE_HOOKS = (
    Hook(_ENGINE, "PipelineEngine._INSTRUCTION_MAP"),
    Hook(_ENGINE, "PipelineEngine._aggregate_total_loss"),
    Hook(_ENGINE, "PipelineEngine.train_batch"),
    Hook("deepspeed.runtime.engine", "DeepSpeedEngine.clip_fp32_gradients"),
    *(Hook(_SCHEDULE, name) for name in BLOCKING_INSTRUCTIONS),
)
#: What sharing one GPU between stages over gloo needs (`stage_cuda_on_host`).
STAGING_HOOK = Hook("deepspeed.comm.torch", "_needs_cpu_staging")
HOOKS = (*ENGINE_HOOKS, STAGING_HOOK)


class UnsupportedDeepSpeed(RuntimeError):
    """The installed DeepSpeed lacks a private name this project needs."""


def missing_hooks(
    hooks: Iterable[Hook] = HOOKS, import_module: Callable[[str], ModuleType | Any] = importlib.import_module
) -> list[Hook]:
    """The hooks that `import_module` (DeepSpeed's modules by default) does not provide."""
    missing = []
    for hook in hooks:
        try:
            target: Any = import_module(hook.module)
        except ImportError:
            missing.append(hook)
            continue
        for part in hook.attribute.split("."):
            if not hasattr(target, part):
                missing.append(hook)
                break
            target = getattr(target, part)
    return missing


def verify_hooks(
    hooks: Iterable[Hook] = HOOKS, import_module: Callable[[str], ModuleType | Any] = importlib.import_module
) -> None:
    """Raise `UnsupportedDeepSpeed` naming every missing hook, the installed and the supported versions."""
    missing = missing_hooks(hooks, import_module)
    if missing:
        version = getattr(import_module("deepspeed"), "__version__", "unknown")
        raise UnsupportedDeepSpeed(
            f"DeepSpeed {version} lacks {', '.join(h.name for h in missing)}; "
            f"pipeline_bubble supports deepspeed{SUPPORTED} (pip install 'hydro-hpo[bubbles]')"
        )


use_environment_extensions_dir()  # before DeepSpeed can build its CPU op (see the module docstring)
verify_hooks(ENGINE_HOOKS)  # staging is checked when it is asked for: a CPU pipeline does not need it

from deepspeed.runtime.pipe import schedule  # noqa: E402  (after the check: a clear error first)
from deepspeed.runtime.pipe.engine import PipelineEngine  # noqa: E402

_BLOCKING = tuple(getattr(schedule, name) for name in BLOCKING_INSTRUCTIONS)


def _through_hook(handler: Callable, name: str, blocking: bool) -> Callable:
    def run(self: HookedPipelineEngine, **kwargs):
        return self.run_instruction(lambda: handler(self, **kwargs), name, blocking)

    run.__name__ = handler.__name__
    return run


class HookedPipelineEngine(PipelineEngine):
    """A `PipelineEngine` that sends every schedule instruction and the loss broadcast through `run_instruction`.

    Subclasses override `run_instruction`; they never need a private DeepSpeed name.
    """

    _INSTRUCTION_MAP = {
        cmd: _through_hook(handler, cmd.__name__, cmd in _BLOCKING)
        for cmd, handler in PipelineEngine._INSTRUCTION_MAP.items()
    }

    def _aggregate_total_loss(self):
        return self.run_instruction(super()._aggregate_total_loss, LOSS_BROADCAST, True)

    def clip_fp32_gradients(self):
        # DeepSpeed clips by default (gradient_clipping 1.0): the optimizer step all-reduces the
        # gradient norm over every stage, a collective the schedule does not show
        return self.run_collective(super().clip_fp32_gradients)

    def run_instruction(self, run: Callable[[], Any], name: str, blocking: bool) -> Any:
        """Run one instruction (`run()`); `blocking`: it waits for a neighbour stage."""
        return run()

    def run_collective(self, run: Callable[[], Any]) -> Any:
        """Run the collective hidden inside the running instruction (`run()`): the gradient norm's all-reduce."""
        return run()


def adopt(engine: PipelineEngine, cls: type[HookedPipelineEngine]) -> HookedPipelineEngine:
    """Re-class `engine` (as `deepspeed.initialize` returned it) to `cls`, which adds no constructor state.

    Nothing DeepSpeed initialised is copied, skipped or rebuilt; an engine already of `cls` is
    returned as is. Only a plain `PipelineEngine` is re-classed: another subclass would lose its
    own behaviour.
    """
    if not isinstance(engine, PipelineEngine):
        raise TypeError(f"needs a deepspeed PipelineEngine, got {type(engine).__name__}")
    if isinstance(engine, cls):
        return engine
    if type(engine) is not PipelineEngine:
        raise TypeError(f"re-classes a plain PipelineEngine; {type(engine).__name__} is already a subclass")
    engine.__class__ = cls
    return engine


def stage_cuda_on_host() -> None:
    """Make DeepSpeed's gloo communication stage CUDA tensors through host memory (one-GPU pipelines).

    NCCL refuses two ranks on one device and gloo has no CUDA send/recv; DeepSpeed already stages
    Apple MPS tensors through the host, and this widens that to CUDA.
    """
    verify_hooks([STAGING_HOOK])
    # `import deepspeed.comm.torch as m` would bind deepspeed.comm's `torch` attribute: PyTorch itself.
    ds_torch_comm = importlib.import_module(STAGING_HOOK.module)
    ds_torch_comm._needs_cpu_staging = lambda t: isinstance(t, torch.Tensor) and t.device.type in ("mps", "cuda")
