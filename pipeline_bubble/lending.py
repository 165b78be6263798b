"""A pipeline job lends its bubbles to sweeps: one call per rank, then train as usual.

Each rank of a DeepSpeed pipeline job that runs on a Ray cluster (its processes connected with
`ray.init(address=...)`, or Ray actors themselves) calls::

    lender = pipeline_bubble.lend_bubbles(engine)       # after deepspeed.initialize
    for batch in ...:
        engine.train_batch(data)
    lender.close()                                      # gives an unfinished group back

From then on, between batches, the stage takes the next fused group that a sweep with
`fusion.placement: bubbles` queued in the cluster's `BubblePool`, and its `BubbleExecutor` trains
the group (a `SweepGroupGuest`) in the stage's idle windows, reporting each iteration to the
group's Tune trials. A stage asked to yield (its job reclaimed the memory, see `bubble_pool`)
gives the group back before its next step.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import ray

from hpo.base.exceptions import describe_exception
from pipeline_bubble.api import predicted_windows
from pipeline_bubble.bubble_pool import bubble_pool
from pipeline_bubble.executor import SAFETY, BubbleExecutor
from pipeline_bubble.instrumented_engine import InstrumentedPipelineEngine, instrument
from pipeline_bubble.profile import PipelineProfile
from pipeline_bubble.sweep_guest import SweepGroupGuest

#: After refusing a group (over its memory cap, or its steps fit none of the stage's windows), a
#: stage waits this many poll intervals to ask again, so that another stage takes the group first.
REFUSED_BACKOFF = 20


class _PeriodicQuery:
    """A remote call made at most once per interval and read without blocking the stage."""

    def __init__(self, call: Callable[[], ray.ObjectRef], interval_s: float):
        self.call = call
        self.interval_s = interval_s
        self.pending: ray.ObjectRef | None = None
        self.next_at = 0.0

    def answer(self) -> Any:
        """The latest call's answer once it has come; None while the call is not due or pending."""
        if self.pending is None:
            if time.monotonic() < self.next_at:
                return None
            self.pending = self.call()
        done, _ = ray.wait([self.pending], timeout=0)
        if not done:
            return None
        value, self.pending = ray.get(self.pending), None
        self.next_at = time.monotonic() + self.interval_s
        return value


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
        #: Groups that left this stage unfinished (yielded, refused, or the job ended) to train
        #: elsewhere: `groups_taken` less these is the groups that ended on this stage.
        self.groups_given_back = 0
        self._take = _PeriodicQuery(lambda: self.pool.take.remote(self.host_id), poll_interval_s)
        self._yield = _PeriodicQuery(lambda: self.pool.should_yield.remote(self.host_id), poll_interval_s)

    def next_guest(self) -> SweepGroupGuest | None:
        """Non-blocking: a group if the pool has answered with one since the last batch.

        A group this stage cannot build (a member's model raises for its config, the group's actor
        is gone) fails its member trials, so the sweep reports the error, and the stage is free
        for the next group: the job itself never sees the exception."""
        group = self._take.answer()
        if group is None:
            return None
        self.groups_taken += 1
        try:
            assignment = ray.get(group.assignment.remote())
            return SweepGroupGuest(group, assignment, self.engine.device, self._closed, self._yield_requested)
        except Exception as error:
            group.fail.remote(f"building the fused group on pipeline stage {self.engine.stage_id} failed: "
                              f"{describe_exception(error)}")
            self.pool.done.remote(self.host_id)
            return None

    def _yield_requested(self) -> bool:
        """Non-blocking: whether the pool asked this stage to give its group back (its owner
        reclaimed the memory, or the allocator moved the sweep); asked once per poll interval."""
        if not self._yield.answer():
            return False
        self.groups_yielded += 1
        self.engine.bubble_executor.request_evict()
        return True

    def _closed(self, group: Any, unfinished: bool) -> None:
        if unfinished:
            self.groups_given_back += 1
            self.pool.give_back.remote(self.host_id, group)
            if self.engine.bubble_executor.refused is not None:  # not for this stage: leave it to others
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
    safety: float = SAFETY,
    profile: PipelineProfile | None = None,
) -> BubbleLender:
    """Lend this rank's pipeline bubbles to sweeps targeting them (`fusion.placement: bubbles`).

    Call on every rank, after `deepspeed.initialize` (the engine is instrumented if it is not
    yet) and with Ray connected. `owner`: the job's id when the allocator runs it
    (`ctx.job_id`), so the allocator decides which sweeps use these bubbles. `memory_cap_bytes`
    refuses groups larger than the stage can spare. Returns the lender; `close()` it when the
    job ends. With the job's `profile`, every group it takes starts from the windows the replay
    predicts (`api.predicted_windows`) instead of learning them first.
    """
    if not ray.is_initialized():
        # Ray's first remote call would start a cluster of this rank's own, listening beyond
        # loopback, where no sweep's groups ever are: the job would train on, lending to no one.
        raise RuntimeError(
            "lend_bubbles needs this rank connected to the Ray cluster the sweeps run on: call "
            "ray.init(address=...) before it (or run the rank as a Ray actor)"
        )
    engine = instrument(engine) if not isinstance(engine, InstrumentedPipelineEngine) else engine
    lender = BubbleLender(engine, poll_interval_s, owner)
    executor = BubbleExecutor(None, memory_cap_bytes=memory_cap_bytes, safety=safety, guest_source=lender.next_guest)
    if profile is not None:
        executor.seed_windows(predicted_windows(engine, profile))
    engine.attach_executor(executor)
    return lender
