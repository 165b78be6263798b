"""What `make run` costs a newcomer: the quickstart sweep end to end (issue 11: its sweep <= 20 s).

    python benchmarks/quickstart_run.py [--repeats N] [--json PATH] [--versus NAME=VALUE]

Each repeat runs the installed `hpo run configs/quickstart.yaml` as a fresh process, as `make run`
does, with the run stored in a temporary folder. It records the whole process's wall time (start,
imports and checks, Ray's start, the sweep, the report, Ray's shutdown and exit) and the two numbers
`hpo run` prints on its last line: the sweep's seconds and Ray's start. The table gives every
repeat and the medians; the JSON keeps them with the load average, since the box is shared.
`--versus NAME=VALUE` alternates each repeat with one run under that environment variable, so the
two are compared side by side (for example Ray's `RAY_preload_python_modules`).
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


def run_once(hpo: Path, workdir: Path, env: dict[str, str] | None = None) -> dict[str, float | int | None]:
    """One `hpo run` of the quickstart sweep, stored under `workdir`."""
    sweep = yaml.safe_load(SWEEP.read_text())
    sweep["storage_path"] = str(workdir / "runs")
    sweep_file = workdir / "quickstart.yaml"
    sweep_file.write_text(yaml.safe_dump(sweep, sort_keys=False))
    started = time.perf_counter()
    proc = subprocess.run([str(hpo), "run", str(sweep_file)], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, **(env or {})})
    wall = time.perf_counter() - started
    timing, best = TIME_LINE.search(proc.stdout), BEST_LINE.search(proc.stdout)
    return {
        "exit_status": proc.returncode,
        "process_s": round(wall, 2),
        "sweep_s": float(timing.group(1)) if timing else None,
        "ray_start_s": float(timing.group(2)) if timing else None,
        "best_val_loss": float(best.group(1)) if best else None,
    }


def succeeded(run: dict) -> bool:
    return run["exit_status"] == 0 and run["sweep_s"] is not None


def medians_of(runs: list[dict]) -> dict[str, float]:
    good = [run for run in runs if succeeded(run)]
    return {key: statistics.median(run[key] for run in good) for key in ("process_s", "sweep_s", "ray_start_s")} if good else {}


def print_table(label: str, runs: list[dict], medians: dict[str, float]) -> None:
    print(f"\n{label:12s}{'process s':>12s}{'sweep s':>12s}{'Ray start s':>14s}")
    for index, run in enumerate(runs, 1):
        print(f"{'run ' + str(index):12s}{run['process_s']:>12}{run['sweep_s']!s:>12}{run['ray_start_s']!s:>14}")
    if medians:
        print(f"{'median':12s}{medians['process_s']:>12.2f}{medians['sweep_s']:>12.2f}{medians['ray_start_s']:>14.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="runs of the sweep (default 3)")
    parser.add_argument("--json", type=Path, default=ROOT / "benchmarks/results/quickstart_run_cpu.json",
                        help="where to write the samples (default benchmarks/results/quickstart_run_cpu.json)")
    parser.add_argument("--versus", metavar="NAME=VALUE", help="also run each repeat under this environment variable")
    args = parser.parse_args()
    hpo = Path(sys.executable).parent / "hpo"
    versus = dict([args.versus.split("=", 1)]) if args.versus else None
    load_before = os.getloadavg()
    runs, versus_runs = [], []
    for repeat in range(args.repeats):
        for env, into in ((None, runs), *(((versus, versus_runs),) if versus else ())):
            with tempfile.TemporaryDirectory(prefix="hpo-quickstart-") as workdir:
                into.append(run_once(hpo, Path(workdir), env))
            print(f"run {repeat + 1}{' with ' + args.versus if env else ''}: {into[-1]}", flush=True)
    medians = medians_of(runs)
    print_table("as is", runs, medians)
    report = {
        "machine": f"{os.cpu_count()} CPUs, shared with other jobs",
        "load_average_before": load_before,
        "command": "hpo run configs/quickstart.yaml (storage in a temporary folder)",
        "runs": runs,
        "median": medians,
    }
    if versus:
        report["versus"] = {"env": versus, "runs": versus_runs, "median": medians_of(versus_runs)}
        print_table(args.versus[:12], versus_runs, report["versus"]["median"])
    report["load_average_after"] = os.getloadavg()
    failed = sum(not succeeded(run) for run in runs + versus_runs)
    report["failed_runs"] = failed
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwrote {args.json}")
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
