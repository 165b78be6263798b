"""The fused optimizer treats parameters as `torch.optim` does, bit for bit in float64.

- a frozen parameter (`requires_grad=False`) is never updated, decayed or given state;
- a parameter whose gradient is None in a step is skipped in that step: no decay, no moment
  update, no step count (Adam's bias correction counts each parameter's own steps);
- gradient clipping takes each parameter's norm, then the norm of those, over the parameters
  that have a gradient, as `clip_grad_norm_` does;
- a member checkpoint holds state only for the parameters torch would hold it for.

Each test steps B members' own `torch.optim` optimizers and one `FusedOptimizer` over the
stacked parameters, with every per-member hyperparameter different, and compares every value.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from fusion import FusedOptimizer
from hpo.base.hparams import OptimHParams, build_torch_optimizer

MEMBERS = 3


class SometimesUsed(nn.Module):
    """A frozen stem, a trunk used every step, an auxiliary head used on even steps only, and a
    table no step uses: every kind of parameter torch.optim treats differently."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Linear(4, 6)
        self.stem.requires_grad_(False)
        self.trunk = nn.Linear(6, 5)
        self.aux = nn.Linear(6, 5)
        self.unused = nn.Embedding(7, 3)

    def forward(self, x: torch.Tensor, step: int) -> torch.Tensor:
        h = torch.tanh(self.stem(x))
        out = self.trunk(h)
        return out + self.aux(h) if step % 2 == 0 else out


def member_configs(optimizer: str) -> list[dict]:
    """Every per-member key differs between members; eps stays at its default."""
    base = {"optimizer": optimizer}
    return [
        {**base, "lr": 0.05, "weight_decay": 0.0, "momentum": 0.9, "nesterov": True, "beta1": 0.9, "beta2": 0.999, "grad_clip": 0.0},
        {**base, "lr": 0.02, "weight_decay": 0.1, "momentum": 0.5, "beta1": 0.8, "beta2": 0.99, "grad_clip": 0.05,
         "lr_schedule": "cosine", "schedule_steps": 6, "warmup_steps": 2, "min_lr_ratio": 0.1},
        {**base, "lr": 0.01, "weight_decay": 1e-3, "momentum": 0.0, "beta1": 0.5, "beta2": 0.9, "grad_clip": 1.0,
         "lr_schedule": "step", "schedule_steps": 3, "lr_gamma": 0.5},
    ]


def hparams(optimizer: str) -> list[OptimHParams]:
    configs = member_configs(optimizer)
    if optimizer != "sgd":
        configs = [{k: v for k, v in c.items() if k not in ("momentum", "nesterov")} for c in configs]
    return [OptimHParams.from_config(c) for c in configs]


def stacked(models: list[nn.Module]) -> dict[str, nn.Parameter]:
    return {
        name: nn.Parameter(torch.stack([dict(m.named_parameters())[name].detach() for m in models]), requires_grad=param.requires_grad)
        for name, param in models[0].named_parameters()
    }


def member_output(params: dict[str, torch.Tensor], i: int, x: torch.Tensor, step: int) -> torch.Tensor:
    h = torch.tanh(nn.functional.linear(x, params["stem.weight"][i], params["stem.bias"][i]))
    out = nn.functional.linear(h, params["trunk.weight"][i], params["trunk.bias"][i])
    if step % 2 == 0:
        out = out + nn.functional.linear(h, params["aux.weight"][i], params["aux.bias"][i])
    return out


def both_sides(optimizer: str, **fused_options):
    """The members' own models with their torch optimizers and schedules, and the fused optimizer
    over their stacked parameters."""
    hps = hparams(optimizer)
    models = []
    for i in range(MEMBERS):
        torch.manual_seed(i)
        models.append(SometimesUsed().double())
    params = stacked(models)
    fused = FusedOptimizer(params, hps, **fused_options)
    alone = [build_torch_optimizer(m.named_parameters(), hp) for m, hp in zip(models, hps)]
    schedules = [torch.optim.lr_scheduler.LambdaLR(o, hp.lr_factor) for o, hp in zip(alone, hps)]
    return hps, models, params, fused, alone, schedules


