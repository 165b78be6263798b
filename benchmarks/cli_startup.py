"""How long the `hpo` commands that start no Ray take, and how much memory they use (issue 11:
`hpo --help` <= 0.5 s; `hpo validate` and `hpo run --dry-run` import only what they need), and
what an `hpo run` of a plain Tune function imports before its Ray starts (no torch), which every
`--resume` pays again.

    python benchmarks/cli_startup.py [--baseline CHECKOUT] [--repeats N] [--json PATH]

Each command runs `--repeats` times as a fresh `python -m hpo.cli` process in this checkout (and,
with `--baseline`, alternately in another checkout, e.g. a `git worktree` of an older commit, so
both are measured side by side under the same load). The table gives the median wall time and the
median peak RSS of the process; the JSON keeps every sample and the load average. A command the
baseline does not have (`validate --no-exec`) is left out for it.
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

ROOT = Path(__file__).resolve().parents[1]
HPO = ["-m", "hpo.cli"]
#: What is timed: the arguments after `python`.
COMMANDS = {
    "hpo --help": [*HPO, "--help"],
    "hpo validate --no-exec": [*HPO, "validate", "--no-exec", "configs/quickstart.yaml"],
    "hpo validate": [*HPO, "validate", "configs/quickstart.yaml"],
    "hpo run --dry-run": [*HPO, "run", "--dry-run", "configs/quickstart.yaml"],
    "hpo sim --help": [*HPO, "sim", "--help"],
    # The modules `hpo run` of a function trainable loads before `ray.init` (Ray and Tune included).
    "function sweep's imports": ["-c", "import hpo.cli, hpo.config.sweep_file, hpo.config.preflight, hpo.tuner.sweep"],
}


def measure(checkout: Path, argv: list[str]) -> tuple[float, float, int]:
    """(wall seconds, peak RSS in MB, exit status) of one `python ARGV` in `checkout`."""
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    started = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, *argv], cwd=checkout, env=env,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    return wall, usage.ru_maxrss / 1024, proc.returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", type=Path, default=None, help="another checkout to time side by side")
    parser.add_argument("--repeats", type=int, default=5, help="runs of each command per checkout (default 5)")
    parser.add_argument("--json", type=Path, default=ROOT / "benchmarks/results/cli_startup_cpu.json",
                        help="where to write the samples (default benchmarks/results/cli_startup_cpu.json)")
    args = parser.parse_args()
    trees = {"this": ROOT} | ({"baseline": args.baseline.resolve()} if args.baseline else {})
    samples: dict[str, dict[str, list[dict]]] = {name: {} for name in trees}
    load_before = os.getloadavg()
    for label, argv in COMMANDS.items():
        for _ in range(args.repeats):
            for tree, checkout in trees.items():  # alternate, so both see the same load
                wall, rss, code = measure(checkout, argv)
                if code == 0:
                    samples[tree].setdefault(label, []).append({"wall_s": round(wall, 4), "peak_rss_mb": round(rss, 1)})
    summary = {
        tree: {
            label: {
                "median_wall_s": statistics.median(s["wall_s"] for s in runs),
                "median_peak_rss_mb": statistics.median(s["peak_rss_mb"] for s in runs),
            }
            for label, runs in by_command.items()
        }
        for tree, by_command in samples.items()
    }
    header = f"{'command':26s}" + "".join(f"{tree + ' s':>14s}{tree + ' MB':>14s}" for tree in trees)
    print(header)
    for label in COMMANDS:
        row = f"{label:26s}"
        for tree in trees:
            cell = summary[tree].get(label)
            row += f"{cell['median_wall_s']:>14.2f}{cell['median_peak_rss_mb']:>14.0f}" if cell else f"{'-':>14s}{'-':>14s}"
        print(row)
    if "baseline" in summary:
        base, this = summary["baseline"]["hpo --help"]["median_wall_s"], summary["this"]["hpo --help"]["median_wall_s"]
        print(f"hpo --help: {base / this:.0f}x faster than the baseline (target <= 0.5 s: {'met' if this <= 0.5 else 'missed'})")
    result = {
        "machine": f"{os.cpu_count()} CPUs, shared with other jobs",
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "repeats": args.repeats,
        "checkouts": {tree: str(path) for tree, path in trees.items()},
        "summary": summary,
        "samples": samples,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(f"json: {args.json}")


if __name__ == "__main__":
    main()
