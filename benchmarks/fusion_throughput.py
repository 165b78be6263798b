"""Training throughput of B tuning trials: one after another, concurrently, and fused.

For each model, dtype and B this measures samples per second (B members x batch x steps over
wall-clock time) of:
- serial: each member trained alone with PyTorch's own optimizer, one member after another
  (members cost the same, so up to `--serial-cap` members are timed and their rate reported);
- concurrent: B Ray actors, each with 1/B of the device's CPUs, training one member each at
  the same time (skipped, null, without Ray, on CUDA, or above `--concurrent-cap` actors);
- fused: `fusion.FusedTrainer` with B different configs (its automatic fusion);
- hand_bmm (MLPs only): a hand-written baddbmm MLP with one torch Adam over the stacked weights
  (one lr for all members: the speed reference, not a tuning engine).
ratio = fused / serial. On CUDA also the fused run's TFLOP/s and its fraction of the measured
peak of a large matmul in the same dtype.

Models: the MLP from examples/mlp_digits.py with its defaults (`mlp`: 2 hidden layers of 64) and
as issue 3's H100 reference (`mlp256`: 4 linear layers of width 256), batch 64, Adam; and the
char GPT from examples/char_gpt.py with its defaults (AdamW). Inputs are synthetic
tensors of the workloads' shapes, so the benchmark needs neither scikit-learn nor a dataset.

    python benchmarks/fusion_throughput.py --quick --json fusion_cpu.json
    python benchmarks/fusion_throughput.py --device cuda --json fusion_cuda.json
    python benchmarks/fusion_throughput.py --zoo all --json benchmarks/results/fusion_throughput_zoo_cpu.json

`--guard` measures what the differential guard (`fusion.verification`) adds to a group's first
iteration (FusedTrainer's construction plus its first `train_iteration`), for the MLP and the
char GPT: members that differ in lr only (as above; the guard then checks member 0) and members
that differ in every per-member key (it checks a witness per optimizer feature). Each round
builds and runs the group with the guard off and on, alternately; the guard's own time is
clocked around its calls; the best of `--repeats` rounds is kept.

A larger proxy: `--width --layers --block --batch` override the models' width, layers (the
MLP's hidden layers, the GPT's blocks), the GPT's context and the batch; `--compile` picks the
fused step's paths (`FusedTrainer(compile=...)`: off, inductor, graphs; several, comma-separated,
are timed side by side in the same rounds against one serial baseline, one row each, with
`fused_vs_off` and `launches_off_vs_this` against eager). Each row then also has the fused and
serial step times (`*_step_ms`: one step of all B members) and the fused step's launches per
step, counted with torch.profiler over a few steps (`launches_per_step`): CUDA kernels on a GPU;
on a CPU, as their stand-in, the ATen ops that compute plus inductor's generated C++ kernels
(`fused_launches_per_step`), and the ATen ops dispatched, views included
(`fused_aten_ops_per_step`). The JSON records the commit, the device's name, torch's version
and the load averages around the run.

    flock /tmp/bench.lock python benchmarks/fusion_throughput.py --device cpu --models char_gpt --members 16 --steps 5 --repeats 3 --serial-cap 4 --no-concurrent --compile off,inductor --json benchmarks/results/fusion_compile_cpu.json

    python benchmarks/fusion_throughput.py --device cuda --models char_gpt --width 512 --layers 6 --members 1,16,64,128 --compile graphs --json gpt512_graphs.json

    python benchmarks/fusion_throughput.py --guard --members 16 --json benchmarks/results/fusion_guard_cpu.json

`--zoo` times the models of tests/fusion_zoo.py (a small ResNet, a Transformer classifier with
padding masks, a 2-layer LSTM LM, an MLP-Mixer, a tied nanoGPT block, a shared block): each row
has `model`, `path` (stacked or vmap, the path `fuse_models` chose) and fused/serial at B=16,
by wall clock (`ratio`) and by the process's CPU time in the same rounds (`ratio_cpu`: on a
shared machine the wall clock also counts other processes' turns), and the load averages.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import math
import os
import platform
import subprocess
import sys
import time
import types
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from torch.nn import functional as F

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _import_engine_without_sweep_dependencies() -> None:
    """`hpo/__init__` imports the Ray/pandas/pydantic sweep API; the engine needs only
    `hpo.base.hparams` and `hpo.base.workload`. Where those dependencies are missing (the GPU machine),
    load the `hpo` package without running its `__init__`."""
    try:
        importlib.import_module("hpo")
    except ImportError:
        for name in [n for n in sys.modules if n == "hpo" or n.startswith("hpo.")]:
            del sys.modules[name]
        package = types.ModuleType("hpo")
        package.__path__ = [str(REPO / "hpo")]
        sys.modules["hpo"] = package


_import_engine_without_sweep_dependencies()

from examples.char_gpt import CharGPTWorkload, load_corpus  # noqa: E402
from examples.mlp_digits import NUM_CLASSES, NUM_FEATURES, DigitsMLP  # noqa: E402
from fusion import FusedTrainer  # noqa: E402
from hpo.base.training import build_trial_model  # noqa: E402
from hpo.base.hparams import OptimHParams, build_torch_optimizer  # noqa: E402
from hpo.base.workload import Batch  # noqa: E402

MEMBERS = (1, 4, 16, 64, 128)
QUICK_MEMBERS = (1, 4, 16)


class SyntheticDigitsMLP(DigitsMLP):
    """The digits MLP fed random inputs of the digits' shapes (no scikit-learn needed)."""

    def train_batches(self, config: Mapping[str, Any], seed: int) -> Iterator[Batch]:
        generator = torch.Generator().manual_seed(seed)
        n = int(config["batch_size"])
        while True:
            yield torch.randn(n, NUM_FEATURES, generator=generator), torch.randint(0, NUM_CLASSES, (n,), generator=generator)

    def eval_batches(self, config: Mapping[str, Any]) -> list[Batch]:
        return [next(self.train_batches(config, 1))]


