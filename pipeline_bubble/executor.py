"""The bubble executor: runs quanta of guest training steps inside a stage's predicted idle windows.

Where the windows are. Every blocking point of a stage's schedule (send/recv of activations and
gradients, the loss broadcast) is a *slot*, numbered by its position in the schedule, which is
the same every batch. The engine tells the executor how long each slot blocked; from that the
executor keeps, per slot, an estimate of the idle window before the peer is ready.

How they are filled. A blocking gloo send/recv cannot share its thread with other work, and a
gloo `irecv` cannot be polled (`is_completed()` stays false until `wait()`; a timed `wait()`
closes the pair). So the executor works *ahead* of the blocking call: right before the engine
issues it, the executor runs whole guest steps while the predicted remaining window still fits
one more step (predicted from the measured step time), then the engine issues the call. It
never starts a step that does not fit.

Where the neighbour signals its arrival (same host, see `peer_signals`): closed loop. The
executor checks before each guest step whether the neighbour has reached the exchange and stops
as soon as it has, so an overrun is at most one step; and the neighbour's arrival stamp gives
the exact window of every exchange, harvested or not. The plan for a slot is then the
`window_quantile` of its last `window_history` exact windows, and no step is started past it;
the signal cuts a plan short when the window is shorter this time, so a high quantile (0.75)
harvests most of a varying window at the cost of one partial step when it is short.

Where it does not (a neighbour on another host): open loop. A window is only ever measured in an
*observation batch* (the first `history` batches after a warm-up one, then one in every
`observe_every`), where the executor runs no guest in such slots, so the waits it sees are the
main job's own. The prediction for a slot is the smallest of its last `history` observed waits,
less the ready latency (below).
Learning windows from harvested batches instead is a trap with rendezvous transports: a quantum
that overruns makes the peer wait, the peer arrives later at the next exchange, and a residual
wait inflated by scheduling latency on a busy host reads as a longer window, so the quanta grow
batch after batch (we measured +60-90% slowdowns that way). In harvested batches the executor
only watches for overruns: when the call after a quantum blocked no longer than an exchange
with a ready peer takes (twice the lower quartile of all blocking calls of the last observation
batch; several ms on a busy host), the slot's quantum is scaled down by `backoff` until the next
observation batch.

Idle cores. On CPU a stage's wait is idle hardware only while the host has a core that no rank
of the job is using; with more ranks than cores the waiting stage's core is running another
stage, and a guest would take it from the job (+22-45% measured with 4 ranks on 2 cores). So on
CPU a guest step starts only while `host.core_free()` (see `peer_signals`).

Safety. Guest steps run under `torch.random.fork_rng`, so the host job's RNG stream is never
advanced; a guest whose footprint exceeds `memory_cap_bytes` is refused; on CUDA its kernels go
to a separate lowest-priority stream; a guest that raises is dropped, never the job. Progress is
checkpointed every `checkpoint_every` steps and on `evict()`; `request_evict()` may be called at
any time (a signal handler, another thread) and takes effect before the next guest step.

A guest that fits no window. The predicted step time is learnt only from the steps the guest
runs, and a step runs only where the prediction fits: a prediction too long for every window
(profiled while the host was busier, or one stage's windows really are shorter than a step)
would never be measured again and would hold its guest, a sweep's group that no other stage may
take, forever. So after `STARVED_BATCHES` batches in a row that ran no guest step, in which a
window was known and the predicted step fitted none, the step time is measured again; after as
many more, the guest is refused (`refused` says why, in one line) and leaves the stage
unfinished, so a lending stage gives it back for a stage whose windows hold its steps.

Guests that come and go. With a `guest_source`, a stage that has no guest (none yet, or the
last one finished, failed or was evicted) asks the source for one between batches, keeping
the windows it has learnt. A guest may also pause itself (`ready()` false: a sweep's group
waits for its trials to take an iteration's results) and end itself (`finished`); a guest
with `close(failure)` is told when it leaves the stage.
"""

from __future__ import annotations

import time
from collections import deque
from contextlib import nullcontext
from dataclasses import dataclass, field
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

import torch

from hpo.base.atomic_files import write_atomically
from hpo.base.exceptions import describe_exception
from hpo.base.trial_state import rng_devices
from pipeline_bubble.guests import GuestWork
from pipeline_bubble.harvest_policy import HISTORY, OBSERVE_EVERY, SAFETY, WINDOW_HISTORY, WINDOW_QUANTILE, quantile
from pipeline_bubble.peer_signals import PeerArrival
from pipeline_bubble.timeline import GUEST

