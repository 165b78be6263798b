"""A pipeline job lends its bubbles to sweeps: one call per rank, then train as usual.

Each rank of a DeepSpeed pipeline job that runs on a Ray cluster (its processes connected with
`ray.init(address=...)`, or Ray actors themselves) calls::

    lender = pipeline_bubble.lend_bubbles(engine)       # after deepspeed.initialize
    for batch in ...:
        engine.train_batch(data)
    lender.close()                                      # gives an unfinished group back

From then on, between batches, the stage takes the next fused group that a sweep with
`fusion.placement: bubbles` queued in the cluster's `BubblePool`, and its `BubbleExecutor` trains
the group in the stage's idle windows. Every `steps_per_iteration` steps the group is evaluated
and each member's metrics and checkpoint go to its Tune trial, exactly as a `FusedGroup` actor
would send them; the group waits (runs nothing) until Tune has taken them, so ASHA/HyperBand
decisions apply before the next iteration, and members Tune stopped are dropped.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import ray
import torch

from fusion.group_actor import member_results, member_state_from_bytes
from pipeline_bubble.bubble_pool import bubble_pool
from pipeline_bubble.executor import BubbleExecutor
from pipeline_bubble.fused_guest import FusedGroupGuest
from pipeline_bubble.guests import _devices_for_rng
from pipeline_bubble.instrumented_engine import InstrumentedPipelineEngine, instrument

#: After refusing a group over its memory cap, a stage waits this many poll intervals to ask again.
REFUSED_BACKOFF = 20


class SweepGroupGuest(FusedGroupGuest):
    """A sweep's fused group (a `BubbleGroup` actor), trained step by step in a stage's bubbles."""

    def __init__(
        self,
        group: Any,
        assignment: Mapping[str, Any],
        device: torch.device,
        on_close: Callable[[Any, bool], None],
        yield_requested: Callable[[], bool] = lambda: False,
    ):
        from fusion import FusedTrainer

        work = assignment
        with torch.random.fork_rng(devices=_devices_for_rng(device)):  # members seed the global RNG
            if any(state is not None for state in work["states"]):
                states = [member_state_from_bytes(s) for s in work["states"]]
                trainer = FusedTrainer.from_member_states(
                    work["workload"], work["configs"], states, member_ids=work["member_ids"], device=device,
                    dtype=work["dtype"],
                )
            else:
                trainer = FusedTrainer(
                    work["workload"], work["configs"], member_ids=work["member_ids"], device=device, dtype=work["dtype"]
                )
        super().__init__(trainer)
        self.group = group
        self.max_iterations = int(work["max_iterations"])
        self.finished = trainer.iteration >= self.max_iterations
        self._on_close = on_close
        self._yield_requested = yield_requested
        self._loss_sums = self._zeros()
        self._steps_in_iteration = 0
        # A group taken over mid-sweep waits until its trials have the last published iteration.
        self._release: ray.ObjectRef | None = group.released.remote()

    def _zeros(self) -> torch.Tensor:
        return torch.zeros(self.trainer.num_members, dtype=torch.float64, device=self.trainer.device)

    def ready(self) -> bool:
        if self._yield_requested():
            return False  # the executor evicts the guest before its next step
        if self._release is not None:
            done, _ = ray.wait([self._release], timeout=0)
            if not done:
                return False
            survivors = ray.get(self._release)
            self._release = None
            if survivors and survivors != self.trainer.member_ids:
                self.trainer.keep_members(survivors)
                self.samples_per_step = self.samples_per_step // len(self._loss_sums) * len(survivors)
                self._loss_sums = self._zeros()
            self.finished = not survivors or self.trainer.iteration >= self.max_iterations
        return not self.finished

    def step(self) -> float:
        losses = self.member_step()
        self._loss_sums += losses.double()
        self._steps_in_iteration += 1
        if self._steps_in_iteration == self.trainer.steps_per_iteration:
            with torch.random.fork_rng(devices=self._rng_devices):
                metrics = self.trainer.finish_iteration(self._loss_sums)
            self.group.publish.remote(self.trainer.iteration, member_results(self.trainer, metrics))
            self._release = self.group.released.remote()
            self._loss_sums, self._steps_in_iteration = self._zeros(), 0
        return float(losses.mean())

    def close(self, failure: str | None) -> None:
        """Leaving the stage: a failure fails the group's trials (Tune retries them); an unfinished
        group goes back to the pool and resumes elsewhere from its last published iteration."""
        if failure is not None:
            self.group.fail.remote(failure)
        self._on_close(self.group, unfinished=failure is None and not self.finished)


class _PeriodicQuery:
    """A remote call made at most once per interval and read without blocking the stage."""

    def __init__(self, call: Callable[[], ray.ObjectRef], interval_s: float):
        self.call = call
        self.interval_s = interval_s
        self.pending: ray.ObjectRef | None = None
        self.next_at = 0.0

    def answer(self) -> tuple[bool, Any]:
        """(True, value) when the latest call has answered; (False, None) while it is due or pending."""
        if self.pending is None:
            if time.monotonic() < self.next_at:
                return False, None
            self.pending = self.call()
        done, _ = ray.wait([self.pending], timeout=0)
        if not done:
            return False, None
        value, self.pending = ray.get(self.pending), None
        self.next_at = time.monotonic() + self.interval_s
        return True, value


class BubbleLender:
    """One rank's link to the pool: asks for groups between batches, gives them back on `close()`."""

    def __init__(self, engine: InstrumentedPipelineEngine, poll_interval_s: float, owner: int | None = None):
        self.engine = engine
        self.pool = bubble_pool()
        self.host_id = f"stage{engine.stage_id}-{uuid.uuid4().hex[:8]}"
        ray.get(self.pool.register.remote(self.host_id, owner))
        self.poll_interval_s = poll_interval_s
        self.groups_taken = 0
        self.groups_yielded = 0
        self._take = _PeriodicQuery(lambda: self.pool.take.remote(self.host_id), poll_interval_s)
        self._yield = _PeriodicQuery(lambda: self.pool.should_yield.remote(self.host_id), poll_interval_s)

    def next_guest(self) -> SweepGroupGuest | None:
        """Non-blocking: a group if the pool has answered with one since the last batch."""
        _, group = self._take.answer()
        if group is None:
            return None
        self.groups_taken += 1
        assignment = ray.get(group.assignment.remote())
        return SweepGroupGuest(group, assignment, self.engine.device, self._closed, self._yield_requested)

    def _yield_requested(self) -> bool:
        """Non-blocking: whether the pool asked this stage to give its group back (its owner
        reclaimed the memory, or the allocator moved the sweep); asked once per poll interval."""
        _, yielding = self._yield.answer()
        if yielding:
            self.groups_yielded += 1
            self.engine.bubble_executor.request_evict()
        return bool(yielding)

    def _closed(self, group: Any, unfinished: bool) -> None:
        if unfinished:
            self.pool.give_back.remote(self.host_id, group)
            if self.engine.bubble_executor.refused is not None:  # too big for this stage: leave it to others
                self._take.next_at = time.monotonic() + REFUSED_BACKOFF * self.poll_interval_s
        else:
            self.pool.done.remote(self.host_id)

    def close(self) -> None:
        """The job is done with its bubbles: give back an unfinished group and leave the pool."""
        executor = self.engine.bubble_executor
        if executor is not None and executor.guest is not None:
            executor.evict()
        if self._take.pending is not None:  # a group the pool handed out after our last look
            group = ray.get(self._take.pending)
            if group is not None:
                self.pool.give_back.remote(self.host_id, group)
        ray.get(self.pool.unregister.remote(self.host_id))


def lend_bubbles(
    engine: Any,
    *,
    owner: int | None = None,
    memory_cap_bytes: int | None = None,
    poll_interval_s: float = 0.5,
    safety: float = 0.9,
) -> BubbleLender:
    """Lend this rank's pipeline bubbles to sweeps targeting them (`fusion.placement: bubbles`).

    Call on every rank, after `deepspeed.initialize` (the engine is instrumented if it is not
    yet) and with Ray connected. `owner`: the job's id when the allocator runs it
    (`ctx.job_id`), so the allocator decides which sweeps use these bubbles. `memory_cap_bytes`
    refuses groups larger than the stage can spare. Returns the lender; `close()` it when the
    job ends.
    """
    engine = instrument(engine) if not isinstance(engine, InstrumentedPipelineEngine) else engine
    lender = BubbleLender(engine, poll_interval_s, owner)
    engine.bubble_executor = BubbleExecutor(
        None, memory_cap_bytes=memory_cap_bytes, safety=safety, guest_source=lender.next_guest
    )
    engine.bubble_executor.start(engine.device)
    return lender
