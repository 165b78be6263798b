"""Python client of the live allocator: start it, submit / list / cancel jobs.

Connect to Ray first (``ray.init(address=...)``); every call finds the named
actor ``hpo:allocator`` in namespace ``hpo``.

    import ray
    from scheduler_bridge.live import client

    ray.init(address="auto")
    client.start_allocator("/var/lib/hpo/journal.jsonl", "/shared/hpo", policy="qssf")
    jid = client.submit("mypkg.train:main", gpus=4, batch_size=256, user="ana")
    client.list_jobs()
    client.cancel(jid)
"""

from __future__ import annotations

import os
import time
import uuid

import ray
from ray.exceptions import ActorDiedError, RayTaskError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from hpo.base.actor_names import ALLOCATOR_NAME, NAMESPACE
from .allocator import Allocator
from .job_state import JobSpec


def _answer(ref, timeout: float | None = None):
    """The allocator's answer to one call. Its refusal (a ValueError it raised: an unknown job, a
    spec its policy cannot run) comes back as that ValueError, one line, not inside Ray's
    ``RayTaskError`` with the actor's traceback around it."""
    try:
        return ray.get(ref, timeout=timeout)
    except RayTaskError as e:
        if isinstance(e.cause, ValueError):
            raise e.cause.with_traceback(None) from None
        raise


def get_allocator():
    """The running allocator's handle; ValueError naming the fix if there is none."""
    try:
        return ray.get_actor(ALLOCATOR_NAME, namespace=NAMESPACE)
    except ValueError:
        raise ValueError(f"no allocator running (named actor {ALLOCATOR_NAME!r} in namespace {NAMESPACE!r}); "
                         "start one with scheduler_bridge.live.client.start_allocator(...) or `hpo job start`") from None


def start_allocator(journal_path: str, storage_path: str, policy: str = "fifo", *,
                    base_policy: str = "fifo", backfill: bool | None = None, seed: int = 0,
                    profiles_dir: str | None = None, tick_s: float = 0.2,
                    stop_grace_s: float = 60.0, start_timeout_s: float = 120.0,
                    cpus_per_bundle: float = 0.0, runtime_env: dict | None = None,
                    max_restarts: int = -1, node_id: str | None = None, wait_s: float = 60.0,
                    tiresias: dict | None = None, ces: dict | None = None,
                    lucid: dict | None = None):
    """Start the allocator (or return the running one) and wait until it answers.

    ``journal_path``: its append-only journal on the local disk of ``node_id``
    (default: this process's node), where the actor is pinned so that a restart
    finds the file again. ``storage_path``: where jobs checkpoint (``<storage>/jobs/<id>``);
    every GPU node must see it (shared filesystem) on a multi-machine cluster.
    ``policy``: fifo, sjf, srtf, qssf, tiresias, lucid, elastic, elastic-fixed-batch or tuning-aware
    (over ``base_policy``). ``tiresias``: ``Tiresias`` options (``thresholds`` in GPU-seconds
    of attained service, ``starvation``); preempted jobs checkpoint through ``ctx.should_stop``.
    ``policy="ces:<base>"`` keeps the forecast GPU capacity through Ray's autoscaler
    (``request_resources``); ``ces``: its knobs (``allocator._live_ces``). ``policy="lucid"``
    profiles jobs that name no ``workload`` first (``profiling``) and packs waiting jobs beside
    running ones of as many GPUs (``packing``);
    ``lucid``: its knobs (``allocator._live_lucid``: table, margin, Lucid's own). ``runtime_env``: for the allocator and the jobs it starts
    (e.g. ``{"env_vars": {"PYTHONPATH": ...}}`` so entry points import).

    Relative paths are this process's (the actor's own folder is wherever Ray started). An
    allocator already running on another journal or policy is a ValueError (stop it first), and
    so is one that cannot start (its journal cannot be opened...): one line naming the cause.
    """
    journal_path, storage_path = os.path.abspath(journal_path), os.path.abspath(storage_path)
    try:
        running = get_allocator()
    except ValueError:
        pass
    else:
        now = _answer(running.status.remote(), timeout=wait_s)
        if (now["journal"], now["policy"]) != (journal_path, policy):
            raise ValueError(f"an allocator is already running with --policy {now['policy']} and --journal "
                             f"{now['journal']}; stop it first (hpo job stop: its journal keeps the queue)")
        return running
    node_id = node_id or ray.get_runtime_context().get_node_id()
    opts = dict(name=ALLOCATOR_NAME, namespace=NAMESPACE, lifetime="detached", num_cpus=0,
                max_restarts=max_restarts, max_task_retries=-1, max_concurrency=1,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False))
    if runtime_env:
        opts["runtime_env"] = runtime_env
    try:
        actor = ray.remote(Allocator).options(**opts).remote(
            str(journal_path), str(storage_path), policy, base_policy=base_policy, backfill=backfill,
            seed=seed, profiles_dir=profiles_dir, tick_s=tick_s, stop_grace_s=stop_grace_s,
            start_timeout_s=start_timeout_s, cpus_per_bundle=cpus_per_bundle, runtime_env=runtime_env,
            tiresias=tiresias, ces=ces, lucid=lucid)
    except ValueError:  # someone else started it first
        return get_allocator()
    try:
        ray.get(actor.ping.remote(), timeout=wait_s)
    except ActorDiedError as e:
        if not e.actor_init_failed:
            raise
        # Ray keeps only the text of the error its constructor raised; the last line is the error
        cause = [line.strip() for line in str(e).splitlines() if line.strip()][-1]
        raise ValueError(f"the allocator could not start: {cause}") from None
    return actor


