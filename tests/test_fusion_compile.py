"""The fused step compiles whole: `torch.compile(fullgraph=True)` takes the fused forward and
loss (its backward through AOTAutograd) and the optimizer's update without a graph break, and
the compiled step trains as the eager one does.

The numeric checks run in float64, where a real bug shows at 1e-5 and above and a compiler's
reordered reductions stay below 1e-9. They compile with the `aot_eager` backend (dynamo's
graph and AOTAutograd's joint forward-backward, run by ATen): the property under test is that
our code traces whole, and inductor's C++ code generation would add minutes per model on CI's
two cores. `FusedTrainer(compile="inductor")` only adds inductor's kernels to the same graphs;
one float32 test runs them (the MLP, the smallest to compile), within the zoo's float32 tolerance.
"""

from __future__ import annotations

import pytest
import torch

from examples.char_gpt import workload as char_gpt
from examples.mlp_digits import workload as mlp_digits
from fusion import FusedOptimizer, FusedTrainer, fuse_models
from fusion.compiled import compile_method
from hpo.base.training import build_trial_model
from hpo.base.hparams import OptimHParams
from tests.fusion_zoo import ZOO, loss

#: Members that differ in lr, decay, clipping and schedule (AdamW: decoupled decay and bias corrections).
CONFIGS = [
    {"seed": 0, "optimizer": "adamw", "lr": 1e-3, "weight_decay": 0.01, "grad_clip": 1.0},
    {"seed": 1, "optimizer": "adamw", "lr": 3e-3, "weight_decay": 0.0, "lr_schedule": "cosine", "warmup_steps": 2, "schedule_steps": 10},
]
WORKLOADS = {
    "mlp": (mlp_digits, {"width": 16}),
    "char_gpt": (char_gpt, {"width": 16, "n_layer": 1, "batch_size": 4, "block_size": 8}),
}


def relative_error(a: torch.nn.Module, b: torch.nn.Module) -> float:
    x = torch.cat([p.detach().flatten() for p in a.parameters()])
    y = torch.cat([p.detach().flatten() for p in b.parameters()])
    return ((x - y).norm() / y.norm()).item()


def test_graphs_are_refused_without_cuda_and_unknown_modes_are_named():
    configs = [{**WORKLOADS["mlp"][1], **c} for c in CONFIGS]
    with pytest.raises(ValueError, match="compile 'graphs' captures CUDA graphs and needs a CUDA device, not 'cpu'"):
        FusedTrainer(mlp_digits, configs, compile="graphs")
    with pytest.raises(ValueError, match="compile is 'fast'; expected one of auto, off, graphs, inductor"):
        FusedTrainer(mlp_digits, configs, compile="fast")


def test_auto_is_eager_on_cpu():
    trainer = FusedTrainer(mlp_digits, [{**WORKLOADS["mlp"][1], **c} for c in CONFIGS], verify=False)
    assert trainer.compile_path == "off"
    assert trainer._forward_loss == trainer.forward_loss


class _Scaled:
    def __init__(self, width: int):
        self.weight = torch.ones(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x * self.weight).sum()


@torch._dynamo.config.patch(recompile_limit=1)  # monkeypatch's undo left the config without the key: later compiles failed
def test_each_object_compiles_its_method_into_a_cache_of_its_own():
    # A process trains groups one after another (a reused actor, a repacked group of another
    # size, fp32 then bf16): with one shared cache, fullgraph's recompile limit ends the run.
    shared = [torch.compile(_Scaled(w).forward, fullgraph=True, backend="eager") for w in (2, 3)]
    shared[0](torch.ones(2))
    with pytest.raises(torch._dynamo.exc.FailOnRecompileLimitHit):
        shared[1](torch.ones(3))
    own = [compile_method(_Scaled(w).forward, fullgraph=True, backend="eager") for w in (2, 3, 4)]
    assert [float(step(torch.ones(w))) for step, w in zip(own, (2, 3, 4))] == [2.0, 3.0, 4.0]


def float64_group(build, configs, example):
    models = [build(c).double() for c in configs]
    fused = fuse_models(models, example.double() if example.is_floating_point() else example)
    return fused, FusedOptimizer(dict(fused.module.named_parameters()), [OptimHParams.from_config(c) for c in configs])


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_the_workloads_fused_step_compiles_whole_and_trains_as_eager_in_float64(name):
    workload, base = WORKLOADS[name]
    trainer = FusedTrainer(workload, [{**base, **c} for c in CONFIGS], verify=False)  # its loss and batches
    inputs, targets = trainer.batches.batch(0)
    inputs = inputs.double() if inputs.is_floating_point() else inputs
    eager, eager_optimizer = float64_group(lambda c: build_trial_model(workload, c), trainer.configs, inputs)
    compiled, compiled_optimizer = float64_group(lambda c: build_trial_model(workload, c), trainer.configs, inputs)
    compiled_optimizer.compile_update(backend="aot_eager")
    forward_loss = torch.compile(trainer.forward_loss, fullgraph=True, backend="aot_eager")
    want = trainer.train_step_on(eager, eager_optimizer, inputs, targets)
    got = trainer.train_step_on(compiled, compiled_optimizer, inputs, targets, forward_loss=forward_loss)
    torch.testing.assert_close(got, want, rtol=1e-9, atol=0)
    assert relative_error(compiled, eager) <= 1e-9
    assert compiled_optimizer.steps == eager_optimizer.steps == [1, 1]


