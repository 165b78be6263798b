"""End to end: the same sweep with and without fusion, on one local Ray, side by side.

Same configurations (a grid, so both runs train exactly the same set), same budget (iterations
per trial, no early stopping), same per-trial resources; prints wall-clock seconds of each sweep,
their ratio, and whether both found the same best configuration, and writes JSON.

    python benchmarks/fused_sweep.py [--quick] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time

os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")


def run_sweep(name: str, storage: str, lrs: list[float], iterations: int, fusion):
    import hpo
    from ray import tune

    start = time.perf_counter()
    result = hpo.run(
        "mlp_digits",
        config={"lr": tune.grid_search(lrs), "width": 64, "depth": 2, "optimizer": "adam", "seed": 0},
        metric="val_loss",
        mode="min",
        stop={"training_iteration": iterations},
        storage_path=storage,
        name=name,
        fusion=fusion,
    )
    seconds = time.perf_counter() - start
    frame = result.get_dataframe()
    return {
        "seconds": seconds,
        "trials": len(frame),
        "best_lr": result.best_config["lr"],
        "best_val_loss": float(result.best_result.metrics["val_loss"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="8 configurations, 4 iterations")
    parser.add_argument("--json", default="benchmarks/fused_sweep.json")
    args = parser.parse_args()

    import ray

    import hpo

    count, iterations = (8, 4) if args.quick else (16, 8)
    lrs = [round(3e-4 * (1000 ** (i / (count - 1))), 6) for i in range(count)]
    ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False, object_store_memory=256 * 1024**2, log_to_driver=False)
    with tempfile.TemporaryDirectory() as storage:
        plain = run_sweep("plain", storage, lrs, iterations, None)
        fused = run_sweep("fused", storage, lrs, iterations, hpo.FusionConfig(max_members=count))
    row = {
        "machine": f"{platform.node()} ({os.cpu_count()} CPUs)",
        "configs": count,
        "iterations": iterations,
        "plain_s": round(plain["seconds"], 2),
        "fused_s": round(fused["seconds"], 2),
        "speedup": round(plain["seconds"] / fused["seconds"], 2),
        "same_best_config": plain["best_lr"] == fused["best_lr"],
        "plain_best": plain,
        "fused_best": fused,
    }
    print(f"{'configs':>8} {'iters':>6} {'plain s':>9} {'fused s':>9} {'speedup':>8} {'same best':>10}")
    print(f"{count:>8} {iterations:>6} {row['plain_s']:>9} {row['fused_s']:>9} {row['speedup']:>8} {str(row['same_best_config']):>10}")
    with open(args.json, "w") as handle:
        json.dump({"rows": [row]}, handle, indent=2)
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
