"""What runs inside a job's placement group: ``JobRunner`` actors calling the entry point.

The allocator starts one ``JobRunner`` per bundle of the job's group (rank 0 on
the first node); each calls the user's ``package.module:function(ctx)`` in a
thread. The function trains, checkpoints through ``ctx`` and returns when done
or as soon as ``ctx.should_stop()`` turns true (the allocator is resizing or
preempting the job): it is then restarted, maybe with another GPU count and
batch size, and must resume from its checkpoint. A function that finds its
checkpoint already complete should just return.

    def train(ctx):
        state = ctx.load_checkpoint() or {"step": 0}
        while state["step"] < 1000 and not ctx.should_stop():
            ...one step on ctx.local_gpus GPUs at global batch ctx.batch_size...
            state["step"] += 1
            if state["step"] % 100 == 0:
                ctx.save_checkpoint(state, progress=state["step"] / 1000)
        ctx.save_checkpoint(state, progress=state["step"] / 1000)
        return {"steps": state["step"]}
"""

from __future__ import annotations

import importlib
import json
import os
import pickle
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

CHECKPOINT_FILE = "checkpoint.pkl"


def resolve_entrypoint(entrypoint: str):
    """``"package.module:function"`` -> the function."""
    module, _, name = entrypoint.partition(":")
    fn = getattr(importlib.import_module(module), name, None)
    if not callable(fn):
        raise ValueError(f"entrypoint {entrypoint!r}: {module} has no function {name!r}")
    return fn


@dataclass
class JobContext:
    """Handed to the entry point. ``gpus`` is the job's total, ``local_gpus`` this
    rank's; ``batch_size`` the global batch the allocator chose (None: the job's own)."""

    job_id: int
    attempt: int
    rank: int
    world_size: int
    gpus: int
    local_gpus: int
    batch_size: int | None
    checkpoint_dir: str
    config: dict = field(default_factory=dict)
    name: str = ""
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)

    @property
    def is_chief(self) -> bool:
        return self.rank == 0

    def should_stop(self) -> bool:
        """True once the allocator wants the job to checkpoint and return."""
        return self._stop.is_set()

    def save_checkpoint(self, state, progress: float | None = None) -> None:
        """Atomically replace the job's checkpoint with ``state`` (rank 0 only; others no-op).

        ``progress``: the fraction (0..1) of the job's work that ``state`` holds. The
        allocator then plans with it (SRTF's remaining time, the elastic policy's
        epoch) instead of the submitted estimate."""
        if progress is not None and not 0.0 <= progress <= 1.0:
            raise ValueError(f"progress must be the fraction of the job's work done, in [0, 1], "
                             f"got {progress!r}")
        if not self.is_chief:
            return
        d = Path(self.checkpoint_dir)
        d.mkdir(parents=True, exist_ok=True)
        tmp = d / f".{CHECKPOINT_FILE}.{os.getpid()}.tmp"
        with open(tmp, "wb") as f:
            pickle.dump(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, d / CHECKPOINT_FILE)
        if progress is not None:
            self._report_progress(progress)

    def load_checkpoint(self):
        """The last saved state, or None before the first checkpoint."""
        p = Path(self.checkpoint_dir) / CHECKPOINT_FILE
        if not p.exists():
            return None
        with open(p, "rb") as f:
            return pickle.load(f)

    def _report_progress(self, done: float) -> None:
        """Tell the allocator without waiting for it (the call is retried across an
        allocator restart). No allocator (stopped without releasing its jobs): the
        checkpoint is all that counts."""
        import ray

        from .allocator import ALLOCATOR_NAME, NAMESPACE
        try:
            allocator = ray.get_actor(ALLOCATOR_NAME, namespace=NAMESPACE)
        except ValueError:
            return
        allocator.progress.remote(self.job_id, self.attempt, float(done))

    def reclaim_bubbles(self) -> None:
        """A pipeline job needs its bubbles' memory back: the allocator evicts its guests."""
        import ray

        from .allocator import ALLOCATOR_NAME, NAMESPACE
        ray.get(ray.get_actor(ALLOCATOR_NAME, namespace=NAMESPACE).reclaim_bubbles.remote(self.job_id))


def _jsonable(value):
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return repr(value)


class JobRunner:
    """One rank of a job. ``start`` is idempotent (a restarted allocator calls it again);
    ``wait`` blocks until the entry point returns: {"status": "done" | "stopped" |
    "error", "value" | "error": ..., "elapsed": seconds the entry point ran}."""

    def __init__(self, entrypoint: str, context: dict):
        self._entrypoint = entrypoint
        self._context = context
        self._stop = threading.Event()
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._outcome: dict | None = None

    def start(self) -> bool:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True)
                self._thread.start()
        return True

    def _run(self) -> None:
        try:
            fn = resolve_entrypoint(self._entrypoint)
            t0 = time.monotonic()
            value = fn(JobContext(**self._context, _stop=self._stop))
            status = "stopped" if self._stop.is_set() else "done"
            self._outcome = {"status": status, "value": _jsonable(value),
                             "elapsed": time.monotonic() - t0}
        except BaseException:  # noqa: BLE001  -- reported to the allocator, which fails the job
            self._outcome = {"status": "error", "error": traceback.format_exc(limit=20)}
        finally:
            self._done.set()

    def wait(self) -> dict:
        self._done.wait()
        return self._outcome

    def stop(self) -> bool:
        self._stop.set()
        return True
