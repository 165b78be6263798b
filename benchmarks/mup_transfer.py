"""Does muP transfer work on real data? The muP paper's Figure 1 for hydro-hpo's char-GPT.

For the char-level GPT of `examples/char_gpt.py` (the CPython Language Reference text), sweep
the learning rate on a log2 grid at several widths, under muP (hpo.scaling, base width = the
widest, i.e. the target) and under standard parametrisation (the plain model), and plot final
validation loss against log2(lr), one curve per width, SP and muP side by side. Under muP the
optimum should move by at most one grid step (2x) across widths; under SP it should move more,
or the wide model should diverge at the narrow model's optimum.

Both use the same model config; only the parametrisation differs. Heads keep head_dim = 16 at
every width, so 1/sqrt(head_dim) attention is a width-independent constant and needs no muP
change. With muP's base width at the target, the muP target *is* the SP target (same model,
every lr factor 1), so the target's SP runs are the muP ones; one SP run at the target
re-checks that they are bit-identical.

Then the end-to-end claim: tune at the proxy width (the narrowest), transfer with
`hpo.scaling.transfer_config`, train the target (the widest), and compare with the best lr of a
direct sweep at the target width: transferred_loss vs direct_best_loss, and the compute of the
proxy sweep over that of the direct sweep (training FLOPs, same grid; the one extra target
run the transfer needs is reported separately as compute_ratio_with_target_run).

    python benchmarks/mup_transfer.py --quick --json results/mup_transfer_quick.json   # CPU, < 10 min
    python benchmarks/mup_transfer.py --device cuda --json results/mup_transfer_gpu.json

`--depth` asks the same of depth at a fixed width (char-GPT at width 64, muP base 256): the best
log2(lr) at depths 1, 2, 4, 8 and 16 on two seeds, without depth scaling (the residual branches
added as they are) and with it (hpo.scaling's CompleteP: branches x (L/L_base)^-alpha, hidden
Adam lr x (L/L_base)^(alpha-1), hidden eps x (L/L_base)^-alpha, L_base = 2); the drift of the
optimum in grid steps, worst over the seeds, is `depth_drift_steps` (scaled) and
`depth_drift_steps_unscaled`. Then the joint transfer: tune a proxy of width 64 and depth 2 (muP
relative to the target's width, CompleteP relative to the proxy's depth: what `hpo.scaling` builds
for `scaling: {target_width: 256, ratio: 4, target_depth: 8, proxy_depth: 2}`), carry its best lr
with `hpo.scaling.transfer_config` to the target of width 256 and depth 8, and compare with direct
tuning of the target on the same grid: `joint_transfer: {gap, compute_ratio}` (training FLOPs of
the proxy sweep over the direct one). The same target without depth scaling is tuned as well
(`joint_transfer.target_without_depth_scaling`).

    python benchmarks/mup_transfer.py --depth --quick --json benchmarks/results/mup_transfer_depth_cpu_quick.json
    python benchmarks/mup_transfer.py --depth --device cuda --json benchmarks/results/mup_transfer_depth_gpu.json

`--resume` reuses the runs a cut-short run left in `<json>.partial.json`. The CPU preset takes about 45-60 minutes on one core of the 2-core box (each run on one torch
thread; the target's direct sweep is 7 runs of width 256 and depth 8).

Needs torch, mup, matplotlib and pydantic; not Ray: it trains in-process with the optimizer and
the muP and depth factors the sweep uses (`hpo.base.hparams.workload_optimizer`).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import platform
import subprocess
import sys
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _ray_installed() -> bool:
    try:
        return importlib.util.find_spec("ray") is not None
    except (ImportError, ValueError):
        return False


if not _ray_installed():
    # `hpo/__init__` loads the Ray-based sweep API; this benchmark needs only Ray-free modules
    # (hpo.base.workload, hpo.base.hparams, hpo.scaling), so without Ray register the bare package.
    _package = types.ModuleType("hpo")
    _package.__path__ = [str(ROOT / "hpo")]
    sys.modules["hpo"] = _package

import torch  # noqa: E402

from examples.char_gpt import workload as char_gpt  # noqa: E402
from hpo.base.hparams import OptimHParams, workload_optimizer  # noqa: E402
from hpo.scaling import MuPWorkload, ScalingConfig, transfer_config  # noqa: E402

PRESETS = {
    # 2-core CPU, under 10 minutes.
    "quick": dict(
        widths=[64, 128, 256], log2_lrs=list(range(-10, -2)), steps=150, batch_size=32, block_size=32, n_layer=2,
        readout_zero_init=False,
    ),
    # One GPU, about 10 minutes on an H100. At a 16x width ratio muP's readout (weights at the
    # base width's scale, output x base/width) starts with logits sqrt(16) = 4x the target's;
    # a zero readout starts every width at 0 (Tensor Programs V's recommendation).
    "full": dict(
        widths=[128, 256, 512, 1024, 2048], log2_lrs=list(range(-14, -4)), steps=500, batch_size=64, block_size=64, n_layer=2,
        readout_zero_init=True,
    ),
}  # fmt: skip


def run_config(settings: dict, log2_lr: int, width: int, parametrization: str) -> dict:
    steps = settings["steps"]
    warmup = max(1, steps // 10)
    return {
        "width": width,
        "n_layer": settings["n_layer"],
        "block_size": settings["block_size"],
        "batch_size": settings["batch_size"],
        "readout_zero_init": settings["readout_zero_init"],
        "attn_scale": "inv_sqrt_d",  # head_dim is fixed, so this is width-independent (see above)
        "optimizer": "adamw",
        "lr": 2.0**log2_lr,
        "weight_decay": 0.0,
        "lr_schedule": "cosine",
        "warmup_steps": warmup,
        "schedule_steps": steps - warmup,
        "min_lr_ratio": 0.1,
        "seed": 0,
        "data_seed": 0,
    }


def train(workload, config: dict, steps: int, device: torch.device) -> dict:
    """One run, as hpo.base.training.TrialTrainer trains it (without Ray, on `device`); final val loss."""
    config = workload.resolve(config)
    torch.manual_seed(int(config["seed"]))
    model = workload.build_model(config).to(device)
    hparams = OptimHParams.from_config(config)
    optimizer = workload_optimizer(workload, model, hparams)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, hparams.lr_factor)
    batches = workload.train_batches(config, int(config["data_seed"]))
    start = time.perf_counter()
    diverged = False
    model.train()
    for _ in range(steps):
        inputs, targets = (t.to(device, non_blocking=True) for t in next(batches))
        loss = workload.loss(model(inputs), targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
        if not math.isfinite(loss.item()):
            diverged = True
            break
    val_loss = math.nan
    if not diverged:
        model.eval()
        with torch.no_grad():
            losses = [workload.loss(model(x.to(device)), y.to(device)).item() for x, y in workload.eval_batches(config)]
        val_loss = sum(losses) / len(losses)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return {
        "val_loss": val_loss if math.isfinite(val_loss) else math.nan,
        "seconds": time.perf_counter() - start,
        "flops": training_flops(model, config, steps),
    }


def training_flops(model: torch.nn.Module, config: dict, steps: int) -> float:
    """6 x (non-embedding parameters) per token plus causal attention (Kaplan et al. 2020)."""
    embedding = sum(p.numel() for name, p in model.named_parameters() if "embedding" in name)
    dense = sum(p.numel() for p in model.parameters()) - embedding
    tokens = config["batch_size"] * config["block_size"]
    attention = 6 * config["n_layer"] * config["block_size"] * config["width"]  # q.k and att.v, fwd + bwd
    return float(steps * tokens * (6 * dense + attention))


def best_index(losses: list[float]) -> int | None:
    finite = [(loss, i) for i, loss in enumerate(losses) if math.isfinite(loss)]
    return min(finite)[1] if finite else None


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    widths, lrs = results["widths"], results["log2_lrs"]
    finite = [v for p in ("mup", "sp") for w in widths for v in results["loss"][p][str(w)] if math.isfinite(v)]
    low = min(finite)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    colors = plt.cm.viridis([i / max(1, len(widths) - 1) for i in range(len(widths))])
    for ax, parametrization, title in zip(axes, ("sp", "mup"), ("Standard parametrisation", "muP (hpo.scaling)")):
        for color, width in zip(colors, widths):
            losses = results["loss"][parametrization][str(width)]
            ax.plot(lrs, [v if math.isfinite(v) else float("nan") for v in losses], "-o", ms=3, color=color, label=f"width {width}")
            i = best_index(losses)
            if i is not None:
                ax.plot([lrs[i]], [losses[i]], "*", ms=12, color=color, markeredgecolor="black")
        ax.set_title(title)
        ax.set_xlabel("log2(learning rate)")
        ax.set_ylim(low - 0.05, low + 1.2)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("validation loss (nats/char)")
    axes[1].legend(loc="upper right", fontsize=8)
    fig.suptitle(f"char-GPT on the CPython Language Reference, {results['settings']['steps']} steps, AdamW (stars: optimum)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


DEPTH_PRESETS = {
    # 2-core CPU, one torch thread: about 45-60 minutes (see the docstring).
    "quick": dict(
        width=64, base_width=256, depths=[1, 2, 4, 8, 16], base_depth=2, depth_alpha=1.0, seeds=[0, 1],
        log2_lrs=list(range(-11, -4)), steps=150, batch_size=32, block_size=32, readout_zero_init=False,
        joint=dict(proxy_width=64, proxy_depth=2, target_width=256, target_depth=8),
    ),
    # One GPU. Not yet measured: sized like the width preset's runs, a little over 10 minutes is expected on an H100.
    "full": dict(
        width=128, base_width=1024, depths=[2, 4, 8, 16, 32], base_depth=4, depth_alpha=1.0, seeds=[0, 1],
        log2_lrs=list(range(-14, -4)), steps=500, batch_size=64, block_size=64, readout_zero_init=True,
        joint=dict(proxy_width=128, proxy_depth=4, target_width=1024, target_depth=16),
    ),
}  # fmt: skip


class DepthRuns:
    """Every run of the depth benchmark, trained once: a run is its workload and its config."""

    def __init__(self, settings: dict, device: torch.device, progress: Path | None, resume: bool = False):
        self.settings, self.device, self.progress = settings, device, progress
        self.runs: dict[str, dict] = {}
        self.used: set[str] = set()  # the runs this result reads: a resumed file may hold others
        self.resumed: set[str] = set()
        if resume and progress and progress.exists():  # a run cut short: keep what it finished
            for run in json.loads(progress.read_text()):
                self.runs[self.key(run["workload"], run["config"])] = run
            self.resumed = set(self.runs)

    @staticmethod
    def key(workload: str, config: dict) -> str:
        return f"{workload} {json.dumps(config, sort_keys=True)}"

    def config(self, log2_lr: int, width: int, depth: int, seed: int) -> dict:
        return {**run_config({**self.settings, "n_layer": depth}, log2_lr, width, "mup"), "seed": seed, "data_seed": seed}

    def run(self, workload, config: dict) -> dict:
        key = self.key(repr(workload), config)
        if key not in self.runs:
            self.runs[key] = {"workload": repr(workload), "config": config, **train(workload, config, self.settings["steps"], self.device)}
            if self.progress:  # progress survives a run cut short by a time limit
                self.progress.parent.mkdir(parents=True, exist_ok=True)
                self.progress.write_text(json.dumps(list(self.runs.values()), indent=1) + "\n")
            run = self.runs[key]
            print(f"{workload!r} n_layer {config['n_layer']} seed {config['seed']} log2(lr) {math.log2(config['lr']):g}: "
                  f"val_loss {run['val_loss']:.4f} ({run['seconds']:.1f}s)", flush=True)  # fmt: skip
        self.used.add(key)
        return self.runs[key]

    def sweep(self, workload, width: int, depth: int, seed: int) -> list[dict]:
        return [self.run(workload, self.config(lr, width, depth, seed)) for lr in self.settings["log2_lrs"]]


def depth_workload(settings: dict, width: int, base_width: int, depth: int, scaled: bool) -> MuPWorkload:
    """muP at `width` (base `base_width`); with `scaled`, depth-scaled relative to the preset's base
    depth. At the base depth depth scaling is the identity (tests/test_scaling_depth.py checks it
    bit for bit), so that run is the unscaled one."""
    if not scaled or depth == settings["base_depth"]:
        return MuPWorkload(char_gpt, width, base_width=base_width)
    return MuPWorkload(
        char_gpt, width, base_width=base_width, depth=depth, base_depth=settings["base_depth"], depth_alpha=settings["depth_alpha"]
    )


def drift_steps(best: dict[int, int | None]) -> int | None:
    """How far the best grid index moves across depths, in grid steps."""
    found = [i for i in best.values() if i is not None]
    return max(found) - min(found) if found else None


def depth_drift(runs: DepthRuns, settings: dict) -> dict:
    """The best log2(lr) per depth and seed, with and without depth scaling, and what it costs."""
    lrs, depths, seeds = settings["log2_lrs"], settings["depths"], settings["seeds"]
    loss: dict[str, dict[str, dict[str, list[float]]]] = {"unscaled": {}, "scaled": {}}
    for seed in seeds:
        for depth in sorted(depths, reverse=True):  # deepest first: the slowest runs, while the machine is fresh
            for kind in ("unscaled", "scaled"):
                workload = depth_workload(settings, settings["width"], settings["base_width"], depth, kind == "scaled")
                sweep = runs.sweep(workload, settings["width"], depth, seed)
                loss[kind].setdefault(str(seed), {})[str(depth)] = [r["val_loss"] for r in sweep]
    summary: dict = {"loss": loss, "best_log2_lr": {}, "drift_steps": {}, "flank_above_optimum": {}, "carry_shallow_optimum": {}}
    for kind in ("unscaled", "scaled"):
        mean = {str(d): [sum(loss[kind][str(s)][str(d)][i] for s in seeds) / len(seeds) for i in range(len(lrs))] for d in depths}
        best = {s: {d: best_index(loss[kind][str(s)][str(d)]) for d in depths} for s in seeds}
        best_mean = {d: best_index(mean[str(d)]) for d in depths}
        summary["best_log2_lr"][kind] = {
            **{f"seed {s}": {str(d): None if i is None else lrs[i] for d, i in best[s].items()} for s in seeds},
            "seed mean": {str(d): None if i is None else lrs[i] for d, i in best_mean.items()},
        }
        per_seed = [drift_steps(best[s]) for s in seeds]
        summary["drift_steps"][kind] = {
            "worst over seeds": None if None in per_seed else max(per_seed),
            "per seed": dict(zip(map(str, seeds), per_seed)),
            "seed mean": drift_steps(best_mean),
        }
        summary["flank_above_optimum"][kind] = {
            str(d): mean[str(d)][i + 1] - mean[str(d)][i] if i is not None and i + 1 < len(lrs) else None for d, i in best_mean.items()
        }
        shallow, deep, seed = depths[1] if len(depths) > 1 else depths[0], depths[-1], seeds[0]
        carried = best[seed][shallow]
        deep_losses = loss[kind][str(seed)][str(deep)]
        summary["carry_shallow_optimum"][kind] = {
            "from_depth": shallow, "to_depth": deep, "seed": seed,
            "loss_at_carried_lr": None if carried is None else deep_losses[carried],
            "best_loss": min((v for v in deep_losses if math.isfinite(v)), default=math.nan),
        }  # fmt: skip
    summary["mean_loss"] = {
        kind: {str(d): [sum(loss[kind][str(s)][str(d)][i] for s in seeds) / len(seeds) for i in range(len(lrs))] for d in depths}
        for kind in ("unscaled", "scaled")
    }
    return summary


def joint_transfer(runs: DepthRuns, settings: dict) -> dict:
    """Tune the proxy (narrow and shallow), transfer with hpo.scaling, compare with tuning the target.

    The proxy and the target are the ones `hpo.scaling` builds for this `scaling:` block (base
    width the target's, base depth the proxy's). The target without depth scaling (its residual
    branches unmultiplied) is tuned too, to show what depth scaling changes.
    """
    joint, lrs, seed = settings["joint"], settings["log2_lrs"], settings["seeds"][0]
    scaling = ScalingConfig(
        target_width=joint["target_width"], proxy_width=joint["proxy_width"],
        target_depth=joint["target_depth"], proxy_depth=joint["proxy_depth"], depth_alpha=settings["depth_alpha"],
    )  # fmt: skip
    if scaling.depth_base != settings["base_depth"]:
        raise ValueError(f"the drift table's base depth {settings['base_depth']} must be the joint proxy's, {scaling.depth_base}")
    proxy = depth_workload(settings, scaling.proxy, scaling.base, scaling.depth_proxy, scaled=True)
    target = depth_workload(settings, scaling.target_width, scaling.base, scaling.target_depth, scaled=True)
    unscaled = depth_workload(settings, scaling.target_width, scaling.base, scaling.target_depth, scaled=False)
    proxy_sweep = runs.sweep(proxy, scaling.proxy, scaling.depth_proxy, seed)
    direct_sweep = runs.sweep(target, scaling.target_width, scaling.target_depth, seed)
    unscaled_sweep = runs.sweep(unscaled, scaling.target_width, scaling.target_depth, seed)
    proxy_losses, direct_losses = [r["val_loss"] for r in proxy_sweep], [r["val_loss"] for r in direct_sweep]
    unscaled_losses = [r["val_loss"] for r in unscaled_sweep]
    proxy_best = lrs[best_index(proxy_losses)]
    transfer = transfer_config(runs.config(proxy_best, scaling.proxy, scaling.depth_proxy, seed), scaling, depth_key=char_gpt.depth_key)
    transferred = runs.run(target, transfer.target_config)  # the direct sweep's run at that lr: same workload and config
    direct_best = min(v for v in direct_losses if math.isfinite(v))
    unscaled_best = min(v for v in unscaled_losses if math.isfinite(v))
    unscaled_transferred = unscaled_losses[lrs.index(proxy_best)]
    proxy_flops, direct_flops = sum(r["flops"] for r in proxy_sweep), sum(r["flops"] for r in direct_sweep)
    return {
        "gap": transferred["val_loss"] / direct_best - 1.0,
        "compute_ratio": proxy_flops / direct_flops,
        "compute_ratio_with_target_run": (proxy_flops + transferred["flops"]) / direct_flops,
        "wall_clock_ratio": sum(r["seconds"] for r in proxy_sweep) / sum(r["seconds"] for r in direct_sweep),
        "transferred_loss": transferred["val_loss"],
        "direct_best_loss": direct_best,
        "proxy_best_log2_lr": proxy_best,
        "direct_best_log2_lr": lrs[best_index(direct_losses)],
        "proxy": {"width": scaling.proxy, "depth": scaling.depth_proxy, "losses": proxy_losses},
        "target": {"width": scaling.target_width, "depth": scaling.target_depth, "losses": direct_losses},
        "target_without_depth_scaling": {
            "losses": unscaled_losses,
            "best_loss": unscaled_best,
            "best_log2_lr": lrs[best_index(unscaled_losses)],
            "loss_at_proxy_best_lr": unscaled_transferred,
            "gap": unscaled_transferred / unscaled_best - 1.0,
        },
        "seed": seed,
        "target_config": transfer.target_config,
        "scaled": transfer.scaled,
        "flagged": transfer.flagged,
    }


def plot_depth(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lrs, depths, drift = results["log2_lrs"], results["depths"], results["drift"]
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.4))
    colors = plt.cm.viridis([i / max(1, len(depths) - 1) for i in range(len(depths))])
    low = min(v for kind in drift["mean_loss"].values() for losses in kind.values() for v in losses if math.isfinite(v))
    titles = {"unscaled": "without depth scaling", "scaled": f"with depth scaling (alpha {results['settings']['depth_alpha']:g})"}
    for ax, kind in zip(axes, ("unscaled", "scaled")):
        for color, depth in zip(colors, depths):
            losses = drift["mean_loss"][kind][str(depth)]
            ax.plot(lrs, losses, "-o", ms=3, color=color, label=f"depth {depth}")
            i = best_index(losses)
            if i is not None:
                ax.plot([lrs[i]], [losses[i]], "*", ms=12, color=color, markeredgecolor="black")
        ax.set_title(f"{titles[kind]}: drift {drift['drift_steps'][kind]['worst over seeds']} step(s)")
        ax.set_xlabel("log2(learning rate)")
        ax.set_ylim(low - 0.05, low + 1.0)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(f"validation loss, mean of seeds {results['seeds']}")
    axes[1].legend(loc="upper right", fontsize=8)
    joint = results["joint_transfer"]
    for part, style in (("proxy", "-o"), ("target", "-s")):
        ax = axes[2]
        ax.plot(lrs, joint[part]["losses"], style, ms=3, label=f"{part}: width {joint[part]['width']}, depth {joint[part]['depth']}")
    axes[2].plot(lrs, joint["target_without_depth_scaling"]["losses"], "--", color="gray", label="target without depth scaling")
    i = lrs.index(joint["proxy_best_log2_lr"])
    axes[2].plot([lrs[i]], [joint["transferred_loss"]], "*", ms=14, color="tab:red", markeredgecolor="black", label="transferred")
    axes[2].set_title(f"joint transfer: gap {100 * joint['gap']:.2f}% at {100 * joint['compute_ratio']:.1f}% of the compute")
    axes[2].set_xlabel("log2(learning rate)")
    axes[2].grid(alpha=0.3)
    axes[2].legend(fontsize=8)
    fig.suptitle(f"char-GPT at width {results['settings']['width']} (muP base {results['settings']['base_width']}), "
                 f"{results['settings']['steps']} steps, AdamW (stars: optimum)")  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def depth_main(args: argparse.Namespace, device: torch.device) -> dict:
    settings = dict(DEPTH_PRESETS["quick" if args.quick else "full"])
    for key in ("depths", "seeds", "log2_lrs"):
        if getattr(args, key) is not None:
            settings[key] = sorted(getattr(args, key))
    for key in ("steps", "base_depth", "depth_alpha"):
        if getattr(args, key) is not None:
            settings[key] = getattr(args, key)
    started, cpu_started, commit = time.perf_counter(), time.process_time(), _commit()
    runs = DepthRuns(settings, device, args.json.with_suffix(".partial.json") if args.json else None, args.resume)
    drift = depth_drift(runs, settings)
    joint = joint_transfer(runs, settings)
    scaled, unscaled = drift["drift_steps"]["scaled"]["worst over seeds"], drift["drift_steps"]["unscaled"]["worst over seeds"]
    results = {
        "mode": "depth",
        "depths": settings["depths"],
        "log2_lrs": settings["log2_lrs"],
        "seeds": settings["seeds"],
        "depth_drift_steps": scaled,
        "depth_drift_steps_unscaled": unscaled,
        "joint_transfer": joint,
        "checks": {
            "scaled_drift_at_most_one_step": scaled is not None and scaled <= 1,
            "unscaled_optimum_moves": unscaled is not None and unscaled >= 1,
            "carrying_the_shallow_optimum_costs_less_with_scaling": _carry_cost(drift, "scaled") < _carry_cost(drift, "unscaled"),
            "joint_within_1pct": joint["gap"] <= 0.01,
            "joint_compute_at_most_10pct": joint["compute_ratio"] <= 0.10,
        },
        "drift": drift,
        "settings": settings,
        "device": str(device) if device.type == "cpu" else torch.cuda.get_device_name(device),
        "machine": f"{platform.node()}: {os.cpu_count()} CPUs, {platform.processor() or platform.machine()}",
        "commit": commit,
        "torch": torch.__version__,
        "threads": args.threads,
        "runs": len(runs.used),
        "runs_resumed": len(runs.used & runs.resumed),
        "run_seconds": sum(runs.runs[k]["seconds"] for k in runs.used),
        "seconds": time.perf_counter() - started,
        # On one torch thread the process's CPU time is about what the run takes on an idle core,
        # whatever else the machine was doing.
        "cpu_seconds": time.process_time() - cpu_started,
    }
    plot_path = args.plot or (args.json.with_suffix(".png") if args.json else ROOT / "results" / "mup_transfer_depth.png")
    plot_path.parent.mkdir(parents=True, exist_ok=True)
    plot_depth(results, plot_path)
    results["plot"] = str(plot_path)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    print_depth_table(results)
    return results


def print_depth_table(results: dict) -> None:
    drift = results["drift"]
    print(f"\nbest log2(lr) by depth (seed mean; per seed in the JSON), grid {results['log2_lrs'][0]}..{results['log2_lrs'][-1]}")
    print(f"{'depth':>6} {'unscaled':>9} {'scaled':>7} {'flank unscaled':>15} {'flank scaled':>13}")
    for depth in results["depths"]:
        row = [drift["best_log2_lr"][k]["seed mean"][str(depth)] for k in ("unscaled", "scaled")]
        flank = [drift["flank_above_optimum"][k][str(depth)] for k in ("unscaled", "scaled")]
        print(f"{depth:>6} {row[0]!s:>9} {row[1]!s:>7} {_fmt(flank[0]):>15} {_fmt(flank[1]):>13}")
    joint = results["joint_transfer"]
    print(json.dumps({
        "depth_drift_steps": results["depth_drift_steps"], "depth_drift_steps_unscaled": results["depth_drift_steps_unscaled"],
        "drift_steps": drift["drift_steps"], "carry_shallow_optimum": drift["carry_shallow_optimum"],
        "joint_transfer": {k: joint[k] for k in ("gap", "compute_ratio", "transferred_loss", "direct_best_loss", "proxy_best_log2_lr", "direct_best_log2_lr")},
        "target_without_depth_scaling": {k: v for k, v in joint["target_without_depth_scaling"].items() if k != "losses"},
        "checks": results["checks"], "seconds": results["seconds"], "cpu_seconds": results["cpu_seconds"],
    }, indent=2))  # fmt: skip


def _carry_cost(drift: dict, kind: str) -> float:
    """What the deepest model loses at the shallow model's best lr, against its own best."""
    carry = drift["carry_shallow_optimum"][kind]
    return math.inf if carry["loss_at_carried_lr"] is None else carry["loss_at_carried_lr"] - carry["best_loss"]


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:+.3f}"


