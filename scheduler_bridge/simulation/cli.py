"""``hpo sim``: replay a trace under one or more policies.

Wire into the main CLI with ``add_sim_parser(subparsers)``; standalone:

    python -m scheduler_bridge.simulation.cli sim --trace philly --policy fifo,qssf,sjf --gpus 500 \\
        --json out.json --plot out.png

``--trace`` takes a CSV file (with ``--format``) or the name of a shipped trace (``philly``,
``workload-1`` ... ``workload-8``, ``workloads-0.5/workload-N``, ``workloads-1.5/workload-N``:
``data_files.shipped_traces``), whose format is known.

Several policies (comma list, or ``--compare``) run on the same trace and print
a table; ``--json`` then holds a list of summaries. Policies include
``tiresias``, ``lucid`` and ``ces:<base>`` (energy saving over a queue policy).
Bad input (missing file, malformed or out-of-range row, a job id given twice, non-UTF-8
bytes, a flag out of range, an output folder that does not exist, a bad interference table)
prints one line naming it and exits with 2, before anything is simulated.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

from ..cluster import ClusterSpec
from ..data_files import default_traces_dir, shipped_traces
from ..interference import InterferenceTable
from ..power_model import PowerModel
from ..policies.registry import POLICIES, check_policy_name, make_policy
from .simulator import simulate
from .synthetic import add_tuning_work
from .traces import FORMATS, TraceError, load_trace, pollux_profiles_dir

TABLE_KEYS = ("policy", "completed", "avg_jct", "p50_jct", "p99_jct", "avg_queue", "p999_queue",
              "makespan", "utilization", "on_utilization", "energy_kwh", "wall_s")
COMPARE_DEFAULT = {"philly": "fifo,sjf,srtf,qssf,tiresias", "helios": "fifo,sjf,srtf,qssf,tiresias",
                   "pollux": "fifo,tiresias,elastic-fixed-batch,elastic"}


def add_sim_parser(subparsers) -> None:
    """Register the ``sim`` subcommand on an argparse ``subparsers`` object."""
    p = subparsers.add_parser("sim", help="replay a cluster trace under scheduling policies",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trace", required=True,
                   help="trace file (CSV), or a shipped trace: philly, workload-1 ... workload-8 (Pollux, "
                        "load 1.0x), workloads-0.5/workload-N, workloads-1.5/workload-N")
    p.add_argument("--format", default=None, choices=FORMATS,
                   help="trace format (default: the shipped trace's; required for a file)")
    p.add_argument("--policy", default=None,
                   help=f"one policy or a comma list of: {', '.join(POLICIES)}")
    p.add_argument("--compare", action="store_true",
                   help="run the standard comparison set for the format and print a table")
    p.add_argument("--gpus", type=int, required=True, help="GPUs in the cluster")
    p.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per node (default: 8)")
    p.add_argument("--spread", action="store_true",
                   help="let jobs larger than a node take free GPUs on any nodes (default: whole nodes)")
    p.add_argument("--profiles", default=None,
                   help="pollux: application profile folder (<app>/placements.csv); default: ../traces "
                        "beside the workload's folder, as the shipped workloads have it")
    p.add_argument("--json", default=None, help="write the summary (list if several policies)")
    p.add_argument("--csv", default=None, help="per-job CSV; {policy} in the name is replaced")
    p.add_argument("--plot", default=None, help="PNG with JCT CDFs and utilisation over time")
    p.add_argument("--backfill", default=None, action=argparse.BooleanOptionalAction,
                   help="greedy backfill for queue policies (default: on)")
    p.add_argument("--restart-cost", type=float, default=30.0,
                   help="checkpoint-restart seconds on preemption or resize")
    p.add_argument("--deadline", type=float, default=None,
                   help="count jobs finished by this time (default 8 h for pollux)")
    p.add_argument("--limit", type=int, default=None, help="replay only the first N jobs")
    p.add_argument("--seed", type=int, default=0,
                   help="random seed of the synthetic tuning work and of seeded policies (default: 0)")
    p.add_argument("--base-policy", default="fifo", help="ordinary-job policy under tuning-aware")
    p.add_argument("--tuning-jobs", type=int, default=None,
                   help="synthetic tuning jobs to add (default 20 with tuning-aware)")
    p.add_argument("--tuning-groups", type=int, default=8, help="fused groups per synthetic tuning job (default: 8)")
    p.add_argument("--tuning-group-work", type=float, default=3600.0, help="GPU-seconds per group")
    p.add_argument("--pipeline-fraction", type=float, default=0.2,
                   help="fraction of multi-GPU jobs treated as pipeline jobs with bubbles")
    p.add_argument("--bubble-fraction", type=float, default=0.3,
                   help="fraction of a pipeline job's GPU time spent idle in bubbles (default: 0.3)")
    d = PowerModel()
    p.add_argument("--boot-delay", type=float, default=d.boot_delay,
                   help="ces: seconds a powered-down node takes to boot and rejoin")
    p.add_argument("--idle-watts", type=float, default=d.idle_watts, help="watts of an idle powered node")
    p.add_argument("--busy-gpu-watts", type=float, default=d.busy_gpu_watts,
                   help="extra watts per busy GPU")
    p.add_argument("--off-watts", type=float, default=d.off_watts, help="watts of a powered-down node")
    p.add_argument("--interference", default=None,
                   help="lucid: interference table CSV from 'hpo profile colocate' "
                        "(default: the shipped one)")
    p.set_defaults(func=run_sim)


def _fail(msg: str) -> int:
    print(f"hpo sim: error: {msg}", file=sys.stderr)
    return 2


def _fmt(v) -> str:
    if isinstance(v, float):
        return "nan" if math.isnan(v) else (f"{v:.3f}" if abs(v) < 10 else f"{v:,.0f}")
    return str(v)


def format_table(summaries: list[dict]) -> str:
    keys = list(TABLE_KEYS) + (["completed_by_deadline"] if "completed_by_deadline" in summaries[0] else [])
    rows = [keys] + [[_fmt(s.get(k)) for k in keys] for s in summaries]
    widths = [max(len(r[i]) for r in rows) for i in range(len(keys))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows)


def _per_policy_path(path: str, policy: str, several: bool) -> str:
    """``{policy}`` in ``path`` is replaced; with several policies and no
    placeholder the policy goes before the suffix (jobs.csv -> jobs-qssf.csv)."""
    if "{policy}" in path:
        return path.replace("{policy}", policy)
    if not several:
        return path
    p = Path(path)
    return str(p.with_name(f"{p.stem}-{policy}{p.suffix}"))


# flag -> (lowest, highest) allowed; None: unbounded on that side. Checked before anything runs.
RANGES = {"limit": (1, None), "restart_cost": (0.0, 1e7), "deadline": (0.0, 1e11),
          "seed": (0, 2**32 - 1), "tuning_jobs": (0, 10**6), "tuning_groups": (1, 10**4),
          "tuning_group_work": (1e-3, 1e9), "pipeline_fraction": (0.0, 1.0),
          "bubble_fraction": (0.0, 0.99), "boot_delay": (0.0, 86400.0), "idle_watts": (0.0, 1e6),
          "busy_gpu_watts": (0.0, 1e5), "off_watts": (0.0, 1e6), "gpus": (1, 10**7),
          "gpus_per_node": (1, 1024)}


def check_ranges(args) -> str | None:
    """The first flag whose value is out of range or not finite, as a message."""
    for key, (lo, hi) in RANGES.items():
        v = getattr(args, key, None)
        if v is None:
            continue
        flag = "--" + key.replace("_", "-")
        if isinstance(v, float) and not math.isfinite(v):
            return f"{flag} = {v!r} must be a finite number"
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            return f"{flag} = {v!r} must be in [{lo}, {hi if hi is not None else 'inf'}]"
    return None


def check_outputs(args, names: list[str]) -> str | None:
    """Refuse output paths that cannot be written, before a long simulation runs."""
    paths = [("--json", args.json), ("--plot", args.plot)]
    if args.csv:
        paths += [("--csv", _per_policy_path(args.csv, n, len(names) > 1)) for n in names]
    for flag, path in paths:
        if not path:
            continue
        p = Path(path)
        folder = p.parent if str(p.parent) else Path(".")
        if p.is_dir():
            return f"{flag} {path}: is a folder, not a file"
        if not folder.is_dir():
            return f"{flag} {path}: folder {folder} does not exist"
        if not os.access(folder, os.W_OK) or (p.exists() and not os.access(p, os.W_OK)):
            return f"{flag} {path}: not writable"
    return None


def resolve_trace(args) -> str | None:
    """Point ``args.trace`` at the shipped file it names (a file of that name here wins) and fill in
    its format; the problem, as a message, if the format is still unknown."""
    shipped = shipped_traces()
    if args.trace in shipped and not Path(args.trace).exists():
        path, fmt = shipped[args.trace]
        args.trace, args.format = str(path), args.format or fmt
    if args.format is None:
        if not Path(args.trace).exists():
            return f"--trace {args.trace}: no such file, nor a shipped trace ({', '.join(shipped)})"
        return f"--trace {args.trace}: give its --format ({', '.join(FORMATS)})"
    return None


def check_profiles(args) -> str | None:
    """``--profiles`` is read by a Pollux workload only, and a workload of the user's own, away from
    the shipped folders, needs it: it has no ``../traces`` beside it, and without this check the
    error named only that folder, not the flag that fixes it."""
    if args.format != "pollux":
        return f"--profiles {args.profiles}: only a --format pollux trace reads application profiles" \
            if args.profiles else None
    beside = pollux_profiles_dir(Path(args.trace).resolve())
    if args.profiles is None and not beside.is_dir():
        return (f"--trace {args.trace}: a Pollux workload's application profiles are read from ../traces "
                f"beside its folder, and {beside} does not exist; give "
                f"--profiles FOLDER (the shipped ones: {default_traces_dir() / 'pollux' / 'traces'})")
    return None


def run_sim(args) -> int:
    """Handler of ``hpo sim``; returns the exit code."""
    bad = resolve_trace(args)
    if bad:
        return _fail(bad)
    spec_policies = args.policy or (COMPARE_DEFAULT[args.format] if args.compare else "")
    names = [p.strip() for p in spec_policies.split(",") if p.strip()]
    if not names:
        return _fail("give --policy NAME[,NAME...] or --compare")
    for name in names:
        try:
            check_policy_name(name)
        except ValueError as e:
            return _fail(str(e))
    if args.gpus < 1 or args.gpus_per_node < 1:
        return _fail(f"--gpus and --gpus-per-node must be >= 1 (got {args.gpus}, {args.gpus_per_node})")
    if args.format != "pollux" and any(n.startswith("elastic") for n in names):
        return _fail("elastic policies need jobs with measured profiles: use --format pollux")
    bad = check_ranges(args) or check_outputs(args, names) or check_profiles(args)
    if bad:
        return _fail(bad)
    try:
        power = PowerModel(args.idle_watts, args.busy_gpu_watts, args.off_watts, args.boot_delay)
        interference = InterferenceTable.load(args.interference) if args.interference else None
        trace = load_trace(args.trace, args.format, args.profiles)
        if args.limit:
            from ..jobs import Trace
            trace = Trace(trace.jobs[: args.limit], trace.source, trace.tuning, trace.t0)
        if "tuning-aware" in names:
            n_tune = 20 if args.tuning_jobs is None else args.tuning_jobs
            trace = add_tuning_work(trace, tuning_jobs=n_tune, groups=args.tuning_groups,
                                    group_work=args.tuning_group_work,
                                    pipeline_fraction=args.pipeline_fraction,
                                    bubble_fraction=args.bubble_fraction, seed=args.seed)
        profiles = None
        if args.format == "pollux":
            from ..app_profiles import load_profiles
            profiles = load_profiles(pollux_profiles_dir(args.trace, args.profiles))
        deadline = args.deadline if args.deadline is not None else (
            8 * 3600.0 if args.format == "pollux" else None)
        cluster = ClusterSpec(args.gpus, args.gpus_per_node, consolidate=not args.spread)
        results = []
        for name in names:
            policy = make_policy(name, backfill=args.backfill, seed=args.seed, base=args.base_policy,
                                 power=power, interference=interference)
            results.append(simulate(trace, policy, cluster, restart_cost=args.restart_cost,
                                    profiles=profiles, deadline=deadline))
    except (TraceError, ValueError, OSError) as e:
        return _fail(str(e))
    summaries = [r.summary() for r in results]
    print(format_table(summaries))
    for s in summaries:
        if "tuning_gpu_hours_free" in s:
            print(f"tuning-aware: {s['tuning_groups_completed']} fused groups finished, "
                  f"{s['tuning_gpu_hours_free']:.1f} GPU-h of tuning work done for free "
                  f"({s['tuning_gpu_hours_bubbles']:.1f} GPU-h in pipeline bubbles)")
    if args.json:
        Path(args.json).write_text(json.dumps(summaries[0] if len(summaries) == 1 else summaries,
                                              indent=2, default=str))
    if args.csv:
        for r in results:
            r.to_csv(_per_policy_path(args.csv, r.policy, len(results) > 1))
    if args.plot:
        from .plots import plot_results
        plot_results(results, args.plot)
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scheduler_bridge.simulation.cli")
    sub = parser.add_subparsers(dest="command", required=True)
    add_sim_parser(sub)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
