"""Benchmark: bubbles of a real DeepSpeed pipeline job, and how much of them a guest harvests.

For each (stages p, micro-batches m) a real p-process DeepSpeed pipeline job (gloo) trains the
reference MLP twice in the same processes, batch by batch in turn: without a guest and with a
guest in its bubbles (see `benchmarks/bubble_ab.py`). Reported per point:

- theory_fraction (p-1)/(m+p-1) and measured_fraction (mean over stages of wait time / batch time),
  next to theory_fraction_measured_stages: the same theory for the stages' measured compute times
  (stages are rarely equal: the first computes no input gradients, the last has head and loss);
- slowdown: median over batch pairs of (batch time with harvesting / without) - 1;
- harvested_fraction: guest step time / bubble time of the run without a guest, next to
  harvestable_fraction, the share of that bubble in waits the executor may fill at all;
- guest_samples_per_s; main_job_bit_identical (losses, parameters and global RNG equal).

    python benchmarks/bubble_harvest.py --quick --json runs/bubble_harvest.json   # CPU, < 5 min
    python benchmarks/bubble_harvest.py --device cuda --json bubble_gpu.json      # one GPU, p=2

On CUDA every stage shares GPU 0 (NCCL refuses two ranks on one device; gloo stages the CUDA
tensors through host memory). Needs torch and deepspeed, no Ray. The guest is a
`fusion.FusedTrainer` group of four digits-MLP configs when fusion/ and scikit-learn import,
else a synthetic MLP (`--guest` picks; the JSON says which ran).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from dataclasses import replace
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable from a plain checkout

import torch  # noqa: E402

from benchmarks.bubble_ab import ABSpec, digits_guest, fused_digits_guest, run_rank, summarize_ab, synthetic_guest  # noqa: E402
from pipeline_bubble.launch import launch  # noqa: E402
from pipeline_bubble.plots import plot_gantt  # noqa: E402
from pipeline_bubble.timeline import StageTimeline, save_timelines  # noqa: E402

CPU_POINTS = {"quick": [(2, 4), (2, 8), (4, 4), (4, 8)], "full": [(2, 2), (2, 4), (2, 8), (2, 16), (4, 4), (4, 8), (4, 16)]}
GPU_POINTS = {"quick": [(2, 4), (2, 8)], "full": [(2, 2), (2, 4), (2, 8), (2, 16)]}


def _guest_factory(name: str, gpu: bool):
    if name == "synthetic":
        # On a GPU a 64-wide MLP is all launch overhead; give the guest real work per step.
        return partial(synthetic_guest, width=1024, batch=1024) if gpu else synthetic_guest
    if name == "digits":
        return digits_guest
    if name == "fused":
        return fused_digits_guest
    raise ValueError(f"--guest must be one of synthetic, digits, fused; got {name!r}")


def _default_guest() -> str:
    try:
        import hpo.examples.mlp_digits  # noqa: F401
        import fusion  # noqa: F401
        import sklearn  # noqa: F401  (the digits data set)

        return "fused"
    except Exception:
        return "synthetic"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer points and batches (CPU: under 5 minutes)")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--out", type=Path, default=Path("runs/bubble_harvest"), help="timelines and Gantt charts")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cpu", "cuda"])
    parser.add_argument("--guest", default=None, help="synthetic | digits | fused (default: fused if available)")
    parser.add_argument("--batches", type=int, help="batches per engine (first one is warm-up)")
    parser.add_argument("--width", type=int, help="hidden width of the main job's MLP")
    parser.add_argument("--micro-batch-size", type=int)
    parser.add_argument("--layers-per-stage", type=int)
    parser.add_argument("--points", help="comma-separated p:m list, e.g. 2:4,4:8")
    parser.add_argument("--safety", type=float, default=ABSpec.safety, help="share of a predicted (open-loop) window used")
    parser.add_argument(
        "--window-quantile", type=float, default=ABSpec.window_quantile, help="quantile of recent signalled windows planned"
    )
    args = parser.parse_args(argv)

    gpu = args.device == "cuda"
    size = "quick" if args.quick else "full"
    if args.points:
        points = [tuple(int(v) for v in p.split(":")) for p in args.points.split(",")]
    else:
        points = (GPU_POINTS if gpu else CPU_POINTS)[size]
    guest = args.guest or _default_guest()
    base = ABSpec(
        device="cuda" if gpu else "cpu",
        width=args.width or (8192 if gpu else 1024),
        micro_batch_size=args.micro_batch_size or (256 if gpu else 128),
        layers_per_stage=args.layers_per_stage or (6 if gpu else 2),
        batches=args.batches or (14 if args.quick else 30),
        guest_factory=_guest_factory(guest, gpu),
        safety=args.safety,
        window_quantile=args.window_quantile,
    )
    if gpu:  # deterministic cuBLAS across the guest's stream and the job's (inherited by the ranks)
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    args.out.mkdir(parents=True, exist_ok=True)
    try:
        import matplotlib  # noqa: F401

        plots = True
    except ImportError:
        plots = False
    if not plots:
        print("matplotlib is not installed: timelines are written, Gantt charts are not", flush=True)
    runs = []
    for stages, micro_batches in points:
        spec = replace(base, stages=stages, micro_batches=micro_batches)
        started, load = time.perf_counter(), os.getloadavg()[0]
        results = launch(run_rank, stages, spec, timeout_s=900, log_dir=args.out / f"logs_p{stages}_m{micro_batches}", same_device=gpu)
        row = {**summarize_ab(results), "guest": guest, "wall_s": time.perf_counter() - started}
        row["host_load_1m"] = [load, os.getloadavg()[0]]  # before / after: other work on the host skews CPU runs
        runs.append(row)
        for run in ("baseline", "harvested"):
            timelines = [StageTimeline.from_dict(r["timelines"][run]) for r in results]
            save_timelines(timelines, args.out / f"timeline_p{stages}_m{micro_batches}_{run}.json")
            if plots:
                plot_gantt(timelines, args.out / f"gantt_p{stages}_m{micro_batches}_{run}.png", title=run)
        print(
            f"p={stages} m={micro_batches:>2} {row['device']}: bubble theory {row['theory_fraction']:.3f} "
            f"({row['theory_fraction_measured_stages']:.3f} for the stage times) "
            f"measured {row['measured_fraction']:.3f} | harvested {row['harvested_fraction']:.1%} of it "
            f"({row['harvestable_fraction']:.0%} harvestable), "
            f"slowdown {row['slowdown']:+.1%}, {row['guest_samples_per_s']:.0f} guest samples/s | "
            f"bit-identical {row['main_job_bit_identical']} ({row['wall_s']:.0f} s, load {load:.1f})",
            flush=True,
        )
    import deepspeed

    report = {
        "runs": runs,
        "environment": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "deepspeed": deepspeed.__version__,
            "gpu": torch.cuda.get_device_name(0) if gpu else None,
            "main_job": {k: getattr(base, k) for k in ("width", "micro_batch_size", "layers_per_stage", "batches")},
            "executor": {"safety": base.safety, "window_quantile": base.window_quantile},
        },
    }
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1))
    return 0 if all(r["main_job_bit_identical"] for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