@pytest.mark.slow
def test_the_inductor_step_trains_as_the_eager_one_in_float32_within_the_zoos_tolerance():
    # Inductor's C++ kernels fuse and reorder float32 arithmetic, so the two paths are not
    # bit-exact; after 5 steps they agree within the zoo's float32 tolerance (5e-4 relative),
    # where a wrong update (a missed bias correction, decay or clip) is off by 1e-2 and more.
    workload, base = WORKLOADS["mlp"]
    configs = [{**base, **c} for c in CONFIGS]
    trainers = [FusedTrainer(workload, configs, verify=False, compile=mode) for mode in ("off", "inductor")]
    eager, compiled = (torch.stack([t.train_step(*t.batches.batch(step)) for step in range(5)]) for t in trainers)
    torch.testing.assert_close(compiled, eager, rtol=5e-4, atol=1e-5)
    assert relative_error(trainers[1].model, trainers[0].model) <= 5e-4


@pytest.mark.slow
def test_the_zoo_transformer_compiles_whole_and_trains_as_eager_in_float64():
    entry = ZOO["transformer"]
    configs = [{**c, "optimizer": "adam"} for c in CONFIGS]
    inputs, targets = next(entry.batches(6))

    def build(config):
        torch.manual_seed(config["seed"])
        return entry.build()

    def forward_loss(model, x, y):
        out = model(x)
        return torch.stack([loss(out[i], y) for i in range(len(configs))])

    groups = [float64_group(build, configs, inputs) for _ in range(2)]
    groups[1][1].compile_update(backend="aot_eager")
    steps = [forward_loss, torch.compile(forward_loss, fullgraph=True, backend="aot_eager")]
    results = []
    for (model, optimizer), step in zip(groups, steps):
        losses = step(model, inputs, targets)
        optimizer.zero_grad()
        losses.sum().backward()
        optimizer.step()
        results.append(losses.detach())
    torch.testing.assert_close(results[1], results[0], rtol=1e-9, atol=0)
    assert relative_error(groups[1][0], groups[0][0]) <= 1e-9


@pytest.mark.slow
def test_the_compiled_update_skips_and_counts_parameters_as_the_eager_one():
    # frozen, sometimes-used and never-used parameters: the update's index and count paths
    from tests.test_fusion_optimizer_semantics import MEMBERS, SometimesUsed, hparams, member_output, stacked

    torch.manual_seed(0)
    models = [SometimesUsed().double() for _ in range(MEMBERS)]
    x = torch.randn(2, 4, dtype=torch.float64)
    groups = []
    for compiled in (False, True):
        params = stacked(models)
        optimizer = FusedOptimizer(params, hparams("adamw"))
        if compiled:
            optimizer.compile_update(backend="aot_eager")
        for step in range(4):
            optimizer.zero_grad()
            sum(member_output(params, i, x, step).sum() for i in range(MEMBERS)).backward()
            optimizer.step()
        groups.append((params, optimizer))
    (eager, eager_optimizer), (compiled, compiled_optimizer) = groups
    for name, tensor in eager.items():
        torch.testing.assert_close(compiled[name], tensor, rtol=1e-9, atol=0, msg=name)
    assert torch.equal(compiled_optimizer.param_steps, eager_optimizer.param_steps)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", sorted(WORKLOADS))
@torch._dynamo.config.patch(recompile_limit=1)
def test_the_graphed_step_trains_as_the_eager_one_on_cuda_for_groups_of_two_sizes_and_dtypes(name):
    # As a long-lived actor or the benchmark does: groups of two sizes, fp32 then bf16, in one
    # process, each compiled in a cache of its own (a limit of 1 shows it). Each graphed step
    # returns its own step's losses (a replay reuses its output buffers) and trains as the eager
    # one within the zoo's float32 tolerance (bf16: within bf16's rounding).
    workload, base = WORKLOADS[name]
    for dtype, tolerance, members in (("fp32", 5e-4, 2), ("bf16", 5e-2, 3)):
        configs = [{**base, **CONFIGS[i % 2], "seed": i} for i in range(members)]
        trainers = [FusedTrainer(workload, configs, device="cuda", dtype=dtype, verify=False, compile=mode) for mode in ("off", "graphs")]
        eager, graphed = (torch.stack([t.train_step(*t.batches.batch(step)) for step in range(4)]) for t in trainers)
        assert not torch.equal(graphed[0], graphed[-1]), "every step returned the same buffer"
        torch.testing.assert_close(graphed, eager, rtol=tolerance, atol=1e-5)
