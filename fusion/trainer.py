"""`FusedTrainer`: `TrialTrainer`'s shape for a fused group of B configurations of one workload.

One actor (one GPU or CPU slot) drives it: `train_iteration()` trains every member
`steps_per_iteration` steps on the shared batches and returns one metrics dict per member, with
the keys `TrialTrainer.train_iteration` reports. Members are named by ids (the caller's trial
ids; by default their index in `configs`) that stay stable while other members leave.

Checkpoints come in two shapes:
- the group's own (`save` / `load`): stacked tensors, one file, fast;
- per member (`member_state_dict` / `save_member`): exactly `TrialTrainer.state_dict()`'s format,
  so a member continues unfused with `TrialTrainer.load_state_dict`, and a group is re-formed
  from members' checkpoints with `FusedTrainer.from_member_states` (members must be at the same
  step: they share one data stream).

Example::

    trainer = FusedTrainer(workload, [{"lr": 1e-3, "seed": 0}, {"lr": 3e-3, "seed": 1}])
    for _ in range(3):
        for member_id, metrics in zip(trainer.member_ids, trainer.train_iteration()):
            print(member_id, metrics["val_loss"])
    trainer.remove_members([1])
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Hashable, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from typing import Any

import torch
from torch.func import vmap
from torch.nn import functional as F

from fusion.compiled import compile_method
from fusion.grouping import FUSIBLE_KEYS, check_fusible
from fusion.layers import FusionError, describe_error
from fusion.model import FusedModel, fuse_models
from fusion.optim import FusedOptimizer, optimized_names
from fusion.verification import (
    check_batches,
    check_initial_states,
    check_shared_batches,
    choose_witnesses,
    copy_witnesses,
    verify_fused_training,
)
from hpo.base.hparams import OptimHParams
from hpo.base.training import build_trial_model, iteration_result
from hpo.base.trial_state import ResumableBatches, load_trial_state, save_trial_state, trial_optimizer, trial_state
from hpo.base.workload import Workload

log = logging.getLogger(__name__)

#: The file a fused group saves into its checkpoint directory.
FUSED_CHECKPOINT_FILE = "fused_state.pt"

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}

#: F.cross_entropy's default ignore_index: positions with this target are left out of the mean.
_IGNORE_INDEX = -100

#: How a group's step runs (`FusedTrainer(compile=...)`, `fusion: {compile: ...}`).
COMPILE_MODES = ("auto", "off", "graphs", "inductor")


def compile_mode(requested: str, device: torch.device) -> str:
    """The step's path on `device`: "off" (eager), "graphs" (CUDA graphs) or "inductor".

    "auto" is eager on a CPU (the eager step there is already compute-bound) and on CUDA takes
    the captured step; "graphs" needs CUDA, so it is refused elsewhere rather than quietly eager.
    """
    if requested not in COMPILE_MODES:
        raise ValueError(f"compile is {requested!r}; expected one of {', '.join(COMPILE_MODES)}")
    if requested == "graphs" and device.type != "cuda":
        raise ValueError(f"compile 'graphs' captures CUDA graphs and needs a CUDA device, not {device.type!r}")
    if requested == "auto":
        return "graphs" if device.type == "cuda" else "off"
    return requested


class FusedTrainer:
    """B configurations of `workload` trained as one fused model with one fused optimizer.

    `dtype` is "fp32" or "bf16" (bf16 autocast for forward and loss, on a bf16 copy of the
    weights cast once per step; the master weights, their gradients and the optimizer state stay
    fp32). `strategy` is passed to `fusion.fuse_models` ("auto", "stacked", "vmap").
    `verify` (default on) trains a float64 copy of the group beside each member's own model for
    a few steps before anything trains, and refuses a group that differs
    (`fusion.verification`); off, a model that fuses wrongly trains on unnoticed.
    `compile` picks the step's path (`compile_mode`): eager ("off"), `torch.compile` with
    inductor of the forward and loss (backward through AOTAutograd) and of the optimizer's update
    ("inductor"), or the same captured into CUDA graphs (`mode="reduce-overhead"`, "graphs").
    """

    def __init__(
        self,
        workload: Workload,
        configs: Sequence[Mapping[str, Any]],
        *,
        member_ids: Sequence[Hashable] | None = None,
        device: str | torch.device = "cpu",
        dtype: str = "fp32",
        strategy: str = "auto",
        fusible_keys: frozenset[str] = FUSIBLE_KEYS,
        verify: bool = True,
        compile: str = "auto",
    ):
        if not configs:
            raise ValueError("a fused group needs at least one config")
        if dtype not in DTYPES:
            raise ValueError(f"dtype is {dtype!r}; expected one of {sorted(DTYPES)}")
        self.workload = workload
        self.configs = [workload.resolve(c) for c in configs]
        check_fusible(self.configs, fusible_keys)
        self.member_ids = list(member_ids) if member_ids is not None else list(range(len(configs)))
        if len(self.member_ids) != len(self.configs) or len(set(self.member_ids)) != len(self.member_ids):
            raise ValueError(f"member_ids must be {len(self.configs)} distinct ids, got {self.member_ids}")
        self.hparams = [OptimHParams.from_config(c) for c in self.configs]
        self.device = torch.device(device)
        self.compile = compile
        self.compile_path = compile_mode(compile, self.device)
        self.dtype = dtype
        self.strategy = strategy
        self.fusible_keys = fusible_keys
        self.verify = verify
        self._vmap_loss = True
        self._vmap_metrics = True
        first = self.configs[0]
        self.steps_per_iteration = int(first.get("steps_per_iteration", workload.steps_per_iteration))
        #: The members' one data stream (they share every batch; `check_fusible` saw to that).
        self.batches = ResumableBatches.of_workload(workload, first)

        models = [build_trial_model(workload, config) for config in self.configs]
        optimized_names(dict(models[0].named_parameters()))  # before the guard: what it refuses, it refuses by name
        multipliers = [workload.lr_multipliers(m, hp.optimizer) for m, hp in zip(models, self.hparams)]
        decay_multipliers = [workload.weight_decay_multipliers(m, hp.optimizer) for m, hp in zip(models, self.hparams)]
        eps_multipliers = [workload.eps_multipliers(m, hp.optimizer) for m, hp in zip(models, self.hparams)]
        first_batch = self.batches.batch(0)
        for part, value in zip(("inputs", "targets"), first_batch):
            if not isinstance(value, torch.Tensor):  # what fusion stacks and folds, and each trainer's evaluation reads
                raise FusionError(
                    f"the workload's batches give their {part} as a {type(value).__name__}; a fused group (and the unfused "
                    "trainer's evaluation) takes each batch as (inputs, targets) of one tensor each"
                )
        if verify:
            check_shared_batches(workload, self.configs, first_batch)
        witnesses = copy_witnesses(models, choose_witnesses(self.configs, self.hparams)) if verify else {}
        fused = fuse_models(models, first_batch[0], strategy)
        if verify:
            check_initial_states(fused, models)
            verify_fused_training(
                fused,
                witnesses,
                self.hparams,
                list(zip(multipliers, decay_multipliers, eps_multipliers)),
                workload,
                check_batches(workload, first),
                self.train_step_on,
            )
        self.model: FusedModel = fused.to(self.device)
        self._full_precision = _beside_running_statistics(self.model)
        self.optimizer = FusedOptimizer(
            dict(self.model.module.named_parameters()),
            self.hparams,
            multipliers,
            weight_decay_multipliers=decay_multipliers,
            eps_multipliers=eps_multipliers,
        )
        self.iteration = 0
        self.step = 0
        self._template: torch.nn.Module | None = None
        self._forward_loss = self.forward_loss
        if self.compile_path != "off":
            mode = "reduce-overhead" if self.compile_path == "graphs" else None
            self._forward_loss = compile_method(self.forward_loss, fullgraph=True, mode=mode)
            if self.compile_path == "graphs":
                self._forward_loss = _graph_step(self._forward_loss)
            self.optimizer.compile_update(mode=mode)

    @property
    def num_members(self) -> int:
        return len(self.member_ids)

    # -- training ------------------------------------------------------------------------------

    @contextmanager
    def _autocast(self) -> Iterator[None]:
        """bf16: the fp32 master weights cast once (one kernel) for the step or evaluation, and
        autocast choosing each op's precision. A compiled step casts inside its graph instead.
        A norm's weights beside running statistics stay fp32 (`_beside_running_statistics`)."""
        if self.dtype == "fp32":
            yield
            return
        with torch.autocast(device_type=self.device.type, dtype=DTYPES[self.dtype]):
            if self.compile_path != "off":
                yield
                return
            casts = self.optimizer.cast_parameters(DTYPES[self.dtype])
            if self._full_precision:
                casts = {key: cast for key, cast in casts.items() if key not in self._full_precision}
            with self.model.parameters_replaced(casts):
                yield

    def member_losses(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """`[B]` losses: the workload's (mean) loss of each member's slice of `output`."""
        # the bound method, not the class's: a loss set on the instance (in __init__) is the user's
        if getattr(self.workload.loss, "__func__", None) is Workload.loss:
            # The default loss (mean cross-entropy over every position) without vmap's per-op
            # overhead: per-element losses of all members at once, then each member's mean over
            # the positions F.cross_entropy counts (those not ignored: targets of -100, its
            # ignore_index, as padded sequences mark them, contribute 0 and are not counted). Its
            # gradient is bit-identical to each member's own F.cross_entropy (both are -1/M for
            # M counted positions).
            members, classes = output.shape[0], output.shape[-1]
            targets = target.reshape(1, -1).expand(members, -1).reshape(-1)
            per_element = F.cross_entropy(output.reshape(-1, classes), targets, reduction="none")
            counted = (target != _IGNORE_INDEX).sum()
            return per_element.view(members, -1).sum(dim=1) / counted
        losses = None
        if self._vmap_loss:
            try:
                losses = vmap(self.workload.loss, in_dims=(0, None))(output, target)
            except Exception:  # a loss vmap cannot batch: one call per member instead
                self._vmap_loss = False
        if losses is None:
            losses = torch.stack([self.workload.loss(member, target) for member in output])
        # summed for the backward, a per-sample loss would train where alone loss.backward() refuses it
        return _one_per_member(losses, "loss", "loss.backward()")

    def _member_metrics(self, output: torch.Tensor, target: torch.Tensor) -> dict[str, torch.Tensor]:
        metrics = None
        if self._vmap_metrics:
            try:
                metrics = vmap(self.workload.batch_metrics, in_dims=(0, None))(output, target)
            except Exception:
                self._vmap_metrics = False
        if metrics is None:
            per_member = [self.workload.batch_metrics(member, target) for member in output]
            metrics = {key: torch.stack([m[key] for m in per_member]) for key in per_member[0]}
        return {key: _one_per_member(value, f"metric {key!r}", ".item()") for key, value in metrics.items()}

    def train_step(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """One optimizer step of every member on a shared batch; returns the `[B]` losses (detached)."""
        inputs, targets = inputs.to(self.device, non_blocking=True), targets.to(self.device, non_blocking=True)
        try:
            losses = self.train_step_on(self.model, self.optimizer, inputs, targets, self._autocast, self._forward_loss)
        except torch._dynamo.exc.Unsupported as error:  # raised while tracing, before anything ran or changed
            self._step_eagerly(error)
            losses = self.train_step_on(self.model, self.optimizer, inputs, targets, self._autocast, self._forward_loss)
        self.step += 1
        return losses

    def _step_eagerly(self, error: Exception) -> None:
        """The user's forward cannot be traced whole (a branch on a tensor's value, `.item()`, a
        print: a graph break, which `fullgraph=True` refuses), where alone it trains eagerly.
        Under "auto" (on CUDA, the captured step) the group's forward and loss run eagerly from
        here on; a compile the user asked for by name is refused, in one line."""
        reason = describe_error(error)
        if self.compile != "auto":
            raise FusionError(
                f"the fused step cannot be compiled whole (fusion: {{compile: {self.compile}}}): the model's forward has a "
                f"graph break ({reason}); fusion: {{compile: off}} or auto runs it eagerly"
            ) from error
        log.warning("the model's forward cannot be compiled whole (%s): its fused forward and loss run eagerly", reason)
        self.compile_path = "off"
        self._forward_loss = self.forward_loss

    def forward_loss(self, model: FusedModel, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The members' `[B]` losses on a shared batch: the part of the step that `compile` compiles."""
        return self.member_losses(model(inputs), targets)

    def train_step_on(
        self,
        model: FusedModel,
        optimizer: FusedOptimizer,
        inputs: torch.Tensor,
        targets: torch.Tensor,
        autocast=nullcontext,
        forward_loss=None,
    ) -> torch.Tensor:
        """The fused step on a given model and optimizer (the group's, or the check's float64 copy,
        which always runs eagerly)."""
        with autocast():
            losses = (forward_loss or self.forward_loss)(model, inputs, targets)
        optimizer.zero_grad()
        # The sum of the members' mean losses: d(sum)/d(member b's weights) is member b's own gradient.
        losses.sum().backward()
        optimizer.step()
        return losses.detach()

    def train_iteration(self) -> list[dict[str, Any]]:
        """Train `steps_per_iteration` steps and evaluate; one `TrialTrainer`-style dict per member."""
        self.model.train()
        total = torch.zeros(self.num_members, dtype=torch.float64, device=self.device)
        for _ in range(self.steps_per_iteration):
            total += self.train_step(*self.batches.batch(self.step)).double()
        return self.finish_iteration(total)

    def finish_iteration(self, loss_sums: torch.Tensor) -> list[dict[str, Any]]:
        """End an iteration whose `steps_per_iteration` steps summed to `loss_sums` ([B]): evaluate.

        Split from `train_iteration` for callers that run the steps one at a time (bubble guests).
        """
        self.iteration += 1
        train_losses = (loss_sums / self.steps_per_iteration).tolist()
        return [iteration_result(loss, evaluation, self.step) for loss, evaluation in zip(train_losses, self.evaluate())]

    @torch.no_grad()
    def evaluate(self) -> list[dict[str, float]]:
        self.model.eval()
        totals: dict[str, torch.Tensor] = {}
        count = 0
        for inputs, targets in self.workload.eval_batches(self.configs[0]):
            inputs, targets = inputs.to(self.device), targets.to(self.device)
            n = inputs.shape[0]
            with self._autocast():
                output = self.model(inputs)
            for key, value in self._member_metrics(output, targets).items():
                totals[key] = totals.get(key, 0.0) + value.double() * n
            count += n
        columns = {f"val_{key}": (value / count).tolist() for key, value in totals.items()}
        return [{key: values[i] for key, values in columns.items()} for i in range(self.num_members)]

    # -- members come and go -------------------------------------------------------------------

    def _positions(self, member_ids: Sequence[Hashable]) -> list[int]:
        unknown = [m for m in member_ids if m not in self.member_ids]
        if unknown:
            raise KeyError(f"no members {unknown} in this group; members: {self.member_ids}")
        return [self.member_ids.index(m) for m in member_ids]

    def remove_members(self, member_ids: Sequence[Hashable]) -> None:
        """Drop members (stopped or diverged): they stop costing compute; survivors are unaffected."""
        gone = set(self._positions(member_ids))
        keep = [i for i in range(self.num_members) if i not in gone]
        if not keep:
            raise ValueError("cannot remove every member of a group; drop the trainer instead")
        self.keep_members([self.member_ids[i] for i in keep])

    def keep_members(self, member_ids: Sequence[Hashable]) -> None:
        """Keep exactly these members, in this order, repacking parameters and optimizer state."""
        keep = self._positions(member_ids)
        self.model.select_members(keep)
        self.optimizer.select_members(keep)
        self.configs = [self.configs[i] for i in keep]
        self.hparams = [self.hparams[i] for i in keep]
        self.member_ids = [self.member_ids[i] for i in keep]

    def add_members(
        self,
        configs: Sequence[Mapping[str, Any]],
        states: Sequence[Mapping[str, Any]] | None = None,
        member_ids: Sequence[Hashable] | None = None,
    ) -> None:
        """Re-form the group with extra members: fresh ones (only while the group is at step 0)
        or members resuming from their `member_state_dict` checkpoints at the group's step."""
        if member_ids is None:
            start = max([m for m in self.member_ids if isinstance(m, int)], default=-1) + 1
            member_ids = list(range(start, start + len(configs)))
        if states is None:
            if self.step:
                raise ValueError(f"fresh members start at step 0 but this group is at step {self.step}; form a new group")
            states = [_fresh_state(self.workload, self.workload.resolve(c)) for c in configs]
        current = [self.member_state_dict(m) for m in self.member_ids]
        rebuilt = FusedTrainer.from_member_states(
            self.workload,
            [*self.configs, *configs],
            [*current, *states],
            member_ids=[*self.member_ids, *member_ids],
            device=self.device,
            dtype=self.dtype,
            strategy=self.strategy,
            fusible_keys=self.fusible_keys,
            verify=self.verify,
            compile=self.compile,
        )
        self.__dict__.update(rebuilt.__dict__)

    # -- checkpoints: per member ---------------------------------------------------------------

    def member_state_dict(self, member_id: Hashable) -> dict[str, Any]:
        """Member `member_id`'s checkpoint in `TrialTrainer.state_dict()`'s format."""
        (index,) = self._positions([member_id])
        hp = self.hparams[index]
        model = self._template_model()
        model.load_state_dict(self.model.member_state_dict(index))
        optimizer, schedule = trial_optimizer(self.workload, model, hp)
        state = self.optimizer.member_state(index)
        for name, param in model.named_parameters():
            own = state["params"].get(name)
            if own is None:  # frozen, or never had a gradient: torch.optim holds no state for it
                continue
            tensors = {k: v.cpu() for k, v in own.items() if k != "step"}
            if hp.optimizer == "sgd":
                if hp.momentum != 0:
                    optimizer.state[param] = {"momentum_buffer": tensors["momentum_buffer"]}
            else:
                optimizer.state[param] = {"step": torch.tensor(float(own["step"])), **tensors}
        _advance_schedule(schedule, state["step"])
        weights = {k: v.detach().clone() for k, v in model.state_dict().items()}  # the template is reused
        return trial_state(weights, optimizer, schedule, self.iteration, state["step"])

    def _template_model(self) -> torch.nn.Module:
        """One unfused model of the group's architecture (on CPU), reused to write member checkpoints."""
        if getattr(self, "_template", None) is None:
            self._template = _member_model(self.workload, self.configs[0])
        return self._template

    def save_member(self, member_id: Hashable, directory: str) -> None:
        """Write member `member_id`'s checkpoint where `TrialTrainer.restore(directory)` reads it."""
        save_trial_state(self.member_state_dict(member_id), directory)

    @classmethod
    def from_member_states(
        cls, workload: Workload, configs: Sequence[Mapping[str, Any]], states: Sequence[Mapping[str, Any]], **kwargs: Any
    ) -> "FusedTrainer":
        """A group re-formed from members' `TrialTrainer`-format checkpoints (all at one step)."""
        if len(configs) != len(states):
            raise ValueError(f"{len(configs)} configs but {len(states)} member states")
        steps = {int(s["step"]) for s in states}
        if len(steps) != 1:
            raise ValueError(f"members at different steps {sorted(steps)} cannot share one data stream; group them by step")
        trainer = cls(workload, configs, **kwargs)
        for index, (config, state) in enumerate(zip(trainer.configs, states)):
            hp = trainer.hparams[index]
            model = _member_model(workload, config)
            optimizer, _ = trial_optimizer(workload, model, hp)
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            trainer.model.load_member_state_dict(index, model.state_dict())
            trainer.optimizer.load_member_state(
                index,
                {
                    "step": int(state["step"]),
                    "params": {name: dict(optimizer.state.get(p, {})) for name, p in model.named_parameters()},
                },
            )
        trainer.step = steps.pop()
        trainer.iteration = int(states[0]["iteration"])
        torch.set_rng_state(states[0]["rng"])
        return trainer

    @classmethod
    def from_member_checkpoints(
        cls, workload: Workload, configs: Sequence[Mapping[str, Any]], directories: Sequence[str], **kwargs: Any
    ) -> "FusedTrainer":
        """`from_member_states` reading each member's `trial_state.pt` (written by either trainer)."""
        states = [load_trial_state(d) for d in directories]
        return cls.from_member_states(workload, configs, states, **kwargs)

    # -- checkpoints: the whole group ----------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {
            "configs": self.configs,
            "member_ids": self.member_ids,
            "model": self.model.module.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "iteration": self.iteration,
            "step": self.step,
            "rng": torch.get_rng_state(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if list(state["member_ids"]) != self.member_ids:
            raise ValueError(f"checkpoint is for members {state['member_ids']}, this group has {self.member_ids}")
        self.model.module.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.iteration = int(state["iteration"])
        self.step = int(state["step"])
        torch.set_rng_state(state["rng"])

    def save(self, directory: str) -> None:
        torch.save(self.state_dict(), os.path.join(directory, FUSED_CHECKPOINT_FILE))

    @classmethod
    def load(cls, workload: Workload, directory: str, **kwargs: Any) -> "FusedTrainer":
        """A group restored from `save(directory)`, with the members it had when saved."""
        state = torch.load(os.path.join(directory, FUSED_CHECKPOINT_FILE), weights_only=True)
        trainer = cls(workload, state["configs"], member_ids=state["member_ids"], **kwargs)
        trainer.load_state_dict(state)
        return trainer


def _one_per_member(values: torch.Tensor, what: str, alone: str) -> torch.Tensor:
    """`values` as `[B]` (the workload's `what` of each member, a one-element tensor each as
    `alone` takes it too), or a FusionError where the workload gives more than one number per
    member, which the unfused trainer's `alone` refuses."""
    if values.dim() > 1 and values[0].numel() != 1:
        raise FusionError(
            f"the workload's {what} is a tensor of shape {tuple(values.shape[1:])} for one member's output, not one "
            f"number: it must reduce the batch (a mean), as the unfused trainer's {alone} needs"
        )
    return values.reshape(values.shape[0])


def _beside_running_statistics(model: torch.nn.Module) -> frozenset[int]:
    """Ids of the parameters of layers that keep floating running statistics (batch norm, instance
    norm with `track_running_stats`), on either fusion path. In bf16 they stay fp32, as under
    autocast alone: PyTorch's batch norm takes a bf16 input with fp32 weights and statistics, and
    refuses bf16 weights beside fp32 statistics ('expected scalar type BFloat16 but found Float')."""
    return frozenset(
        id(parameter)
        for module in model.modules()
        if isinstance(getattr(module, "running_mean", None), torch.Tensor) and module.running_mean.is_floating_point()
        for parameter in module._parameters.values()
        if parameter is not None
    )


def _member_model(workload: Workload, config: Mapping[str, Any]) -> torch.nn.Module:
    """A member's unfused model, to read or write its state: built as `TrialTrainer` builds it,
    but leaving the global RNG where it was, which the group's training goes on drawing from."""
    with torch.random.fork_rng(devices=[]):
        return build_trial_model(workload, config)


def _advance_schedule(schedule: torch.optim.lr_scheduler.LambdaLR, step: int) -> None:
    """Put a fresh LambdaLR where `step` optimizer steps would have left it."""
    if step > 0:
        schedule.last_epoch = step - 1
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "scheduler.step() before optimizer.step()"
            schedule.step()


def _fresh_state(workload: Workload, config: Mapping[str, Any]) -> dict[str, Any]:
    """A step-0 member checkpoint, as a new `TrialTrainer` would save it."""
    hp = OptimHParams.from_config(config)
    model = _member_model(workload, config)
    optimizer, schedule = trial_optimizer(workload, model, hp)
    return trial_state(model.state_dict(), optimizer, schedule, 0, 0)


def _graph_step(compiled_forward_loss):
    """CUDA graph trees hand out their output buffers again at the next replay: the optimizer's
    graph, run after the backward, would overwrite the losses the step returns. So each step opens
    a new generation, and the `[B]` losses are copied out of the graph's buffer (one small kernel)."""

    def forward_loss(model: FusedModel, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        torch.compiler.cudagraph_mark_step_begin()
        return compiled_forward_loss(model, inputs, targets).clone()

    return forward_loss
