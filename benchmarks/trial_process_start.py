"""What a Tune trial pays before its first line of training: a new worker process and its imports.

Issue 11 asks a fused 16x8 sweep to finish within the in-process loop's time (no Ray, torch already
imported) and a fused 64x8 sweep to be 3x faster than plain Ray Tune. Both meet a cost that no engine
of ours sets: Ray Tune creates every trial's actor with a runtime env of its own (`PL_DISABLE_FORK`),
and Ray starts a dedicated worker process for such an actor, in which a torch trial then imports
torch and Ray Tune. Measured here, on hpo's local Ray:

- `cold`: `Tuner(Probe).fit()` of a trainable that imports nothing; seconds from `fit` to the
  worker process's creation and to `Probe.__init__`;
- `warmed`: the same after warming workers with tasks given the same runtime env Tune gives its
  actors (`ray.remote(runtime_env=...)`; Ray has no public way to hand a warm worker to an actor):
  does the actor land in a process that was already running (`warm_process`)?
- `imports`: a fresh Python process importing what a torch trial imports first (`TRIAL_MODULES`).

    python benchmarks/trial_process_start.py [--repeats N] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

#: The runtime env Ray Tune gives every trial actor (its `DEFAULT_ENV_VARS`), written out: the point
#: is whether a worker warmed under the very same env is reused.
TUNE_ACTOR_ENV = {"env_vars": {"PL_DISABLE_FORK": "1"}}
#: Ray's own start-up work finishes before anything is timed.
SETTLE_S = 5.0
#: What a trial of a torch workload imports before its first step (`torch._dynamo`: at its first
#: optimizer step).
TRIAL_MODULES = ("torch", "ray.tune", "torch._dynamo")


def import_seconds() -> float:
    code = f"import time; t = time.perf_counter(); import {', '.join(TRIAL_MODULES)}; print(time.perf_counter() - t)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def one_fit(name: str, storage: str) -> dict[str, Any]:
    from ray import tune

    class Probe(tune.Trainable):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            import psutil

            self.init_t = time.time()
            self.process_t = psutil.Process().create_time()
            super().__init__(*args, **kwargs)

        def step(self) -> dict[str, Any]:
            return {"init_t": self.init_t, "process_t": self.process_t, "done": True}

        def save_checkpoint(self, checkpoint_dir: str) -> None:  # Tune saves a trial that ends
            return None

        def load_checkpoint(self, checkpoint: Any) -> None:
            pass

    start = time.time()
    grid = tune.Tuner(Probe, run_config=tune.RunConfig(name=name, storage_path=storage, verbose=0)).fit()
    if grid.errors:
        raise grid.errors[0]
    metrics = grid[0].metrics
    return {
        "process_created_s": round(metrics["process_t"] - start, 3),
        "init_s": round(metrics["init_t"] - start, 3),
        "warm_process": metrics["process_t"] < start,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)

    import tempfile

    from hpo.base.ray_runtime import ensure_ray  # before ray: the local Ray listens on loopback only

    import torch  # noqa: F401  (as a Workload sweep's driver has it)
    import ray

    imports = [import_seconds() for _ in range(args.repeats)]
    ensure_ray()
    time.sleep(SETTLE_S)
    storage = tempfile.mkdtemp(prefix="trial_start_")
    cold = [one_fit(f"cold{i}", storage) for i in range(args.repeats)]

    @ray.remote(num_cpus=1, runtime_env=TUNE_ACTOR_ENV)
    def warm() -> None:
        time.sleep(0.5)  # long enough that each of the tasks gets a worker of its own

    warmed = []
    for i in range(args.repeats):
        ray.get([warm.remote() for _ in range(os.cpu_count() or 1)])
        time.sleep(SETTLE_S)
        warmed.append(one_fit(f"warm{i}", storage))
    ray.shutdown()

    def median(rows: list[dict[str, Any]], key: str) -> float:
        return round(statistics.median(row[key] for row in rows), 3)

    report = {
        "machine": f"{os.cpu_count()} CPUs, shared with other jobs; load average {os.getloadavg()[0]:.1f} at the end",
        "imports_s": [round(s, 3) for s in imports],
        "cold": cold,
        "warmed": warmed,
        "median": {
            "imports_s": round(statistics.median(imports), 3),
            "cold_process_created_s": median(cold, "process_created_s"),
            "cold_init_s": median(cold, "init_s"),
            "warmed_init_s": median(warmed, "init_s"),
            "warmed_fits_in_a_warm_process": sum(row["warm_process"] for row in warmed),
        },
    }
    print(f"{'run':<8} {'process created s':>18} {'__init__ s':>11}  warm process")
    for label, rows in (("cold", cold), ("warmed", warmed)):
        for row in rows:
            print(f"{label:<8} {row['process_created_s']:>18} {row['init_s']:>11}  {row['warm_process']}")
    print(f"a fresh process importing the trial modules: {report['median']['imports_s']} s (median of {args.repeats})")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
