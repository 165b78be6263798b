"""The differential guard: a fused group trains only after a copy of it has trained as its members do alone.

`fuse_models` checks a fused model's outputs and that members cannot see each other; neither
sees a member that trains wrongly on its own (a frozen parameter stepped, a hyperparameter
applied to the wrong member, a layer whose gradient is off). So before a group trains:

- `check_shared_batches`: each member's own data stream is the one the group shares;
- `check_initial_states`: every member's row of the fused model holds exactly its own model's
  parameters and buffers;
- `verify_fused_training`: a copy of the fused model, reduced to the *witnesses*
  (`choose_witnesses`), takes a few optimizer steps in float64 on the CPU, on a few samples of
  the group's first batches, with the witnesses' own hyperparameters, and beside it each
  witness trains its own model under `torch.optim` (the unfused trainer's step, `hpo.base.training.optimizer_step`).
  For each witness it compares every parameter and buffer afterwards (frozen and unused ones
  included), the loss at every step and every output on a probe batch (the next batch) in
  eval mode, and names the first that differs.

Witnesses, not every member: a member's own model steps through PyTorch's per-parameter Python
(autograd, `torch.optim`, the schedule) at about a millisecond a step for a small model, so B
members alone would cost a good part of a small group's first iteration. What goes wrong for
one member of a fused group goes wrong for every member that uses the same features (a fused
layer's arithmetic, a skipped or frozen parameter), so the witnesses are a few members that
between them use every optimizer feature some member uses (weight decay, clipping, momentum,
Nesterov, warm-up, a schedule) and every muP multiplier in which members differ (member 0 when
none does); rows that mix up members are caught by the initial states here and by the
member-independence check (`fusion.independence`).

Float64 leaves rounding nowhere to hide: the tolerance is 1e-12 relative. Two kinds of
difference are not faults:
- A parameter direction the model's outputs do not depend on, whose gradient is rounding noise
  fused or not, which Adam turns into lr-sized steps (the key bias of softmax attention: shifting
  every logit of a query changes nothing). So where parameters or buffers differ, the member's
  own model takes the fused values of all of them, and if its outputs and loss on the probe batch
  stay the same the difference is in that null space.
- A difference PyTorch makes itself. Some results are so sensitive to rounding that the member's
  own run moves them far past 1e-12 when nothing but the rounding changes: a Linear's or Conv's
  bias under BatchNorm gets a gradient the batch mean cancels to rounding noise, Adam divides
  that noise by its own square root, and the bias (with the running mean that follows it, and
  the eval outputs that read that) lands 1e-10 away after two steps; a LayerNorm's bias before
  such a Linear lands lr-sized steps away. Where a result differs, the member's run is repeated
  with every parameter moved by one ulp (`torch.nextafter`), up and then down, and a fused result
  within NOISE_FACTOR times the farther run's distance from the member's own is rounding. A fault
  (a wrong learning rate, decay, clip or row) moves results by far more than the rounding of
  well-conditioned ones, whose own noise is some 1e-16.
A parameter that got no gradient in the member's run (frozen, unused) must match exactly as
well: there the member's value is its initial one.

A model that draws random numbers in training (dropout) takes its steps in eval mode: fused
and unfused draws differ by design. A model that differs is refused with a FusionError naming
the member and the first loss, parameter or output that differs, before any real training.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, NamedTuple

import torch
from torch import nn
from torch.nn.parameter import is_lazy
from torch.overrides import TorchFunctionMode

from fusion.grouping import MULTIPLIER_KEYS
from fusion.independence import output_tensors, preserved_state
from fusion.layers import FusionError, describe_error
from fusion.model import FusedModel
from fusion.optim import FusedOptimizer
from hpo.base.hparams import OptimHParams, build_torch_optimizer
from hpo.base.trial_state import ResumableBatches
from hpo.base.training import optimizer_step
from hpo.base.workload import Batch, Workload

#: Optimizer steps of the check: the second sees moments, schedules, and per-parameter step
#: counts that a parameter without a gradient in the first left behind.
STEPS = 2
#: Samples of each batch the check trains on (the arithmetic per sample is what it checks).
SAMPLES = 4
#: Relative difference (of a tensor's norm) above which float64 results are different.
RTOL = 1e-12
#: How many times the member's own rounding noise (see the module doc) a fused result may differ by.
NOISE_FACTOR = 100

#: A member's per-parameter multipliers, by parameter name: lr, weight decay, Adam eps
#: (`Workload.lr_multipliers`, `weight_decay_multipliers`, `eps_multipliers`).
Multipliers = tuple[Mapping[str, float], Mapping[str, float], Mapping[str, float]]

#: One fused training step: (fused model, optimizer, inputs, targets) -> the members' `[B]` losses.
FusedStep = Callable[[FusedModel, FusedOptimizer, torch.Tensor, torch.Tensor], torch.Tensor]


#: Optimizer settings a member may use that change which code of the fused step runs.
_FEATURES: dict[str, Callable[[OptimHParams], bool]] = {
    "weight decay": lambda hp: hp.weight_decay != 0,
    "clipping": lambda hp: hp.grad_clip > 0,
    "momentum": lambda hp: hp.momentum != 0,
    "nesterov": lambda hp: hp.nesterov,
    "warm-up": lambda hp: hp.warmup_steps > 0,
    "schedule": lambda hp: hp.lr_schedule != "constant",
}


def choose_witnesses(configs: Sequence[Mapping[str, Any]], hparams: Sequence[OptimHParams]) -> list[int]:
    """Greedily, the members that add the most features no witness has yet (the first such member
    on a tie); member 0 where no member uses any."""

    def features(index: int) -> set[str]:
        used = {name for name, uses in _FEATURES.items() if uses(hparams[index])}
        return used | {key for key in MULTIPLIER_KEYS if configs[index].get(key) != configs[0].get(key)}

    chosen: list[int] = []
    covered: set[str] = set()
    wanted = set().union(*(features(i) for i in range(len(configs))))
    while wanted - covered:
        best = max(range(len(configs)), key=lambda i: len(features(i) - covered))
        chosen.append(best)
        covered |= features(best)
    return sorted(chosen) or [0]


def copy_witnesses(models: Sequence[nn.Module], indices: Sequence[int]) -> dict[int, nn.Module]:
    """Float64 CPU copies of the witnesses' models, taken before fusing consumes them (made in
    the check's precision at once: one copy of each tensor, not a copy and then a conversion)."""
    return {index: _float64_copy(models[index]) for index in indices}


