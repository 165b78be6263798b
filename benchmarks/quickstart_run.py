"""What `make run` costs a newcomer: the quickstart sweep end to end (issue 11: its sweep <= 20 s).

    python benchmarks/quickstart_run.py [--repeats N] [--json PATH]

Each repeat runs the installed `hpo run configs/quickstart.yaml` as a fresh process, as `make run`
does, with the run stored in a temporary folder. It records the whole process's wall time (start,
imports and checks, Ray's start, the sweep, the report, Ray's shutdown and exit) and the two numbers
`hpo run` prints on its last line: the sweep's seconds and Ray's start. The table gives every
repeat and the medians; the JSON keeps them with the load average, since the box is shared.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
SWEEP = ROOT / "configs" / "quickstart.yaml"
TIME_LINE = re.compile(r"^time:\s+sweep ([\d.]+) s \(Ray started in ([\d.]+) s\)", re.MULTILINE)
BEST_LINE = re.compile(r"^Best configuration \(\w+ = ([\d.eE+-]+)\)", re.MULTILINE)


def run_once(hpo: Path, workdir: Path) -> dict[str, float | int | None]:
    """One `hpo run` of the quickstart sweep, stored under `workdir`."""
    sweep = yaml.safe_load(SWEEP.read_text())
    sweep["storage_path"] = str(workdir / "runs")
    sweep_file = workdir / "quickstart.yaml"
    sweep_file.write_text(yaml.safe_dump(sweep, sort_keys=False))
    started = time.perf_counter()
    proc = subprocess.run([str(hpo), "run", str(sweep_file)], cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - started
    timing, best = TIME_LINE.search(proc.stdout), BEST_LINE.search(proc.stdout)
    return {
        "exit_status": proc.returncode,
        "process_s": round(wall, 2),
        "sweep_s": float(timing.group(1)) if timing else None,
        "ray_start_s": float(timing.group(2)) if timing else None,
        "best_val_loss": float(best.group(1)) if best else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="runs of the sweep (default 3)")
    parser.add_argument("--json", type=Path, default=ROOT / "benchmarks/results/quickstart_run_cpu.json",
                        help="where to write the samples (default benchmarks/results/quickstart_run_cpu.json)")
    args = parser.parse_args()
    hpo = Path(sys.executable).parent / "hpo"
    load_before = os.getloadavg()
    runs = []
    for repeat in range(args.repeats):
        with tempfile.TemporaryDirectory(prefix="hpo-quickstart-") as workdir:
            runs.append(run_once(hpo, Path(workdir)))
        print(f"run {repeat + 1}: {runs[-1]}", flush=True)
    good = [run for run in runs if run["exit_status"] == 0 and run["sweep_s"] is not None]
    medians = {key: statistics.median(run[key] for run in good) for key in ("process_s", "sweep_s", "ray_start_s")} if good else {}
    print(f"\n{'':12s}{'process s':>12s}{'sweep s':>12s}{'Ray start s':>14s}")
    for index, run in enumerate(runs, 1):
        print(f"{'run ' + str(index):12s}{run['process_s']:>12}{run['sweep_s']!s:>12}{run['ray_start_s']!s:>14}")
    if medians:
        print(f"{'median':12s}{medians['process_s']:>12.2f}{medians['sweep_s']:>12.2f}{medians['ray_start_s']:>14.2f}")
    report = {
        "machine": f"{os.cpu_count()} CPUs, shared with other jobs",
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "command": "hpo run configs/quickstart.yaml (storage in a temporary folder)",
        "runs": runs,
        "median": medians,
        "failed_runs": len(runs) - len(good),
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwrote {args.json}")
    if len(good) != len(runs):
        sys.exit(1)


if __name__ == "__main__":
    main()