def train_both(optimizer: str, steps: int = 7, **fused_options):
    hps, models, params, fused, alone, schedules = both_sides(optimizer, **fused_options)
    generator = torch.Generator().manual_seed(0)
    for step in range(steps):
        x = torch.randn(8, 4, generator=generator, dtype=torch.float64)
        fused.zero_grad()
        sum(member_output(params, i, x, step).square().mean() for i in range(MEMBERS)).backward()
        fused.step()
        for model, opt, schedule, hp in zip(models, alone, schedules, hps):
            opt.zero_grad(set_to_none=True)
            model(x, step).square().mean().backward()
            if hp.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), hp.grad_clip)
            opt.step()
            schedule.step()
    return params, fused, models, alone


@pytest.mark.parametrize("optimizer", ["sgd", "adam", "adamw"])
def test_frozen_unused_and_sometimes_used_parameters_step_exactly_as_torch_optim(optimizer):
    params, fused, models, _ = train_both(optimizer)
    for i, model in enumerate(models):
        for name, param in model.named_parameters():
            assert torch.equal(params[name][i], param), f"member {i} {name} differs from torch.optim ({optimizer})"
    torch.manual_seed(0)
    initial = SometimesUsed().double()
    assert torch.equal(params["stem.weight"][0], initial.stem.weight), "the frozen stem moved"
    assert torch.equal(params["unused.weight"][0], initial.unused.weight), "the unused table moved"
    assert "stem.weight" not in fused.names, "a frozen parameter took a place in the optimizer's matrices"


def test_schedule_tables_sized_for_fewer_steps_than_training_takes_grow_and_still_step_as_torch_optim():
    """The guard's optimizer holds its schedule and bias-correction tables for two steps; a run
    past the end of its tables (here from one step, doubling) steps as torch.optim does."""
    params, _, models, _ = train_both("adam", table_steps=1)
    for i, model in enumerate(models):
        for name, param in model.named_parameters():
            assert torch.equal(params[name][i], param), f"member {i} {name} differs from torch.optim"


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_member_state_holds_what_torch_optim_holds(optimizer):
    _, fused, models, alone = train_both(optimizer)
    for i, (model, opt) in enumerate(zip(models, alone)):
        state = fused.member_state(i)
        torch_names = {name for name, p in model.named_parameters() if p in opt.state and opt.state[p]}
        if optimizer == "sgd" and fused.hparams[i].momentum == 0:
            torch_names = {name for name in torch_names if opt.state[dict(model.named_parameters())[name]].get("momentum_buffer") is not None}
            assert not torch_names
            continue
        assert set(state["params"]) == torch_names, f"member {i}: state for {sorted(state['params'])}, torch has {sorted(torch_names)}"
        for name in torch_names:
            expected = opt.state[dict(model.named_parameters())[name]]
            if optimizer == "adam":
                assert state["params"][name]["step"] == int(expected["step"]), f"member {i} {name}: step count"
                assert torch.equal(state["params"][name]["exp_avg_sq"], expected["exp_avg_sq"])
            else:
                assert torch.equal(state["params"][name]["momentum_buffer"], expected["momentum_buffer"])


def test_member_state_round_trips_through_per_parameter_step_counts():
    _, fused, models, _ = train_both("adam")
    params = stacked(models)
    copy = FusedOptimizer(params, hparams("adam"), steps=list(fused.steps))
    for i in range(MEMBERS):
        copy.load_member_state(i, fused.member_state(i))
    assert copy.param_steps is not None and torch.equal(copy.param_steps, fused.param_steps)
    assert [copy.member_param_steps(i) for i in range(MEMBERS)] == [fused.member_param_steps(i) for i in range(MEMBERS)]


def test_gradient_clipping_rounds_as_clip_grad_norm():
    torch.manual_seed(0)
    grads = [[torch.randn(s, dtype=torch.float64) * scale for s, scale in ((37, 1e-3), (5, 1.0), (300, 10.0))] for _ in range(MEMBERS)]
    params = {f"p{j}": nn.Parameter(torch.zeros(MEMBERS, g.numel(), dtype=torch.float64)) for j, g in enumerate(grads[0])}
    hps = [OptimHParams(optimizer="sgd", lr=1.0, grad_clip=clip) for clip in (0.5, 0.0, 3.0)]
    fused = FusedOptimizer(params, hps)
    fused.zero_grad()
    sum((param * torch.stack([member[j] for member in grads])).sum() for j, param in enumerate(params.values())).backward()
    fused.step()
    for i, hp in enumerate(hps):
        alone = [nn.Parameter(torch.zeros_like(g)) for g in grads[i]]
        for p, g in zip(alone, grads[i]):
            p.grad = g.clone()
        if hp.grad_clip:
            torch.nn.utils.clip_grad_norm_(alone, hp.grad_clip)
        torch.optim.SGD(alone, lr=1.0).step()
        for j, p in enumerate(alone):
            assert torch.equal(params[f"p{j}"][i], p), f"member {i} parameter {j} after clipping"


