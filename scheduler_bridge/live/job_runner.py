"""What runs inside a job's placement group: ``JobRunner`` actors calling the entry point.

The allocator starts one ``JobRunner`` per bundle of the job's group (rank 0 on
the first node); each calls the user's ``package.module:function(ctx)`` in a
thread. The function trains, checkpoints through ``ctx`` and returns when done
or as soon as ``ctx.should_stop()`` turns true (the allocator is resizing or
preempting the job): it is then restarted, maybe with another GPU count and
batch size, and must resume from its checkpoint. A function that finds its
checkpoint already complete should just return.

Checkpoints live on shared storage that other hosts write, so they are never
unpickled: a state of plain data (dicts, lists, numbers, strings) is stored as
JSON (tuples come back as lists, dict keys as strings); one holding tensors
(a model's ``state_dict``) is stored with ``torch.save`` and read back with
``torch.load(weights_only=True)``, which only rebuilds tensors and plain data.

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
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from hpo.base.atomic_files import write_atomically
from hpo.base.actor_names import ALLOCATOR_NAME, NAMESPACE
from .memory_probe import PeakMemory

CHECKPOINT_FILE = "checkpoint.state"   # JSON, or a torch zip archive (tensors)
_ZIP_MAGIC = b"PK\x03\x04"               # what torch.save writes; JSON never starts so
_LEGACY_PICKLE = "checkpoint.pkl"


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

        ``state``: plain data, or plain data holding torch tensors (see the module
        docstring); anything else is a TypeError here, not an unreadable checkpoint later.
        ``progress``: the fraction (0..1) of the job's work that ``state`` holds. The
        allocator then plans with it (SRTF's remaining time, the elastic policy's
        epoch) instead of the submitted estimate."""
        if progress is not None and not 0.0 <= progress <= 1.0:
            raise ValueError(f"progress must be the fraction of the job's work done, in [0, 1], "
                             f"got {progress!r}")
        if not self.is_chief:
            return
        data = _encode_state(state)
        write_atomically(Path(self.checkpoint_dir) / CHECKPOINT_FILE, data, private=True)  # the job's own state
        if progress is not None:
            self._report_progress(progress)

    def load_checkpoint(self):
        """The last saved state, or None before the first checkpoint."""
        d = Path(self.checkpoint_dir)
        p = d / CHECKPOINT_FILE
        if not p.exists():
            if (d / _LEGACY_PICKLE).exists():
                raise ValueError(f"{d / _LEGACY_PICKLE}: pickled checkpoints are not loaded (another host "
                                 "could have written code into it); resubmit the job or convert the state")
            return None
        return _decode_state(p.read_bytes(), p)

    def _report_progress(self, done: float) -> None:
        """Tell the allocator without waiting for it (the call is retried across an
        allocator restart). No allocator (stopped without releasing its jobs): the
        checkpoint is all that counts."""
        import ray

        try:
            allocator = ray.get_actor(ALLOCATOR_NAME, namespace=NAMESPACE)
        except ValueError:
            return
        allocator.progress.remote(self.job_id, self.attempt, float(done))

    def reclaim_bubbles(self) -> None:
        """A pipeline job needs its bubbles' memory back: the allocator evicts its guests."""
        import ray

        ray.get(ray.get_actor(ALLOCATOR_NAME, namespace=NAMESPACE).reclaim_bubbles.remote(self.job_id))


def _encode_state(state) -> bytes:
    try:
        return json.dumps(state, allow_nan=True).encode("utf-8")
    except TypeError:
        pass
    import io

    import torch

    buf = io.BytesIO()
    torch.save(state, buf)
    data = buf.getvalue()
    try:
        torch.load(io.BytesIO(data), weights_only=True)
    except Exception as exc:  # noqa: BLE001  -- refused now rather than at resume
        raise TypeError(f"checkpoint state must be plain data or tensors (JSON or torch weights_only); "
                        f"{type(state).__name__} holds something else: {exc}") from None
    return data


def _decode_state(data: bytes, path: Path):
    if data.startswith(_ZIP_MAGIC):
        import io

        import torch

        return torch.load(io.BytesIO(data), weights_only=True)
    try:
        return json.loads(data)
    except (UnicodeDecodeError, ValueError) as exc:
        raise ValueError(f"{path}: damaged checkpoint, neither JSON nor a torch archive ({exc})") from None


def _jsonable(value):
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return repr(value)


class JobRunner:
    """One rank of a job. ``start`` returns once the entry point is imported and running, so
    the allocator's "ready" (all ranks started) is when the job's code runs: its service time,
    and a Lucid profiling window, never include a slow node importing the job's modules
    (a profiling run stopped before its code ran would measure nothing). ``start`` is
    idempotent (a restarted allocator calls it again); ``wait`` blocks until the entry point
    returns: {"status": "done" | "stopped" | "error", "value" | "error": ..., "elapsed":
    seconds the entry point ran, "peak_memory_mb": the memory it added (``memory_probe``;
    what a Lucid profiling run classifies the job by, measured from outside the job's code)}."""

    def __init__(self, entrypoint: str, context: dict):
        self._entrypoint = entrypoint
        self._context = context
        self._stop = threading.Event()
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._started = False
        self._outcome: dict | None = None

    def start(self) -> bool:
        with self._lock:
            if not self._started:
                self._started = True
                try:
                    fn = resolve_entrypoint(self._entrypoint)
                except BaseException:  # noqa: BLE001  -- the job's error, reported by wait()
                    self._record_error()
                    self._done.set()
                else:
                    threading.Thread(target=self._run, args=(fn,), daemon=True).start()
        return True

    def _record_error(self) -> None:
        self._outcome = {"status": "error", "error": traceback.format_exc(limit=20)}

    def _run(self, fn) -> None:
        try:
            memory, t0 = PeakMemory(), time.monotonic()
            value = fn(JobContext(**self._context, _stop=self._stop))
            status = "stopped" if self._stop.is_set() else "done"
            self._outcome = {"status": status, "value": _jsonable(value),
                             "elapsed": time.monotonic() - t0, "peak_memory_mb": memory.mb()}
        except BaseException:  # noqa: BLE001  -- reported to the allocator, which fails the job
            self._record_error()
        finally:
            self._done.set()

    def wait(self) -> dict:
        self._done.wait()
        return self._outcome

    def stop(self) -> bool:
        self._stop.set()
        return True
