"""Start a DeepSpeed pipeline job as real separate processes on one host (gloo) and collect results.

Each rank is a `spawn`ed process with the usual RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR /
MASTER_PORT environment (a free port is picked), one intra-op thread unless told otherwise, and
its stdout/stderr sent to `log_dir/rank<r>.log` (DeepSpeed prints a lot). The worker is a
module-level function `worker(rank, world_size, payload) -> result`; results come back in rank
order. A failing rank fails the launch (`LaunchError`) with the tail of every rank's log, and
in one line (`LaunchError.summary`) with the first exception raised: the other ranks then fail
only because their peer has gone.

On a single GPU, `same_device=True` gives every rank `LOCAL_RANK=0`: all stages share cuda:0.
NCCL refuses two ranks on one device and gloo has no CUDA send/recv, so then the worker calls
`deepspeed_adapter.stage_cuda_on_host()`, which lets DeepSpeed's gloo path copy CUDA tensors
through host memory.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp

from hpo.base.exceptions import describe_exception


class LaunchError(RuntimeError):
    """A rank failed or the launch timed out. `str()` has every rank's log tail; `summary` is one
    line: the rank whose exception came first and that exception (`describe_exception`)."""

    def __init__(self, message: str, summary: str):
        super().__init__(message)
        self.summary = summary


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _entry(worker, rank, world_size, port, payload, result_dir, log_dir, threads, same_device):
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK="0" if same_device else str(rank),
        LOCAL_WORLD_SIZE=str(world_size),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    log = open(Path(log_dir) / f"rank{rank}.log", "w", buffering=1)
    sys.stdout = sys.stderr = log
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    torch.set_num_threads(threads)
    try:
        result = worker(rank, world_size, payload)
        torch.save(result, Path(result_dir) / f"rank{rank}.pt")
    except BaseException as error:
        traceback.print_exc()
        log.flush()
        failure = {"at": time.time(), "error": describe_exception(error)}
        (Path(result_dir) / f"rank{rank}.error.json").write_text(json.dumps(failure))
        raise


def launch(
    worker: Callable[[int, int, Any], Any],
    world_size: int,
    payload: Any = None,
    *,
    timeout_s: float = 600,
    log_dir: str | Path | None = None,
    threads: int = 1,
    same_device: bool = False,
) -> list[Any]:
    """Run `worker` on `world_size` spawned ranks and return their results, rank by rank."""
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="bubble_launch_") as tmp:
        logs = Path(log_dir) if log_dir is not None else Path(tmp)
        logs.mkdir(parents=True, exist_ok=True)
        port = free_port()
        procs = [
            ctx.Process(
                target=_entry, args=(worker, r, world_size, port, payload, tmp, str(logs), threads, same_device)
            )
            for r in range(world_size)
        ]
        for p in procs:
            p.start()
        deadline = time.monotonic() + timeout_s
        try:
            while any(p.is_alive() for p in procs):
                failed = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0)]
                if failed or time.monotonic() > deadline:
                    what = "timed out" if not failed else f"rank {failed[0]} failed"
                    raise LaunchError(_failure(procs, logs, what), _summary(procs, tmp, what, timeout_s))
                time.sleep(0.05)
            if any(p.exitcode != 0 for p in procs):
                raise LaunchError(_failure(procs, logs, "a rank failed"), _summary(procs, tmp, "a rank failed", timeout_s))
        finally:
            for p in procs:
                if p.is_alive():
                    p.kill()
                p.join()
        return [torch.load(Path(tmp) / f"rank{r}.pt", weights_only=True) for r in range(world_size)]


def _summary(procs, result_dir: str, what: str, timeout_s: float) -> str:
    """One line: the first exception a rank raised, else how the launch failed."""
    failures = []
    for rank in range(len(procs)):
        path = Path(result_dir) / f"rank{rank}.error.json"
        try:
            failure = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        failures.append((failure["at"], rank, failure["error"]))
    if failures:
        _, rank, error = min(failures)
        return f"rank {rank} raised {error}"
    if what == "timed out":
        return f"timed out after {timeout_s:g} s"
    codes = {rank: p.exitcode for rank, p in enumerate(procs) if p.exitcode not in (None, 0)}
    return f"{what}: exit codes {codes} (killed?)"


def _failure(procs, logs: Path, what: str) -> str:
    lines = [f"pipeline launch: {what}; exit codes {[p.exitcode for p in procs]}"]
    for r in range(len(procs)):
        path = logs / f"rank{r}.log"
        tail = path.read_text()[-3000:] if path.exists() else "(no log)"
        lines.append(f"--- rank {r} log tail ---\n{tail}")
    return "\n".join(lines)