MODELS: dict[str, tuple[Any, dict[str, Any]]] = {
    # the examples' MLP with its defaults (2 hidden layers of 64, batch 64, Adam)
    "mlp": (SyntheticDigitsMLP(), {"width": 64, "depth": 2, "batch_size": 64, "optimizer": "adam", "lr": 1e-3}),
    # issue 3's H100 reference: 4 linear layers of width 256, batch 64, Adam
    "mlp256": (SyntheticDigitsMLP(), {"width": 256, "depth": 3, "batch_size": 64, "optimizer": "adam", "lr": 1e-3}),
    "char_gpt": (CharGPTWorkload(), {"optimizer": "adamw", "lr": 3e-3}),
}


def member_configs(model: str, members: int) -> list[dict[str, Any]]:
    """B distinct configs of one structure: per-member lr and seed, as a sweep would give."""
    workload, base = MODELS[model]
    return [workload.resolve({**base, "seed": i, "lr": base["lr"] * (0.5 + i / max(members, 1))}) for i in range(members)]


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def autocast(device: torch.device, dtype: str):
    if dtype == "fp32":
        return torch.autocast(device.type, enabled=False)
    return torch.autocast(device.type, dtype=torch.bfloat16)


#: Each measurement is the best of this many timed runs (the CPU may be shared).
REPEATS = 5


def measure(
    methods: Mapping[str, tuple[list[Callable[[], None]], int]], steps: int, warmup: int, device: torch.device
) -> dict[str, float]:
    """Samples/s of each method: `(step functions, samples per step of all of them)`.

    Methods take turns within each of `REPEATS` rounds and each keeps its fastest round, so a
    burst of load from other processes on a shared machine hits them alike."""
    return measure_wall_and_cpu(methods, steps, warmup, device)[0]


def measure_wall_and_cpu(
    methods: Mapping[str, tuple[list[Callable[[], None]], int]], steps: int, warmup: int, device: torch.device
) -> tuple[dict[str, float], dict[str, float]]:
    """`measure`'s samples/s by wall clock, and by this process's CPU time in the same rounds.

    On a shared CPU the wall clock also counts the time the scheduler gave other processes; with
    one torch thread the CPU time leaves that out (contention for caches and memory stays in),
    so the two together say how much of a ratio is the machine's load."""
    for step_fns, _ in methods.values():
        for step in step_fns:
            for _ in range(warmup):
                step()
    best = dict.fromkeys(methods, math.inf)
    best_cpu = dict.fromkeys(methods, math.inf)
    for _ in range(REPEATS):
        for name, (step_fns, _) in methods.items():
            synchronize(device)
            start, start_cpu = time.perf_counter(), time.process_time()
            for step in step_fns:  # serial: one member after another
                for _ in range(steps):
                    step()
            synchronize(device)
            best[name] = min(best[name], time.perf_counter() - start)
            best_cpu[name] = min(best_cpu[name], time.process_time() - start_cpu)
    rates = {name: samples * steps / best[name] for name, (_, samples) in methods.items()}
    cpu_rates = {name: samples * steps / best_cpu[name] for name, (_, samples) in methods.items()}
    return rates, cpu_rates


