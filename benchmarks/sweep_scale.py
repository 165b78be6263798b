"""What a large sweep costs the driver: plain Ray Tune and `hpo.run` side by side, and fused
against unfused, as the sweep grows.

Rows, each in a fresh driver process on a fresh local Ray started as `hpo run` starts it (loopback
only), one after another, so no row inherits another's memory, imports or worker processes:

- `tune_<N>` and `hpo_<N>` for each N of `--trials`: N trials of a trivial function (three reports
  of a score, no training), random search with the same seed, `reuse_actors=True`, once with plain
  `tune.Tuner` and once with `hpo.run`;
- `unfused_<C>` and `fused_<C>` for each C of `--configs`: C configurations of the built-in
  `mlp_digits` (width 16, one layer, `--iterations` iterations each), `hpo.run` unfused and fused
  (`FusionConfig(max_members=--members)`).

For each row: trials/s per decile of the sweep's trials (a decile's trials over the time between
its first and its last end; the first decile counts from `fit`), driver CPU per trial (user + system,
every thread of the driver), the driver's bytes written (`write_bytes`: what reached the block
layer, and `wchar`: what went through write calls), the driver's peak RSS and its growth per trial
(end of the sweep minus start, over the trials; and from the end of the first decile of trials to
the last trial's end, which leaves out what is loaded once and the results built at the end),
`results.csv` rows and the best configuration (the same seed gives Tune and hpo the same
configurations). Before a row is timed, its driver runs
one untimed one-trial Tune run (what a process's first Tune run imports) and waits `RAY_SETTLE_S`.
The storage folder is on disk (`--storage`, default a temporary folder under the checkout), not
tmpfs, so bytes written are real.

    python benchmarks/sweep_scale.py [--quick] [--trials 1000,10000] [--configs 256,1024]
        [--iterations 2] [--members 64] [--rows tune,hpo,unfused,fused] [--rounds 1] [--json PATH]

`--rounds R` runs each `tune_<N>`/`hpo_<N>` pair R times, alternating which of the two goes first
(rows `tune_<N>`, `hpo_<N>`, then `..._round2`, ...), and takes the throughput ratio as the median
of the R pairs' ratios: on this 2-core box one pair's ratio at N=1000 has ranged from 0.83 to 1.27
for the same code, and a pair run back to back shares most of what the load does to it.

`--quick` is `--trials 200 --configs 64`. The JSON (default `benchmarks/results/sweep_scale.json`)
holds every row, the ratios the issue asks for, the git commit, the machine and the load average
before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

#: Seconds a fresh local Ray gets (its agents, its first workers) before a row is timed.
RAY_SETTLE_S = 5.0
SEED = 2024
REPORTS = 3


def trivial(config: dict[str, Any]) -> None:
    """Three reports of a score that depends on the configuration only: the sweep is all overhead."""
    from ray import tune

    for step in range(1, REPORTS + 1):
        tune.report({"score": (config["x"] - 0.5) ** 2 + config["y"] / step})


def trivial_space() -> dict[str, Any]:
    from ray import tune

    return {"x": tune.uniform(0.0, 1.0), "y": tune.loguniform(1e-3, 1.0)}


class DriverProbe:
    """What the driver spends while a sweep runs: CPU, bytes written, RSS (sampled for the peak),
    and the time each trial (or fused member) ends, as a Tune callback sees it."""

    def __init__(self) -> None:
        import psutil
        from ray import tune

        self.process = psutil.Process()
        self.peak_rss = 0
        self._stop = threading.Event()

        class _Ends(tune.Callback):
            """The time each trial ends (Tune pickles its callbacks: this one holds only a list)."""

            def __init__(self) -> None:
                self.ends: list[float] = []
                self.rss_at_ends: list[int] = []

            def on_trial_complete(self, iteration, trials, trial, **info):
                self.ends.append(time.perf_counter())
                self.rss_at_ends.append(psutil.Process().memory_info().rss)

            def on_trial_error(self, iteration, trials, trial, **info):
                self.on_trial_complete(iteration, trials, trial)

        self.callback = _Ends()

    def _sample(self) -> None:
        while not self._stop.wait(0.2):
            self.peak_rss = max(self.peak_rss, self.process.memory_info().rss)

    def __enter__(self) -> "DriverProbe":
        io = self.process.io_counters()
        cpu = self.process.cpu_times()
        self.io0, self.cpu0 = io, cpu.user + cpu.system
        self.rss0 = self.peak_rss = self.process.memory_info().rss
        self.start = time.perf_counter()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.end = time.perf_counter()
        self._stop.set()
        self._thread.join()
        io = self.process.io_counters()
        cpu = self.process.cpu_times()
        self.rss1 = self.process.memory_info().rss
        self.peak_rss = max(self.peak_rss, self.rss1)
        self.write_bytes = io.write_bytes - self.io0.write_bytes
        self.wchar = getattr(io, "write_chars", 0) - getattr(self.io0, "write_chars", 0)
        self.cpu_s = cpu.user + cpu.system - self.cpu0

    def report(self, trials: int, ends: list[float] | None = None) -> dict[str, Any]:
        ends = sorted(ends if ends is not None else self.callback.ends)
        deciles = []
        if len(ends) >= 10:
            bounds = [self.start] + [ends[round(len(ends) * k / 10) - 1] for k in range(1, 11)]
            per = len(ends) / 10
            deciles = [round(per / max(bounds[k + 1] - bounds[k], 1e-9), 2) for k in range(10)]
        seconds = self.end - self.start
        rss = self.callback.rss_at_ends  # in the order trials ended; empty for a fused sweep's members
        at = [round(len(rss) * k / 10) - 1 for k in range(1, 11)] if len(rss) >= 10 else []
        rss_deciles = [rss[index] for index in at]
        return {
            "seconds": round(seconds, 2),
            "trials": trials,
            "trials_per_s": round(trials / seconds, 2),
            "trials_per_s_by_decile": deciles,
            # from the last trial's end to `fit` returning: the final save, results files and plot
            "after_last_trial_s": round(self.end - ends[-1], 2) if ends else None,
            "driver_cpu_ms_per_trial": round(1000 * self.cpu_s / trials, 1),
            "driver_write_bytes": self.write_bytes,
            "driver_wchar": self.wchar,
            "driver_peak_rss_mb": round(self.peak_rss / 1024**2, 1),
            "driver_rss_growth_kb_per_trial": round((self.rss1 - self.rss0) / 1024 / trials, 1),
            "driver_rss_growth_until_last_end_kb_per_trial": round((rss[-1] - self.rss0) / 1024 / trials, 1) if rss else None,
            # the sweep's own growth: from the end of its first decile to its last trial's end, so
            # neither what the first trials load once nor the results built after the last count
            "driver_rss_growth_deciles_2_to_10_kb_per_trial":
                round((rss_deciles[-1] - rss_deciles[0]) / 1024 / (at[-1] - at[0]), 1) if at else None,
            "driver_rss_mb_by_decile": [round(value / 1024**2, 1) for value in rss_deciles],
        }


def warm_driver(storage: str) -> None:
    """One untimed one-trial Tune run: what only a process's first Tune run imports (Tune's
    controller and loggers, MLflow and W&B through Ray's usage tags) is not billed to the row."""
    from ray import tune

    def probe(config: dict[str, Any]) -> None:
        tune.report({"value": 0.0})

    tune.Tuner(probe, run_config=tune.RunConfig(name="warm_driver", storage_path=storage, verbose=0,
                                                callbacks=[tune.Callback()])).fit()


