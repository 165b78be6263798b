"""``hpo job start|submit|list|cancel|stop``: the live allocator from the shell.

Wire into the main CLI with ``add_job_parser(subparsers)``; standalone:

    python -m scheduler_bridge.live.cli job start --journal /var/lib/hpo/journal.jsonl \\
        --storage /shared/hpo --policy qssf
    python -m scheduler_bridge.live.cli job submit mypkg.train:main --gpus 4 --set lr=0.1
    python -m scheduler_bridge.live.cli job list

Every command joins an existing Ray cluster (``--address``, else ``RAY_ADDRESS``,
else ``auto``). Bad input prints one line naming it and exits with 2.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from typing import NamedTuple

from ..policies.registry import POLICY_NAMES

EXIT_BAD_INPUT = 2


class _Knob(NamedTuple):
    """One of a policy's settings on ``hpo job start``: its flag, and the policy's keyword it sets."""

    flag: str
    type: type
    keyword: str
    help: str
    metavar: str | None = None


#: The CES and Lucid settings ``hpo job start`` takes. One table declares the flags and gathers the
#: ones given into the policy's keywords (``_given``), so a setting is never declared without being
#: passed on, or passed on under another name.
_KNOBS: dict[str, tuple[_Knob, ...]] = {
    "ces": (
        _Knob("--ces-spare-nodes", int, "spare_nodes", "ces: idle nodes kept on (default 1)"),
        _Knob("--ces-margin", float, "margin", "ces: headroom over the forecast (0.1)"),
        _Knob("--ces-interval", float, "interval", "ces: seconds without change before capacity is given back (300)"),
        _Knob("--ces-boot-delay", float, "boot_delay", "ces: node boot time, s (300)"),
        _Knob("--ces-max-nodes", int, "max_nodes", "ces: the autoscaler's GPU node limit (default: nodes seen)"),
    ),
    "lucid": (
        _Knob("--interference", str, "table",
              "lucid: interference table from 'hpo profile colocate' (default: the shipped one); "
              "jobs of equal GPU count are packed by it, classified by --workload or by profiling", "CSV"),
        _Knob("--pack-max-slowdown", float, "max_slowdown", "lucid: largest predicted slowdown (2.0)"),
        _Knob("--pack-gpu-memory-mb", float, "gpu_memory_mb", "lucid: one GPU's memory, MB (32768)"),
        _Knob("--pack-margin", float, "margin",
              "lucid: part a pair measured slower than predicted by this fraction (0.25)"),
        _Knob("--profile-nodes", int, "profile_nodes",
              "lucid: GPU nodes that first run jobs submitted without --workload, to classify them (2; 0: none)"),
        _Knob("--profile-seconds", float, "profile_s", "lucid: how long a job runs on the profiling nodes, s (300)"),
    ),
}


def _given(args: argparse.Namespace, policy: str) -> dict:
    """The policy's settings given on the command line, by the policy's keywords."""
    values = ((knob.keyword, getattr(args, knob.flag.lstrip("-").replace("-", "_"))) for knob in _KNOBS[policy])
    return {keyword: value for keyword, value in values if value is not None}


def _guarded(cmd):
    """Bad input or no cluster / allocator: one line on stderr, exit 2 (also under ``hpo``)."""
    def run(args) -> int:
        from hpo.base.ray_runtime import use_token_auth_if_available  # here: importing it sets Ray's loopback switch

        use_token_auth_if_available()
        try:
            return cmd(args)
        except (ValueError, ConnectionError, TimeoutError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_BAD_INPUT
        except Exception as exc:  # noqa: BLE001  -- Ray's own refusal: one line too
            from ray.exceptions import AuthenticationError
            if not isinstance(exc, AuthenticationError):
                raise
            print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
            return EXIT_BAD_INPUT
    run.__name__ = cmd.__name__
    return run


def _connect(address: str | None) -> None:
    import ray

    if not ray.is_initialized():
        from hpo.base.ray_runtime import cluster_address  # here: importing it sets Ray's loopback switch

        ray.init(address=cluster_address(address, "auto"), namespace="hpo", log_to_driver=False)


def _value(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _floats(flag: str, text: str) -> tuple[float, ...]:
    try:
        return tuple(float(x) for x in text.split(","))
    except ValueError:
        raise ValueError(f"{flag} expects comma-separated numbers, got {text!r}") from None


def _config(pairs: list[str]) -> dict:
    out = {}
    for pair in pairs:
        key, sep, val = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--set expects KEY=VALUE, got {pair!r}")
        out[key] = _value(val)
    return out


@_guarded
def _cmd_start(args) -> int:
    from . import client
    from ..policies.tiresias import Tiresias

    # the allocator and the jobs run in Ray's folders: a relative entry would be read from there
    pythonpath = os.pathsep.join(os.path.abspath(entry) for entry in args.pythonpath.split(os.pathsep)
                                 if entry) if args.pythonpath else None
    env = {"env_vars": {"PYTHONPATH": pythonpath}} if pythonpath else None
    # NaN passes every `< 0` check below and in the policies: refuse what is not finite first
    for knob in (*_KNOBS["ces"], *_KNOBS["lucid"]):
        value = getattr(args, knob.flag.lstrip("-").replace("-", "_"))
        if knob.type is float and value is not None and not math.isfinite(value):
            raise ValueError(f"{knob.flag} = {value!r} must be a finite number")
    if not math.isfinite(args.tiresias_starvation):
        raise ValueError(f"--tiresias-starvation = {args.tiresias_starvation!r} must be a finite number")
    tiresias = {}
    if args.tiresias_thresholds is not None:
        tiresias["thresholds"] = _floats("--tiresias-thresholds", args.tiresias_thresholds)
        if not all(map(math.isfinite, tiresias["thresholds"])):
            raise ValueError(f"--tiresias-thresholds = {args.tiresias_thresholds} must be finite GPU-seconds")
    if args.tiresias_starvation:
        tiresias["starvation"] = args.tiresias_starvation
    if tiresias and args.policy != "tiresias":
        raise ValueError(f"--tiresias-* options need --policy tiresias, got --policy {args.policy}")
    Tiresias(**tiresias)   # bad values fail here, before connecting
    ces = _given(args, "ces")
    if ces and not args.policy.startswith("ces:"):
        raise ValueError(f"--ces-* options need --policy ces:<base>, got --policy {args.policy}")
    if any(v < 0 for v in ces.values()):
        raise ValueError(f"--ces-* options must be >= 0, got {ces}")
    lucid = _given(args, "lucid")
    if lucid and args.policy != "lucid":
        raise ValueError(f"--interference, --pack-* and --profile-* options need --policy lucid, "
                         f"got --policy {args.policy}")
    if args.policy == "lucid":
        from .allocator import _live_lucid
        _live_lucid(dict(lucid), True, 0)   # a bad table or knob fails here, naming the row and column
    elif args.policy == "tuning-aware":
        from ..policies.registry import make_policy
        make_policy(args.policy, base=args.base_policy)   # an unknown --base-policy fails here
    _connect(args.address)
    client.start_allocator(args.journal, args.storage, args.policy, base_policy=args.base_policy,
                             backfill=args.backfill, runtime_env=env, tiresias=tiresias, ces=ces,
                             lucid=lucid)
    print(json.dumps(client.status(), indent=2))
    return 0


@_guarded
def _cmd_submit(args) -> int:
    from . import client

    fields = dict(name=args.name, user=args.user, vc=args.vc, config=_config(args.set),
                  batch_size=args.batch_size, min_batch=args.min_batch, max_batch=args.max_batch,
                  application=args.application, min_gpus=args.min_gpus, max_gpus=args.max_gpus,
                  expected_seconds=args.expected_seconds, bubble_fraction=args.bubble_fraction,
                  workload=args.workload)
    if args.bubble_profile:
        fields.update(bubble_lending(args.bubble_profile, args.gpus, args.bubble_fraction))
    from .job_state import JobSpec
    JobSpec(entrypoint=args.entrypoint, gpus=args.gpus, **fields)   # bad input fails before connecting
    _connect(args.address)
    print(client.submit(args.entrypoint, args.gpus, **fields))
    return 0


def bubble_lending(profile_path: str, gpus: int, bubble_fraction: float = 0.0) -> dict:
    """The JobSpec fields of a pipeline job whose bubbles its profile predicts (``hpo profile
    pipeline``): the idle GPU-seconds per iteration of the profiled configuration, replayed, for
    every one of its data-parallel copies, the iteration's length, and (unless given) the bubble
    fraction. A profile from another machine is used with a warning."""
    import warnings

    from pipeline_bubble.profile import load_profile
    from pipeline_bubble.replay import replay

    profile = load_profile(profile_path)
    stages = profile.config.stages
    if gpus % stages:
        raise ValueError(f"--bubble-profile {profile_path}: a {stages}-stage pipeline cannot run on {gpus} GPUs")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        predicted = replay(profile, profile.config)
    for warning in caught:
        print(f"warning: {warning.message}", file=sys.stderr)
    copies = gpus // stages
    fraction = bubble_fraction or min(0.99, sum(predicted.bubble_fraction()) / stages)
    return {"bubble_capacity_gpu_s": predicted.bubble_capacity_gpu_s() * copies,
            "iteration_s": predicted.iteration_s, "bubble_fraction": fraction}


@_guarded
def _cmd_list(args) -> int:
    from . import client

    _connect(args.address)
    jobs = client.list_jobs()
    if args.json:
        print(json.dumps(jobs, indent=2, default=str))
        return 0
    print(job_table(jobs))
    return 0


def job_table(jobs: list[dict]) -> str:
    """`hpo job list`'s table of job summaries. A placed job whose ranks are not all up yet shows as
    "starting": a rank can take a minute to start, and its run time counts only from then."""
    lines = [f"{'id':>4}  {'state':<9} {'gpus':>4} {'asked':>5} {'batch':>6} {'tries':>5}  {'name':<16} entrypoint"]
    for j in jobs:
        batch = "" if j["batch_size"] is None else j["batch_size"]
        state = "starting" if j["state"] == "running" and not j["ready"] else j["state"]
        lines.append(f"{j['job_id']:>4}  {state:<9} {j['gpus']:>4} {j['requested_gpus']:>5} {batch!s:>6} "
                     f"{j['attempt']:>5}  {j['name'][:16]:<16} {j['entrypoint']}")
    return "\n".join(lines)


@_guarded
def _cmd_cancel(args) -> int:
    from . import client

    _connect(args.address)
    ok = client.cancel(args.job_id)
    print("cancelled" if ok else "already ended")
    return 0


@_guarded
def _cmd_stop(args) -> int:
    from . import client

    _connect(args.address)
    client.stop_allocator(release_jobs=True)
    print("allocator stopped; its journal keeps the queue for the next start")
    return 0


def add_job_parser(subparsers) -> None:
    """Register ``job`` (with start, submit, list, cancel, stop) on an argparse ``subparsers``."""
    job = subparsers.add_parser("job", help="submit and manage jobs on the live allocator",
                                description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = job.add_subparsers(dest="job_command", required=True)

    def common(p):
        p.add_argument("--address", default=None, help="Ray cluster address (default: RAY_ADDRESS or auto)")
        return p

    st = common(sub.add_parser("start", help="start the allocator actor on this node"))
    st.add_argument("--journal", required=True, help="journal file on this node's local disk")
    st.add_argument("--storage", required=True, help="checkpoint folder every GPU node can reach")
    st.add_argument("--policy", default="fifo", choices=POLICY_NAMES, help="scheduling policy (default: fifo)")
    st.add_argument("--base-policy", default="fifo", help="ordinary-job policy under tuning-aware")
    st.add_argument("--backfill", default=None, action=argparse.BooleanOptionalAction,
                    help="greedy backfill for queue policies (default: on)")
    st.add_argument("--pythonpath", default=None, help="PYTHONPATH for the allocator and its jobs")
    st.add_argument("--tiresias-thresholds", default=None, metavar="GPU_S[,GPU_S...]",
                    help="tiresias: attained GPU-seconds that demote a job to the next queue "
                         "(default one threshold at 16 GPU-hours)")
    st.add_argument("--tiresias-starvation", type=float, default=0.0,
                    help="tiresias: promote a job back to the first queue after waiting this many "
                         "times its run time (0: never)")
    for knob in (*_KNOBS["ces"], *_KNOBS["lucid"]):
        st.add_argument(knob.flag, type=knob.type, default=None, metavar=knob.metavar, help=knob.help)
    st.set_defaults(func=_cmd_start)

    sm = common(sub.add_parser("submit", help="queue a training job; prints its id"))
    sm.add_argument("entrypoint", help="package.module:function, called with a JobContext")
    sm.add_argument("--gpus", type=int, default=1, help="GPUs the job asks for (default: 1)")
    sm.add_argument("--name", default="", help="a name shown by hpo job list")
    sm.add_argument("--user", default=os.environ.get("USER", ""), help="who submits it (default: $USER)")
    sm.add_argument("--vc", default="", help="virtual cluster / team (QSSF history key)")
    sm.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="entry-point config (ctx.config); values parsed as JSON when they can be")
    sm.add_argument("--batch-size", type=int, default=None, help="elastic: the global batch size asked for")
    sm.add_argument("--min-batch", type=int, default=None, help="elastic: smallest global batch a resize may pick")
    sm.add_argument("--max-batch", type=int, default=None, help="elastic: largest global batch a resize may pick")
    sm.add_argument("--application", default=None, help="measured profile: makes the job elastic")
    sm.add_argument("--min-gpus", type=int, default=None, help="elastic: fewest GPUs the job runs on")
    sm.add_argument("--max-gpus", type=int, default=None, help="elastic: most GPUs the job runs on")
    sm.add_argument("--expected-seconds", type=float, default=3600.0, help="run-time hint (SJF/SRTF)")
    sm.add_argument("--bubble-fraction", type=float, default=0.0,
                    help="pipeline job: fraction of time its GPUs idle in bubbles")
    sm.add_argument("--bubble-profile", default=None, metavar="PROFILE.json",
                    help="pipeline job: its profile (hpo profile pipeline); the replay's predicted bubble "
                         "capacity sends tuning sweeps to the job with the most room")
    sm.add_argument("--workload", default="", help="its name in the interference table (packing)")
    sm.set_defaults(func=_cmd_submit)

    ls = common(sub.add_parser("list", help="all jobs and their state"))
    ls.add_argument("--json", action="store_true", help="print the jobs as JSON")
    ls.set_defaults(func=_cmd_list)

    cc = common(sub.add_parser("cancel", help="cancel a queued or running job"))
    cc.add_argument("job_id", type=int, help="the id hpo job submit printed")
    cc.set_defaults(func=_cmd_cancel)

    sp = common(sub.add_parser("stop", help="stop the allocator (the journal keeps the queue)"))
    sp.set_defaults(func=_cmd_stop)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="hpo")
    add_job_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