def check_initial_states(fused: FusedModel, members: Sequence[nn.Module]) -> None:
    """Every member's row of `fused` holds its own model's tensors, exactly (right after fusing):
    each fused tensor against its members' tensors stacked, so the check costs a few operations
    per tensor, not per member and tensor."""
    rows = {name: t for name, t in fused.module.state_dict().items() if name not in fused.internal_names}
    owns = [_named_tensors(member) for member in members]
    for name, tensor in rows.items():
        own = [tensors[name].to(tensor.device) for tensors in owns]
        if len({t.shape for t in own}) == 1 and torch.equal(tensor, torch.stack(own)):
            continue
        index = next((i for i, t in enumerate(own) if not torch.equal(tensor[i], t)), None)
        if index is not None:
            raise _refusal(f"member {index}'s '{name}' is not its own model's before training", checked="a comparison")


def check_batches(workload: Workload, config: Mapping[str, Any]) -> list[Batch]:
    """The group's first STEPS + 1 batches (the steps' and the probe), read from a stream of the
    check's own: the trainer's stays where it is."""
    stream = ResumableBatches.of_workload(workload, config)
    return [stream.batch(step) for step in range(STEPS + 1)]


def check_shared_batches(workload: Workload, configs: Sequence[Mapping[str, Any]], first: Batch) -> None:
    """Refuse a group whose members would not train on one stream alone: `first` is config 0's
    first batch, which every member trains on fused, and the last config's own first batch must
    equal it. A workload breaks this when its `train_batches` reads a key the members differ in
    (a shuffle seeded from `config["seed"]` rather than its `seed` argument, the data seed); each
    member alone would see other batches. One other member's batch keeps the cost flat in B."""
    if len(configs) < 2:
        return
    own = ResumableBatches.of_workload(workload, configs[-1]).batch(0)
    if not all(torch.equal(mine, shared) for mine, shared in zip(own, first)):
        raise FusionError(
            f"config {len(configs) - 1}'s training batches differ from config 0's, which every member of a fused "
            "group trains on: the workload's train_batches may depend only on batch_size and its seed argument "
            "(data_seed), not on a key the members differ in (seed, lr, ...); fix train_batches, or train these "
            "configurations unfused (fusion: {enabled: false})"
        )


