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

Needs torch, mup, matplotlib; not Ray (nor pydantic): it trains in-process with the optimizer
and muP factors the sweep uses (`hpo.base.hparams.build_torch_optimizer` + `lr_multipliers`).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
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
from hpo.base.hparams import OptimHParams, build_torch_optimizer  # noqa: E402
from hpo.scaling import MuPWorkload, transfer_config  # noqa: E402

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


class _Scaling:
    """The two numbers `transfer_config` reads (hpo.ScalingConfig needs pydantic; not here)."""

    def __init__(self, proxy: int, target: int):
        self.proxy, self.target_width, self.base = proxy, target, target


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
    optimizer = build_torch_optimizer(model.named_parameters(), hparams, workload.lr_multipliers(model, hparams.optimizer))
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
    transfer = transfer_config(proxy_config, _Scaling(proxy, target))
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