def run_row(kind: str, size: int, args: argparse.Namespace, storage: str) -> dict[str, Any]:
    """One row, in this (fresh) process."""
    import pandas as pd

    import hpo
    from hpo.base.ray_runtime import ensure_ray

    ensure_ray()
    time.sleep(RAY_SETTLE_S)
    warm_driver(storage)
    from ray import tune
    from ray.tune.search import BasicVariantGenerator

    probe = DriverProbe()
    name = f"{kind}_{size}"
    if kind in ("tune", "hpo"):
        common = dict(metric="score", mode="min", num_samples=size)
        with probe:
            if kind == "tune":
                grid = tune.Tuner(
                    tune.with_resources(trivial, {"cpu": 1}),
                    param_space=trivial_space(),
                    tune_config=tune.TuneConfig(**common, search_alg=BasicVariantGenerator(random_state=SEED),
                                                reuse_actors=True),
                    run_config=tune.RunConfig(name=name, storage_path=storage, verbose=0, callbacks=[probe.callback]),
                ).fit()
                best = grid.get_best_result("score", "min")
                results_file, best_config = None, best.config
            else:
                result = hpo.run(trivial, config=trivial_space(), **common,
                                 search_alg=BasicVariantGenerator(random_state=SEED),
                                 storage_path=storage, name=name, callbacks=[probe.callback])
                results_file, best_config = result.paths["results"], result.best_config
        # per trial that ended: a row stopped early (Ctrl-C) reports what it measured, not a share of the plan
        row = probe.report(max(len(probe.callback.ends), 1))
        row["trials_planned"] = size
        # read after the probe: the benchmark's own reading is not the driver's growth
        row["results_csv_rows"] = len(pd.read_csv(results_file)) if results_file else None
        row["best_config"] = {key: round(value, 12) for key, value in best_config.items()}
        return row

    fused = kind == "fused"
    lrs = [round(1e-4 * (1e3 ** (i / max(size - 1, 1))), 8) for i in range(size)]
    with probe:
        result = hpo.run(
            "mlp_digits",
            config={"width": 16, "depth": 1, "optimizer": "adam", "seed": 0, "lr": tune.grid_search(lrs)},
            metric="val_loss", mode="min", stop={"training_iteration": args.iterations},
            storage_path=storage, name=name, callbacks=[probe.callback],
            fusion=hpo.FusionConfig(max_members=args.members) if fused else None,
        )
    # A fused sweep's Tune trials are its groups: too few for deciles, so its rate is the whole sweep's.
    row = probe.report(size, ends=[] if fused else None)
    row["tune_trials"] = len(result.result_grid)
    row["results_csv_rows"] = len(pd.read_csv(result.paths["results"]))
    row["best_config"] = {"lr": result.best_config["lr"]}
    return row


