"""The `hpo` command: `run`, `validate`, and the engines' subcommands.

Bad input never produces a traceback: a `SweepConfigError` prints each problem as
`FILE:LINE: key.path: message` and exits with status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hpo.base.ray_runtime import (  # before anything imports ray: loopback only
    BadClusterAddress, DashboardUnavailable, UnreachableCluster, use_token_auth_if_available,
)
from hpo.config.errors import SweepConfigError
from hpo.reporting.tune_errors import mlflow_refusal, storage_full, unreported_metric

EXIT_BAD_INPUT = 2
#: The sweep ran, but no finished trial reported its metric.
EXIT_NO_RESULT = 1
#: The sweep ran, and at least one trial errored (its best, if any, is still printed).
EXIT_TRIALS_ERRORED = 3
#: Stopped by Ctrl-C: a sweep before every trial ended (what finished is kept, `--resume` goes on), or any command.
EXIT_INTERRUPTED = 130
#: The disk holding the run is full: like bad input, the user must act before running again.
EXIT_STORAGE_FULL = 2


def _cmd_validate(args: argparse.Namespace) -> int:
    from hpo.config.preflight import preflight
    from hpo.config.sweep_file import describe_plan, load_sweep

    _join_with_token(args.address)
    loaded = load_sweep(args.file, execute=not args.no_exec, for_ray=False)
    warnings = preflight(loaded, address=args.address)
    _print_warnings(warnings, loaded.source.name)
    checks = "static checks only: the trainable's code was not run" if args.no_exec else "all checks"
    if warnings:
        checks += f"; {len(warnings)} warning{'s' if len(warnings) > 1 else ''} above"
    print(f"{args.file}: OK ({checks})")
    print(describe_plan(loaded))
    return 0


def _join_with_token(address: str | None) -> None:
    """A cluster given by address gets the token this user holds for it, as `hpo job` gives it
    (`use_token_auth_if_available`); before the sweep file's code imports ray, which reads the mode."""
    if address or os.environ.get("RAY_ADDRESS"):
        use_token_auth_if_available()


def _print_warnings(notes: list, source: str) -> None:
    for note in notes:
        print(note.format(source), file=sys.stderr)


def _submit_to_allocator(spec) -> int:
    """Queue the sweep with the cluster's allocator (tuning-aware policy) as a tuning job of as
    many groups as the sweep keeps in flight; the allocator then places them on idle GPUs and in
    pipeline jobs' bubbles."""
    import math

    from scheduler_bridge.live import client as allocator

    in_flight = spec.max_concurrent_trials or spec.run_cap or 10
    groups = max(1, math.ceil(in_flight / int(spec.fusion.max_members)))
    job_id = allocator.submit_sweep(spec.name, groups)
    print(f"sweep {spec.name!r} is tuning job {job_id} of the allocator ({groups} groups)")
    return job_id


