"""What a sweep costs beyond its training: the same grid four ways, side by side in one run.

Rows (same configurations: N learning rates of the built-in `mlp_digits`, width 64, depth 2, adam,
seed 0, K iterations each, no early stopping):

1. `in_process`: one process, no Ray, configurations one after another (an Optuna-in-process user),
   run before Ray starts; its seconds include its one-time costs (the dataset, torch's lazy imports);
2. `plain_tune`: plain Ray Tune written carefully (function trainable, `reuse_actors=True`, no
   checkpoints);
3. `hpo_run`: `hpo.run` unfused (checkpoints per the default policy);
4. `hpo_run_fused`: `hpo.run` with `FusionConfig(max_members=N)` (Tune runs the fused groups, as
   many at once as there are CPUs, each as one trial);
5. `hpo_run_checkpoint_at_end` (with `--rows`): `hpo.run` unfused checkpointing only the last
   iteration; its difference with `hpo_run` is what persisting checkpoints costs.

Each Ray row runs on a fresh local Ray started as `hpo run` starts it (`hpo.base.ray_runtime.ensure_ray`:
loopback only), so every row starts from
the same state and no row inherits another's warm or spent worker processes. Before the first
row, one throwaway Tune run (`warm_driver`, untimed) imports what only a process's first Tune run
imports in the driver, so that the first Ray row (`plain_tune`) does not carry it alone. Ray's start
(`ray_init_s`, per row) and `RAY_SETTLE_S` after it, while its own processes and those imports
finish, are excluded from every sweep's seconds. For each Ray row the
profile splits wall time by what the driver sees (start-up until the first result, the stream of
results, tear-down after the last) and by what the trials report they spent (training, checkpoint
persistence); `peak_worker_rss_gb` sums the RSS of every Ray worker process, sampled while the
sweep runs, and `peak_worker_pss_gb` the same as proportional set size (shared pages counted once).

    python benchmarks/sweep_overhead.py [--quick] [--configs N] [--iterations K] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import hpo.base.ray_runtime  # noqa: E402  before anything imports ray: the embedded Ray then listens on loopback only


#: Seconds given to each fresh Ray (its dashboard and agents, its workers' imports) before a row is timed.
RAY_SETTLE_S = 5.0


def grid(count: int) -> list[float]:
    return [round(3e-4 * (1000 ** (i / max(count - 1, 1))), 6) for i in range(count)]


def base_config() -> dict[str, Any]:
    return {"width": 64, "depth": 2, "optimizer": "adam", "seed": 0}


class WorkerMemory:
    """Peak summed RSS and PSS of this driver's Ray worker processes (`ray::...` titles among its
    descendants: other Ray clusters on a shared box are not counted), sampled in a thread."""

    def __init__(self, interval_s: float = 0.25):
        self.interval_s = interval_s
        self.peak_rss = 0
        self.peak_pss = 0
        self.peak_processes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> "WorkerMemory":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        while not self._stop.is_set():
            rss = pss = count = 0
            for proc in psutil.Process().children(recursive=True):
                try:
                    cmdline = proc.cmdline()
                    if not cmdline or not cmdline[0].startswith("ray::"):
                        continue
                    info = proc.memory_full_info()
                    rss += info.rss
                    pss += getattr(info, "pss", info.rss)
                    count += 1
                except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                    continue
            self.peak_rss = max(self.peak_rss, rss)
            self.peak_pss = max(self.peak_pss, pss)
            self.peak_processes = max(self.peak_processes, count)
            self._stop.wait(self.interval_s)


def in_process(lrs: list[float], iterations: int) -> dict[str, Any]:
    import torch

    from hpo.config.trainable_lookup import resolve_trainable
    from hpo.base.training import TrialTrainer

    workload = resolve_trainable("mlp_digits").obj
    torch.set_num_threads(1)
    start = time.perf_counter()
    best: tuple[float, float] | None = None
    for lr in lrs:
        trainer = TrialTrainer(workload, {**base_config(), "lr": lr})
        for _ in range(iterations):
            metrics = trainer.train_iteration()
        if best is None or metrics["val_loss"] < best[0]:
            best = (metrics["val_loss"], lr)
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "best_lr": best[1], "best_val_loss": best[0], "trials": len(lrs)}


class Timeline:
    """Driver-side timestamps of a Tune run, as a Tune callback sees them."""

    def __init__(self) -> None:
        from ray import tune

        timeline = self

        class _Callback(tune.Callback):
            def on_trial_result(self, iteration, trials, trial, result, **info):
                now = time.perf_counter()
                timeline.first_result = timeline.first_result or now
                timeline.last_result = now
                timeline.results += 1

        self.callback = _Callback()
        self.first_result: float | None = None
        self.last_result: float | None = None
        self.results = 0

    def profile(self, start: float, end: float) -> dict[str, float]:
        first = self.first_result or end
        last = self.last_result or end
        return {
            "startup_s": round(first - start, 2),
            "results_stream_s": round(last - first, 2),
            "teardown_s": round(end - last, 2),
            "results": self.results,
        }


def plain_tune(lrs: list[float], iterations: int, storage: str) -> dict[str, Any]:
    """Careful plain Ray Tune: the same training, a function trainable, reused actors, no checkpoints."""
    from ray import tune

    def train(config: dict[str, Any]) -> None:
        import torch

        from hpo.config.trainable_lookup import resolve_trainable
        from hpo.base.training import TrialTrainer

        torch.set_num_threads(1)
        trainer = TrialTrainer(resolve_trainable("mlp_digits").obj, config)
        for _ in range(iterations):
            tune.report(trainer.train_iteration())

    timeline = Timeline()
    start = time.perf_counter()
    grid_result = tune.Tuner(
        tune.with_resources(train, {"cpu": 1}),
        param_space={**base_config(), "lr": tune.grid_search(lrs)},
        tune_config=tune.TuneConfig(metric="val_loss", mode="min", reuse_actors=True),
        run_config=tune.RunConfig(name="plain_tune", storage_path=storage, verbose=0, callbacks=[timeline.callback]),
    ).fit()
    end = time.perf_counter()
    best = grid_result.get_best_result("val_loss", "min")
    return {
        "seconds": end - start,
        "best_lr": best.config["lr"],
        "best_val_loss": float(best.metrics["val_loss"]),
        "trials": len(grid_result),
        "profile": timeline.profile(start, end),
    }


def warm_driver(storage: str) -> float:
    """One throwaway one-trial Tune run, untimed, so that no row pays for what only the first Tune
    run in a process imports in the driver (Tune's controller and loggers, and the MLflow and W&B
    modules that Ray's usage tagging imports whenever a run has callbacks: about a second here).
    Without it `plain_tune`, the first Ray row, carried those imports for every row after it."""
    from ray import tune

    def probe(config: dict[str, Any]) -> None:
        tune.report({"value": 0.0})

    start = time.perf_counter()
    tune.Tuner(probe, run_config=tune.RunConfig(name="warm_driver", storage_path=storage, verbose=0,
                                                callbacks=[Timeline().callback])).fit()
    return time.perf_counter() - start


def hpo_sweep(
    lrs: list[float], iterations: int, storage: str, name: str, fusion: Any, checkpoint: dict[str, Any] | None = None
) -> dict[str, Any]:
    import hpo
    from ray import tune

    timeline = Timeline()
    start = time.perf_counter()
    result = hpo.run(
        "mlp_digits",
        config={**base_config(), "lr": tune.grid_search(lrs)},
        metric="val_loss",
        mode="min",
        stop={"training_iteration": iterations},
        storage_path=storage,
        name=name,
        fusion=fusion,
        checkpoint=checkpoint,
        callbacks=[timeline.callback],
    )
    end = time.perf_counter()
    frame = result.get_dataframe()
    profile = timeline.profile(start, end)
    return {
        "seconds": end - start,
        "best_lr": result.best_config["lr"],
        "best_val_loss": float(result.best_result.metrics["val_loss"]),
        "trials": len(frame),
        "profile": profile,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="8 configurations, 4 iterations")
    parser.add_argument("--configs", type=int, default=16)
    parser.add_argument("--iterations", type=int, default=8)
    parser.add_argument("--rows", default="in_process,plain_tune,hpo_run,hpo_run_fused")
    parser.add_argument("--json", default=None, help="default benchmarks/results/sweep_overhead_<N>x<K>.json")
    args = parser.parse_args()
    count, iterations = (8, 4) if args.quick else (args.configs, args.iterations)
    rows_wanted = args.rows.split(",")
    lrs = grid(count)

    import ray

    from hpo.base.ray_runtime import ensure_ray

    rows: dict[str, dict[str, Any]] = {}
    if "in_process" in rows_wanted:
        # Before Ray starts: it needs no Ray, and Ray's own processes still start up for seconds
        # after `ray.init` returns, which would bill this row for them.
        rows["in_process"] = in_process(lrs, iterations)
    ray_init_s: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as storage:
        runs = {
            "plain_tune": lambda: plain_tune(lrs, iterations, storage),
            "hpo_run": lambda: hpo_sweep(lrs, iterations, storage, "hpo_run", None),
            "hpo_run_fused": lambda: hpo_sweep(lrs, iterations, storage, "hpo_run_fused", hpo.FusionConfig(max_members=count)),
            # checkpoint persistence's share, by difference with hpo_run's default policy
            "hpo_run_checkpoint_at_end": lambda: hpo_sweep(
                lrs, iterations, storage, "hpo_run_checkpoint_at_end", None, {"every": iterations, "at_end": True}
            ),
        }
        ensure_ray()
        warm_driver_s = round(warm_driver(storage), 2)
        ray.shutdown()
        for label, sweep in runs.items():
            if label not in rows_wanted:
                continue
            start = time.perf_counter()
            ensure_ray()
            ray_init_s[label] = round(time.perf_counter() - start, 2)
            time.sleep(RAY_SETTLE_S)
            with WorkerMemory() as memory:
                rows[label] = sweep()
            rows[label]["peak_worker_rss_gb"] = round(memory.peak_rss / 1024**3, 2)
            rows[label]["peak_worker_pss_gb"] = round(memory.peak_pss / 1024**3, 2)
            rows[label]["peak_worker_processes"] = memory.peak_processes
            ray.shutdown()

    best_lrs = {row["best_lr"] for row in rows.values()}
    reference = rows.get("plain_tune", {}).get("seconds")
    print(f"{count} configs x {iterations} iterations; ray_init_s per row {ray_init_s} (excluded)")
    print(f"{'row':<15} {'seconds':>8} {'/plain':>7} {'best lr':>9} {'workers RSS GB':>15} {'PSS GB':>7} {'procs':>6}  profile")
    for label, row in rows.items():
        row["seconds"] = round(row["seconds"], 2)
        ratio = f"{row['seconds'] / reference:.2f}" if reference else "-"
        print(f"{label:<15} {row['seconds']:>8} {ratio:>7} {row['best_lr']:>9} {row.get('peak_worker_rss_gb', '-'):>15} "
              f"{row.get('peak_worker_pss_gb', '-'):>7} {row.get('peak_worker_processes', '-'):>6}  {row.get('profile', '')}")
    report = {
        "machine": f"{platform.node()}: {os.cpu_count()} CPUs, {psutil.virtual_memory().total / 1024**3:.0f} GB, "
                   f"load average {os.getloadavg()[0]:.1f} at the end (the box is shared)",
        "configs": count,
        "iterations": iterations,
        "ray_init_s": ray_init_s,
        "ray_settle_s": RAY_SETTLE_S,
        "warm_driver_s": warm_driver_s,
        "same_best_config": len(best_lrs) == 1,
        "rows": rows,
        "ratios": {
            label: round(row["seconds"] / reference, 2) for label, row in rows.items() if reference
        },
    }
    if "in_process" in rows and "hpo_run_fused" in rows:
        report["fused_vs_in_process"] = round(rows["hpo_run_fused"]["seconds"] / rows["in_process"]["seconds"], 2)
    path = Path(args.json or f"benchmarks/results/sweep_overhead_{count}x{iterations}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"same best config in every row: {report['same_best_config']}; wrote {path}")


if __name__ == "__main__":
    main()