# -- the ways to train B members ----------------------------------------------------------------


def serial_steps(model: str, members: int, dtype: str, device: torch.device, cap: int) -> tuple[list[Callable[[], None]], int]:
    """One step function per member (PyTorch's own optimizer), for up to `cap` members."""
    workload, _ = MODELS[model]
    configs = member_configs(model, members)[:cap]
    batch = [t.to(device) for t in next(workload.train_batches(configs[0], 0))]
    steps = []
    for config in configs:
        net = build_trial_model(workload, config).to(device)
        hp = OptimHParams.from_config(config)
        optimizer = build_torch_optimizer(net.named_parameters(), hp, workload.lr_multipliers(net, hp.optimizer))

        def step(net=net, optimizer=optimizer) -> None:
            with autocast(device, dtype):
                loss = workload.loss(net(batch[0]), batch[1])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()

        steps.append(step)
    return steps, len(configs) * batch[0].shape[0]


def fused_steps(
    model: str, members: int, dtype: str, device: torch.device, compile: str = "off"
) -> tuple[list[Callable[[], None]], int]:
    workload, _ = MODELS[model]
    trainer = FusedTrainer(workload, member_configs(model, members), device=device, dtype=dtype, compile=compile)
    inputs, targets = (t.to(device) for t in next(workload.train_batches(trainer.configs[0], 0)))
    return [lambda: trainer.train_step(inputs, targets)], members * inputs.shape[0]


def hand_bmm_steps(model: str, members: int, dtype: str, device: torch.device) -> tuple[list[Callable[[], None]], int]:
    """The MLP written by hand as stacked baddbmm layers, one Adam for all members' weights."""
    workload, base = MODELS[model]
    config = member_configs(model, 1)[0]
    sizes = [NUM_FEATURES] + [int(base["width"])] * int(base["depth"]) + [NUM_CLASSES]
    weights = [(torch.randn(members, i, o, device=device) / math.sqrt(i)).requires_grad_() for i, o in zip(sizes, sizes[1:])]
    biases = [torch.zeros(members, 1, o, device=device, requires_grad=True) for o in sizes[1:]]
    optimizer = torch.optim.Adam(weights + biases, lr=1e-3, foreach=True)
    inputs, targets = (t.to(device) for t in next(workload.train_batches(config, 0)))
    x = inputs.unsqueeze(0).expand(members, *inputs.shape)
    repeated = targets.repeat(members)

    def step() -> None:
        with autocast(device, dtype):
            h = x
            for layer, (w, b) in enumerate(zip(weights, biases)):
                h = torch.baddbmm(b, h, w)
                if layer < len(weights) - 1:
                    h = torch.relu(h)
            # sum of the members' mean losses
            loss = F.cross_entropy(h.reshape(-1, NUM_CLASSES).float(), repeated) * members
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return [step], members * inputs.shape[0]


def concurrent_rate(model: str, members: int, steps: int, warmup: int, cpus: int) -> float | None:
    """B Ray actors sharing `cpus` CPU slots (fractional resources, cpus/B each), one member each."""
    try:
        import hpo.base.ray_runtime  # noqa: F401  before ray: this private Ray listens on loopback only
        import ray
    except ImportError:
        return None
    if not ray.is_initialized():
        ray.init(  # a private local instance, never someone else's cluster
            address="local",
            num_cpus=cpus,
            include_dashboard=False,
            log_to_driver=False,
            runtime_env={"env_vars": {"PYTHONPATH": str(REPO)}},
        )
    Member = ray.remote(num_cpus=cpus / members)(_MemberActor)
    actors = [Member.remote(model, config, steps, warmup) for config in member_configs(model, members)]
    ray.get([a.ready.remote() for a in actors])
    elapsed = math.inf
    for _ in range(REPEATS):  # fastest round, as for the other methods
        start = time.perf_counter()
        samples = sum(ray.get([a.train.remote() for a in actors]))
        elapsed = min(elapsed, time.perf_counter() - start)
    for actor in actors:
        ray.kill(actor)
    return samples / elapsed