def verify_fused_training(
    fused: FusedModel,
    witnesses: Mapping[int, nn.Module],
    hparams: Sequence[OptimHParams],
    multipliers: Sequence[Multipliers],
    workload: Workload,
    batches: Sequence[Batch],
    fused_step: FusedStep,
    samples: int | None = SAMPLES,
) -> None:
    """Raise FusionError unless `fused` (left as it is) trains as the witnesses (member index ->
    its unfused model as built; the check trains them) train alone. `hparams` and `multipliers`
    (each member's lr, weight-decay and Adam-eps multipliers: muP, depth) are every member's; the
    check takes a step on each of `batches` but the last, the probe (on the first `samples`
    samples of each; None: all)."""
    steps = len(batches) - 1
    indices = sorted(witnesses)
    with _refusing(f"a check of {steps} float64 steps"), torch.random.fork_rng(devices=[]), _float64_throughout():
        fused_copy = _rows_copy(fused, indices)
        alone = [witnesses[index] for index in indices]
        own_hparams = [hparams[index] for index in indices]
        own_multipliers = [multipliers[index] for index in indices]
        data = [(_small(x, samples), _small(y, samples)) for x, y in batches]
        probe, _ = data[steps]
        optimizer = FusedOptimizer(
            dict(fused_copy.module.named_parameters()),
            own_hparams,
            [lr for lr, _, _ in own_multipliers],
            weight_decay_multipliers=[decay for _, decay, _ in own_multipliers],
            eps_multipliers=[eps for _, _, eps in own_multipliers],
            table_steps=steps + 1,
        )
        training = not fused.draws_random
        fused_losses = []
        fused_copy.train(training)
        for x, y in data[:steps]:
            fused_losses.append(fused_step(fused_copy, optimizer, x, y).detach())
        replaced = optimizer.replaced_parameters()
        if replaced:  # the cause, where comparing would only find the parameter differing
            raise FusionError(
                f"parameter '{replaced[0]}' got new storage during training (param.data = ...), so the fused optimizer, "
                "which steps its own matrix, no longer updates it; assign in place (param.copy_(...) under torch.no_grad()), "
                "or train these configurations unfused (fusion: {enabled: false})"
            )
        fused_outputs = _eval_outputs(fused_copy, probe)
        for row, (index, model, hp) in enumerate(zip(indices, alone, own_hparams)):
            start = _float64_copy(model)  # the member before its steps: the rounding-noise runs start here
            initial = {name: p.detach() for name, p in start.named_parameters()}
            stepped = _train_alone(model, hp, multipliers[index], workload, data[:steps], training)
            own_outputs = _eval_outputs(model, probe)
            own = _Results(model.state_dict(), stepped.losses, own_outputs)
            noise = _RoundingNoise(start, own, hp, multipliers[index], workload, data, training)
            # parameters first: a wrong one names the cause, a wrong loss only the symptom
            _compare_state(fused_copy.member_state_dict(row), model, index, initial, stepped.received, workload, data[steps], noise)
            for step, expected in enumerate(stepped.losses):
                _compare(fused_losses[step][row], expected, f"member {index}'s training loss at step {step + 1}", noise.of_loss(step))
            for k, (got, expected) in enumerate(zip(fused_outputs, own_outputs)):
                _compare(got[row], expected, f"member {index}'s output {k} on a probe batch (eval mode)", noise.of_output(k))


def _rows_copy(fused: FusedModel, rows: Sequence[int]) -> FusedModel:
    """A float64 CPU copy of `fused` holding only `rows`."""
    return _float64_copy(fused, torch.as_tensor(list(rows), dtype=torch.long))


