"""What `make run` costs a newcomer: the quickstart sweep end to end (issue 11: its sweep <= 20 s),
and, with `--fresh`, the whole `make run` on a fresh machine, install included (issue 34: under
3 minutes on a quiet 2-core box).

    python benchmarks/quickstart_run.py [--repeats N] [--json PATH] [--versus NAME=VALUE]
    python benchmarks/quickstart_run.py --fresh [--no-pip-cache] [--json PATH]

`--fresh` clones this checkout's committed HEAD into a temporary folder (no venv, no build), then
runs `make run`'s two steps there apart, with the interpreter the Makefile finds outside any venv:
its install (`make .venv/.quickstart-stamp`: a venv and the pinned packages the quickstart needs)
and then `make run`, which finds it done and runs the sweep.
The JSON records the install, the sweep (and Ray's start) as `hpo run` reports them, the `hpo run`
process and the total, the commit, the machine and its load. pip's download cache is used unless
`--no-pip-cache` (a machine that never downloaded the wheels); which one is recorded too.

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


#: What a newcomer's `make run` may take on a quiet 2-core box, install included.
FRESH_BUDGET_S = 180
#: The Makefile's target for `make run`'s install step.
INSTALL_STEP = ".venv/.quickstart-stamp"


def outside_any_venv() -> dict[str, str]:
    """This process's environment without its virtual environment: `make` then finds the machine's
    Python, as on a fresh machine."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    venv_bins = {str(Path(sys.prefix) / "bin"), str(Path(sys.executable).parent)}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p not in venv_bins)
    return env


def timed(command: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, subprocess.CompletedProcess]:
    started = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
    return round(time.perf_counter() - started, 1), done


def fresh_run(pip_cache: bool) -> dict:
    """`make run`'s install step, then `make run`, in a fresh clone of this checkout's HEAD (see the docstring)."""
    env = outside_any_venv()
    if not pip_cache:
        env["PIP_NO_CACHE_DIR"] = "1"
    with tempfile.TemporaryDirectory(prefix="hpo-fresh-") as workdir:
        checkout = Path(workdir) / "checkout"
        subprocess.run(["git", "clone", "--quiet", "--no-hardlinks", str(ROOT), str(checkout)], check=True)
        install_s, setup = timed(["make", INSTALL_STEP], checkout, env)
        run_s, run = timed(["make", "run"], checkout, env) if setup.returncode == 0 else (None, setup)
    timing, best = TIME_LINE.search(run.stdout), BEST_LINE.search(run.stdout)
    failed = setup if setup.returncode else run
    return {
        "exit_status": failed.returncode,
        "install_s": install_s,
        "run_s": run_s,
        "sweep_s": float(timing.group(1)) if timing else None,
        "ray_start_s": float(timing.group(2)) if timing else None,
        "total_s": round(install_s + run_s, 1) if run_s is not None else None,
        "best_val_loss": float(best.group(1)) if best else None,
        **({"error_tail": (failed.stdout + failed.stderr)[-3000:]} if failed.returncode else {}),
    }


def main_fresh(args: argparse.Namespace) -> None:
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    load_before = os.getloadavg()
    run = fresh_run(pip_cache=not args.no_pip_cache)
    report = {
        "machine": f"{os.cpu_count()} CPUs, shared with other jobs",
        "commit": commit,
        "command": f"git clone <checkout>; make {INSTALL_STEP}; make run (timed apart; make run = both)",
        "pip_download_cache": "off" if args.no_pip_cache else "on",
        "load_average_before": load_before,
        **run,
        "budget_s": FRESH_BUDGET_S,
        "within_budget": run["total_s"] is not None and run["total_s"] <= FRESH_BUDGET_S,
        "load_average_after": os.getloadavg(),
    }
    print(f"{'install s':>10s}{'hpo run s':>11s}{'sweep s':>9s}{'Ray start s':>13s}{'total s':>9s}")
    print(f"{run['install_s']!s:>10s}{run['run_s']!s:>11s}{run['sweep_s']!s:>9s}{run['ray_start_s']!s:>13s}{run['total_s']!s:>9s}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwrote {args.json}")
    if run["exit_status"]:
        print(run["error_tail"], file=sys.stderr)
        sys.exit(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="runs of the sweep (default 3)")
    parser.add_argument("--json", type=Path, default=None,
                        help="where to write the samples (default benchmarks/results/quickstart_run_cpu.json, "
                        "with --fresh quickstart_fresh_cpu.json)")
    parser.add_argument("--versus", metavar="NAME=VALUE", help="also run each repeat under this environment variable")
    parser.add_argument("--fresh", action="store_true",
                        help="time make run in a fresh clone, install included (see above)")
    parser.add_argument("--no-pip-cache", action="store_true", help="with --fresh: download every package again")
    args = parser.parse_args()
    default = "quickstart_fresh_cpu.json" if args.fresh else "quickstart_run_cpu.json"
    args.json = args.json or ROOT / "benchmarks" / "results" / default
    if args.fresh:
        main_fresh(args)
        return
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