class _MemberActor:
    """One trial of the concurrent baseline (a Ray actor; imports happen on the worker)."""

    def __init__(self, model: str, config: dict[str, Any], steps: int, warmup: int):
        torch.set_num_threads(1)
        workload, _ = MODELS[model]
        self.steps = steps
        self.net = build_trial_model(workload, config)
        hp = OptimHParams.from_config(config)
        self.optimizer = build_torch_optimizer(self.net.named_parameters(), hp, workload.lr_multipliers(self.net, hp.optimizer))
        self.workload = workload
        self.batch = next(workload.train_batches(config, 0))
        for _ in range(warmup):
            self._step()

    def _step(self) -> None:
        loss = self.workload.loss(self.net(self.batch[0]), self.batch[1])
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()

    def ready(self) -> bool:
        return True

    def train(self) -> int:
        for _ in range(self.steps):
            self._step()
        return self.steps * self.batch[0].shape[0]


# -- GPU efficiency ----------------------------------------------------------------------------


def resize_models(args: argparse.Namespace) -> None:
    """Apply `--width --layers --block --batch` to every model's base config."""
    for name, (workload, base) in MODELS.items():
        if args.width:
            base["width"] = args.width
        if args.layers:
            base["depth" if name.startswith("mlp") else "n_layer"] = args.layers
        if args.block and not name.startswith("mlp"):
            base["block_size"] = args.block
        if args.batch:
            base["batch_size"] = args.batch


#: ATen ops that run no kernel of their own: views, allocations, and conversions or copies
#: that are no-ops when they have no child op (`to` of a tensor already in that dtype).
NO_KERNEL = frozenset({
    "view", "_unsafe_view", "_reshape_alias", "as_strided", "alias", "reshape", "expand", "expand_as", "t", "transpose",
    "permute", "unsqueeze", "squeeze", "slice", "select", "split", "split_with_sizes", "unflatten", "flatten", "narrow",
    "unbind", "chunk", "view_as", "resolve_conj", "resolve_neg", "detach", "lift_fresh", "empty", "empty_strided",
    "empty_like", "resize_", "set_", "to", "_to_copy", "contiguous", "lift", "numpy_T", "_nested_tensor_size",
})


def launches_per_step(step: Callable[[], None], device: torch.device, steps: int = 3) -> dict[str, float]:
    """What one call of `step` launches, by torch.profiler over `steps` calls (the first call,
    which compiles and captures, is left out):
    - `launches`: kernels. On CUDA the CUDA kernels. On a CPU, as their stand-in, every ATen op
      that computes (`NO_KERNEL` aside) and calls no such op itself (a matmul counts once, its
      views not at all), plus every kernel inductor generated (C++ kernels, profiled through
      `torch._inductor.config.cpp.enable_kernel_profile`);
    - `aten_ops`: the ATen ops dispatched without an ATen op below them, views and no-ops
      included, inductor's own kernels not: the host's per-op work (CPU only)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    step()  # compiled paths compile and capture outside the count
    synchronize(device)
    with profile(activities=activities) as prof:
        for _ in range(steps):
            step()
        synchronize(device)
    events = prof.events()

    def aten(event: Any) -> bool:
        return event.name.startswith("aten::")

    def computes(event: Any) -> bool:
        return aten(event) and event.name[len("aten::"):] not in NO_KERNEL

    def computes_below(event: Any) -> bool:
        return any(computes(child) or computes_below(child) for child in event.cpu_children)

    if device.type == "cuda":
        return {"launches": sum(1 for e in events if e.device_type == DeviceType.CUDA) / steps}
    kernels = sum(1 for e in events if "cpp_fused" in e.name or (computes(e) and not computes_below(e)))
    aten_ops = sum(1 for e in events if aten(e) and not any(aten(c) for c in e.cpu_children))
    return {"launches": kernels / steps, "aten_ops": aten_ops / steps}


def flops_per_sample(model: str) -> float:
    """Training FLOPs (forward + backward = 3x forward) of one sample of one member."""
    workload, _ = MODELS[model]
    config = member_configs(model, 1)[0]
    net = build_trial_model(workload, config)
    if model.startswith("mlp"):
        return 6.0 * sum(m.weight.numel() for m in net.modules() if isinstance(m, torch.nn.Linear))
    tokens = int(config["block_size"])
    linear = sum(m.weight.numel() for m in net.modules() if isinstance(m, torch.nn.Linear))
    attention = 4 * tokens * tokens * int(config["width"]) * int(config["n_layer"])  # QK^T and AV, per sequence
    return 6.0 * linear * tokens + 3.0 * attention


def matmul_peak(device: torch.device, dtype: str) -> float:
    """FLOP/s of a large square matmul in `dtype` (TF32 off: fp32 is true fp32)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    n = 8192
    a = torch.randn(n, n, device=device, dtype=torch.float32 if dtype == "fp32" else torch.bfloat16)
    b = torch.randn_like(a)
    rate = measure({"matmul": ([lambda: a @ b], 1)}, 20, 3, device)["matmul"]  # matmuls per second
    return 2 * n**3 * rate