def stop_allocator(release_jobs: bool = True) -> None:
    """Kill the allocator for good (no restart). With ``release_jobs`` its running jobs'
    groups are removed first; the journal stays, so a new allocator requeues them."""
    actor = get_allocator()
    if release_jobs:
        ray.get(actor.shutdown.remote())
    ray.kill(actor, no_restart=True)
    deadline = time.time() + 30
    while time.time() < deadline:  # the name is free once Ray has seen it die
        try:
            ray.get_actor(ALLOCATOR_NAME, namespace=NAMESPACE)
        except ValueError:
            return
        time.sleep(0.1)


def submit(entrypoint: str, gpus: int = 1, *, request_id: str | None = None, **fields) -> int:
    """Queue a training job; returns its id. ``fields``: the rest of ``JobSpec``
    (name, user, vc, config, batch_size, min_batch, max_batch, application,
    min_gpus, max_gpus, expected_seconds, bubble_fraction, bubble_capacity_gpu_s, iteration_s,
    max_attempts, workload; ``live.cli.bubble_lending`` gives the bubble fields from a profile).
    Validated here first; a retried call with the same ``request_id`` never
    queues the job twice."""
    spec = JobSpec(entrypoint=entrypoint, gpus=gpus, **fields)
    rid = request_id or uuid.uuid4().hex
    return _answer(get_allocator().submit.remote(spec.to_dict(), rid))


def submit_sweep(sweep: str, groups: int, *, request_id: str | None = None, **fields) -> int:
    """Queue a running sweep (``fusion.placement: bubbles``) as a tuning job of ``groups``
    groups (tuning-aware policy only): the allocator places them as guests on idle GPUs and in
    running pipeline jobs' bubbles, and the bubble pool hands its fused groups only to those
    hosts. Cancel the job when the sweep ends."""
    return submit("hpo.tuner.sweep:build_tuner", 1, request_id=request_id, kind="tuning", groups=groups,
                  sweep=sweep, name=sweep, **fields)


def list_jobs() -> list[dict]:
    return _answer(get_allocator().list.remote())


def get_job(job_id: int) -> dict:
    return _answer(get_allocator().get.remote(job_id))


def cancel(job_id: int) -> bool:
    return _answer(get_allocator().cancel.remote(job_id))


def status() -> dict:
    return _answer(get_allocator().status.remote())


def wait_job(job_id: int, timeout_s: float = 300.0, poll_s: float = 0.5) -> dict:
    """Block until the job ends (done, failed or cancelled); returns its summary."""
    deadline = time.time() + timeout_s
    while True:
        job = get_job(job_id)
        if job["state"] in ("done", "failed", "cancelled"):
            return job
        if time.time() > deadline:
            raise TimeoutError(f"job {job_id} still {job['state']} after {timeout_s:.0f} s")
        time.sleep(poll_s)