#: Below this residual (seconds, above the transfer floor) a blocking call "did not wait".
_READY_TOLERANCE_S = 5e-4
#: Quantile of the recent guest step times used as the predicted length of the next step.
_STEP_QUANTILE = 0.75
#: Batches in a row in which the predicted step fitted none of the known windows before the step
#: time is measured again, and, measured again, before it is refused (see the module doc).
STARVED_BATCHES = 8


class _Host(Protocol):
    def core_free(self) -> bool: ...


class _Recorder(Protocol):
    def mark(self) -> Any: ...

    def record(self, name: str, category: str, start: Any, end: Any, slot: int) -> None: ...


@dataclass
class HarvestStats:
    """Guest work done inside bubbles (`losses` also has the profiling steps run at start)."""

    steps: int = 0
    samples: int = 0
    guest_seconds: float = 0.0
    overruns: int = 0
    #: Quanta cut short because every core of the host was running the job.
    no_core: int = 0
    losses: list[float] = field(default_factory=list)


class BubbleExecutor:
    """Fills one pipeline stage's idle windows with steps of `guest`.

    Args:
        guest: the tuning work (see `GuestWork`); None for an executor that only measures.
        memory_cap_bytes: refuse the guest if its footprint exceeds this (None: no cap).
        checkpoint_path: where guest progress is saved (and resumed from, if it exists).
        checkpoint_every: guest steps between checkpoints.
        safety: share of an open-loop predicted window the executor plans to use.
        backoff: factor applied to a slot's quantum after a suspected overrun (until re-observed).
        profile_steps: guest steps run at `start()` to measure its step time.
        observe_every: one batch in this many runs no guest and re-measures the windows.
        history: observation batches an open-loop window prediction is the minimum of.
        window_history: exact windows (closed loop) a slot's plan is taken from.
        window_quantile: the quantile of those windows a slot's plan is.
        guest_source: asked between batches for a new guest while the stage has none.
        clock: seconds on the clock the neighbours' arrival stamps use (`time.monotonic`, see
            `peer_signals`); every window and step time is measured on it, so a spec can drive
            the executor with a fake clock instead of sleeping.
    """

    def __init__(
        self,
        guest: GuestWork | None,
        *,
        memory_cap_bytes: int | None = None,
        checkpoint_path: str | Path | None = None,
        checkpoint_every: int = 100,
        safety: float = SAFETY,
        backoff: float = 0.6,
        profile_steps: int = 8,
        observe_every: int = OBSERVE_EVERY,
        history: int = HISTORY,
        window_history: int = WINDOW_HISTORY,
        window_quantile: float = WINDOW_QUANTILE,
        guest_source: Callable[[], GuestWork | None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        if not 0 < safety <= 1:
            raise ValueError(f"safety must be in (0, 1], got {safety}")
        if not 0 < backoff < 1:
            raise ValueError(f"backoff must be in (0, 1), got {backoff}")
        if not 0 <= window_quantile <= 1:
            raise ValueError(f"window_quantile must be in [0, 1], got {window_quantile}")
        self.guest = guest
        self.memory_cap_bytes = memory_cap_bytes
        self.checkpoint_path = Path(checkpoint_path) if checkpoint_path is not None else None
        self.checkpoint_every = checkpoint_every
        self.safety = safety
        self.backoff = backoff
        self.profile_steps = profile_steps
        self.stats = HarvestStats()
        self.refused: str | None = None
        #: Why the guest was dropped mid-run (its last checkpoint stays valid), if it failed.
        self.failed: str | None = None
        self.step_time_s: float | None = None
        self.observe_every = observe_every
        self.history = history
        self.window_history = window_history
        self.window_quantile = window_quantile
        self.guest_source = guest_source
        self._clock = clock
        self._waits: dict[int, deque[float]] = {}
        self._windows: dict[int, deque[float]] = {}  # exact, from the neighbours' arrival stamps
        self._seeds: dict[int, float] = {}  # predicted, until a slot is measured (`seed_windows`)
        self._entered = 0.0  # `clock()` when the stage reached the current blocking call
        self._scale: dict[int, float] = {}
        self._batches = 0
        self._observing = True
        self._warmup = False
        self._floor = float("inf")
        #: A blocking call's duration when its peer is already there: the lower quartile of
        #: all blocking calls in the last observation batch (most exchanges do not wait).
        self._ready_latency = 0.0
        self._observed_now: list[float] = []
        self._stream: torch.cuda.Stream | None = None
        self._device = torch.device("cpu")
        self._since_checkpoint = 0
        self._evict_requested = False
        self._recent: deque[float] = deque(maxlen=32)
        self._host: _Host | None = None
        #: Batches in a row with no guest step whose known windows all were too short (`STARVED_BATCHES`).
        self._starved = 0
        #: The longest budget of this batch that the predicted step did not fit; None while none.
        self._unfit_budget: float | None = None
        self._steps_at_begin = 0

    # ---- lifecycle ------------------------------------------------------------------------
    def start(self, device: torch.device | str = "cpu", *, host: _Host | None = None) -> None:
        """Resume from the checkpoint, check the memory cap, and profile the guest's step time.

        Called once when the executor is attached to an engine, before the first batch;
        `host` tells whether the host's cores are all taken by the job (checked on CPU only).
        """
        self._device = torch.device(device)
        self._host = host if self._device.type == "cpu" else None
        if self._device.type == "cuda":
            # The lowest priority there is; PyTorch's default stream, which the job uses, has it too,
            # so on one device this separates the guest's work rather than deprioritising it.
            lowest_priority, _ = torch.cuda.Stream.priority_range()
            self._stream = torch.cuda.Stream(self._device, priority=lowest_priority)
        if self.guest is None:
            return
        if self.checkpoint_path is not None and self.checkpoint_path.exists():
            saved = torch.load(self.checkpoint_path, weights_only=True)  # tensors and plain values: nothing in it runs code
            try:
                self.guest.load_state_dict(saved["guest"])
            except (ValueError, KeyError, RuntimeError) as error:  # another guest's (other configs, another model)
                first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
                raise ValueError(f"{self.checkpoint_path}: cannot resume this guest from it: {first}; "
                                 "give it a checkpoint path of its own, or remove that file to start afresh") from None
        self._check_memory()
        self._profile()

    def adopt(self, guest: GuestWork) -> None:
        """Take `guest` in place of one that ended, keeping the windows learnt so far."""
        self.guest, self.refused, self.failed = guest, None, None
        self._recent.clear()
        self._starved = 0
        self.step_time_s = None
        self._check_memory()
        self._profile()

    def _profile(self) -> None:
        """Run `profile_steps` guest steps (outside any window) to predict a step's length."""
        for _ in range(self.profile_steps):
            if not self._guest_ready() or self._guarded_step() is None:
                break
        if len(self._recent) < self.profile_steps:
            return  # the guest paused (or failed) first: the steps it ran predict, else a later batch's end profiles
        for _ in range(min(2, len(self._recent) - 1)):
            self._recent.popleft()  # the first steps pay for allocations and cold caches
        self.step_time_s = self._predict_step()
        self._check_memory()

    def evict(self) -> None:
        """Checkpoint the guest and drop it; the stage keeps training, its windows stay empty."""
        if self.guest is not None:
            self.checkpoint()
        self._release_guest(None)
        self._evict_requested = False

    def _release_guest(self, failure: str | None) -> None:
        guest, self.guest = self.guest, None
        close = getattr(guest, "close", None)
        if close is not None:
            close(failure)

    def request_evict(self) -> None:
        """Ask for eviction from anywhere (a signal handler, another thread): it happens before
        the guest's next step or at the end of the batch, never in the middle of a step."""
        self._evict_requested = True

    def checkpoint(self) -> None:
        if self.guest is None or self.checkpoint_path is None:
            return
        state = {"guest": self.guest.state_dict(), "harvested_steps": self.stats.steps}
        write_atomically(self.checkpoint_path, lambda temporary: torch.save(state, temporary))
        self._since_checkpoint = 0

    def begin_batch(self) -> None:
        """Start a batch: the first `history + 1` ones (none once seeded) and every `observe_every`-th
        one run no guest in open-loop slots.

        The very first batch is not used for predictions: DeepSpeed exchanges tensor shapes and
        allocates its buffers in it, so its waits are not the job's steady state.
        """
        if self._observed_now:  # the batch before was an observation batch
            ordered = sorted(self._observed_now)
            self._ready_latency = ordered[len(ordered) // 4]
            self._observed_now = []
        initial = self._batches <= self.history and not self._seeds
        self._observing = initial or (self._batches > 0 and self._batches % self.observe_every == 0)
        self._warmup = self._batches == 0
        self._batches += 1
        self._unfit_budget, self._steps_at_begin = None, self.stats.steps
        if self._observing:
            self._scale.clear()

    def end_batch(self) -> None:
        if self._evict_requested:
            self.evict()
        elif self.guest is not None and self._since_checkpoint >= self.checkpoint_every:
            self.checkpoint()
        if self.guest is not None and getattr(self.guest, "finished", False):
            self._release_guest(None)
        self._count_starved_batch()
        if self.guest is None and self.guest_source is not None:
            try:  # a source or guest that fails is dropped, never the job
                guest = self.guest_source()
            except Exception as error:
                self.failed = f"the guest source failed: {describe_exception(error)}"
                guest = None
            if guest is not None:
                try:
                    self.adopt(guest)
                except Exception as error:
                    self.failed = describe_exception(error)
                    self._release_guest(self.failed)
        elif self.guest is not None and self.step_time_s is None:
            self._profile()

    # ---- the engine's two calls -----------------------------------------------------------
    def harvest(self, slot: int, recorder: _Recorder, arrival: PeerArrival | None = None) -> float:
        """Run whole guest steps that fit the window of `slot`; returns seconds used.

        `arrival`: the neighbours' signal for this exchange (closed loop), None to predict its window.
        """
        self._entered = self._clock()
        if self.guest is None or self.step_time_s is None or (arrival is None and self._observing):
            return 0.0
        window = self.predicted_window(slot, closed_loop=arrival is not None)
        if window is None:
            return 0.0
        budget = window if arrival is not None else window * self.safety * self._scale.get(slot, 1.0)
        start = self._clock()
        steps = 0
        while (self._clock() - start) + self.step_time_s <= budget:
            if self._evict_requested:
                self.evict()
                break
            if (arrival is not None and arrival.arrived()) or not self._guest_ready():
                break
            if self._host is not None and not self._host.core_free():
                self.stats.no_core += 1
                break
            if self._device.type == "cuda" and torch.cuda.mem_get_info(self._device)[0] < self.guest.memory_bytes:
                break
            with self._on_guest_stream():  # on CUDA the marks are events on the guest's stream
                begin = recorder.mark()
            elapsed = self._guarded_step()
            if elapsed is None:
                break
            with self._on_guest_stream():
                end = recorder.mark()
            self.stats.guest_seconds += elapsed
            recorder.record("guest_step", GUEST, begin, end, slot)
            self.stats.steps += 1
            self.stats.samples += int(getattr(self.guest, "samples_per_step", 0))
            steps += 1
        if not steps and self.step_time_s is not None and self.step_time_s > budget:
            self._unfit_budget = max(budget, self._unfit_budget or 0.0)
        return self._clock() - start if steps else 0.0

    def observe(
        self,
        slot: int,
        harvested_s: float,
        blocked_s: float,
        *,
        fillable: bool = True,
        arrival: PeerArrival | None = None,
    ) -> None:
        """Record how long the blocking call of `slot` took (after a quantum of `harvested_s`).

        The engine reports every blocking call; only `fillable` ones get windows, the others
        tell how long an exchange takes when the peer is already there (the ready latency).
        With `arrival` (closed loop) the window is exact: from reaching the call to the
        neighbours' arrival.
        """
        if self._warmup:
            return
        if arrival is not None:
            arrived_at = arrival.arrival_time()
            if arrived_at is not None:
                window = max(0.0, arrived_at - self._entered)
                self._windows.setdefault(slot, deque(maxlen=self.window_history)).append(window)
                self.stats.overruns += int(harvested_s > window)
            return
        self._floor = min(self._floor, blocked_s)
        if self._observing:
            if harvested_s == 0:
                self._observed_now.append(blocked_s)
            if fillable:
                self._waits.setdefault(slot, deque(maxlen=self.history)).append(blocked_s)
        elif harvested_s > 0 and blocked_s <= max(self._floor + _READY_TOLERANCE_S, 2 * self._ready_latency):
            # The call barely waited: the peer was most likely there before the quantum ended.
            self.stats.overruns += 1
            self._scale[slot] = self._scale.get(slot, 1.0) * self.backoff

    def seed_windows(self, windows: Mapping[int, float]) -> None:
        """Start from predicted idle windows (seconds before each slot's peer is ready, such as
        `pipeline_bubble.replay.Replay.seed_windows` gives) instead of learning them from scratch.

        A seeded slot is harvested from the first batch on, open loop included (its first
        observation batches are skipped); the executor's own measurements of a slot replace its
        seed as soon as there are any, and open-loop slots are still re-observed every
        `observe_every` batches.
        """
        self._seeds = {int(slot): float(window) for slot, window in windows.items() if window > 0}

    @property
    def signalled_slots(self) -> list[int]:
        """Slots whose windows come from the neighbours' arrival signals (closed loop)."""
        return sorted(self._windows)

    def predicted_window(self, slot: int, *, closed_loop: bool = False) -> float | None:
        """Idle seconds expected before the peer of `slot` is ready; None before it was observed."""
        if closed_loop:
            windows = self._windows.get(slot)
            return quantile(windows, self.window_quantile) if windows else self._seeds.get(slot)
        waits = self._waits.get(slot)
        return max(0.0, min(waits) - max(self._floor, self._ready_latency)) if waits else self._seeds.get(slot)

    # ---- internals --------------------------------------------------------------------------
    def _count_starved_batch(self) -> None:
        """At a batch's end: a guest that fitted no window for `STARVED_BATCHES` batches is measured
        again (its prediction may be stale), and after as many more it is refused (see the module doc)."""
        if self.guest is None or self.stats.steps > self._steps_at_begin:
            self._starved = 0
            return
        if self._unfit_budget is None:
            return  # no window was tried (an observation batch, a guest paused before its profile, none known)
        self._starved += 1
        if self._starved == STARVED_BATCHES:
            self._recent.clear()
            self.step_time_s = None  # end_batch profiles the guest again
        elif self._starved >= 2 * STARVED_BATCHES:
            assert self.step_time_s is not None
            self.refused = (
                f"its step ({self.step_time_s * 1e3:.1f} ms, measured twice) fitted none of this stage's "
                f"bubble windows (the longest {self._unfit_budget * 1e3:.1f} ms) in {self._starved} batches"
            )
            self.evict()

    def _guarded_step(self) -> float | None:
        """`_timed_step`, except that a failing guest is dropped (None) instead of failing the job."""
        try:
            return self._timed_step()
        except Exception as error:  # the guest's last checkpoint stays valid
            self.failed = f"{type(error).__name__}: {error}"
            self._release_guest(self.failed)
            return None

    def _guest_ready(self) -> bool:
        ready = getattr(self.guest, "ready", None)
        if self.guest is None or ready is None:
            return self.guest is not None
        try:
            return bool(ready())
        except Exception as error:  # (a sweep's group whose actor is gone) dropped, never the job
            self.failed = describe_exception(error)
            self._release_guest(self.failed)
            return False

    def _timed_step(self) -> float:
        """One guest step under a private RNG (and stream on CUDA); returns its duration."""
        assert self.guest is not None
        begin = self._clock()
        # The engine may be inside no_grad (the loss broadcast is): the guest trains regardless.
        with torch.random.fork_rng(devices=rng_devices(self._device)), torch.enable_grad():
            with self._on_guest_stream():
                loss = self.guest.step()
            if self._stream is not None:
                self._stream.synchronize()
        elapsed = self._clock() - begin
        self._recent.append(elapsed)
        self.step_time_s = self._predict_step()
        self.stats.losses.append(loss)
        self._since_checkpoint += 1
        return elapsed

    def _on_guest_stream(self):
        return torch.cuda.stream(self._stream) if self._stream is not None else nullcontext()

    def _predict_step(self) -> float:
        """A high quantile of the recent step times (a quantum's first step is the slowest)."""
        return quantile(self._recent, _STEP_QUANTILE)

    def _check_memory(self) -> None:
        if self.guest is None or self.memory_cap_bytes is None:
            return
        if self.guest.memory_bytes > self.memory_cap_bytes:
            self.refused = (
                f"guest needs {self.guest.memory_bytes} bytes, over memory_cap_bytes={self.memory_cap_bytes}"
            )
            self.evict()

