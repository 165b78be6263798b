"""``hpo profile pipeline``: profile a DeepSpeed pipeline job once (or read a saved profile), predict
other configurations by replaying it, and with --measure run them too and print predicted against
measured.

The job file (YAML) names the job and what to profile and predict; every key but `profile` may be
left out::

    job: pipeline_bubble.profiling:MLPJob   # module:attribute, called with `options`; this is the default
    options: {width: 1024, blocks: 4}       # the bubble benchmark's model
    device: cpu                             # or cuda (every stage on GPU 0)
    batches: 8                              # profiled batches; the first is warm-up
    profile: {stages: 2, micro_batches: 4, micro_batch_size: 128}
    configurations:                         # what to predict; unset keys are the profiled ones
      - {micro_batches: 16}
      - {micro_batch_size: 64}
      - {split: [9, 4]}                     # layers per stage
      - {guest_step_s: 0.004}               # guest steps of 4 ms admitted into the bubbles

--config adds configurations on the command line (m=16,mbs=64,p=2,split=9:4,guest=4ms). A job
file names Python code that runs (as a sweep file does), and so does a saved profile with
--measure: the job it records is built again to be measured.

With a job file, --measure profiles the job once more in the processes that measure (a block of
the profiled configuration before every measured block, `profiling.profile_and_measure`), and
the table predicts from that profile, which --out then holds: a profile recorded apart carries
its own minute's host (on a shared CPU host, batches 13% longer in the minute after it). The
profile recorded first still seeds the guests' executors, which must start before the
measurement does. A saved profile (--profile) is what the table checks, so it is not re-recorded.

    hpo profile pipeline job.yaml --out profile.json --measure --gantt gantt/
    hpo profile pipeline --profile profile.json --config m=16 --config m=8,guest=4ms

Bad input prints one line naming the file, line and key (or the flag) and exits with 2; the job file is
read as a sweep file is (a key given twice is refused, 1e-3 is a number).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tempfile
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from hpo.base.exceptions import describe_exception
from pipeline_bubble.profile import PipelineConfig, ProfileError, config_from_dict, load_profile

#: The short names --config takes, and the PipelineConfig field each sets.
_SHORT = {"p": "stages", "m": "micro_batches", "mbs": "micro_batch_size", "split": "split", "guest": "guest_step_s"}
DEFAULT_JOB = "pipeline_bubble.profiling:MLPJob"


class UsageError(ValueError):
    """Bad input: printed as one line, exit status 2."""


def add_pipeline_parser(subparsers) -> None:
    """Register ``pipeline`` on the ``hpo profile`` subcommand's ``subparsers``."""
    p = subparsers.add_parser(
        "pipeline",
        help="profile a DeepSpeed pipeline job once, predict other configurations by replay",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("job_file", nargs="?", help="the job file (YAML) to profile; see above")
    p.add_argument("--profile", help="read this saved profile instead of profiling")
    p.add_argument("--out", default="pipeline_profile.json", help="where to save a new profile (default: pipeline_profile.json)")
    p.add_argument("--config", action="append", default=[], metavar="KEY=VALUE,...",
                   help="a configuration to predict: p, m, mbs, split (a:b:..), guest (seconds or Nms); repeatable")
    p.add_argument("--measure", action="store_true", help="also run every configuration and print measured beside predicted")
    p.add_argument("--batches", type=int, default=12,
                   help="measured batches per configuration, in two rounds of back-to-back batches (default: 12)")
    p.add_argument("--iterations", type=int, default=100, help="batches each prediction replays (default: 100)")
    p.add_argument("--gantt", help="folder for one Gantt chart per configuration and stage, predicted above measured")
    p.add_argument("--json", help="write the predictions (and measurements) here")
    p.add_argument("--device", choices=("cpu", "cuda"), help="where to profile and measure (default: the job file's, else cpu)")
    p.set_defaults(func=run_pipeline_profile)


def _fail(message: str) -> int:
    print(f"hpo profile pipeline: error: {message}", file=sys.stderr)
    return 2


def parse_config(text: str, base: PipelineConfig) -> PipelineConfig:
    """`m=16,mbs=64,split=9:4,guest=4ms` on top of `base` (split and guest start unset)."""
    values: dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or key not in _SHORT:
            raise UsageError(f"--config {text!r}: {item!r} is not KEY=VALUE with KEY one of {', '.join(_SHORT)}")
        field = _SHORT[key]
        try:
            if field == "split":
                values[field] = tuple(int(n) for n in value.split(":"))
            elif field == "guest_step_s":
                match = re.fullmatch(r"([0-9.]+(?:e-?[0-9]+)?)(ms|s)?", value)
                if match is None:
                    raise ValueError(value)
                values[field] = float(match.group(1)) / (1000 if match.group(2) == "ms" else 1)
            else:
                values[field] = int(value)
        except ValueError:
            raise UsageError(f"--config {text!r}: {key}={value!r} is not a valid value") from None
    try:
        return replace(base, **{"split": None, "guest_step_s": None, **values})
    except ValueError as error:
        raise UsageError(f"--config {text!r}: {error}") from None


def read_job_file(path: Path) -> dict[str, Any]:
    """The job file's settings, checked: each problem is one line naming the file, the line and the
    key (`at(key)` gives that prefix for the checks made later, against the job itself)."""
    from hpo.base.yaml_source import SweepConfigError, YamlSource

    try:  # as a sweep file is read: a key given twice is refused, 1e-3 is a number
        source = YamlSource.from_file(path, kind="job file")
    except SweepConfigError as error:
        raise UsageError(error.issues[0].format(error.source)) from None
    except OSError as error:
        raise UsageError(f"{path}: cannot read ({error.strerror or error})") from None
    data = source.data

    def at(key: str, label: str | None = None) -> str:
        line = source.line_of(key)
        return f"{path}{f':{line}' if line is not None else ''}: {label or key}"

    if not isinstance(data, dict):
        raise UsageError(f"{at('')}a mapping of job, options, device, batches, profile, configurations expected")
    known = {"job", "options", "device", "batches", "profile", "configurations"}
    unknown = sorted(set(data) - known, key=str)
    if unknown:
        raise UsageError(f"{at(str(unknown[0]))}: unknown key {unknown[0]!r}; known: {', '.join(sorted(known))}")
    if not isinstance(data.get("job", DEFAULT_JOB), str) or ":" not in data.get("job", DEFAULT_JOB):
        raise UsageError(f"{at('job')}: give module:attribute, got {data.get('job')!r}")
    if not isinstance(data.get("options", {}), dict):
        raise UsageError(f"{at('options')}: a mapping expected")
    if data.get("device", "cpu") not in ("cpu", "cuda"):
        raise UsageError(f"{at('device')}: cpu or cuda, got {data.get('device')!r}")
    batches = data.get("batches", 8)
    if not isinstance(batches, int) or isinstance(batches, bool) or batches < 2:
        raise UsageError(f"{at('batches')}: an integer >= 2 (the first is warm-up), got {batches!r}")
    if not isinstance(data.get("profile"), dict):
        raise UsageError(f"{at('profile')}: the configuration to profile, e.g. {{stages: 2, micro_batches: 4}}")
    try:
        profiled = config_from_dict(data["profile"], at("profile"))
        if profiled.guest_step_s is not None:
            raise UsageError(f"{at('profile.guest_step_s')}: a profile is recorded without guests; "
                             "give guest_step_s in a configuration to predict")
        entries = data.get("configurations") or []
        if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
            raise UsageError(f"{at('configurations')}: a list of mappings expected")
        base = replace(profiled, split=None, guest_step_s=None)
        configs = [config_from_dict({**base.to_dict(), **e}, at(f"configurations.{i}", f"configurations[{i}]"))
                   for i, e in enumerate(entries)]
    except ProfileError as error:
        raise UsageError(str(error)) from None
    return {
        "job": {"job": data.get("job", DEFAULT_JOB), "options": data.get("options") or {}},
        "device": data.get("device", "cpu"),
        "batches": batches,
        "profile": profiled,
        "configurations": configs,
        "at": at,
    }


def _check_output(flag: str, value: str | None, folder: bool = False) -> None:
    if value is None:
        return
    path = Path(value)
    parent = path if folder else path.parent
    if folder and path.exists() and not path.is_dir():
        raise UsageError(f"{flag} {value}: not a folder")
    if not folder and path.is_dir():
        raise UsageError(f"{flag} {value}: a folder, not a file path")
    if not folder and not parent.is_dir():
        raise UsageError(f"{flag} {value}: its folder does not exist")


def _check_nothing_overwritten(args) -> None:
    """No file this run writes is one it reads or another it writes: `--json profile.json` beside
    `--profile profile.json` would replace a profile (a minute or more of profiling) with predictions."""
    read = {"the job file": args.job_file, "--profile": args.profile}
    written = {"--out": args.out if args.job_file else None, "--json": args.json}  # --out: only a new profile
    seen: dict[Path, str] = {}
    for name, value in [*read.items(), *written.items()]:
        if value is None:
            continue
        path = Path(value).resolve()
        if path in seen and name in written:
            raise UsageError(f"{name} {value}: that is {seen[path]}, which this would overwrite; give another file")
        seen.setdefault(path, name)


def run_pipeline_profile(args) -> int:
    try:
        return _run(args)
    except UsageError as error:
        return _fail(str(error))


def _run(args) -> int:
    if (args.job_file is None) == (args.profile is None):
        raise UsageError("give a job file to profile or --profile FILE to read one (not both)")
    if args.batches < 4 or args.iterations < 1:
        raise UsageError(f"--batches must be >= 4 and --iterations >= 1, got {args.batches}, {args.iterations}")
    for flag, value, folder in (("--out", args.out, False), ("--json", args.json, False), ("--gantt", args.gantt, True)):
        _check_output(flag, value, folder)
    _check_nothing_overwritten(args)
    spec = read_job_file(Path(args.job_file)) if args.job_file else None
    profile = None
    if args.profile:
        try:
            profile = load_profile(args.profile)
        except ProfileError as error:
            raise UsageError(str(error)) from None
    profiled = spec["profile"] if spec else profile.config
    entries = [(spec["at"](f"configurations.{i}", f"configurations[{i}]"), c) for i, c in enumerate(spec["configurations"])] if spec else []
    entries += [(f"--config {text!r}", parse_config(text, profiled)) for text in args.config]
    configs = [config for _, config in entries]
    device = args.device or (spec["device"] if spec else profile.device.split(":")[0])
    if device == "cuda" and (spec is not None or args.measure):
        import torch

        if not torch.cuda.is_available():
            raise UsageError("device cuda: no CUDA device here")

    from pipeline_bubble.replay import predict, split_for

    job = None
    if spec is not None or args.measure:
        from pipeline_bubble.profiling import load_job

        where = args.job_file or args.profile
        try:  # the job's module beside the job file (or the saved profile) is found, as a sweep's trainable is
            job = load_job(spec["job"] if spec else profile.job, where, [Path(where).resolve().parent, Path.cwd()])
        except ValueError as error:
            raise UsageError(str(error)) from None
    # every configuration the profile can describe, before a minute of profiling and measuring
    if profile is None:
        layers, split = _job_shape(job, profiled, spec["at"])
    else:
        layers, split = len(profile.layers), profile.stage_split()
        if args.measure:  # the job the profile names, built again to be measured, must still be its job
            _job_shape(job, profile.config, lambda key: f"{args.profile}: {key}")
    for where, config in entries:
        try:
            split_for(config, layers, split)
        except ProfileError as error:
            raise UsageError(f"{where}: {error}") from None
    if profile is None:
        from pipeline_bubble.profiling import profile_pipeline

        print(f"profiling {profiled.label} of {spec['job']['job']} on {device} ({spec['batches']} batches)...", flush=True)
        with _ranks(f"profiling {profiled.label}") as logs:
            profile = profile_pipeline(job, profiled, batches=spec["batches"], device=device, log_dir=logs)
        profile.save(args.out)
        print(f"wrote {args.out}")
    configs = configs or [profile.config]

    predictions = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for config in configs:
            try:
                predictions.append(predict(profile, config, iterations=args.iterations))
            except ProfileError as error:
                raise UsageError(str(error)) from None
    for message in dict.fromkeys(str(w.message) for w in caught):
        print(f"warning: {message}", file=sys.stderr)

    measured = None
    if args.measure:
        with _ranks("measuring") as logs:
            measured, again = measure_configurations(job, configs, predictions, batches=args.batches, device=device,
                                                     profiled=profile.config if spec is not None else None, log_dir=logs)
        if again is not None:
            profile = again
            profile.save(args.out)
            print(f"wrote {args.out} (profiled in the measuring processes)")
        for i, (config, (run, _)) in enumerate(zip(configs, measured)):
            steps = [s for s in run.guest_step_s if s]
            guests = config.guest_step_s is not None and bool(steps)
            if guests:  # predicted for the guest step the executor measured
                config = replace(config, guest_step_s=sum(steps) / len(steps))
            if guests or again is not None:
                predictions[i] = predict(profile, config, iterations=args.iterations)
    report = _report(profile, predictions, measured)
    print(report["table"])
    if args.gantt:
        _gantts(Path(args.gantt), predictions, measured)
        print(f"wrote Gantt charts to {args.gantt}")
    if args.json:
        Path(args.json).write_text(json.dumps({k: v for k, v in report.items() if k != "table"}, indent=1))
        print(f"wrote {args.json}")
    return 0


@contextmanager
def _ranks(what: str) -> Iterator[Path]:
    """A folder for the ranks' logs while they run `what`: removed once they succeed, kept and named
    in one line when one fails (its exception, not every rank's traceback)."""
    from pipeline_bubble.launch import LaunchError

    logs = Path(tempfile.mkdtemp(prefix="hpo-profile-pipeline-"))
    try:
        yield logs
    except LaunchError as error:
        raise UsageError(f"{what} failed: {error.summary}; every rank's log is in {logs}") from None
    except BaseException:  # Ctrl-C: nothing to read there
        shutil.rmtree(logs, ignore_errors=True)
        raise
    shutil.rmtree(logs, ignore_errors=True)


def _job_shape(job, profiled: PipelineConfig, at: Callable[[str], str]) -> tuple[int, tuple[int, ...]]:
    """How many layers `job` builds, and their split over `profiled`'s stages (its own, else the job's
    default), checked before any rank starts; `at(key)` says where the file gives `key`."""
    try:
        layers = len(job.layers())
    except Exception as error:  # the job's own code
        raise UsageError(f"{at('options')}: building the job's layers failed: {describe_exception(error)}") from None
    split = profiled.split
    if split is None:
        try:
            split = tuple(job.default_split(profiled.stages))
        except ValueError as error:
            raise UsageError(f"{at('profile')}: {error}") from None
        except Exception as error:
            raise UsageError(f"{at('profile')}: the job's default_split({profiled.stages}) failed: {describe_exception(error)}") from None
    if sum(split) != layers:
        raise UsageError(f"{at('profile')}: the split {list(split)} holds {sum(split)} layers; the job has {layers}")
    return layers, split


def measure_configurations(job, configs: list[PipelineConfig], predictions, *, batches: int, device: str,
                           profiled: PipelineConfig | None = None, log_dir: str | Path | None = None) -> tuple[list, Any]:
    """Measure `configs` (each with guests seeded by its prediction), adding each guest configuration's
    baseline (the same without guests) where it is not already among them; returns one entry per
    config, its `Measured` and its baseline's (or None), and, given `profiled`, that configuration's
    profile recorded in the processes that measured those with its stage count (else None)."""
    from pipeline_bubble.profiling import MeasureRun, measure, profile_and_measure

    runs, index = [], {}
    for config, prediction in zip(configs, predictions):
        for wanted in ([replace(config, guest_step_s=None)] if config.guest_step_s is not None else []) + [config]:
            if wanted not in index:
                seed = None
                if wanted.guest_step_s is not None:
                    seed = [prediction.typical.seed_windows(s) for s in range(wanted.stages)]
                index[wanted] = len(runs)
                runs.append(MeasureRun(wanted, seed))
    by_stages: dict[int, list[int]] = {}
    for i, run in enumerate(runs):
        by_stages.setdefault(run.config.stages, []).append(i)
    results: list = [None] * len(runs)
    again = None
    for stages, members in by_stages.items():
        print(f"measuring {len(members)} configuration(s) of {stages} stages, {batches} batches each...", flush=True)
        block = max(2, batches // 2)  # two rounds of back-to-back batches, ABBA
        group = [runs[i] for i in members]
        if profiled is not None and profiled.stages == stages:
            again, group_results = profile_and_measure(job, profiled, group, block=block, device=device, log_dir=log_dir)
        else:
            group_results = measure(job, group, block=block, device=device, log_dir=log_dir)
        for i, result in zip(members, group_results):
            results[i] = result
    out = []
    for config in configs:
        baseline = results[index[replace(config, guest_step_s=None)]] if config.guest_step_s is not None else None
        out.append((results[index[config]], baseline))
    return out, again


def _report(profile, predictions, measured) -> dict[str, Any]:
    from pipeline_bubble.accuracy import compare, format_rows, summarize_errors

    if measured is None:
        # each column as wide as its widest cell: an 8-stage split's label or bubbles pushed the rest out of line
        rows = [("configuration", "iteration ms", "bubble per stage ms", "capacity GPU-ms/it", "guest slowdown")]
        for p in predictions:
            rows.append((p.config.label, f"{p.iteration_s * 1e3:.1f}", " ".join(f"{b * 1e3:.1f}" for b in p.bubble_s),
                         f"{p.typical.bubble_capacity_gpu_s() * 1e3:.1f}", f"{p.slowdown:+.1%}" if p.slowdown is not None else ""))
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        lines = [" ".join([row[0].ljust(widths[0])] + [cell.rjust(w) for cell, w in zip(row[1:], widths[1:])]).rstrip()
                 for row in rows]
        return {"profile": profile.config.to_dict(), "machine": profile.machine, "predictions": [p.to_dict() for p in predictions],
                "table": "\n".join(lines)}
    rows = [compare(p, m, b) for p, (m, b) in zip(predictions, measured)]
    summary = summarize_errors(rows)
    table = format_rows(rows) + (
        f"\niteration error: median {summary['iteration_error']['median']:.1%}, worst {summary['iteration_error']['worst']:.1%}"
        f"; bubble error: median {summary['bubble_error_s']['median'] * 1e3:.1f} ms, worst {summary['bubble_error_s']['worst'] * 1e3:.1f} ms"
    )
    return {"profile": profile.config.to_dict(), "machine": profile.machine, "predictions": [p.to_dict() for p in predictions],
            "rows": rows, "summary": summary, "table": table}


def _gantts(folder: Path, predictions, measured) -> None:
    from pipeline_bubble.plots import plot_stage_comparison

    folder.mkdir(parents=True, exist_ok=True)
    for i, prediction in enumerate(predictions):
        slug = re.sub(r"[^A-Za-z0-9.]+", "_", prediction.config.label).strip("_")
        timelines = measured[i][0].timelines if measured else [None] * prediction.config.stages
        for stage, observed in enumerate(timelines):
            plot_stage_comparison(prediction.typical.timelines[stage], observed, folder / f"{slug}_stage{stage}.png",
                                  title=prediction.config.label)
