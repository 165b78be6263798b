"""The `hpo` command: `run`, `validate`, and the engines' subcommands.

Bad input never produces a traceback: a `SweepConfigError` prints each problem as
`FILE:LINE: key.path: message` and exits with status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from hpo.errors import SweepConfigError

EXIT_BAD_INPUT = 2


def _cmd_validate(args: argparse.Namespace) -> int:
    from hpo.sweep import describe_plan, load_sweep

    loaded = load_sweep(args.file)
    print(f"{args.file}: OK")
    print(describe_plan(loaded))
    return 0


def _submit_to_allocator(spec) -> int:
    """Queue the sweep with the cluster's allocator (tuning-aware policy) as a tuning job of as
    many groups as the sweep keeps in flight; the allocator then places them on idle GPUs and in
    pipeline jobs' bubbles."""
    import math

    from scheduler_bridge import jobs_api

    in_flight = spec.max_concurrent_trials or spec.run_cap or 10
    groups = max(1, math.ceil(in_flight / int(spec.fusion.max_members)))
    job_id = jobs_api.submit_sweep(spec.name, groups)
    print(f"sweep {spec.name!r} is tuning job {job_id} of the allocator ({groups} groups)")
    return job_id


def _cmd_run(args: argparse.Namespace) -> int:
    from hpo.sweep import build_tuner, describe_plan, load_sweep

    loaded = load_sweep(args.file)
    if args.dry_run:
        print(describe_plan(loaded))
        return 0
    from hpo.ray_runtime import ensure_ray

    fusion = loaded.spec.fusion
    if args.allocator and (fusion is None or not fusion.enabled or fusion.placement != "bubbles"):
        print(f"error: {args.file}: hpo run --allocator runs a sweep where the allocator places its groups; "
              "it needs fusion: {placement: bubbles, max_members: N}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.resume and not loaded.experiment_path.exists():
        print(f"error: nothing to resume at {loaded.experiment_path}", file=sys.stderr)
        return EXIT_BAD_INPUT
    ensure_ray(address=args.address, dashboard=args.dashboard)
    tuning_job = _submit_to_allocator(loaded.spec) if args.allocator else None
    try:
        tuner = build_tuner(loaded, show_progress=True)
        result = tuner.resume(str(loaded.experiment_path)) if args.resume else tuner.fit()
    finally:
        if tuning_job is not None:
            from scheduler_bridge import jobs_api

            jobs_api.cancel(tuning_job)  # the allocator withdraws the sweep's idle GPUs and bubbles
    paths = result.write()
    print()
    print(result.summary_table())
    print()
    try:
        best = result.best_result
    except RuntimeError:
        print("no trial reported the metric; see the error column in", paths["results"])
        return 1
    print(f"Best configuration ({result.metric} = {best.metrics[result.metric]:.4g}):")
    print(json.dumps(result.best_config, indent=2, default=str))
    for label, value in result.extras.items():
        print(f"{label}: {value}")
    print(f"results: {paths['results']}\nplot:    {paths['plot']}")
    return 0


def _cmd_coord_check(args: argparse.Namespace) -> int:
    from hpo.scaling import coord_check
    from hpo.trainables import TrainableNotFound, resolve_trainable
    from hpo.workload import Workload

    try:
        workload = resolve_trainable(args.trainable)
    except TrainableNotFound as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if not isinstance(workload, Workload):
        print(f"error: {args.trainable!r} is a function; the coordinate check needs a Workload", file=sys.stderr)
        return EXIT_BAD_INPUT
    config = dict(item.split("=", 1) for item in args.set)
    report = coord_check(
        workload,
        widths=args.widths,
        config={key: _literal(value) for key, value in config.items()},
        tolerance=args.tolerance,
        plot_path=args.plot,
        parametrization=args.parametrization,
    )
    print(report.summary())
    print(f"plot: {report.plot_path}")
    return 0 if report.ok else 1


def _literal(text: str) -> object:
    """`--set key=value` values: numbers as numbers, everything else as text."""
    for convert in (int, float):
        try:
            return convert(text)
        except ValueError:
            pass
    return text


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hpo", description="Hyperparameter tuning on Ray Tune (hydro-hpo).")
    commands = parser.add_subparsers(dest="command", required=True)

    run = commands.add_parser("run", help="run a YAML sweep")
    run.add_argument("file", help="sweep YAML file")
    run.add_argument("--resume", action="store_true", help="continue an interrupted sweep of the same name")
    run.add_argument("--dry-run", action="store_true", help="print the resolved plan without starting Ray")
    run.add_argument("--address", default=None, help="join an existing Ray cluster (default: RAY_ADDRESS or a local Ray)")
    run.add_argument("--dashboard", action="store_true", help="start the Ray dashboard with the local Ray")
    run.add_argument(
        "--allocator", action="store_true",
        help="submit the sweep to the cluster's allocator (hpo job start --policy tuning-aware): its fused groups "
        "run on idle GPUs and in pipeline jobs' bubbles, where the allocator places them (needs "
        "fusion.placement: bubbles)",
    )
    run.set_defaults(func=_cmd_run)

    validate = commands.add_parser("validate", help="check a YAML sweep without running it")
    validate.add_argument("file")
    validate.set_defaults(func=_cmd_validate)

    check = commands.add_parser("coord-check", help="muP coordinate check of a workload over several widths")
    check.add_argument("trainable", help="built-in example name or package.module:workload")
    check.add_argument("--widths", type=int, nargs="+", default=[32, 64, 128, 256])
    check.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="fixed config values")
    check.add_argument("--tolerance", type=float, default=None, help="largest allowed slope of log activation size")
    check.add_argument("--parametrization", choices=["mup", "sp"], default="mup")
    check.add_argument("--plot", default="coord_check.png")
    check.set_defaults(func=_cmd_coord_check)

    from scheduler_bridge.cli import add_sim_parser
    from scheduler_bridge.colocate import add_profile_parser
    from scheduler_bridge.job_cli import add_job_parser

    add_sim_parser(commands)
    add_profile_parser(commands)
    add_job_parser(commands)
    return parser


def _quiet_tune() -> None:
    """Tune's per-checkpoint warnings drown the progress lines on short trials."""
    import logging
    import os

    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    for name in ("ray", "ray.tune", "ray.train"):
        logging.getLogger(name).setLevel(logging.ERROR)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _quiet_tune()
    try:
        return args.func(args)
    except SweepConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
