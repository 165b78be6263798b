"""Benchmark: profile a DeepSpeed pipeline job once, replay the profile to predict other configurations, measure them all.

One configuration of the bubble benchmark's job (`pipeline_bubble.profiling.MLPJob`: 4 blocks of
Linear(width), ReLU, Dropout and a 10-way head, AdamW; p=2 stages on gloo) is profiled; the
replayer (`pipeline_bubble.replay`, no DeepSpeed or torch) then predicts it and eleven more:
micro-batches 2, 4, 8, 16; half and double the micro-batch size; a deliberately unbalanced split
(3 blocks on stage 0, 1 and the head on stage 1); guest steps admitted into the bubbles, with an
executor seeded by the prediction and, for one, without (today's executor). All are then
measured in one set of processes, each in blocks of batches back to back as a job runs them,
the blocks in ABBA order, and the table gives predicted against measured: iteration time, each
stage's bubble (with the closed-form theory's errors beside, `pipeline_bubble.timeline`), the
guests' slowdown, and the harvest of the first batches with and without the seed.

The profile the table predicts from is recorded in the measuring processes
(`profiling.profile_and_measure`): the profiled configuration, on an engine of its own, trains a
block before every measured block, so the profile sees the host as the measurement does. A
profile recorded apart before the measurement (`profile_pipeline`, --profile-batches batches)
seeds the seeded executors, and its own errors are reported beside (`profile_apart`): on a
shared CPU host they carry the host's drift between the two minutes, the same offset in every
configuration.

    flock /tmp/bench.lock python benchmarks/pipeline_replay.py --json benchmarks/results/pipeline_replay_cpu.json
    python benchmarks/pipeline_replay.py --device cuda --json benchmarks/results/pipeline_replay_cuda.json

Flags: --block and --rounds (each configuration trains --rounds blocks of --block batches, default
3 x 5; the first batch of a block is warm-up; the profiled one a block before each of them),
--profile-batches (the profile recorded apart, 16), --iterations (batches each
prediction replays, 100), --guest-ms (guest step lengths, default 4,8 on CPU, 1,2 on
CUDA), --width and --micro-batch-size (the job; default 1024 and 128 on CPU, 8192 and 256 on
CUDA), --gantt DIR (one chart per configuration and stage). A CPU run takes 3-4 minutes on a
quiet 2-core box. Needs torch and DeepSpeed to measure; the predictions need neither.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import warnings
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # runnable from a plain checkout

from hpo.base.machine import fingerprint  # noqa: E402
from pipeline_bubble.accuracy import compare, format_rows, summarize_errors  # noqa: E402
from pipeline_bubble.profile import PipelineConfig  # noqa: E402
from pipeline_bubble.replay import ReplayWarning, predict, replay  # noqa: E402


def configurations(micro_batch_size: int, guests_s: tuple[float, float]) -> list[tuple[str, PipelineConfig, bool]]:
    """(name, configuration, executor seeded) of every measured run; the first is the profiled one."""
    b = micro_batch_size
    short, long = guests_s
    return [
        ("profiled", PipelineConfig(2, 4, b), False),
        ("m=2", PipelineConfig(2, 2, b), False),
        ("m=8", PipelineConfig(2, 8, b), False),
        ("m=16", PipelineConfig(2, 16, b), False),
        ("half micro-batch, m=4", PipelineConfig(2, 4, b // 2), False),
        ("half micro-batch, m=16", PipelineConfig(2, 16, b // 2), False),
        ("double micro-batch, m=4", PipelineConfig(2, 4, 2 * b), False),
        ("unbalanced 3:1 blocks, m=4", PipelineConfig(2, 4, b, split=(9, 4)), False),
        ("unbalanced 3:1 blocks, m=8", PipelineConfig(2, 8, b, split=(9, 4)), False),
        ("guests, m=4, seeded", PipelineConfig(2, 4, b, guest_step_s=short), True),
        ("guests, m=4, unseeded", PipelineConfig(2, 4, b, guest_step_s=short), False),
        ("guests, m=8, seeded", PipelineConfig(2, 8, b, guest_step_s=long), True),
    ]


def _commit() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()
        return head + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--device", default=None, choices=["cpu", "cuda"], help="default: cuda when available")
    parser.add_argument("--block", type=int, default=5, help="batches each configuration trains back to back (the first is warm-up)")
    parser.add_argument("--rounds", type=int, default=3, help="blocks per configuration, in ABBA order")
    parser.add_argument("--profile-batches", type=int, default=16, help="batches of the profile recorded apart (the first is warm-up)")
    parser.add_argument("--iterations", type=int, default=100, help="batches each prediction replays")
    parser.add_argument("--guest-ms", default=None, help="two guest step lengths in ms (default 4,8 on CPU, 1,2 on CUDA)")
    parser.add_argument("--width", type=int, help="the job's hidden width")
    parser.add_argument("--micro-batch-size", type=int, help="the profiled micro-batch size")
    parser.add_argument("--gantt", type=Path, help="folder for one Gantt chart per configuration and stage")
    parser.add_argument("--out", type=Path, default=Path("runs/pipeline_replay"),
                        help="the profile, the measured timelines and the ranks' logs")
    args = parser.parse_args(argv)

    import torch

    from pipeline_bubble.profiling import MeasureRun, MLPJob, profile_and_measure, profile_pipeline

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    gpu = device == "cuda"
    if gpu:  # deterministic cuBLAS across the guest's stream and the job's (inherited by the ranks)
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    guests_s = tuple(float(v) / 1000 for v in (args.guest_ms or ("1,2" if gpu else "4,8")).split(","))
    job = MLPJob(width=args.width or (8192 if gpu else 1024), blocks=4)
    runs = configurations(args.micro_batch_size or (256 if gpu else 128), guests_s)
    args.out.mkdir(parents=True, exist_ok=True)
    load_before, started = os.getloadavg(), time.perf_counter()

    # profiled once on its own, as a user profiles a job: what the seeded executors start from
    apart = profile_pipeline(job, runs[0][1], batches=args.profile_batches, device=device, log_dir=args.out / "profile_logs")
    apart.save(args.out / "profile_apart.json")
    profiled_s = time.perf_counter() - started
    print(f"profiled {apart.config.label} on {device} in {profiled_s:.0f} s", flush=True)
    seeds = {name: predict(apart, config, iterations=args.iterations).typical for name, config, seeded in runs if seeded}
    measure_runs = [
        MeasureRun(config, [seeds[name].seed_windows(s) for s in range(config.stages)] if seeded else None)
        for name, config, seeded in runs
    ]
    # profiled again in the measuring processes, a block before every measured block: the same host state
    profile, measured_runs = profile_and_measure(job, runs[0][1], measure_runs, block=args.block, rounds=args.rounds,
                                                 device=device, log_dir=args.out / "measure_logs")
    profile.save(args.out / "profile.json")
    measured = dict(zip([name for name, _, _ in runs], measured_runs))
    measured_s = time.perf_counter() - started - profiled_s

    predictions, replay_ms = {}, {}
    for name, config, _ in runs:
        begin = time.perf_counter()
        replay(profile, config)
        replay_ms[name] = (time.perf_counter() - begin) * 1e3
        predictions[name] = predict(profile, config, iterations=args.iterations)
    (args.out / "measured.json").write_text(json.dumps({
        name: {"config": run.config.to_dict(), "seeded": run.seeded, "block": run.block, "guest_step_s": run.guest_step_s,
               "timelines": [t.to_dict() for t in run.timelines]}
        for name, run in measured.items()
    }))

    baselines = {config: measured[name] for name, config, _ in runs if config.guest_step_s is None}

    def rows_from(profile, predictions) -> list[dict]:
        rows = []
        for name, config, seeded in runs:
            run, baseline = measured[name], None
            prediction = predictions[name]
            if config.guest_step_s is not None:
                baseline = baselines[replace(config, guest_step_s=None)]
                steps = [s for s in run.guest_step_s if s]
                # predicted for the guest step the executor measured (what it plans with) and its seeding
                actual = replace(config, guest_step_s=sum(steps) / len(steps))
                prediction = predict(profile, actual, iterations=args.iterations, seeded=seeded)
            row = compare(prediction, run, baseline)
            row["name"], row["replay_ms"] = name, replay_ms[name]
            rows.append(row)
        return rows

    rows = rows_from(profile, predictions)
    summary = summarize_errors(rows)
    # the same predictions from the profile recorded apart, before the measurement: the host's drift
    apart_summary = summarize_errors(rows_from(apart, {name: predict(apart, config, iterations=args.iterations) for name, config, _ in runs}))
    seeded, unseeded = measured["guests, m=4, seeded"], measured["guests, m=4, unseeded"]
    seeding = {
        "configuration": seeded.config.label,
        "first_batches_guest_s": {"unseeded": unseeded.guest_s_by_batch()[:3], "seeded": seeded.guest_s_by_batch()[:3]},
        "total_guest_s": {"unseeded": sum(unseeded.guest_s_by_batch()), "seeded": sum(seeded.guest_s_by_batch())},
        "at_least_as_much_from_the_first_batch": all(
            sum(seeded.guest_s_by_batch()[: k + 1]) >= sum(unseeded.guest_s_by_batch()[: k + 1]) for k in range(len(seeded.guest_s_by_batch()))
        ),
    }
    elsewhere = replace(profile, machine={**profile.machine, "cpu": "another CPU", "host": "another-host"})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        replay(elsewhere, profile.config)
    foreign = [str(w.message) for w in caught if issubclass(w.category, ReplayWarning)]

    print(format_rows(rows))
    it, bub = summary["iteration_error"], summary["bubble_error_s"]
    theory = summary["theory_bubble_error_s"]
    print(
        f"iteration error: median {it['median']:.1%}, worst {it['worst']:.1%} ({summary['passed']['iteration']}/{len(rows)} within 5%); "
        f"the measured batch times' own spread (interquartile range / median): median "
        f"{summary['measured_iteration_spread']['median']:.1%}, worst {summary['measured_iteration_spread']['worst']:.1%}\n"
        f"bubble error: median {bub['median'] * 1e3:.1f} ms, worst {bub['worst'] * 1e3:.1f} ms ({summary['passed']['bubble']}/{len(rows)} "
        f"configurations with every stage within 10% or 2 ms); closed form: median {theory['uniform']['median'] * 1e3:.1f} ms, "
        f"worst {theory['uniform']['worst'] * 1e3:.1f} ms; with measured stage times: median "
        f"{theory['measured_stages']['median'] * 1e3:.1f} ms, worst {theory['measured_stages']['worst'] * 1e3:.1f} ms\n"
        f"guest slowdown error: median {summary['slowdown_error']['median']:.1%} points, worst {summary['slowdown_error']['worst']:.1%} "
        f"({summary['passed']['slowdown']}/{summary['passed']['of_slowdown']} within 2 points)\n"
        f"first-batch harvest, guest seconds in batches 0-2: unseeded {seeding['first_batches_guest_s']['unseeded']}, "
        f"seeded {seeding['first_batches_guest_s']['seeded']}\n"
        f"from the profile recorded apart, before the measurement: iteration error median {apart_summary['iteration_error']['median']:.1%}, "
        f"worst {apart_summary['iteration_error']['worst']:.1%} ({apart_summary['passed']['iteration']}/{len(rows)} within 5%); "
        f"bubbles {apart_summary['passed']['bubble']}/{len(rows)} within tolerance\n"
        f"replay of one configuration: {min(replay_ms.values()):.1f}-{max(replay_ms.values()):.1f} ms; "
        f"a foreign profile warns: {bool(foreign)}",
        flush=True,
    )
    if args.gantt:
        from pipeline_bubble.plots import plot_stage_comparison

        args.gantt.mkdir(parents=True, exist_ok=True)
        for index, (name, config, _) in enumerate(runs):
            for stage in range(config.stages):
                plot_stage_comparison(predictions[name].typical.timelines[stage], measured[name].timelines[stage],
                                      args.gantt / f"{index:02d}_stage{stage}.png", title=name)
    import deepspeed

    report = {
        "commit": _commit(),
        "machine": fingerprint(),
        "device": device,
        "gpu": torch.cuda.get_device_name(0) if gpu else None,
        "deepspeed": deepspeed.__version__,
        "job": job.describe(),
        "profile": {"config": profile.config.to_dict(), "batches": profile.batches, "measured": profile.summary(),
                    "recorded": "in the measuring processes, a block before every measured block"},
        "profile_apart": {"batches": apart.batches, "measured": apart.summary(), "summary": apart_summary,
                          "recorded": "on its own before the measurement; seeds the seeded executors"},
        "settings": {"block": args.block, "rounds": args.rounds, "profile_batches": args.profile_batches, "iterations": args.iterations, "guest_s": guests_s},
        "rows": rows,
        "summary": summary,
        "seeding": seeding,
        "foreign_machine_warning": foreign,
        "wall_s": {"profile": profiled_s, "measure": measured_s, "total": time.perf_counter() - started},
        "host_load_1m": [load_before[0], os.getloadavg()[0]],  # before / after: other work on the host skews CPU runs
    }
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