def _cmd_run(args: argparse.Namespace) -> int:
    from hpo.config.preflight import preflight
    from hpo.config.sweep_file import describe_plan, load_sweep

    _join_with_token(args.address)
    loaded = load_sweep(args.file, for_ray=not args.dry_run)
    if args.address and not args.dry_run:
        _start_ray(loaded, args.address)  # the cluster preflight checks is the one the sweep runs on
    _print_warnings(preflight(loaded, address=args.address), loaded.source.name)  # before a local Ray starts
    if args.dry_run:
        print(describe_plan(loaded))
        return 0
    from hpo.reporting.dashboard_actor import SweepNameTaken
    from hpo.tuner.sweep import build_tuner

    from hpo.config.spec import fused_placement

    if args.allocator and fused_placement(loaded.spec.fusion) != "bubbles":
        print(f"error: {args.file}: hpo run --allocator runs a sweep where the allocator places its groups; "
              "it needs fusion: {placement: bubbles, max_members: N}", file=sys.stderr)
        return EXIT_BAD_INPUT
    run_path = None
    if args.resume:
        from hpo.tuner.run_folders import RunStateError, latest_run, verify_run_state

        run_path = latest_run(Path(loaded.storage), loaded.spec.name)
        if run_path is None:
            print(f"error: nothing to resume at {loaded.experiment_path}", file=sys.stderr)
            return EXIT_BAD_INPUT
        try:
            verify_run_state(run_path)  # before Ray starts: a damaged run is refused, never started over
        except RunStateError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_BAD_INPUT
    started = time.perf_counter()
    ray_was_up = "ray" in sys.modules and sys.modules["ray"].is_initialized()  # a test's, a notebook's: theirs to stop
    tuner = tuning_job = None
    try:
        _start_ray(loaded, args.address, args.dashboard)
        ray_up = time.perf_counter()
        tuning_job = _submit_to_allocator(loaded.spec) if args.allocator else None
        tuner = build_tuner(loaded, show_progress=True)
        result = tuner.resume(str(run_path)) if run_path is not None else tuner.fit()
    except KeyboardInterrupt:
        # A Ctrl-C while Tune's fit runs is an orderly stop (reported below, see
        # hpo.tuner.stop_signal); this one came before the fit (Ray starting, the trainable
        # loading), or was a second one while Tune saved its last state.
        print(_interrupted(getattr(tuner, "run_path", None) or run_path, args.file), file=sys.stderr)
        return EXIT_INTERRUPTED
    except SweepConfigError:
        raise  # already one line (a tracking store MLflow refuses names the key it was read from)
    except SweepNameTaken as exc:  # another sweep of this name runs on the cluster
        raise loaded.fail("name", exc.reason) from None
    except Exception as exc:
        if loaded.spec.scaling is not None:  # the proxy's coordinate check failed: the model is the user's to fix
            from hpo.scaling import ScalingError

            if isinstance(exc, ScalingError):
                raise loaded.fail("scaling", " ".join(str(exc).split())) from None
        if (refusal := mlflow_refusal(exc)) is not None:
            raise loaded.fail("logging.mlflow", f"MLflow refused a trial's metric or parameter: {refusal.rstrip('.')}; Tune stopped "
                              "the sweep there: rename it in the trainable or the search space, or drop logging.mlflow") from None
        reported = unreported_metric(exc)
        if reported is None:
            raise
        metric = loaded.spec.metric.name
        raise loaded.fail("metric.name", f"a trial's result has no {metric!r} (it reported: {reported or 'see above'}); "
                          "Tune stopped the sweep at that result: report it, or name a metric the trainable "
                          "reports") from None
    finally:
        if tuning_job is not None:
            from scheduler_bridge.live import client as allocator

            allocator.cancel(tuning_job)  # the allocator withdraws the sweep's idle GPUs and bubbles
    status = _report(result, args.file)
    swept = time.perf_counter() - ray_up
    if not ray_was_up:  # what Ray's workers still send arrives now, not after the last line
        import ray

        ray.shutdown()
    # what the sweep cost, apart from Ray's start (`benchmarks/quickstart_run.py` reads this line)
    print(f"time:    sweep {swept:.1f} s (Ray started in {ray_up - started:.1f} s)")
    return status


def _interrupted(run: Path | None, sweep_file: str) -> str:
    """The line for a Ctrl-C that stopped `hpo run` outside Tune's own handling of it; whether
    anything ran is `--resume`'s own test (`nothing_ran`), so the line and `--resume` agree."""
    from hpo.tuner.run_folders import nothing_ran

    if run is None or nothing_ran(run):
        return f"error: interrupted before any trial ran; nothing was lost; start it again with: hpo run {sweep_file}"
    return f"error: interrupted; what finished is kept in {run}; continue it with: hpo run {sweep_file} --resume"


def _start_ray(loaded, address: str | None, dashboard: bool = False) -> None:
    """Start or join Ray; a trainable beside the sweep file travels to every worker with its
    folder, wherever `hpo run` runs. A folder Ray will not ship (over its package size limit) is
    the sweep's error, in one line."""
    import ray
    from ray.exceptions import RuntimeEnvSetupError

    from hpo.base.ray_runtime import ensure_ray
    from hpo.reporting.trial_output import quiet_ray_on_workers

    quiet_ray_on_workers()  # Tune's INFO lines stay off the console among the trials' prints
    # and those logged before a trial's code runs (Tune's "Restored on ..." as a resumed trial
    # starts): the local Ray's workers read this level when they start
    os.environ.setdefault("RAY_LOGGER_LEVEL", "warning")
    folder = loaded.code_folder
    try:
        ensure_ray(address=address, dashboard=dashboard, code_folder=folder, exclude=[loaded.storage])
    except RuntimeEnvSetupError as exc:
        ray.shutdown()  # the local Ray had started; its agents would otherwise linger
        reason = str(exc.__cause__ or exc).strip().splitlines()[-1]
        raise loaded.fail("trainable", f"Ray cannot ship the trainable's folder {folder} to its workers: {reason}") from None