class AlwaysAux(SometimesUsed):
    """The auxiliary head on every step: only the stem (frozen) and the table (unused) get no gradient."""

    def forward(self, x):
        return super().forward(x, 0)


def test_a_member_checkpoint_holds_no_state_for_frozen_or_unused_parameters_and_resumes_unfused():
    from torch.utils.data import TensorDataset

    from fusion import FusedTrainer
    from hpo import DatasetWorkload
    from hpo.base.training import TrialTrainer

    generator = torch.Generator().manual_seed(0)
    x, y = torch.randn(64, 4, generator=generator, dtype=torch.float64), torch.randn(64, 5, generator=generator, dtype=torch.float64)
    workload = DatasetWorkload(
        model=lambda config: AlwaysAux().double(), train=TensorDataset(x, y), val=TensorDataset(x[:8], y[:8]),
        loss=lambda out, target: (out - target).square().mean(), defaults={"batch_size": 8}, steps_per_iteration=3,
    )
    configs = [{"seed": i, "optimizer": "adam", "lr": 1e-2 * (i + 1), "weight_decay": 0.1} for i in range(2)]
    fused = FusedTrainer(workload, configs)
    fused.train_iteration()
    state = fused.member_state_dict(1)
    names = [name for name, _ in AlwaysAux().named_parameters()]
    assert {names[i] for i in state["optimizer"]["state"]} == {"trunk.weight", "trunk.bias", "aux.weight", "aux.bias"}
    alone = TrialTrainer(workload, configs[1])
    alone.load_state_dict(state)
    fused.train_iteration()
    alone.train_iteration()
    for name, tensor in alone.model.state_dict().items():
        assert torch.equal(fused.model.member_state_dict(1)[name], tensor), f"{name} after resuming unfused"


class OpsRecorder(TorchDispatchMode):
    """The ATen ops run while it is active."""

    def __init__(self):
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func.overloadpacket))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_a_step_neither_reads_the_device_nor_sends_it_host_values(optimizer):
    # Once a pattern of used parameters has been seen, a step's every input is on the device:
    # no `.item()` / `float()` / `bool()` (`_local_scalar_dense`, a sync on a GPU) and no
    # tensor made from Python values (`lift_fresh`), so the step can be captured as a graph.
    torch.manual_seed(0)
    models = [SometimesUsed().double() for _ in range(MEMBERS)]
    params = stacked(models)
    fused = FusedOptimizer(params, hparams(optimizer))
    x = torch.randn(2, 4, dtype=torch.float64)
    recorded = []
    for step in range(6):
        fused.zero_grad()
        sum(member_output(params, i, x, step).sum() for i in range(MEMBERS)).backward()
        with OpsRecorder() as recorder:
            fused.step()
        recorded.append(recorder.ops)
    for ops in recorded[2:]:  # both patterns (aux used or not) seen
        assert "aten._local_scalar_dense" not in ops and "aten.lift_fresh" not in ops, sorted(set(ops))