#: What a row's label adds after its first round: `hpo_1000` then `hpo_1000_round2`, ...
ROUND = "_round"


def round_suffix(number: int) -> str:
    return f"{ROUND}{number}" if number > 1 else ""


def child(args: argparse.Namespace) -> None:
    kind, size = args.row.rsplit("_", 1)
    row = run_row(kind, int(size), args, args.storage)
    Path(args.row_json).write_text(json.dumps(row))


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="--trials 200 --configs 64")
    parser.add_argument("--trials", default="1000,10000", help="trial counts of the tune/hpo rows")
    parser.add_argument("--configs", default="256,1024", help="configuration counts of the fused/unfused rows")
    parser.add_argument("--iterations", type=int, default=2, help="iterations per configuration (fused rows)")
    parser.add_argument("--members", type=int, default=64, help="max_members of the fused rows")
    parser.add_argument("--rows", default="tune,hpo,unfused,fused")
    parser.add_argument("--rounds", type=int, default=1, help="runs of each tune/hpo pair (the ratio is their median)")
    parser.add_argument("--storage", default=None, help="where runs are stored (default: a temporary folder on disk)")
    parser.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "sweep_scale.json"))
    parser.add_argument("--row", help=argparse.SUPPRESS)
    parser.add_argument("--row-json", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.row:
        return child(args)
    if args.quick:
        args.trials, args.configs = "200", "64"
    kinds = args.rows.split(",")
    plan = [f"{kind}_{n}{round_suffix(r)}" for n in args.trials.split(",") if n for r in range(1, args.rounds + 1)
            for kind in (("tune", "hpo") if r % 2 else ("hpo", "tune")) if kind in kinds]
    plan += [f"{kind}_{n}" for n in args.configs.split(",") if n for kind in ("unfused", "fused") if kind in kinds]
    load_before = os.getloadavg()
    rows: dict[str, Any] = {}
    scratch = Path(args.storage) if args.storage else Path(tempfile.mkdtemp(prefix=".sweep_scale_", dir=ROOT))
    try:
        for label in plan:
            storage = scratch / label
            storage.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(suffix=".json") as out:
                command = [sys.executable, __file__, "--row", label.split(ROUND)[0], "--row-json", out.name, "--storage", str(storage),
                           "--iterations", str(args.iterations), "--members", str(args.members)]
                started = time.perf_counter()
                done = subprocess.run(command, cwd=ROOT)
                if done.returncode != 0:
                    rows[label] = {"error": f"exit status {done.returncode}"}
                    continue
                rows[label] = json.loads(Path(out.name).read_text())
                rows[label]["process_s"] = round(time.perf_counter() - started, 1)
            print(label, json.dumps(rows[label]), flush=True)
            shutil.rmtree(storage, ignore_errors=True)
    finally:
        if not args.storage:
            shutil.rmtree(scratch, ignore_errors=True)
    ratios: dict[str, Any] = {}
    for n in args.trials.split(","):
        pairs = [(rows.get(f"tune_{n}{round_suffix(r)}", {}), rows.get(f"hpo_{n}{round_suffix(r)}", {}))
                 for r in range(1, args.rounds + 1)]
        by_round = [round(hpo_row["trials_per_s"] / tune_row["trials_per_s"], 2) for tune_row, hpo_row in pairs
                    if "trials_per_s" in tune_row and "trials_per_s" in hpo_row]
        if args.rounds > 1 and by_round:
            ratios[f"hpo_vs_tune_trials_per_s_{n}_by_round"] = by_round
        tune_row, hpo_row = pairs[0]  # the other ratios are the first pair's
        if "trials_per_s" in tune_row and "trials_per_s" in hpo_row:
            deciles = hpo_row["trials_per_s_by_decile"]
            ratios[f"hpo_vs_tune_trials_per_s_{n}"] = statistics.median(by_round)
            ratios[f"hpo_write_bytes_vs_tune_{n}"] = round(hpo_row["driver_write_bytes"] / max(tune_row["driver_write_bytes"], 1), 2)
            if deciles:
                ratios[f"hpo_last_decile_vs_best_early_{n}"] = round(deciles[-1] / max(deciles[:5]), 2)
            ratios[f"same_best_config_{n}"] = tune_row["best_config"] == hpo_row["best_config"]
    for n in args.configs.split(","):
        unfused, fused = rows.get(f"unfused_{n}", {}), rows.get(f"fused_{n}", {})
        if "seconds" in unfused and "seconds" in fused:
            ratios[f"fused_speedup_{n}"] = round(unfused["seconds"] / fused["seconds"], 2)
    print(f"{'row':<18} {'s':>8} {'trials/s':>9} {'cpu ms/trial':>13} {'MB written':>11} {'peak RSS MB':>12} "
          f"{'KB/trial':>9} {'csv rows':>9}  trials/s by decile")
    for label, row in rows.items():
        if "error" in row:
            print(f"{label:<18} {row['error']}")
            continue
        print(f"{label:<18} {row['seconds']:>8} {row['trials_per_s']:>9} {row['driver_cpu_ms_per_trial']:>13} "
              f"{row['driver_write_bytes'] / 1e6:>11.1f} {row['driver_peak_rss_mb']:>12} "
              f"{row['driver_rss_growth_kb_per_trial']:>9} {row['results_csv_rows']!s:>9}  {row['trials_per_s_by_decile']}")
    print(json.dumps(ratios, indent=2))
    import psutil

    report = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "git_commit": git_commit(),
        "machine": f"{platform.node()}: {os.cpu_count()} CPUs, {psutil.virtual_memory().total / 1024**3:.0f} GB",
        "load_average_before": [round(v, 2) for v in load_before],
        "load_average_after": [round(v, 2) for v in os.getloadavg()],
        "ray_settle_s": RAY_SETTLE_S,
        "rows": rows,
        "ratios": ratios,
    }
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