def _commit() -> str:
    """The checkout's commit, `-dirty` when tracked files differ from it."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("-dirty" if dirty.stdout.strip() else "")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="CPU-sized run: widths 64-256, under 10 minutes")
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    parser.add_argument("--plot", type=Path, default=None, help="the figure (default: next to --json, or results/)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--widths", type=int, nargs="+", help="override the preset's widths")
    parser.add_argument("--log2-lrs", type=int, nargs="+", help="override the preset's log2 learning-rate grid")
    parser.add_argument("--steps", type=int, help="override the preset's training steps per run")
    parser.add_argument("--readout-zero-init", type=int, choices=[0, 1], help="override the preset's readout init")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--depth", action="store_true", help="transfer across depth (and width and depth jointly)")
    parser.add_argument("--depths", type=int, nargs="+", help="--depth: override the preset's depths")
    parser.add_argument("--seeds", type=int, nargs="+", help="--depth: override the preset's seeds")
    parser.add_argument("--base-depth", type=int, help="--depth: override the depth where depth scaling is the identity")
    parser.add_argument("--depth-alpha", type=float, help="--depth: 1 CompleteP (default), 0.5 Depth-muP")
    parser.add_argument("--resume", action="store_true", help="--depth: reuse the runs <json>.partial.json already holds")
    args = parser.parse_args(argv)

    settings = dict(PRESETS["quick" if args.quick else "full"])
    for key in ("widths", "log2_lrs"):
        if getattr(args, key) is not None:
            settings[key] = sorted(getattr(args, key))
    if args.steps is not None:
        settings["steps"] = args.steps
    if args.readout_zero_init is not None:
        settings["readout_zero_init"] = bool(args.readout_zero_init)
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    torch.set_num_threads(args.threads)
    if args.depth:
        return depth_main(args, device)
    widths, log2_lrs, steps = settings["widths"], settings["log2_lrs"], settings["steps"]
    proxy, target = widths[0], widths[-1]

    started = time.perf_counter()
    runs: dict[tuple[str, int, int], dict] = {}
    for width in sorted(widths, reverse=True):  # widest first: the slowest runs, while the machine is fresh
        for parametrization in ("mup", "sp") if width != target else ("mup",):
            workload = MuPWorkload(char_gpt, width, base_width=target) if parametrization == "mup" else char_gpt
            for log2_lr in log2_lrs:
                run = train(workload, run_config(settings, log2_lr, width, parametrization), steps, device)
                runs[(parametrization, width, log2_lr)] = run
                if args.json:  # progress survives a run cut short by a time limit
                    partial = [{"parametrization": p, "width": w, "log2_lr": lr, **r} for (p, w, lr), r in runs.items()]
                    args.json.parent.mkdir(parents=True, exist_ok=True)
                    args.json.with_suffix(".partial.json").write_text(json.dumps(partial, indent=1) + "\n")
                print(
                    f"{parametrization:3s} width {width:5d} log2(lr) {log2_lr:4d}: val_loss {run['val_loss']:.4f} "
                    f"({run['seconds']:.1f}s)",
                    flush=True,
                )

    for log2_lr in log2_lrs:  # the SP target is the muP target (base width = target): same runs
        runs[("sp", target, log2_lr)] = runs[("mup", target, log2_lr)]
    loss = {p: {str(w): [runs[(p, w, lr)]["val_loss"] for lr in log2_lrs] for w in widths} for p in ("mup", "sp")}
    best_log2_lr = {
        p: {str(w): (log2_lrs[i] if (i := best_index(loss[p][str(w)])) is not None else None) for w in widths}
        for p in ("mup", "sp")
    }

    # End to end: the proxy sweep's best config, transferred to the target by hpo.scaling.
    proxy_losses = loss["mup"][str(proxy)]
    proxy_best = log2_lrs[best_index(proxy_losses)]
    proxy_config = run_config(settings, proxy_best, proxy, "mup")
    transfer = transfer_config(proxy_config, ScalingConfig(target_width=target, proxy_width=proxy))
    target_config = transfer.target_config
    reused = target_config == run_config(settings, proxy_best, target, "mup")  # same config and seed: same run
    target_run = runs[("mup", target, proxy_best)] if reused else train(
        MuPWorkload(char_gpt, target, base_width=target), target_config, steps, device
    )
    check = train(char_gpt, run_config(settings, proxy_best, target, "sp"), steps, device)
    sp_equals_mup_at_target = check["val_loss"] == runs[("mup", target, proxy_best)]["val_loss"]
    direct = loss["mup"][str(target)]
    direct_best = min(v for v in direct if math.isfinite(v))
    proxy_flops = sum(runs[("mup", proxy, lr)]["flops"] for lr in log2_lrs)
    direct_flops = sum(runs[("mup", target, lr)]["flops"] for lr in log2_lrs)
    proxy_seconds = sum(runs[("mup", proxy, lr)]["seconds"] for lr in log2_lrs)
    direct_seconds = sum(runs[("mup", target, lr)]["seconds"] for lr in log2_lrs)

    sp_proxy_best = best_log2_lr["sp"][str(proxy)]
    sp_target_at_proxy_best = loss["sp"][str(target)][log2_lrs.index(sp_proxy_best)] if sp_proxy_best is not None else math.nan
    sp_direct_best = min((v for v in loss["sp"][str(target)] if math.isfinite(v)), default=math.nan)

    def shift(p: str) -> int | None:
        found = [v for v in best_log2_lr[p].values() if v is not None]
        return max(found) - min(found) if found else None

    results = {
        "widths": widths,
        "log2_lrs": log2_lrs,
        "best_log2_lr": best_log2_lr,
        "transfer": {
            "direct_best_loss": direct_best,
            "transferred_loss": target_run["val_loss"],
            "compute_ratio": proxy_flops / direct_flops,
            "compute_ratio_with_target_run": (proxy_flops + target_run["flops"]) / direct_flops,
            "wall_clock_ratio": proxy_seconds / direct_seconds,
            "relative_gap": target_run["val_loss"] / direct_best - 1.0,
            "proxy_width": proxy,
            "target_width": target,
            "proxy_best_log2_lr": proxy_best,
            "direct_best_log2_lr": log2_lrs[best_index(direct)],
            "flagged": transfer.flagged,
            "target_run_reused_from_sweep": reused,
            "sp_transferred_loss": sp_target_at_proxy_best,
            "sp_direct_best_loss": sp_direct_best,
        },
        "checks": {
            "mup_optimum_shift_grid_steps": shift("mup"),
            "sp_optimum_shift_grid_steps": shift("sp"),
            "mup_shift_at_most_one_step": shift("mup") is not None and shift("mup") <= 1,
            "sp_shift_larger_or_diverges": (shift("sp") or 0) > (shift("mup") or 0) or not math.isfinite(sp_target_at_proxy_best),
            "transfer_within_1pct": target_run["val_loss"] <= 1.01 * direct_best,
            "compute_ratio_at_most_one_fifth": proxy_flops / direct_flops <= 0.2,
            "sp_target_run_equals_mup_target_run": sp_equals_mup_at_target,
        },
        "loss": loss,
        "run_seconds": {p: {str(w): [round(runs[(p, w, lr)]["seconds"], 2) for lr in log2_lrs] for w in widths} for p in ("mup", "sp")},
        "settings": settings,
        "device": str(device) if device.type == "cpu" else torch.cuda.get_device_name(device),
        "torch": torch.__version__,
        "threads": args.threads,
        "seconds": time.perf_counter() - started,
    }
    plot_path = args.plot or (args.json.with_suffix(".png") if args.json else ROOT / "results" / "mup_transfer.png")
    plot_path.parent.mkdir(parents=True, exist_ok=True)
    plot(results, plot_path)
    results["plot"] = str(plot_path)
    text = json.dumps(results, indent=2)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n")
    print(json.dumps({k: results[k] for k in ("best_log2_lr", "transfer", "checks", "seconds")}, indent=2))
    return results


if __name__ == "__main__":
    main()