def test_backward_hands_gradients_over_without_a_kernel_per_parameter_and_the_step_gathers_them_in_one():
    # Autograd gives each parameter its gradient as it is (`.grad` is None after zero_grad), and
    # the step copies them all into its gradient matrix with one concatenation: no add per
    # parameter outside a compiled graph.
    torch.manual_seed(0)
    models = [SometimesUsed().double() for _ in range(MEMBERS)]
    params = stacked(models)
    fused = FusedOptimizer(params, hparams("adam"))
    x = torch.randn(2, 4, dtype=torch.float64)
    for _ in range(2):  # the second step: the first also builds the schedule tables
        fused.zero_grad()
        assert all(param.grad is None for param in params.values())
        with OpsRecorder() as backward:
            sum(member_output(params, i, x, 0).sum() for i in range(MEMBERS)).backward()
        with OpsRecorder() as step:
            fused.step()
    assert "aten.add_" not in backward.ops, backward.ops
    assert step.ops.count("aten.cat") == 1, step.ops


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_gradients_accumulated_over_two_backward_passes_or_set_by_hand_step_as_torch_optim(optimizer):
    # Without zero_grad between them two backward passes add up in `.grad`, as in torch; a
    # gradient assigned by hand is taken as it is, and a parameter left without one is skipped.
    hps, models, params, fused, alone, schedules = both_sides(optimizer)
    generator = torch.Generator().manual_seed(0)
    for step in range(4):
        x1, x2 = (torch.randn(8, 4, generator=generator, dtype=torch.float64) for _ in range(2))
        by_hand = torch.randn(MEMBERS, 7, 3, generator=generator, dtype=torch.float64)
        fused.zero_grad()
        for x, at in ((x1, step), (x2, step + 1)):  # the aux head in one of the two passes
            sum(member_output(params, i, x, at).square().mean() for i in range(MEMBERS)).backward()
        if step % 2:
            params["unused.weight"].grad = by_hand.clone()
        fused.step()
        for i, (model, opt, schedule, hp) in enumerate(zip(models, alone, schedules, hps)):
            opt.zero_grad(set_to_none=True)
            for x, at in ((x1, step), (x2, step + 1)):
                model(x, at).square().mean().backward()
            if step % 2:
                model.unused.weight.grad = by_hand[i].clone()
            if hp.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), hp.grad_clip)
            opt.step()
            schedule.step()
    for i, model in enumerate(models):
        for name, param in model.named_parameters():
            assert torch.equal(params[name][i], param), f"member {i} {name}"


def test_bf16_gradients_of_two_backward_passes_add_up_in_float32_as_in_a_zeroed_master_gradient():
    # `cast_parameters` runs a step's forward on one bf16 copy of the parameters; the step
    # takes their gradients into its float32 matrix, summed in float32 when two passes gave them.
    torch.manual_seed(0)
    params = {"w": nn.Parameter(torch.randn(MEMBERS, 5, 3)), "b": nn.Parameter(torch.randn(MEMBERS, 5))}
    fused = FusedOptimizer(params, [OptimHParams(optimizer="sgd", lr=1.0)] * MEMBERS)
    x = torch.randn(4, 3)
    fused.zero_grad()
    expected = {name: torch.zeros_like(p) for name, p in params.items()}
    for scale, uses_bias in ((1.0, True), (3.0, False)):
        cast = fused.cast_parameters(torch.bfloat16)
        w, b = cast[id(params["w"])], cast[id(params["b"])]
        out = torch.einsum("ni,boi->bno", x.bfloat16(), w) + (b.unsqueeze(1) if uses_bias else 0)
        grads = torch.autograd.grad((scale * out).sum(), [w, b], retain_graph=True, allow_unused=True)
        (scale * out).sum().backward()
        for name, grad in zip(("w", "b"), grads):
            if grad is not None:
                expected[name] += grad.float()
    before = {name: p.detach().clone() for name, p in params.items()}
    fused.step()
    for name, p in params.items():
        assert torch.equal(p.detach(), before[name] - expected[name]), name  # SGD at lr 1: p - grad


def test_a_bf16_step_that_leaves_some_parameters_uncast_takes_their_own_full_precision_gradients():
    # bf16 keeps a norm's weights fp32 beside its running statistics: those get `.grad` from
    # autograd directly, the cast ones through the cast's backward, and the step takes both.
    torch.manual_seed(0)
    params = {"w": nn.Parameter(torch.randn(MEMBERS, 5, 3)), "scale": nn.Parameter(torch.randn(MEMBERS, 5))}
    fused = FusedOptimizer(params, [OptimHParams(optimizer="sgd", lr=1.0)] * MEMBERS)
    x = torch.randn(4, 3)

    def forward(w: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        return (torch.einsum("ni,boi->bno", x.bfloat16(), w).float() * scale.unsqueeze(1)).sum()

    alone = {"w": params["w"].detach().bfloat16().requires_grad_(), "scale": params["scale"].detach().clone().requires_grad_()}
    forward(alone["w"], alone["scale"]).backward()
    fused.zero_grad()
    forward(fused.cast_parameters(torch.bfloat16)[id(params["w"])], params["scale"]).backward()
    expected = {name: p.detach() - alone[name].grad.float() for name, p in params.items()}  # SGD at lr 1
    fused.step()
    for name, p in params.items():
        assert torch.equal(p.detach(), expected[name]), name