def _float64_copy(model: nn.Module, rows: torch.Tensor | None = None) -> nn.Module:
    """A float64 CPU copy of `model` (of only `rows` of each tensor, if given): its tensors are
    made first and handed to `copy.deepcopy`, which then copies the structure only (not every
    tensor, twice). Parameters keep their attributes (mup's `infshape`, which `MuReadout` reads
    in `forward`), which `copy.deepcopy` would drop. A module's empty hook tables (a dozen each)
    are handed over as new empty ones: `copy.deepcopy` would rebuild each through its pickling
    protocol, most of the copy's time."""
    memo: dict[int, Any] = {}
    for module in model.modules():
        for value in vars(module).values():
            if type(value) in _EMPTY_COPIES and not value:
                memo.setdefault(id(value), type(value)())
            elif isinstance(value, torch.Tensor) and value.grad_fn is not None:
                # a tensor computed from the parameters (the `weight` torch.nn.utils.weight_norm
                # recomputes before every forward), which copy.deepcopy refuses: copied detached
                memo.setdefault(id(value), value.detach().clone())
        for table in (module._parameters, module._buffers):
            for tensor in table.values():
                if tensor is None or id(tensor) in memo or is_lazy(tensor):  # a lazy one: fusing names it
                    continue
                value = tensor.detach() if rows is None else tensor.detach()[rows.to(tensor.device)]
                dtype = torch.float64 if value.is_floating_point() else value.dtype
                value = value.to(device="cpu", dtype=dtype, copy=rows is None)
                if isinstance(tensor, nn.Parameter):
                    value = nn.Parameter(value, tensor.requires_grad)
                    value.__dict__.update(tensor.__dict__)
                memo[id(tensor)] = value
    return copy.deepcopy(model, memo)


#: Container types whose empty instances `_float64_copy` copies as new empty ones.
_EMPTY_COPIES = (OrderedDict, dict, set)


def _named_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """Parameters and buffers by every name they have, in one walk of the modules."""
    return {
        f"{path}.{name}" if path else name: tensor
        for path, module in model.named_modules(remove_duplicate=False)
        for table in (module._parameters, module._buffers)
        for name, tensor in table.items()
        if tensor is not None
    }


class _Differs(Exception):
    """What differs (the refusal's message adds what was checked)."""


@contextmanager
def _refusing(checked: str) -> Iterator[None]:
    """What differs, or a model the check cannot run (one that casts to float32 in `forward`),
    becomes the refusal: a group nothing vouches for does not train unless asked to."""
    try:
        yield
    except _Differs as difference:
        raise _refusal(str(difference), checked) from None
    except FusionError:
        raise
    except Exception as error:
        raise FusionError(
            f"the differential check cannot train this group in float64 on the CPU ({describe_error(error)}); "
            "fusion: {verify: false} trains it unchecked"
        ) from error


def _eval_outputs(model: nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    """Outputs in eval mode (the check's models are done training), with autograd on: eval mode
    without it takes PyTorch's inference fast paths (`nn.TransformerEncoderLayer`'s), which only
    one of the two sides would take."""
    model.eval()
    with torch.enable_grad():
        return [t.detach() for t in output_tensors(model(x))]


class _AloneRun:
    def __init__(self):
        self.losses: list[torch.Tensor] = []
        #: Parameters that got a gradient in some step.
        self.received: set[str] = set()


def _train_alone(
    model: nn.Module,
    hp: OptimHParams,
    multipliers: Multipliers,
    workload: Workload,
    data: Sequence[Batch],
    training: bool,
) -> _AloneRun:
    """A step on each batch of `data`, the unfused trainer's own update: `TrialTrainer`'s optimizer (with the
    member's lr, decay and eps multipliers, read from its original model: a copy has lost mup's shapes),
    schedule and clipping."""
    optimizer = build_torch_optimizer(model.named_parameters(), hp, *multipliers)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, hp.lr_factor)
    run = _AloneRun()
    named = list(model.named_parameters())
    model.train(training)
    for x, y in data:
        loss = workload.loss(model(x), y)
        optimizer_step(model, optimizer, loss, grad_clip=hp.grad_clip, schedule=schedule)
        run.losses.append(loss.detach().reshape(()))  # a one-element loss (`.view(1)`) as the fused member's number
        run.received |= {name for name, p in named if p.grad is not None}
    return run


