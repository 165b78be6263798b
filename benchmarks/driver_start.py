"""What a sweep's driver spends between `hpo run`'s checks and Tune's first trial, on imports and
Ray's start: one after the other, or with `hpo.fit_imports` importing while Ray starts.

Each sample is a fresh driver process that imports the sweep layer (as `hpo run` does before Ray
starts), then times starting a local Ray (`ensure_ray`) and importing `FIT_IMPORTS`, the modules
Tune's telemetry and the results plot import on the sweep's clock. The two ways alternate, so a
noisy machine shifts both alike.

    python benchmarks/driver_start.py [--rounds 3] [--json benchmarks/results/driver_start_cpu.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

SAMPLE = r"""
import json, sys, time
import hpo.sweep  # noqa: F401  imported before Ray starts, as `hpo run` does
import ray
from hpo.base.ray_runtime import ensure_ray
from hpo.fit_imports import FIT_IMPORTS, import_modules, importing_in_background

overlap = sys.argv[1] == "overlapped"
started = time.perf_counter()
if overlap:
    with importing_in_background():
        ensure_ray()
    ray_up = imports_done = time.perf_counter()
else:
    ensure_ray()
    ray_up = time.perf_counter()
    import_modules(FIT_IMPORTS)
    imports_done = time.perf_counter()
print(json.dumps({"total_s": imports_done - started, "ray_start_s": ray_up - started}))
ray.shutdown()
"""
WAYS = ("sequential", "overlapped")


def sample(way: str) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", SAMPLE, way], capture_output=True, text=True, check=True,
                         env={key: value for key, value in os.environ.items() if key != "RAY_ADDRESS"})
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="samples of each way, alternating (default 3)")
    parser.add_argument("--json", type=Path, default=None, help="write the samples and medians here")
    args = parser.parse_args()
    samples: dict[str, list[dict[str, float]]] = {way: [] for way in WAYS}
    load_before = os.getloadavg()
    for _ in range(args.rounds):
        for way in WAYS:
            samples[way].append(sample(way))
    medians = {way: {key: round(statistics.median(s[key] for s in samples[way]), 2) for key in ("total_s", "ray_start_s")}
               for way in WAYS}
    print(f"{'way':<12} {'Ray start + imports (s)':>24} {'of which Ray start (s)':>24}")
    for way in WAYS:
        print(f"{way:<12} {medians[way]['total_s']:>24.2f} {medians[way]['ray_start_s']:>24.2f}")
    saved = medians["sequential"]["total_s"] - medians["overlapped"]["total_s"]
    print(f"overlapping saves {saved:.2f} s of the driver's start (median of {args.rounds} each)")
    if args.json:
        args.json.write_text(json.dumps({
            "machine": f"{os.cpu_count()} CPUs; load average {load_before[0]:.1f} before, {os.getloadavg()[0]:.1f} after",
            "rounds": args.rounds, "medians": medians, "saved_s": round(saved, 2),
            "samples": samples,
        }, indent=2) + "\n")


if __name__ == "__main__":
    main()