def _report(result, sweep_file: str) -> int:
    """Print the table, the best configuration and the files (`hpo.reporting.console.report`); the exit
    status says whether every trial ran (0), the sweep was interrupted (EXIT_INTERRUPTED), some
    trial errored (EXIT_TRIALS_ERRORED), or none reported the metric (1)."""
    from hpo.reporting import console

    return _exit_status(console.report(result, f"hpo run {sweep_file} --resume"))


def _cmd_results(args: argparse.Namespace) -> int:
    """Reprint a stored run's table, best configuration and files; `--rebuild` first rewrites
    results.csv and summary.json from the trials' own folders (for a run whose state is damaged).
    A damaged results file is one line naming it (exit 2), as bad input is, never a traceback."""
    from hpo.reporting.rebuild import records_from_trial_dirs
    from hpo.reporting.results_files import (RESULTS_FILE, SUMMARY_FILE, names_reported_without, read_summary,
                                             summary_table, write_run_files)

    run = Path(args.run_dir)
    if run.is_file():  # a sweep file: its newest run, where `hpo run FILE` stored it
        run = _newest_run_of(run)
    summary_path = run / SUMMARY_FILE
    if args.rebuild:
        try:
            stored = read_summary(summary_path) if summary_path.exists() else {}
        except ValueError as exc:
            if not args.metric:
                print(f"error: {exc}; name the metric with --metric to rebuild without it", file=sys.stderr)
                return EXIT_BAD_INPUT
            stored = {}
        metric = args.metric or stored.get("metric")
        if not metric:
            print(f"error: {summary_path} is missing; name the metric with --metric", file=sys.stderr)
            return EXIT_BAD_INPUT
        mode = args.mode or stored.get("mode", "min")
        records = records_from_trial_dirs(run, _verdicts(run / RESULTS_FILE))
        if not records:
            print(f"error: {run}: no trial folders (*/params.json) to rebuild from", file=sys.stderr)
            return EXIT_BAD_INPUT
        if args.metric and (unknown := names_reported_without(records, metric)):
            print(f"error: --metric {metric!r}: no trial of {run} reported it (they reported: {unknown}); "
                  "nothing was rewritten", file=sys.stderr)
            return EXIT_BAD_INPUT
        write_run_files(run, records, metric, mode, stored.get("max_iterations"), stored.get("target"))
        print(f"rebuilt {run / RESULTS_FILE} from {len(records)} trial folders")
    if not (run / RESULTS_FILE).exists() or not summary_path.exists():
        print(f"error: {run}: no {RESULTS_FILE} and {SUMMARY_FILE}; is this a run folder? (try --rebuild)", file=sys.stderr)
        return EXIT_BAD_INPUT
    import pandas as pd

    try:
        summary = read_summary(summary_path)
        try:
            rows = pd.read_csv(run / RESULTS_FILE)
        except (ValueError, pd.errors.ParserError) as exc:  # EmptyDataError is a ValueError
            raise ValueError(f"{run / RESULTS_FILE}: damaged ({exc})") from None
    except ValueError as exc:
        print(f"error: {exc}; rebuild it from the trials' own folders: hpo results {run} --rebuild", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(summary_table(rows, summary["metric"]))
    print()
    best = summary.get("best")
    if best:
        from hpo.reporting.console import config_text

        print(f"Best configuration ({summary['metric']} = {best['value']:.4g}): {config_text(best['config'])}")
        if best.get("checkpoint"):
            print(f"best checkpoint: {best['checkpoint']}")
    if isinstance(summary.get("target"), dict):  # a scaled sweep's target, as hpo run printed it
        from hpo.reporting.console import target_lines

        print("\n".join(target_lines(summary["target"])))
    print(f"results: {run / RESULTS_FILE}\nsummary: {summary_path}")
    return _stored_verdict(summary, rows)


def _stored_verdict(summary: dict, rows: Any) -> int:
    """The exit status `hpo run` gave this run, by the same verdicts in the same order as its
    report (`console.report`), so a script that checks a stored run (or a run rebuilt after a
    crash) reads it as it read the sweep."""
    from hpo.reporting import console

    errored = int(summary.get("errored") or 0)
    running = sum(1 for status in (rows["status"] if "status" in rows else ()) if status == "running")
    if running:
        print(f"{running} of {len(rows)} trials had not ended: the sweep was stopped; hpo run FILE --resume goes on",
              file=sys.stderr)
        return _exit_status(console.INTERRUPTED)
    if errored:
        print(f"{errored} of {summary['trials']} trials errored", file=sys.stderr)
        return _exit_status(console.ERRORED)
    if not summary.get("best"):
        print(f"no finished trial reported {summary['metric']}", file=sys.stderr)
        return _exit_status(console.NO_RESULT)
    if line := console.target_error(summary.get("target") if isinstance(summary.get("target"), dict) else None):
        print(line, file=sys.stderr)
        return _exit_status(console.ERRORED)
    return _exit_status(console.OK)


def _exit_status(verdict: str) -> int:
    """The exit status of a sweep's verdict (`console.report`'s)."""
    from hpo.reporting import console

    return {console.OK: 0, console.INTERRUPTED: EXIT_INTERRUPTED, console.ERRORED: EXIT_TRIALS_ERRORED,
            console.NO_RESULT: EXIT_NO_RESULT}[verdict]


def _verdicts(results_file: Path) -> dict[str, str]:
    """How each trial ended, as results.csv said when it ended (Tune's verdicts: which trials its
    scheduler stopped is known only then); a `running` row was not decided yet."""
    import pandas as pd

    try:
        rows = pd.read_csv(results_file, usecols=["trial_id", "status"], dtype=str)
    except (OSError, ValueError, pd.errors.ParserError):
        return {}
    return {row.trial_id: row.status for row in rows.itertuples() if row.status != "running"}


def _newest_run_of(sweep_file: Path) -> Path:
    """The newest run of a sweep file (the one `--resume` continues); read without running its code."""
    from hpo.tuner.run_folders import latest_run
    from hpo.config.spec import SweepSpec
    from hpo.config.sweep_file import LoadedSweep, YamlSource

    source = YamlSource.from_file(sweep_file)
    loaded = LoadedSweep(SweepSpec.from_source(source), None, source)
    run = latest_run(Path(loaded.storage), loaded.spec.name)
    if run is None:
        raise loaded.fail("storage_path", f"no run of sweep {loaded.spec.name!r} in {loaded.storage}; run it with: hpo run {sweep_file}")
    return run


def _cmd_coord_check(args: argparse.Namespace) -> int:
    from pathlib import Path

    from hpo.scaling import depth_contract_problem
    from hpo.config.sweep_file import describe_exception
    from hpo.config.trainable_lookup import TrainableNotFound, resolve_trainable
    from hpo.base.hparams import OptimHParams
    from hpo.base.workload import Workload

    try:  # a module in the current folder is importable, as it is for `python -m`
        workload = resolve_trainable(args.trainable, search_dir=Path.cwd(), for_ray=False).obj
    except TrainableNotFound as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except Exception as exc:  # the module's own code failed (a SyntaxError included): one line
        print(f"error: importing {args.trainable!r} failed: {describe_exception(exc)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if not isinstance(workload, Workload):
        print(f"error: {args.trainable!r} is a function; the coordinate check needs a Workload", file=sys.stderr)
        return EXIT_BAD_INPUT
    config = {key: _literal(value) for key, value in dict(args.set).items()}
    try:  # the optimizer keys are read before any model is built: a bad value is the --set's
        OptimHParams.from_config(config)
    except ValueError as exc:
        print(f"error: --set: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.depths and (problem := depth_contract_problem(workload)):
        print(f"error: --depths: {problem}", file=sys.stderr)
        return EXIT_BAD_INPUT
    for option, points in (("--widths", args.widths), ("--depths", args.depths), ("--base-depth", args.base_depth)):
        sizes = points if isinstance(points, list) else [] if points is None else [points]
        if any(size <= 0 for size in sizes):
            print(f"error: {option}: sizes must be positive, got {points}", file=sys.stderr)
            return EXIT_BAD_INPUT
        if isinstance(points, list) and len(set(points)) < 2:  # a slope needs two sizes
            print(f"error: {option}: the coordinate check compares at least two sizes, got {points}", file=sys.stderr)
            return EXIT_BAD_INPUT
    if args.tolerance is not None and not args.tolerance > 0:
        print(f"error: --tolerance: must be positive, got {args.tolerance}", file=sys.stderr)
        return EXIT_BAD_INPUT
    common = dict(config=config, tolerance=args.tolerance, parametrization=args.parametrization)
    reports = []
    with warnings.catch_warnings(record=True) as messages:  # one line each, not a line of hpo's source
        warnings.simplefilter("always")
        code = _run_coord_checks(args, workload, common, reports)
    for message in messages:
        print(f"warning: {' '.join(str(message.message).split())}", file=sys.stderr)
    if code is not None:
        return code
    for report in reports:
        print(report.summary())
        print(f"plot: {report.plot_path}")
    return 0 if all(report.ok for report in reports) else 1


def _run_coord_checks(args: argparse.Namespace, workload: Any, common: dict[str, Any], reports: list) -> int | None:
    """The width and depth checks `args` ask for, appended to `reports`; an exit status on failure."""
    from hpo.config.sweep_file import describe_exception
    from hpo.scaling import ScalingError, coord_check, depth_coord_check

    try:  # a model muP cannot scale (no readout, a width it ignores) is the user's to fix: one line
        if args.widths or not args.depths:
            reports.append(coord_check(
                workload, widths=args.widths or [32, 64, 128, 256], readout=args.readout, plot_path=args.plot, **common
            ))  # fmt: skip
        if args.depths:
            plot = Path(args.plot)
            depth_plot = str(plot.with_name(f"{plot.stem}_depth{plot.suffix}"))
            reports.append(depth_coord_check(
                workload, args.depths, base_depth=args.base_depth, depth_alpha=args.depth_alpha, plot_path=depth_plot, **common
            ))  # fmt: skip
    except ScalingError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except Exception as exc:  # the workload's own code failed (its factory, its data): one line, where
        print(f"error: the coordinate check of {args.trainable!r} failed: {describe_exception(exc)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return None


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def _literal(text: str) -> object:
    """`--set key=value` values: numbers as numbers, true/false as booleans, everything else as text."""
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for convert in (int, float):
        try:
            return convert(text)
        except ValueError:
            pass
    return text


def _add_sim(commands) -> None:
    from scheduler_bridge.simulation.cli import add_sim_parser

    add_sim_parser(commands)


def _add_job(commands) -> None:
    from scheduler_bridge.live.cli import add_job_parser

    add_job_parser(commands)


def _add_profile(commands) -> None:
    """`hpo profile MEASUREMENT`: each measurement of the local device registers its own parser."""
    from pipeline_bubble.profile_cli import add_pipeline_parser
    from scheduler_bridge.live.colocate import add_colocate_parser

    profile = commands.add_parser("profile", help=ENGINE_COMMANDS["profile"][1])
    measurements = profile.add_subparsers(dest="profile_command", required=True)
    add_colocate_parser(measurements)
    add_pipeline_parser(measurements)


#: Subcommands whose parsers live with their engines. `hpo` registers each by name only and builds
#: the engine's own parser when the command runs, so `hpo --help` imports no engine (the simulator
#: alone pulls in pandas and scikit-learn): each register function imports its engine's parser
#: inside, when called. name -> (register function, one-line help, description shown by
#: `hpo NAME --help`, or None to keep the engine's own)
ENGINE_COMMANDS = {
    "sim": (
        _add_sim,
        "replay a cluster trace under scheduling policies",
        """Replay a cluster trace (Philly, Helios or Pollux CSV) under one or more scheduling policies.

Several policies (a comma list, or --compare) run on the same trace and print a table; --json then
holds a list of summaries. Bad input (missing file, malformed row, unknown policy) prints one line
naming it and exits with 2. The shipped traces go by name: philly, workload-1 ... workload-8 (Pollux,
load 1.0x), workloads-0.5/workload-N and workloads-1.5/workload-N.

examples:
  hpo sim --trace philly --policy fifo,qssf,sjf --gpus 500 --json out.json --plot out.png
  hpo sim --trace workload-1 --compare --gpus 64 --gpus-per-node 4
""",
    ),
    "job": (
        _add_job,
        "submit and manage jobs on the live allocator",
        """The cluster's live allocator from the shell: start it, submit, list and cancel jobs, stop it.

Every command joins an existing Ray cluster (--address, else RAY_ADDRESS, else auto). Bad input
prints one line naming it and exits with 2.

examples:
  hpo job start --journal /var/lib/hpo/journal.jsonl --storage /shared/hpo --policy qssf
  hpo job submit mypkg.train:main --gpus 4 --set lr=0.1
  hpo job list
""",
    ),
    "profile": (_add_profile, "measure workloads or a pipeline job on the local device", None),
}


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("hydro-hpo")
    except PackageNotFoundError:
        return "unknown (not installed)"


class _VersionAction(argparse.Action):
    """`--version` that reads the installed version only when asked (importlib.metadata is slow)."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, **kwargs) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        print(f"hpo (hydro-hpo) {_version()}")
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hpo", description="Hyperparameter tuning on Ray Tune (hydro-hpo).")
    parser.add_argument("--version", action=_VersionAction, help="print the installed version and exit")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = commands.add_parser(
        "run", help="run a YAML sweep", description="Run a YAML sweep. It is checked first, before Ray starts "
        "(the checks of `hpo validate`)."
    )
    run.add_argument("file", help="sweep YAML file; it names Python code that runs (see the README: Sweep files are code)")
    run.add_argument("--resume", action="store_true", help="continue an interrupted sweep of the same name")
    run.add_argument("--dry-run", action="store_true", help="check the sweep and print the plan without starting Ray")
    run.add_argument("--address", default=None, help="join an existing Ray cluster (default: RAY_ADDRESS or a local Ray)")
    run.add_argument("--dashboard", action="store_true", help="start the Ray dashboard with the local Ray")
    run.add_argument(
        "--allocator", action="store_true",
        help="submit the sweep to the cluster's allocator (hpo job start --policy tuning-aware): its fused groups "
        "run on idle GPUs and in pipeline jobs' bubbles, where the allocator places them (needs "
        "fusion.placement: bubbles)",
    )
    run.set_defaults(func=_cmd_run)

    validate = commands.add_parser(
        "validate", help="check a YAML sweep without running it",
        description="Check a sweep file and everything it names, without starting Ray: the schema, the "
        "trainable (its module, signature, metric and config keys), muP scaling (the model built at two "
        "widths) and the resources a trial asks for. Importing the trainable runs its module's code; "
        "--no-exec checks without running any.",
    )
    validate.add_argument("file", help="sweep YAML file")
    validate.add_argument(
        "--no-exec", action="store_true",
        help="static checks only: find and parse the trainable's module without importing it, so no code "
        "from the sweep runs (skips the metric, config-key and scaling checks)",
    )
    validate.add_argument("--address", default=None, help="check resources against this Ray cluster (default: RAY_ADDRESS or this machine)")
    validate.set_defaults(func=_cmd_validate)

    results = commands.add_parser("results", help="reprint a stored run's table, best configuration and files")
    results.add_argument("run_dir", help="the run's folder (storage_path/name), or the sweep file (its newest run)")
    results.add_argument("--rebuild", action="store_true",
                         help="first rebuild results.csv and summary.json from the trials' own folders")
    results.add_argument("--metric", default=None, help="with --rebuild when summary.json is missing: the metric")
    results.add_argument("--mode", choices=["min", "max"], default=None, help="with --rebuild: min or max")
    results.set_defaults(func=_cmd_results)

    check = commands.add_parser("coord-check", help="muP coordinate check of a workload over several widths (and depths)")
    check.add_argument("trainable", help="built-in example name or package.module:workload")
    check.add_argument("--widths", type=int, nargs="+", default=None,
                       help="model widths to compare (default: 32 64 128 256, unless only --depths is given)")
    check.add_argument("--depths", type=int, nargs="+", default=None,
                       help="also check across depth (CompleteP), e.g. 2 4 8 16; needs the workload's depth contract")
    check.add_argument("--base-depth", type=int, default=None, help="with --depths: depth where scaling is the identity (default: the shallowest)")
    check.add_argument("--depth-alpha", type=float, default=1.0, help="with --depths: 1 CompleteP (default), 0.5 Depth-muP")
    check.add_argument("--readout", default="readout",
                       help="module name of the output layer, muP's readout (default: readout; a sweep's scaling.readout)")
    check.add_argument("--set", action="append", default=[], type=_key_value, metavar="KEY=VALUE", help="fixed config values")
    check.add_argument("--tolerance", type=float, default=None, help="largest allowed slope of log activation size")
    check.add_argument("--parametrization", choices=["mup", "sp"], default="mup", help="muP (default) or standard parametrisation, to compare")
    check.add_argument("--plot", default="coord_check.png",
                       help="where to write the plot (default: coord_check.png; the depth check's gets a _depth suffix)")
    check.set_defaults(func=_cmd_coord_check)

    for name, (_, summary, _) in ENGINE_COMMANDS.items():
        # add_help=False: `hpo sim --help` reaches the engine's own parser with its arguments
        commands.add_parser(name, help=summary, add_help=False).set_defaults(engine=name)
    return parser


def _engine_args(name: str, argv: list[str]) -> argparse.Namespace:
    """Parse `hpo NAME ARGV...` with the engine's own parser, imported now."""
    register, _, description = ENGINE_COMMANDS[name]
    parser = argparse.ArgumentParser(prog="hpo")
    commands = parser.add_subparsers(dest="command", required=True)
    register(commands)
    if description is not None:  # the module's docstring is written for developers
        commands.choices[name].description = description
    return parser.parse_args([name, *argv])


def _quiet_tune() -> None:
    """Tune's own console output stays off for the process (`hpo.reporting.console.quiet_tune`)."""
    import logging

    from hpo.reporting.console import quiet_tune

    quiet_tune()
    # a full disk is reported in one line (see main); Tune's tracebacks of the same error would bury it
    for name in ("ray.tune.execution.tune_controller", "ray.tune.execution.experiment_state"):
        logging.getLogger(name).addFilter(lambda record: not (record.exc_info and storage_full(record.exc_info[1])))


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if getattr(args, "engine", None):
        args = _engine_args(args.engine, rest)
    elif rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    _quiet_tune()
    try:
        return args.func(args)
    except KeyboardInterrupt:  # before `hpo run` started its sweep, or in any other command
        print(f"error: interrupted ({args.command})", file=sys.stderr)
        return EXIT_INTERRUPTED
    except (SweepConfigError, BadClusterAddress, UnreachableCluster, DashboardUnavailable) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except Exception as exc:  # Tune wraps what its callbacks raise: a full disk is one line, anything else raises
        full = storage_full(exc)
        if full is None:
            raise
        print(f"error: {full.filename or 'the run folder'}: {full.strerror}; nothing half-written was kept (the "
              "files there are the last complete ones); free space, then run again (`hpo run FILE --resume` "
              "continues a sweep)", file=sys.stderr)
        return EXIT_STORAGE_FULL


def entry() -> None:
    """The `hpo` command's entry point: `main`, then a prompt exit.

    Once `main` returns, the results are written and Ray is stopped; what is left is Python's own
    teardown of the torch, Ray and pandas modules, which takes 1.5-2 s here (more than the report
    and Ray's shutdown together) and has nothing to save. Tests call `main`, which returns.
    """
    import os
    import signal

    status = main()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # what ran is written; a Ctrl-C now would only leave Ray running
    if "ray" in sys.modules:
        import ray

        ray.shutdown()  # what Ray's own atexit handler would do: stop the local Ray, close the driver
    import logging

    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


if __name__ == "__main__":
    entry()