def _compare_state(
    fused_state: Mapping[str, torch.Tensor],
    model: nn.Module,
    index: int,
    initial: Mapping[str, torch.Tensor],
    received: set[str],
    workload: Workload,
    probe_batch: Batch,
    noise: _RoundingNoise,
) -> None:
    """Member `index`'s parameters and buffers (see the module doc for the null space and for
    rounding noise)."""
    own_state = model.state_dict()
    differing = [
        name for name, tensor in own_state.items()
        if not _close(fused_state[name], tensor) and not noise.of_state(name)(fused_state[name], tensor)
    ]
    without_gradient = [name for name in differing if name in initial and name not in received]
    if without_gradient:
        name = without_gradient[0]
        moved = "moved" if _close(own_state[name], initial[name]) else "differs"
        raise _Differs(f"member {index}'s parameter '{name}' {moved} although it gets no gradient (frozen or unused)")
    if differing and not _outputs_ignore(model, {name: fused_state[name] for name in differing}, probe_batch, workload):
        name = differing[0]
        kind = "parameter" if name in initial else "buffer"
        raise _Differs(f"member {index}'s {kind} '{name}' differs ({_relative(fused_state[name], own_state[name]):.1e} relative)")


def _outputs_ignore(model: nn.Module, values: Mapping[str, torch.Tensor], batch: Batch, workload: Workload) -> bool:
    """Whether `model`'s eval outputs and training loss on `batch` stay the same (within RTOL)
    when its tensors named in `values` take those values: a difference in the null space."""

    def run() -> list[torch.Tensor]:
        x, y = batch
        with torch.enable_grad():
            model.eval()
            outputs = [t.detach() for t in output_tensors(model(x))]
            model.train()
            torch.manual_seed(0)
            return [*outputs, workload.loss(model(x), y).detach()]

    with preserved_state(model):
        before = run()
    with preserved_state(model):
        with torch.no_grad():
            for name, value in values.items():
                _tensor(model, name).copy_(value)
        after = run()
    return all(_close(a, b) for a, b in zip(after, before))


def _tensor(model: nn.Module, name: str) -> torch.Tensor:
    owner, _, leaf = name.rpartition(".")
    module = model.get_submodule(owner)
    return module._parameters[leaf] if leaf in module._parameters else module._buffers[leaf]


def _relative(got: torch.Tensor, expected: torch.Tensor) -> float:
    if got.shape != expected.shape:
        return float("inf")
    difference = (got.double() - expected.double()).norm().item()
    scale = expected.double().norm().item()
    return difference / scale if scale else difference


def _close(got: torch.Tensor, expected: torch.Tensor) -> bool:
    if got.shape != expected.shape:
        return False
    if torch.equal(got, expected) or not expected.is_floating_point():  # equal: the stacked path's usual case
        return bool(torch.equal(got, expected))
    nan = expected.isnan()
    if not torch.equal(got.isnan(), nan):
        return False
    got, expected = got.masked_fill(nan, 0).double(), expected.masked_fill(nan, 0).double()
    return bool((got - expected).norm() <= RTOL * expected.norm())


def _compare(got: torch.Tensor, expected: torch.Tensor, what: str, within_noise: Callable[[torch.Tensor, torch.Tensor], bool]) -> None:
    if not _close(got, expected) and not within_noise(got, expected):
        raise _Differs(f"{what} differs ({_relative(got, expected):.1e} relative)")


class _Results(NamedTuple):
    """What a member's run is compared by: its state, its losses and its eval outputs."""

    state: Mapping[str, torch.Tensor]
    losses: list[torch.Tensor]
    outputs: list[torch.Tensor]


