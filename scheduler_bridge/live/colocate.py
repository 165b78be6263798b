"""``hpo profile colocate``: measure how the project's workloads slow each other down.

Each workload (``WORKLOADS``: the example MLP and character GPT of ``hpo.examples`` at
two sizes) trains in its own process on the local device. For every pair, both are
measured alone and then together, in the same run and back to back, so the
slowdown (alone / together steps per second) is taken under the same
background load. On a CPU both processes are pinned to the same cores (one
device, shared, as two jobs packed on one GPU share it) with ``--threads``
torch threads each; on a GPU both use ``cuda:0``. The result is an interference table CSV
(``interference.InterferenceTable``) headed by a description of the machine.

    hpo profile colocate --out interference.csv --seconds 3

Bad arguments (unknown workload, unwritable output, non-positive seconds)
print one line and exit with 2, before anything is measured.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import math
import multiprocessing as mp
import os
import platform
import queue
import sys
import time
from pathlib import Path

from hpo.base.machine import cpu_name

from ..interference import write_table
from .memory_probe import PeakMemory

WORKER_TIMEOUT = 600.0  # seconds a worker may take to start up and report
# name -> (example in ``hpo.examples``, config overrides)
WORKLOADS = {
    "mlp-small": ("mlp_digits", {"width": 64, "depth": 2, "batch_size": 64}),
    "mlp-large": ("mlp_digits", {"width": 512, "depth": 3, "batch_size": 128}),
    "gpt-small": ("char_gpt", {"width": 64, "n_layer": 2, "batch_size": 32}),
    "gpt-large": ("char_gpt", {"width": 128, "n_layer": 3, "block_size": 64, "batch_size": 32}),
}


def _workload(example: str):
    """The example's ``Workload``, imported in the worker that trains it (it imports torch)."""
    from hpo.examples import char_gpt, mlp_digits

    return {"mlp_digits": mlp_digits, "char_gpt": char_gpt}[example].workload


def _train(name: str, device: str, cores: list[int], threads: int, warmup: float, seconds: float,
           barrier, results) -> None:
    """Worker process: build the workload, warm up, wait for the partner, count steps."""
    import torch

    from hpo.base.hparams import OptimHParams, workload_optimizer

    if device == "cpu":
        os.sched_setaffinity(0, cores)
    torch.set_num_threads(threads)
    example, overrides = WORKLOADS[name]
    workload = _workload(example)
    config = workload.resolve(overrides)
    torch.manual_seed(0)
    memory = PeakMemory()
    model = workload.build_model(config).to(device)
    optimizer = workload_optimizer(workload, model, OptimHParams.from_config(config))
    batches = workload.train_batches(config, 0)

    def step() -> None:
        x, y = next(batches)
        loss = workload.loss(model(x.to(device)), y.to(device))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    end = time.perf_counter() + warmup
    while time.perf_counter() < end:
        step()
    if device != "cpu":
        torch.cuda.synchronize()
    barrier.wait()
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        step()
        steps += 1
    if device != "cpu":
        torch.cuda.synchronize()
    results.put((name, steps / (time.perf_counter() - start), memory.mb()))


def _run(names: list[str], device: str, cores: list[int], threads: int, warmup: float,
         seconds: float) -> list[tuple[str, float, float]]:
    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(len(names)), ctx.Queue()
    procs = [ctx.Process(target=_train, args=(n, device, cores, threads, warmup, seconds, barrier, results))
             for n in names]
    for p in procs:
        p.start()
    out: list[tuple[str, float, float]] = []
    deadline = time.monotonic() + WORKER_TIMEOUT + warmup + seconds
    try:
        while len(out) < len(procs):
            try:
                out.append(results.get(timeout=1.0))
                continue
            except queue.Empty:
                pass
            # a worker that died (its workload failed to import or build) sends nothing: say so now,
            # not after the timeout; its partner waits at the barrier for it forever
            dead = [p.exitcode for p in procs if p.exitcode]
            if dead:
                raise ProfileError(f"{'+'.join(names)}: profiling worker exited with {dead[0]} "
                                   "(its traceback is above)")
            if time.monotonic() > deadline:
                raise ProfileError(f"{'+'.join(names)}: no result within {WORKER_TIMEOUT:.0f} s "
                                   "(is the host overloaded?)")
    finally:
        for p in procs:
            if len(out) < len(procs):
                p.terminate()
            p.join()
    return out


class ProfileError(RuntimeError):
    """A measurement that could not be taken; reported as one line."""


