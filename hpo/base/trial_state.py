"""One trial's state, whichever engine trains it: the checkpoint format, the resumable data stream
and a private RNG stream.

A configuration moves between engines: trained unfused (`hpo.base.training.TrialTrainer`), as a member
of a fused group (`fusion.FusedTrainer`), or in a pipeline stage's bubbles (`pipeline_bubble`),
and a crash or a re-formed group resumes it on whichever engine has room. It resumes bit-exactly
only if every engine writes the same state, replays the same batches from the same step, and
draws its random numbers from the same stream; so each of those is written once, here.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from hpo.base.checkpointing import CHECKPOINT_FILE
from hpo.base.hparams import OptimHParams, workload_optimizer
from hpo.base.workload import Batch, Workload

Schedule = torch.optim.lr_scheduler.LambdaLR


# ---- the checkpoint format ---------------------------------------------------------------------
def trial_optimizer(workload: Workload, model: torch.nn.Module, hparams: OptimHParams) -> tuple[torch.optim.Optimizer, Schedule]:
    """The optimizer and LR schedule a trial trains with: the fused engine builds them too, to
    write and read a member's state in exactly the unfused trainer's format."""
    optimizer = workload_optimizer(workload, model, hparams)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, hparams.lr_factor)


def trial_state(
    model: Mapping[str, torch.Tensor], optimizer: torch.optim.Optimizer, schedule: Schedule, iteration: int, step: int
) -> dict[str, Any]:
    """A trial's checkpoint: tensors and plain values only, so it loads with
    `torch.load(weights_only=True)`; the global RNG goes with it because the trainers draw from it."""
    return {
        "model": dict(model),
        "optimizer": optimizer.state_dict(),
        "schedule": schedule.state_dict(),
        "iteration": int(iteration),
        "step": int(step),
        "rng": torch.get_rng_state(),
    }


def save_trial_state(state: Mapping[str, Any], directory: str | Path) -> None:
    """Write `state` where every engine looks for a trial's checkpoint in `directory`."""
    torch.save(dict(state), Path(directory, CHECKPOINT_FILE))


def load_trial_state(directory: str | Path) -> dict[str, Any]:
    """The trial state `save_trial_state` wrote to `directory`; nothing in it runs code on load."""
    return torch.load(Path(directory, CHECKPOINT_FILE), weights_only=True)


def trial_state_bytes(state: Mapping[str, Any]) -> bytes:
    """`state` as the bytes of its checkpoint file, for actors that pass a member's state on."""
    buffer = io.BytesIO()
    torch.save(dict(state), buffer)
    return buffer.getvalue()


def trial_state_from_bytes(blob: bytes) -> dict[str, Any]:
    """The state in a checkpoint file's bytes (`trial_state_bytes`, or a file another host wrote):
    loaded with `weights_only=True`, so nothing in it runs code."""
    return torch.load(io.BytesIO(blob), weights_only=True)


# ---- the resumable data stream -----------------------------------------------------------------
class ResumableBatches:
    """A trial's training batches, addressed by the optimizer step that trains on them.

    Why by step: after a restore (or when a group is re-formed at its members' step) the trial
    must see the batches it would have seen had it never stopped. A workload's stream is
    deterministic for its seed, so a read at a step the open stream is not at reopens it and
    replays it up to that step; reads in order cost what the stream costs. The last batch read is
    kept, so peeking at the next batch (to size a group) and then training on it reads it once.
    """

    def __init__(self, open_stream: Callable[[], Iterator[Batch]]):
        self._open = open_stream
        self._stream: Iterator[Batch] | None = None
        self._position = 0  # the step of the batch the open stream yields next
        self._last: tuple[int, Batch] | None = None

    @classmethod
    def of_workload(cls, workload: Workload, config: Mapping[str, Any]) -> "ResumableBatches":
        """The stream every engine trains `config` on: the workload's, seeded by `data_seed`."""
        return cls(lambda: workload.train_batches(config, int(config.get("data_seed", 0))))

    def batch(self, step: int) -> Batch:
        """The batch that optimizer step `step` (0-based) trains on."""
        if self._last is not None and self._last[0] == step:
            return self._last[1]
        if self._stream is None or step != self._position:
            self._stream = self._open()
            for _ in range(step):
                next(self._stream)
        batch = next(self._stream)
        self._position = step + 1
        self._last = (step, batch)
        return batch


# ---- a private RNG stream ----------------------------------------------------------------------
def rng_devices(device: torch.device | str) -> list[int]:
    """The CUDA devices whose generators a computation on `device` draws from (none on CPU)."""
    device = torch.device(device)
    if device.type != "cuda":
        return []
    return [device.index if device.index is not None else torch.cuda.current_device()]


class PrivateRNG:
    """A random stream of a trial's own, on the CPU generator and `device`'s.

    Why: a trial trained beside another job (a guest in a pipeline stage's bubbles) must neither
    move that job's random numbers nor depend on them, and must resume with the numbers it would
    have drawn. Inside `active()` the global generators hold this stream; outside, whatever they
    held before, untouched.
    """

    def __init__(self, seed: int, device: torch.device | str = "cpu"):
        self.device = torch.device(device)
        self.devices = rng_devices(self.device)
        with torch.random.fork_rng(devices=self.devices):
            torch.manual_seed(seed)
            self._state = self._capture()

    def _capture(self) -> list[torch.Tensor]:
        states = [torch.get_rng_state()]
        if self.devices:
            states.append(torch.cuda.get_rng_state(self.device))
        return states

    @contextmanager
    def active(self) -> Iterator[None]:
        """Draw from this stream for the duration; the draws advance it, not the caller's."""
        with torch.random.fork_rng(devices=self.devices):
            torch.set_rng_state(self._state[0])
            if self.devices:
                torch.cuda.set_rng_state(self._state[1], self.device)
            yield
            self._state = self._capture()

    def isolated(self) -> Any:
        """Leave the global generators as they are found, whatever runs inside (builds that seed
        them, evaluations that draw from them), without advancing this stream either."""
        return torch.random.fork_rng(devices=self.devices)

    def state_dict(self) -> list[torch.Tensor]:
        return [state.clone() for state in self._state]

    def load_state_dict(self, state: list[torch.Tensor]) -> None:
        self._state = [s.clone() for s in state]