class _RoundingNoise:
    """How far the member's own results (`own`) move when only their rounding changes: its run
    repeated from `start`, its state before the run, with every parameter one ulp up, and once one
    ulp down (see the module doc); the larger distance of the two, as one draw of noise can fall
    near zero. The runs are taken only when some result differs past RTOL, so a group that matches
    pays one copy of each witness."""

    def __init__(self, start: nn.Module, own: _Results, hp: OptimHParams, multipliers: Multipliers,
                 workload: Workload, data: Sequence[Batch], training: bool):
        self._start, self._own, self._hp, self._multipliers = start, own, hp, multipliers
        self._workload, self._data, self._training = workload, data, training
        self._nudged: list[_Results] = []

    def of_state(self, name: str) -> Callable[[torch.Tensor, torch.Tensor], bool]:
        return lambda got, expected: self._within(got, expected, lambda results: results.state[name])

    def of_loss(self, step: int) -> Callable[[torch.Tensor, torch.Tensor], bool]:
        return lambda got, expected: self._within(got, expected, lambda results: results.losses[step])

    def of_output(self, k: int) -> Callable[[torch.Tensor, torch.Tensor], bool]:
        return lambda got, expected: self._within(got, expected, lambda results: results.outputs[k])

    def _within(self, got: torch.Tensor, expected: torch.Tensor, pick: Callable[[_Results], torch.Tensor]) -> bool:
        if got.shape != expected.shape or not expected.is_floating_point() or not torch.isfinite(expected).all():
            return False
        own = pick(self._own).double()
        noise = max((pick(nudged).double() - own).norm() for nudged in self._nudged_runs())
        return bool((got.double() - expected.double()).norm() <= NOISE_FACTOR * noise)

    def _nudged_runs(self) -> list[_Results]:
        if not self._nudged:
            steps = len(self._data) - 1
            for direction in (float("inf"), float("-inf")):
                model = _float64_copy(self._start)
                with torch.no_grad():
                    for parameter in model.parameters():
                        if parameter.is_floating_point():
                            parameter.copy_(torch.nextafter(parameter, torch.full_like(parameter, direction)))
                run = _train_alone(model, self._hp, self._multipliers, self._workload, self._data[:steps], self._training)
                self._nudged.append(_Results(model.state_dict(), run.losses, _eval_outputs(model, self._data[steps][0])))
        return self._nudged


def _refusal(difference: str, checked: str) -> FusionError:
    return FusionError(
        f"the fused group does not train as its members do alone: {difference} ({checked}); it is not "
        "trained (fusion: {verify: false} trains it anyway, unchecked)"
    )


def _small(t: torch.Tensor, samples: int | None) -> torch.Tensor:
    """The first `samples` samples, in float64 where floating (targets too: a regression's)."""
    t = t[:samples].cpu()
    return t.double() if t.is_floating_point() else t


@contextmanager
def _float64_throughout() -> Iterator[None]:
    """The check's models compute in float64 all the way through: tensors they create in
    `forward` (`torch.zeros(...)`) follow the default dtype, and a cast to a lower float precision
    (`x.float()` on uint8 pixels, `.to(torch.float32)`, `.half()`), which users write for the
    precision they train in, casts to float64 instead. The member alone and the fused model run
    the same casts, so the check still compares like with like; without this every such model
    was refused for mixing float32 inputs with float64 weights."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        with _Float64Casts():
            yield
    finally:
        torch.set_default_dtype(previous)


_LOWER_FLOATS = frozenset({torch.float32, torch.float16, torch.bfloat16})
_LOWER_FLOAT_CASTS = frozenset({torch.Tensor.float, torch.Tensor.half, torch.Tensor.bfloat16})


def _as_float64(value: Any) -> Any:
    return torch.float64 if isinstance(value, torch.dtype) and value in _LOWER_FLOATS else value


class _Float64Casts(TorchFunctionMode):
    """Every cast to a lower float precision casts to float64 (`_float64_throughout`)."""

    def __torch_function__(self, func: Callable, types: Any, args: tuple = (), kwargs: Mapping | None = None) -> Any:
        if func in _LOWER_FLOAT_CASTS:
            return args[0] if args[0].dtype == torch.float64 else args[0].double()
        return func(*(_as_float64(a) for a in args), **{k: _as_float64(v) for k, v in (kwargs or {}).items()})