def machine_lines(device: str, cores: list[int], threads: int, seconds: float) -> list[str]:
    import torch
    lines = [f"measured {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC by "
             "hpo profile colocate; each pair alone then together, back to back",
             f"host: {platform.machine()} {cpu_name()}, {os.cpu_count()} CPUs, "
             f"Python {platform.python_version()}, torch {torch.__version__}",
             f"device: {device}" + (
                 f" ({torch.cuda.get_device_name(0)})" if device == "cuda" else
                 f", both processes pinned to cores {cores}, {threads} torch thread(s) each"),
             f"{seconds:g} s of training per measurement; the host is shared with other jobs, "
             "so treat differences below ~10% as noise"]
    return lines


def measure(names: list[str], device: str, cores: list[int], seconds: float,
            warmup: float = 1.0, threads: int = 1, log=print) -> list[dict]:
    """Rows of the interference table for every unordered pair of ``names`` (self-pairs too)."""
    rows = []
    for a, b in itertools.combinations_with_replacement(names, 2):
        alone = {}
        for n in dict.fromkeys((a, b)):
            (_, rate, mem), = _run([n], device, cores, threads, warmup, seconds)
            alone[n] = (rate, mem)
        together = _run([a, b], device, cores, threads, warmup, seconds)
        if a == b:  # two copies: the slower one is what a packed copy can count on
            pairs = [(a, a, min(together, key=lambda r: r[1]))]
        else:  # results arrive in finishing order: match them by name
            by = {r[0]: r for r in together}
            pairs = [(a, b, by[a]), (b, a, by[b])]
        for w, partner, (_, rate, _) in pairs:
            rows.append({"workload": w, "partner": partner, "alone_steps_s": alone[w][0],
                         "together_steps_s": rate, "slowdown": alone[w][0] / rate,
                         "memory_mb": alone[w][1]})
            log(f"  {w:10s} beside {partner:10s}: {alone[w][0]:8.1f} -> {rate:8.1f} steps/s "
                f"(slowdown {alone[w][0] / rate:.2f})")
    return rows


def add_colocate_parser(subparsers) -> None:
    """Register ``colocate`` on the argparse ``subparsers`` of ``hpo profile``."""
    c = subparsers.add_parser("colocate", help="pairwise co-location slowdowns -> interference CSV",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    c.add_argument("--out", required=True, help="CSV to write")
    c.add_argument("--workloads", default=",".join(WORKLOADS),
                   help=f"comma list of: {', '.join(WORKLOADS)}")
    c.add_argument("--seconds", type=float, default=3.0, help="training seconds per measurement")
    c.add_argument("--warmup", type=float, default=1.0, help="seconds before measuring")
    c.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="where to measure (default: auto, CUDA when available)")
    c.add_argument("--cores", default=None, help="CPU cores both processes share (default: all allowed)")
    c.add_argument("--threads", type=int, default=1,
                   help="torch threads per process (more than one spins badly on a loaded host)")
    c.set_defaults(func=run_colocate)


def _fail(msg: str) -> int:
    print(f"hpo profile colocate: error: {msg}", file=sys.stderr)
    return 2


def run_colocate(args) -> int:
    # a workload named twice is one workload: its pairs are measured once, and the table has one row each
    names = list(dict.fromkeys(n.strip() for n in args.workloads.split(",") if n.strip()))
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown or not names:
        return _fail(f"--workloads: unknown {unknown or 'empty list'}; choose from {', '.join(WORKLOADS)}")
    for flag, v in (("--seconds", args.seconds), ("--warmup", args.warmup)):
        if not (math.isfinite(v) and 0 < v <= 3600) and not (flag == "--warmup" and v == 0):
            return _fail(f"{flag} = {v!r} must be in (0, 3600]")
    out = Path(args.out)
    if out.is_dir() or not out.parent.is_dir() or not os.access(out.parent, os.W_OK):
        return _fail(f"--out {out}: not a writable file path (does its folder exist?)")
    allowed = sorted(os.sched_getaffinity(0))
    try:
        cores = allowed if args.cores is None else [int(c) for c in args.cores.split(",")]
    except ValueError:
        return _fail(f"--cores {args.cores!r}: give a comma list of core numbers")
    if not set(cores) <= set(allowed) or not cores:
        return _fail(f"--cores {args.cores!r}: this process may use cores {allowed}")
    import torch
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        return _fail("--device cuda: no CUDA device here")
    if not 1 <= args.threads <= 256:
        return _fail(f"--threads = {args.threads} must be in [1, 256]")
    lines = machine_lines(device, cores, args.threads, args.seconds)
    print("\n".join(lines))
    try:
        rows = measure(names, device, cores, args.seconds, args.warmup, args.threads)
    except ProfileError as e:
        print(f"hpo profile colocate: error: {e}", file=sys.stderr)
        return 1
    write_table(out, rows, lines)
    print(f"wrote {len(rows)} rows to {out}")
    return 0