# -- the differential guard's cost ---------------------------------------------------------------


def every_key_configs(model: str, members: int) -> list[dict[str, Any]]:
    """`member_configs`, with every other per-member key varied too (a sweep's search space)."""
    variants = [
        {},
        {"weight_decay": 0.1, "beta2": 0.99},
        {"grad_clip": 1.0, "warmup_steps": 5},
        {"lr_schedule": "cosine", "schedule_steps": 100, "min_lr_ratio": 0.1},
        {"weight_decay": 1e-3, "lr_schedule": "step", "schedule_steps": 10, "lr_gamma": 0.5, "beta1": 0.8},
    ]
    return [{**config, **variants[i % len(variants)]} for i, config in enumerate(member_configs(model, members))]


def guard_cost(model: str, members: int, configs: list[dict[str, Any]]) -> dict[str, Any]:
    """Best-of-REPEATS first iteration without and with the guard, and the guard's own time."""
    import fusion.trainer as trainer_module

    workload, _ = MODELS[model]
    guard_s = [0.0]
    originals = {
        name: getattr(trainer_module, name)
        for name in ("copy_witnesses", "check_initial_states", "check_batches", "verify_fused_training")
    }

    def clocked(function: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                guard_s[0] += time.perf_counter() - start

        return call

    FusedTrainer(workload, configs[:2]).train_iteration()  # imports and first-call costs out of the way
    best = {"off": math.inf, "on": math.inf, "guard": math.inf}
    witnesses = 0
    try:
        for name, function in originals.items():
            setattr(trainer_module, name, clocked(function))
        for _ in range(REPEATS):
            for verify in (False, True):
                guard_s[0] = 0.0
                start = time.perf_counter()
                trainer = FusedTrainer(workload, configs, verify=verify)
                trainer.train_iteration()
                elapsed = time.perf_counter() - start
                best["on" if verify else "off"] = min(best["on" if verify else "off"], elapsed)
                if verify:
                    best["guard"] = min(best["guard"], guard_s[0])
                    witnesses = len(trainer_module.choose_witnesses(trainer.configs, trainer.hparams))
    finally:
        for name, function in originals.items():
            setattr(trainer_module, name, function)
    return {
        "model": model, "B": members, "strategy": trainer.model.strategy, "witnesses": witnesses,
        "steps_per_iteration": trainer.steps_per_iteration,
        "first_iteration_s": best["off"], "first_iteration_verified_s": best["on"], "guard_s": best["guard"],
        "guard_share": best["guard"] / best["off"], "difference_share": best["on"] / best["off"] - 1,
    }


def run_guard(args: argparse.Namespace) -> list[dict[str, Any]]:
    torch.set_num_threads(args.threads)
    load_corpus()
    rows = []
    for model in (args.models if args.models != "mlp,mlp256,char_gpt" else "mlp,char_gpt").split(","):
        for b in tuple(int(b) for b in (args.members or "16").split(",")):
            for varied, configs in (("lr", member_configs(model, b)), ("every key", every_key_configs(model, b))):
                row = {"varied": varied, **guard_cost(model, b, configs)}
                rows.append(row)
                print(
                    f"{model:>9} B={b:<3} varied={varied:<9} {row['strategy']:>7} witnesses {row['witnesses']}  first iteration "
                    f"{row['first_iteration_s']:.3f} s  guard {row['guard_s']:.3f} s ({row['guard_share']:.1%}; "
                    f"on vs off {row['difference_share']:+.1%})",
                    flush=True,
                )
    return rows


# -- the fusion zoo (tests/fusion_zoo.py): models written as users write them -------------------

ZOO_SAMPLES = 32
#: Timed steps per round: with 5, run-to-run noise on the 2-core box (5-8%) decided which side of 3x a model fell.
ZOO_STEPS = 30


def zoo_configs(members: int) -> list[dict[str, Any]]:
    return [{"seed": i, "optimizer": "adam", "lr": 1e-3 * (0.5 + i / max(members, 1))} for i in range(members)]


def zoo_serial_steps(name: str, members: int, cap: int) -> tuple[list[Callable[[], None]], int]:
    from tests.fusion_zoo import ZOO, loss

    entry = ZOO[name]
    x, y = next(entry.batches(ZOO_SAMPLES))
    steps = []
    for config in zoo_configs(members)[:cap]:
        torch.manual_seed(config["seed"])
        net = entry.build().train()
        optimizer = build_torch_optimizer(net.named_parameters(), OptimHParams.from_config(config))

        def step(net=net, optimizer=optimizer) -> None:
            value = loss(net(x), y)
            optimizer.zero_grad(set_to_none=True)
            value.backward()
            optimizer.step()

        steps.append(step)
    return steps, len(steps) * ZOO_SAMPLES


def zoo_fused_steps(name: str, members: int) -> tuple[list[Callable[[], None]], int, str]:
    from fusion import FusedOptimizer, fuse_models
    from tests.fusion_zoo import ZOO

    entry = ZOO[name]
    x, y = next(entry.batches(ZOO_SAMPLES))
    nets = []
    for config in zoo_configs(members):
        torch.manual_seed(config["seed"])
        nets.append(entry.build())
    fused = fuse_models(nets, x).train()
    optimizer = FusedOptimizer(dict(fused.module.named_parameters()), [OptimHParams.from_config(c) for c in zoo_configs(members)])
    targets = y.reshape(1, -1).expand(members, -1).reshape(-1)

    def step() -> None:
        out = fused(x)
        # each member's mean cross-entropy, all members in one call (as FusedTrainer does)
        per_element = F.cross_entropy(out.reshape(-1, out.shape[-1]), targets, reduction="none")
        losses = per_element.view(members, -1).mean(dim=1)
        optimizer.zero_grad()
        losses.sum().backward()
        optimizer.step()

    return [step], members * ZOO_SAMPLES, fused.strategy


def run_zoo(args: argparse.Namespace) -> list[dict[str, Any]]:
    """fused / serial per zoo model on CPU (members in `--members`, default 16)."""
    from tests.fusion_zoo import ZOO

    torch.set_num_threads(args.threads)
    members = tuple(int(b) for b in (args.members or "16").split(","))
    steps, warmup = (args.steps or ZOO_STEPS), 2
    rows = []
    names = [n for n, entry in ZOO.items() if entry.path != "refused"] if args.zoo == "all" else args.zoo.split(",")
    for name in names:
        for b in members:
            fused, samples, path = zoo_fused_steps(name, b)
            methods = {"serial": zoo_serial_steps(name, b, args.serial_cap), "fused": (fused, samples)}
            row: dict[str, Any] = {"model": name, "path": path, "device": "cpu", "dtype": "fp32", "B": b, "batch": ZOO_SAMPLES}
            rates, cpu_rates = measure_wall_and_cpu(methods, steps, warmup, torch.device("cpu"))
            row.update(rates)
            row["ratio"] = row["fused"] / row["serial"]
            row.update(serial_cpu=cpu_rates["serial"], fused_cpu=cpu_rates["fused"], ratio_cpu=cpu_rates["fused"] / cpu_rates["serial"])
            rows.append(row)
            print(
                f"{name:>22} {path:>8} B={b:<4} serial {row['serial']:>10,.0f}/s  fused {row['fused']:>10,.0f}/s  ratio {row['ratio']:.2f}"
                f"  (by CPU time {row['ratio_cpu']:.2f})",
                flush=True,
            )
    return rows


# -- driver --------------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> dict[str, Any]:
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda but torch sees no CUDA device")
    if device.type == "cpu":
        torch.set_num_threads(args.threads)
    dtypes = args.dtypes.split(",") if args.dtypes else ["fp32", "bf16"] if device.type == "cuda" else ["fp32"]
    members = QUICK_MEMBERS if args.quick else MEMBERS
    if args.members:
        members = tuple(int(b) for b in args.members.split(","))
    steps, warmup = (args.steps or (4 if args.quick else 20)), 2
    global REPEATS
    REPEATS = args.repeats or (3 if args.quick else 5)
    modes = args.compile.split(",")
    if device.type == "cpu" and modes != ["off"]:
        # inductor's C++ kernels show in the profile, so the launch count has them
        importlib.import_module("torch._inductor.config").cpp.enable_kernel_profile = True
    load_before = os.getloadavg()
    load_corpus()
    peaks = {dtype: matmul_peak(device, dtype) for dtype in dtypes} if device.type == "cuda" else {}
    rows = []
    for model in args.models.split(","):
        for dtype in dtypes:
            for b in members:
                # every compile mode's fused step beside the same serial baseline, in the same rounds
                methods = {"serial": serial_steps(model, b, dtype, device, args.serial_cap)}
                counts = {}
                for mode in modes:
                    methods[f"fused_{mode}"] = fused_steps(model, b, dtype, device, mode)
                    counts[mode] = launches_per_step(methods[f"fused_{mode}"][0][0], device)
                if model.startswith("mlp"):
                    methods["hand_bmm"] = hand_bmm_steps(model, b, dtype, device)
                rates = measure(methods, steps, warmup, device)
                del methods
                samples = b * int(member_configs(model, 1)[0]["batch_size"])
                for mode in modes:
                    row: dict[str, Any] = {"model": model, "device": device.type, "dtype": dtype, "B": b, "concurrent": None}
                    row["compile"] = mode
                    row["serial"], row["fused"], row["hand_bmm"] = rates["serial"], rates[f"fused_{mode}"], rates.get("hand_bmm")
                    row["fused_launches_per_step"] = counts[mode]["launches"]
                    if "aten_ops" in counts[mode]:
                        row["fused_aten_ops_per_step"] = counts[mode]["aten_ops"]
                    if mode != "off" and "off" in modes:
                        row["fused_vs_off"] = row["fused"] / rates["fused_off"]
                        row["launches_off_vs_this"] = counts["off"]["launches"] / counts[mode]["launches"]
                    row["ratio"] = row["fused"] / row["serial"]
                    row["fused_step_ms"] = 1000 * samples / row["fused"]
                    row["serial_step_ms"] = 1000 * samples / row["serial"]  # B members one step each, one after another
                    if device.type == "cuda":
                        achieved = row["fused"] * flops_per_sample(model)
                        row["fused_tflops"] = achieved / 1e12
                        row["peak_tflops"] = peaks[dtype] / 1e12
                        row["peak_fraction"] = achieved / peaks[dtype]
                    if row["hand_bmm"]:
                        row["fused_vs_hand_bmm"] = row["fused"] / row["hand_bmm"]
                    rows.append(row)
                    print_row(row)
    # Ray last, so its worker processes never compete with the other measurements.
    concurrent_cap = args.concurrent_cap if args.concurrent_cap is not None else (4 if args.quick else 16)
    if device.type == "cpu" and not args.no_concurrent and importlib.util.find_spec("ray") is None:
        print("concurrent: skipped, Ray is not installed", flush=True)
    elif device.type == "cpu" and not args.no_concurrent:
        print("concurrent (Ray actors with fractional CPUs):", flush=True)
        for row in rows:
            if row["B"] <= concurrent_cap:
                row["concurrent"] = concurrent_rate(row["model"], row["B"], steps, warmup, args.threads)
                print_row(row)
    print("results:", flush=True)
    print_row.header = False
    for row in rows:
        print_row(row)
    return {
        "rows": rows,
        "commit": git_commit(),
        # a shared machine: the 1/5/15-minute load averages around the run say how shared
        "load_average": {"before": load_before, "after": os.getloadavg()},
        "machine": {
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "python": platform.python_version(),
        },
        "settings": {
            "steps": steps,
            "warmup": warmup,
            "repeats": REPEATS,
            "serial_cap": args.serial_cap,
            "concurrent_cap": concurrent_cap,
            "torch_threads": args.threads,
            "units": "samples/s (members x batch x steps / s); ratio = fused / serial",
        },
        "models": {name: member_configs(name, 1)[0] for name in args.models.split(",")},
    }


def git_commit() -> str:
    """The checkout's commit, marked dirty when it has uncommitted changes."""
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=False).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain"], cwd=REPO, capture_output=True, text=True, check=False).stdout.strip()
    return head + ("-dirty" if dirty else "")


def fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.1f}" if value >= 10 else f"{value:.2f}"
    return str(value)


COLUMNS = (
    "model", "dtype", "B", "compile", "serial", "concurrent", "fused", "hand_bmm", "ratio", "fused_vs_hand_bmm",
    "fused_step_ms", "serial_step_ms", "fused_launches_per_step", "fused_aten_ops_per_step", "fused_vs_off",
    "launches_off_vs_this", "peak_fraction",
)


def print_row(row: Mapping[str, Any]) -> None:
    if not getattr(print_row, "header", False):
        print(" ".join(f"{c:>17}" for c in COLUMNS), flush=True)
        print_row.header = True
    print(" ".join(f"{fmt(row.get(c)):>17}" for c in COLUMNS), flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="B in {1,4,16}, few steps: a CPU run under 3 minutes")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--json", type=Path, help="write the rows here")
    parser.add_argument("--models", default="mlp,mlp256,char_gpt")
    parser.add_argument("--members", help="comma-separated B values (default 1,4,16,64,128; --quick 1,4,16)")
    parser.add_argument("--steps", type=int, help="timed steps per measurement")
    parser.add_argument(
        "--threads", type=int, default=1, help="CPU slots: torch threads for serial/fused, Ray CPUs for concurrent (default 1)"
    )
    parser.add_argument("--repeats", type=int, help="timed runs per measurement, best kept (default 5; --quick 3)")
    parser.add_argument("--serial-cap", type=int, default=8, help="members timed for the serial rate")
    parser.add_argument("--concurrent-cap", type=int, help="most Ray actors for the concurrent rate (default 16; --quick 4)")
    parser.add_argument("--no-concurrent", action="store_true")
    parser.add_argument("--width", type=int, help="every model's width")
    parser.add_argument("--layers", type=int, help="the MLPs' hidden layers and the GPT's blocks")
    parser.add_argument("--block", type=int, help="the GPT's context length")
    parser.add_argument("--batch", type=int, help="samples per member per step")
    parser.add_argument(
        "--compile", default="off", help="the fused step's paths, comma-separated (off, inductor, graphs): timed side by side"
    )
    parser.add_argument("--dtypes", help="comma-separated fp32,bf16 (default: both on CUDA, fp32 on CPU)")
    parser.add_argument(
        "--zoo", help="time the fusion zoo instead (tests/fusion_zoo.py): 'all' or comma-separated names; CPU, fp32"
    )
    parser.add_argument("--guard", action="store_true", help="measure the differential guard's cost instead (MLP and char GPT; CPU)")
    args = parser.parse_args(argv)
    unknown = [mode for mode in args.compile.split(",") if mode not in ("off", "inductor", "graphs")]
    if unknown:
        parser.error(f"--compile: {unknown[0]!r} is not a path; expected off, inductor or graphs, comma-separated")
    resize_models(args)
    if args.guard:
        global REPEATS
        REPEATS = args.repeats or 5
        load_before = os.getloadavg()
        rows = run_guard(args)
        results = {
            "rows": rows,
            "commit": git_commit(),
            "machine": {"device": platform.processor() or platform.machine(), "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(), "torch": torch.__version__, "python": platform.python_version()},
            "load_average": {"before": load_before, "after": os.getloadavg()},
            "settings": {"repeats": REPEATS, "units": "seconds; guard_share = guard_s / first_iteration_s (the guard off); difference_share = on / off - 1, by wall clock"},
        }
        if args.json:
            args.json.write_text(json.dumps(results, indent=2))
            print(f"wrote {args.json}")
        return
    if args.zoo:
        REPEATS = args.repeats or 3
        load_before = os.getloadavg()
        rows = run_zoo(args)
        results = {
            "rows": rows,
            "machine": {"device": platform.processor() or platform.machine(), "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(), "torch": torch.__version__, "python": platform.python_version()},
            # a shared machine: the 1/5/15-minute load averages around the run say how shared
            "load_average": {"before": load_before, "after": os.getloadavg()},
            "settings": {"steps": args.steps or ZOO_STEPS, "repeats": REPEATS, "serial_cap": args.serial_cap, "samples_per_member": ZOO_SAMPLES, "units": "samples/s (members x batch x steps / s); ratio = fused / serial; *_cpu: by this process's CPU time (torch_threads=1) instead of wall clock"},
        }
        if args.json:
            args.json.write_text(json.dumps(results, indent=2))
            print(f"wrote {args.json}")
        return
    try:
        results = run(args)
    finally:
        if "ray" in sys.modules and sys.modules["ray"].is_initialized():
            sys.modules["ray"].shutdown()
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
