"""What a Tune trial pays before its first line of training, and whether anything Ray offers makes
it start warm: in a process that already has torch imported.

Each variant starts a fresh local Ray as `hpo run` starts it (loopback only), waits `SETTLE_S` for
Ray's own start-up (its prestarted idle workers included), then runs `--repeats` fits of `Probe`,
a trainable whose `setup` imports torch, as a torch trial's does. For each fit: seconds from `fit`
to the start of `setup`, seconds `setup` spent importing torch (0 where the process had it), and
whether the trial landed in one of the idle workers the raylet held when `fit` began
(`in_idle_worker`; a process that merely started a moment before `fit`, as the raylet starts one
when the previous trial's actor exits, is not warm). The variants:

- `default`: Ray as hpo starts it;
- `preload_torch`: `_system_config={"preload_python_modules": ["torch"]}`, so every worker Ray
  starts imports torch before it takes work, the idle workers it prestarts at start-up included;
- `job_env_as_tune`: the job's runtime env set to the one Tune gives every trial actor
  (`{"env_vars": {"PL_DISABLE_FORK": "1"}}`), so that job and trial ask for the same env;
- `task_warmed`: before each fit, one task per CPU under Tune's actor env that imports torch, so
  that idle workers of that very env, with torch imported, exist when Tune asks for its actors;
- `plain_actor`: the control: a plain actor (no runtime env) created with `.remote()`: does it land
  in one of the idle workers Ray prestarted?

Ray's worker pool hands an actor an idle worker only if the worker has never leased (a worker
that ran a task is a task worker) and its runtime env hash equals the actor's; the idle workers it
prestarts have the empty env, and Tune gives every trial actor a runtime env of its own. See
"Why a Tune trial never starts warm" in docs/architecture.md for the source lines.

    python benchmarks/trial_process_start.py [--repeats N] [--variants default,preload_torch,...] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

#: The runtime env Ray Tune gives every trial actor (`ray.tune.execution.class_cache.DEFAULT_ENV_VARS`),
#: written out: the point is whether a worker of the very same env is reused.
TUNE_ACTOR_ENV = {"env_vars": {"PL_DISABLE_FORK": "1"}}
#: Ray's own start-up work finishes (and its idle workers are prestarted) before anything is timed.
SETTLE_S = 5.0
#: What a trial of a torch workload imports before its first step (`torch._dynamo`: at its first
#: optimizer step).
TRIAL_MODULES = ("torch", "ray.tune", "torch._dynamo")
VARIANTS = ("default", "preload_torch", "job_env_as_tune", "task_warmed", "plain_actor")


def import_seconds() -> float:
    code = f"import time; t = time.perf_counter(); import {', '.join(TRIAL_MODULES)}; print(time.perf_counter() - t)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def idle_workers() -> set[int]:
    """The pids of this driver's Ray's idle workers (`ray::IDLE`), as the raylet holds them now."""
    import psutil

    idle = set()
    for process in psutil.Process().children(recursive=True):
        try:
            if process.cmdline()[:1] == ["ray::IDLE"]:
                idle.add(process.pid)
        except (psutil.Error, IndexError):
            continue
    return idle


def one_fit(name: str, storage: str) -> dict[str, Any]:
    from ray import tune

    class Probe(tune.Trainable):
        def setup(self, config: dict[str, Any]) -> None:
            self.setup_t = time.time()
            self.torch_was_imported = "torch" in sys.modules
            import torch  # noqa: F401

            self.import_s = time.time() - self.setup_t

        def step(self) -> dict[str, Any]:
            return {"setup_t": self.setup_t, "pid": os.getpid(), "import_s": self.import_s,
                    "torch_was_imported": self.torch_was_imported, "done": True}

        def save_checkpoint(self, checkpoint_dir: str) -> None:  # Tune saves a trial that ends
            return None

        def load_checkpoint(self, checkpoint: Any) -> None:
            pass

    idle = idle_workers()
    start = time.time()
    grid = tune.Tuner(Probe, run_config=tune.RunConfig(name=name, storage_path=storage, verbose=0)).fit()
    if grid.errors:
        raise grid.errors[0]
    metrics = grid[0].metrics
    return {
        "fit_to_setup_s": round(metrics["setup_t"] - start, 3),
        "torch_import_in_setup_s": round(metrics["import_s"], 3),
        "torch_was_imported": metrics["torch_was_imported"],
        "in_idle_worker": metrics["pid"] in idle,
    }


def plain_actor() -> dict[str, Any]:
    """The control: a plain actor's `__init__`, timed from `.remote()`."""
    import ray

    @ray.remote(num_cpus=1)
    class Plain:
        def __init__(self) -> None:
            self.init_t = time.time()

        def facts(self) -> tuple[float, int]:
            return self.init_t, os.getpid()

    idle = idle_workers()
    start = time.time()
    actor = Plain.remote()
    init_t, pid = ray.get(actor.facts.remote())
    ray.kill(actor)
    return {"remote_to_init_s": round(init_t - start, 3), "in_idle_worker": pid in idle}


def run_variant(variant: str, repeats: int, storage: str) -> list[dict[str, Any]]:
    import ray

    from hpo.base.ray_runtime import start_local_ray

    options: dict[str, Any] = {}
    if variant == "preload_torch":
        options["_system_config"] = {"preload_python_modules": ["torch"]}
    if variant == "job_env_as_tune":
        options["runtime_env"] = TUNE_ACTOR_ENV
    start_local_ray(num_cpus=os.cpu_count() or 1, **options)
    time.sleep(SETTLE_S)

    @ray.remote(num_cpus=1, runtime_env=TUNE_ACTOR_ENV)
    def warm() -> None:
        import torch  # noqa: F401

        time.sleep(0.5)  # long enough that each of the tasks gets a worker of its own

    rows = []
    for i in range(repeats):
        if variant == "plain_actor":
            rows.append(plain_actor())
            continue
        if variant == "task_warmed":
            ray.get([warm.remote() for _ in range(os.cpu_count() or 1)])
            time.sleep(1.0)
        rows.append(one_fit(f"{variant}{i}", storage))
    ray.shutdown()
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)

    import hpo.base.ray_runtime  # noqa: F401  before ray: the local Ray listens on loopback only

    load_before = os.getloadavg()
    imports = [import_seconds() for _ in range(args.repeats)]
    storage = tempfile.mkdtemp(prefix="trial_start_")
    variants = {name: run_variant(name, args.repeats, storage) for name in args.variants.split(",")}
    medians: dict[str, Any] = {"imports_s": round(statistics.median(imports), 3)}
    print(f"a fresh process importing {', '.join(TRIAL_MODULES)}: {medians['imports_s']} s (median of {args.repeats})")
    for name, rows in variants.items():
        key = "remote_to_init_s" if name == "plain_actor" else "fit_to_setup_s"
        medians[name] = {
            key: round(statistics.median(row[key] for row in rows), 3),
            "in_an_idle_worker": f"{sum(row['in_idle_worker'] for row in rows)} of {len(rows)}",
        }
        if name != "plain_actor":
            medians[name]["torch_import_in_setup_s"] = round(statistics.median(r["torch_import_in_setup_s"] for r in rows), 3)
        print(f"{name:<16} {medians[name]}")
    report = {
        "machine": f"{os.cpu_count()} CPUs, shared with other jobs; load average {load_before[0]:.1f} before, "
                   f"{os.getloadavg()[0]:.1f} at the end",
        "imports_s": [round(s, 3) for s in imports],
        "variants": variants,
        "median": medians,
    }
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
