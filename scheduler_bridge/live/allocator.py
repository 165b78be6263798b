"""The live allocator: one named, detached, restartable Ray actor (``hpo:allocator``).

It owns the GPU inventory (alive nodes' ``GPU`` resources from ``ray.nodes()``,
refreshed every second), the job table and the policy, driven through
``driver.LiveDriver`` (the simulator's policy objects). A background
thread ticks every ``tick_s``:

1. collect finished, stopped, failed and dead jobs (``JobRunner.wait``);
2. ``driver.decide`` against the inventory: lost jobs (a node is gone) go back
   to the queue; stops (resize, preemption) ask the job to checkpoint and return;
   starts become placement groups (``placement_groups``) created only now that the
   allocator's own accounting says they fit, so Ray never reorders the queue;
   tuning groups become guest placements; for a sweep submitted as a tuning job
   (``hpo run --allocator``) they become real: an ``IdleGpuHost`` actor holds each
   idle GPU given to it, and the bubble pool's quotas send its fused groups to
   exactly those hosts and to the pipeline jobs' stages it was granted (groups
   leave when an ordinary job needs the GPU or the owner reclaims its memory);
3. every change is appended to the journal (``journal``: a checksummed write-ahead
   log) before it is acted on;
4. Lucid: jobs that name no workload run on its profiling partition first, and
   what they measured classifies them (``profiling``); a packed job runs in
   its host's group, which stays until neither runs in it (``_end``);
   CES: the capacity to keep is asked of Ray's autoscaler (``autoscaling``).

A restarted allocator (Ray restarts it, ``max_restarts``) replays the journal
through the same driver (CES's demand history and last autoscaler request
included: they are journaled too, as ``demand`` and ``capacity`` events), finds
the running jobs' detached actors by name and waits on them again; a job whose
actors are gone goes back to the queue and resumes from its checkpoint. Submits
carry a request id, so a client retry after a crash never makes a second job.

Start it with ``client.start_allocator``; talk to it with ``client``.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import ray

from . import placement_groups
from hpo.base.actor_names import NAMESPACE, idle_gpu_host_name
from .journal import Journal
from .driver import FAULTS, LiveDriver
from ..policies.demand_forecast import DemandForecaster
from ..interference import InterferenceTable
from .packing import SHARE, LivePacking
from .job_state import JobSpec, LiveJob
from ..policies.ces import CES
from ..policies.lucid import Lucid
from ..policies.tiresias import Tiresias
from ..power_model import PowerModel

log = logging.getLogger(__name__)


def _live_ces(pol: CES, options: dict) -> tuple[CES, int | None]:
    """CES with the operator's knobs: margin, spare_nodes, interval (s), boot_delay (s),
    forecast (``DemandForecaster`` arguments) and max_nodes (the autoscaler's limit;
    default: every GPU node the allocator has seen)."""
    forecast, boot, max_nodes = options.pop("forecast", None), options.pop("boot_delay", None), \
        options.pop("max_nodes", None)
    return CES(pol.base, power=PowerModel(boot_delay=boot) if boot is not None else None,
               forecaster=DemandForecaster(**forecast) if forecast else None, **options), max_nodes


def _live_lucid(options: dict, backfill: bool, seed: int) -> LivePacking:
    """Lucid with the operator's knobs: table (an interference CSV from ``hpo profile colocate``;
    default: the shipped one), margin (``packing``) and ``Lucid``'s own (max_slowdown,
    min_gain, priority_ratio, gpu_memory_mb)."""
    table, margin = options.pop("table", None), options.pop("margin", 0.25)
    lucid = Lucid(InterferenceTable.load(table) if table else None, backfill, seed=seed, **options)
    return LivePacking(lucid, margin)


@dataclass
class _Run:
    """Handles of one running attempt (not journaled: found again by name)."""

    name: str
    workers: list
    waits: list
    ready: object = None              # the group's ready() ref, until it resolves
    starting: list | None = None      # the ranks' start() refs, until all resolve
    started: float = field(default_factory=time.time)
    stop_deadline: float | None = None


class Allocator:
    """The actor class; see the module docstring. Public methods are the RPC surface."""

    def __init__(self, journal_path: str, storage_path: str, policy: str = "fifo", *,
                 base_policy: str = "fifo", backfill: bool | None = None, seed: int = 0,
                 profiles_dir: str | None = None, tick_s: float = 0.2, stop_grace_s: float = 60.0,
                 start_timeout_s: float = 120.0, cpus_per_bundle: float = 0.0,
                 runtime_env: dict | None = None, tiresias: dict | None = None,
                 ces: dict | None = None, lucid: dict | None = None):
        from ..app_profiles import load_profiles
        from ..policies.registry import make_policy

        packing = None
        if policy == "lucid":
            packing = _live_lucid(dict(lucid or {}), True if backfill is None else backfill, seed)
            pol = packing.lucid
        else:
            pol = make_policy(policy, backfill=backfill, seed=seed, base=base_policy)
        if policy == "tiresias" and tiresias:
            pol = Tiresias(pol.backfill, **tiresias)
        self.max_nodes = None
        if isinstance(pol, CES):
            pol, self.max_nodes = _live_ces(pol, dict(ces or {}))
        profiles = load_profiles(profiles_dir) if policy.startswith("elastic") else None
        self.driver = LiveDriver(pol, profiles, packing)
        self.storage = Path(storage_path)
        self.tick_s, self.stop_grace_s, self.start_timeout_s = tick_s, stop_grace_s, start_timeout_s
        self.cpus_per_bundle, self.runtime_env = cpus_per_bundle, runtime_env
        self.lock = threading.RLock()
        self.journal = Journal(journal_path)
        records = self.journal.scan().records
        for problem in self.driver.replay(records):
            self.journal.note(f"{self.journal.path}: {problem}")
        self.replayed = len(records)
        self.restarted = ray.get_runtime_context().was_current_actor_reconstructed
        self.order: list[str] = []
        self.inventory: dict[str, int] = {}
        self._nodes_at = 0.0
        self.runs: dict[int, _Run] = {}
        self.ticks = 0               # decisions made and acted on since this actor (re)started
        self.tick_errors = 0
        self.last_error = ""
        self._closing = False
        self._pushed_quotas: dict[str, dict[int | str, int]] = {}
        self._gpu_hosts: dict[str, object] = {}
        self._gpus_per_node = 1      # largest GPU node seen: the bundle CES asks for per node
        with self.lock:
            self._refresh_nodes(force=True)
            self._reattach()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="allocator-loop")
        self._thread.start()

    # ---- RPC ----------------------------------------------------------------------
    def submit(self, spec: dict, request_id: str = "") -> int:
        """Queue a job (``JobSpec`` fields); returns its id. The same ``request_id``
        twice returns the first job's id instead of queueing a second job."""
        with self.lock:
            if request_id and request_id in self.driver.by_request:
                return self.driver.by_request[request_id]
            js = JobSpec.from_dict(spec)
            self.driver.check(js)
            jid = self.driver.next_id
            self._emit({"ev": "submit", "job_id": jid, "request_id": request_id, "spec": js.to_dict()})
            return jid

    def list(self) -> list[dict]:
        with self.lock:
            return [j.summary() for j in sorted(self.driver.jobs.values(), key=lambda j: j.job_id)]

    def get(self, job_id: int) -> dict:
        with self.lock:
            return self._job(job_id).summary()

    def cancel(self, job_id: int) -> bool:
        """Cancel a job; False if it had already ended."""
        with self.lock:
            job = self._job(job_id)
            if not job.active:
                return False
            if job.state in ("running", "stopping"):
                self._release(job)
            self._emit({"ev": "finish", "job_id": job_id, "status": "cancelled"})
            return True

    def progress(self, job_id: int, attempt: int, done: float) -> bool:
        """Attempt ``attempt`` of the job checkpointed ``done`` (0..1) of its work; the
        policy plans with it from now on. False (ignored) if that attempt is no
        longer the job's current one, or the job has ended."""
        with self.lock:
            job = self._job(job_id)
            if not job.active or job.attempt != attempt:
                return False
            self._emit({"ev": "progress", "job_id": job_id, "done": float(done)})
            return True

    def reclaim_bubbles(self, job_id: int) -> int:
        """The pipeline job ``job_id`` needs its memory: evict its guests; returns how many."""
        with self.lock:
            n = sum(1 for t in self.driver.jobs.values() for w in t.guests.values()
                    if w[0] == "bubble" and w[1] == job_id)
            self._emit({"ev": "reclaim", "job_id": job_id})
            return n

    def status(self) -> dict:
        with self.lock:
            states: dict[str, int] = {}
            for j in self.driver.jobs.values():
                states[j.state] = states.get(j.state, 0) + 1
            return {"policy": self.driver.policy.name, "inventory": dict(self.inventory),
                    "nodes": list(self.order), "jobs": states, "restarted": self.restarted,
                    "replayed_events": self.replayed, "journal": str(self.journal.path),
                    "journal_problems": list(self.journal.problems),
                    "capacity_request": self.driver.capacity.requested if self.driver.capacity else None,
                    "packed": {j.job_id: j.share[0] for j in self.driver.jobs.values()
                               if j.share and self.driver.host_of(j) is not None},
                    "ticks": self.ticks, "tick_errors": self.tick_errors, "last_error": self.last_error}

    def ping(self) -> bool:
        return True

    def shutdown(self) -> int:
        """Stop scheduling and release every running job's group (jobs stay journaled
        as they are: a new allocator on the same journal requeues them). Returns how many."""
        with self.lock:
            self._closing = True
            for host in list(self._gpu_hosts):
                ray.kill(self._gpu_hosts.pop(host), no_restart=True)
            n = 0
            for job in self.driver.jobs.values():
                if job.state in ("running", "stopping"):
                    self._release(job, shared_too=True)
                    n += 1
            self.journal.close()
            return n

    # ---- internals ----------------------------------------------------------------
    def _job(self, job_id: int) -> LiveJob:
        try:
            return self.driver.jobs[int(job_id)]
        except KeyError:
            raise ValueError(f"no job {job_id}; known: 0..{self.driver.next_id - 1}") from None

    def _emit(self, ev: dict) -> None:
        ev.setdefault("t", time.time())
        self.journal.append(ev)
        self.driver.apply(ev)

    def _refresh_nodes(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._nodes_at < 1.0:
            return
        self._nodes_at = now
        inv = {}
        for n in ray.nodes():
            gpus = int(n.get("Resources", {}).get("GPU", 0))
            if n.get("Alive") and gpus > 0:
                inv[n["NodeID"]] = gpus
                if n["NodeID"] not in self.order:
                    self.order.append(n["NodeID"])
        self.inventory = inv

    def _contexts(self, job: LiveJob) -> list[dict]:
        ranks = self.driver.ranks(job)
        return [{"job_id": job.job_id, "attempt": job.attempt, "rank": r, "world_size": len(ranks),
                 "gpus": job.gpus, "local_gpus": k, "batch_size": job.batch_size,
                 "checkpoint_dir": str(self.storage / "jobs" / str(job.job_id)),
                 "config": dict(job.spec.config), "name": job.spec.name}
                for r, (_, k) in enumerate(ranks)]

    def _reattach(self) -> None:
        """After a restart: wait again on running jobs whose actors survived; requeue the rest."""
        for job in list(self.driver.jobs.values()):
            if job.state not in ("running", "stopping"):
                continue
            name = placement_groups.group_name(job.job_id, job.attempt)
            n = len(self.driver.ranks(job))
            workers = placement_groups.find_ranks(name, n)
            if len(workers) < n or any(node not in self.inventory for node, _ in job.where):
                placement_groups.release(name, n, workers)
                self._requeue(job, "lost")
                continue
            run = _Run(name, workers, [w.wait.remote() for w in workers],
                       starting=[w.start.remote() for w in workers])
            if job.state == "stopping":
                for w in workers:
                    w.stop.remote()
                run.stop_deadline = time.time() + self.stop_grace_s
            self.runs[job.job_id] = run
        self._release_ended_groups()

    def _release_ended_groups(self) -> None:
        """Remove the groups (and ranks) of attempts that no running job holds: an attempt's end
        is journaled before its group is released (`_close_run`), so a kill in between leaves
        the group to the next allocator, and GPUs held by no job would never be placed again."""
        held = set()
        for job in self.driver.jobs.values():
            if job.state in ("running", "stopping"):
                held.add(placement_groups.group_name(job.job_id, job.attempt))
                if job.gpu_group:
                    held.add(placement_groups.group_name(*job.gpu_group))
        for name, bundles in placement_groups.groups_named_like_ours().items():
            if name not in held:
                placement_groups.release(name, bundles)

    def _requeue(self, job: LiveJob, reason: str, error: str = "") -> None:
        if reason in FAULTS and job.faults + 1 >= job.spec.max_attempts:
            self._emit({"ev": "finish", "job_id": job.job_id, "status": "failed",
                        "error": error or f"gave up after {job.faults + 1} faults ({reason})"})
        else:
            self._emit({"ev": "requeue", "job_id": job.job_id, "reason": reason})

    def _loop(self) -> None:
        while not self._closing:
            try:
                with self.lock:
                    if self._closing:
                        return
                    self._tick()
                    self.ticks += 1
            except Exception as exc:  # noqa: BLE001  -- keep scheduling; visible in status()
                self.tick_errors += 1
                self.last_error = repr(exc)
                log.exception("allocator tick failed")
            time.sleep(self.tick_s)

    def _tick(self) -> None:
        self._refresh_nodes()
        self._collect()
        d = self.driver.decide(self.inventory, self.order, time.time())
        for jid in d.lost:
            job = self.driver.jobs[jid]
            self._release(job)
            self._requeue(job, "node-lost")
        for jid, reason in d.stops:
            run = self.runs.get(jid)
            self._emit({"ev": "stop", "job_id": jid, "reason": reason})
            if run is not None:
                for w in run.workers:
                    w.stop.remote()
                run.stop_deadline = time.time() + self.stop_grace_s
        for jid, where, gpus, batch in d.starts:
            self._start(jid, where, gpus, batch, profiling=jid in d.profiling)
        for jid, host in d.packs:
            self._start_packed(jid, host)
        for tid, g in d.evictions:
            self._emit({"ev": "evict", "job_id": tid, "group": g})
        for tid, g, where in d.guests:
            self._emit({"ev": "guest", "job_id": tid, "group": g, "where": where})
        self._sync_sweep_guests()
        if self.driver.capacity is not None:
            self._request_capacity()

    def _request_capacity(self) -> None:
        """CES: journal the demand sample, then ask Ray's autoscaler for the GPU nodes to keep on
        (``autoscaling``); the request is journaled before it is made, like every change."""
        from ray.autoscaler.sdk import request_resources

        self._gpus_per_node = max([self._gpus_per_node, *self.inventory.values()])
        now = time.time()
        demand = self.driver.demand_event(now)
        if demand is not None:
            self._emit(demand)
        ask = self.driver.capacity_event(now, self._gpus_per_node, self.max_nodes or len(self.order))
        if ask is not None:
            self._emit(ask)
            request_resources(bundles=self.driver.capacity.requested)
            log.info("CES: asked the autoscaler to keep %d GPU node(s)", ask["nodes"])

    def _sync_sweep_guests(self) -> None:
        """Make sweeps' guest placements real: one `IdleGpuHost` per idle GPU placed, and the
        bubble pool's quotas (each such host may hold one group, each pipeline job as many as
        were placed in its bubbles; nothing once the sweep's tuning job has ended)."""
        sweeps = [j for j in self.driver.jobs.values() if j.spec.kind == "tuning" and j.spec.sweep]
        if not sweeps:
            return
        from pipeline_bubble.bubble_pool import bubble_pool
        from pipeline_bubble.idle_gpu_host import idle_gpu_host_id

        quotas: dict[str, dict[int | str, int]] = {}
        gpus: dict[str, str] = {}
        for job in sweeps:
            counts: dict[int | str, int] = {}
            for group, where in job.guests.items() if job.active else ():
                if where[0] == "gpu":
                    host = idle_gpu_host_id(job.job_id, group)
                    gpus[host] = where[1]
                    counts[host] = 1
                else:
                    counts[int(where[1])] = counts.get(int(where[1]), 0) + 1
            quotas[job.spec.sweep] = counts
        changed = {sweep: q for sweep, q in quotas.items() if self._pushed_quotas.get(sweep) != q}
        if not changed and gpus.keys() == self._gpu_hosts.keys():
            return
        pool = bubble_pool()
        for host in set(self._gpu_hosts) - set(gpus):  # evicted: its group goes back in line first
            pool.unregister.remote(host)
            ray.kill(self._gpu_hosts.pop(host), no_restart=True)
        for host, node in gpus.items():
            if host not in self._gpu_hosts:
                self._gpu_hosts[host] = self._idle_gpu_host(host, node)
        for sweep, q in changed.items():
            pool.set_quotas.remote(sweep, q)
        self._pushed_quotas.update(changed)

    def _idle_gpu_host(self, host: str, node: str):
        """The host actor of one idle-GPU placement: found again after an allocator restart."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from pipeline_bubble.idle_gpu_host import IdleGpuHost

        name = idle_gpu_host_name(host)
        try:
            return ray.get_actor(name, namespace=NAMESPACE)
        except ValueError:
            pass
        options = dict(name=name, namespace=NAMESPACE, lifetime="detached", num_gpus=1,
                       scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False))
        if self.runtime_env:
            options["runtime_env"] = self.runtime_env
        actor = IdleGpuHost.options(**options).remote(host)
        actor.run.remote()
        return actor

    def _start(self, jid: int, where, gpus: int, batch, profiling: bool = False) -> None:
        job = self.driver.jobs[jid]
        attempt = job.attempt + 1
        self._emit({"ev": "start", "job_id": jid, "attempt": attempt, "where": [list(w) for w in where],
                    "gpus": gpus, "batch_size": batch, **({"profiling": True} if profiling else {})})
        name = placement_groups.group_name(jid, attempt)
        ranks = self.driver.ranks(job)
        placement_groups.release(name, len(ranks))   # leftovers of an attempt whose journal record was lost
        share = SHARE if self.driver.shareable(job) else 1.0
        try:
            pg = placement_groups.create_group(name, ranks, self.cpus_per_bundle)
            workers = placement_groups.launch_ranks(pg, name, ranks, job.spec.entrypoint, self._contexts(job),
                                             self.runtime_env, share)
        except Exception as exc:  # noqa: BLE001  -- Ray refused: back to the queue
            placement_groups.release(name, len(ranks))
            self._requeue(job, "fault", repr(exc))
            return
        self.runs[jid] = _Run(name, workers, [w.wait.remote() for w in workers], ready=pg.ready(),
                              starting=[w.start.remote() for w in workers])

    def _start_packed(self, jid: int, host_id: int) -> None:
        """Lucid: run ``jid`` on the free half of the host's GPU, in the group that holds it."""
        job, host = self.driver.jobs[jid], self.driver.jobs[host_id]
        attempt = job.attempt + 1
        self._emit({"ev": "start-packed", "job_id": jid, "attempt": attempt, "host": host_id})
        name = placement_groups.group_name(jid, attempt)
        ranks = self.driver.ranks(job)
        placement_groups.release(name, len(ranks))
        pg = placement_groups.find_group(placement_groups.group_name(*host.gpu_group))
        try:
            if pg is None:
                raise RuntimeError(f"host {host_id}'s placement group is gone")
            workers = placement_groups.launch_ranks(pg, name, ranks, job.spec.entrypoint, self._contexts(job),
                                             self.runtime_env, SHARE)
        except Exception as exc:  # noqa: BLE001  -- back to the queue
            placement_groups.release(name, len(ranks))
            self._requeue(job, "fault", repr(exc))
            return
        self.runs[jid] = _Run(name, workers, [w.wait.remote() for w in workers], ready=pg.ready(),
                              starting=[w.start.remote() for w in workers])

    def _collect(self) -> None:
        now = time.time()
        for jid, run in list(self.runs.items()):
            job = self.driver.jobs[jid]
            if run.ready is not None:
                done, _ = ray.wait([run.ready], timeout=0)
                if done:
                    run.ready = None
                elif now - run.started > self.start_timeout_s:
                    self._close_run(jid, run)
                    self._requeue(job, "fault", "placement group not ready in time")
                    continue
            if run.starting is not None:
                started, _ = ray.wait(run.starting, num_returns=len(run.starting), timeout=0)
                if len(started) == len(run.starting):
                    run.starting = None   # its service counts from here, not from the placement
                    self._emit({"ev": "ready", "job_id": jid, "attempt": job.attempt})
            done, _ = ray.wait(run.waits, num_returns=len(run.waits), timeout=0)
            outcomes, died = [], ""
            for ref in done:
                try:
                    outcomes.append(ray.get(ref))
                except Exception as exc:  # noqa: BLE001  -- actor died: node lost or killed
                    died = repr(exc)
            if died:
                self._close_run(jid, run)
                self._refresh_nodes(force=True)   # a dead node must not get the retry
                lost = any(n not in self.inventory for n, _ in job.where)
                self._requeue(job, "node-lost" if lost else "fault", died)
                continue
            errors = [o["error"] for o in outcomes if o["status"] == "error"]
            if errors:
                self._close_run(jid, run, {"ev": "finish", "job_id": jid, "status": "failed", "error": errors[0]})
                continue
            if len(done) == len(run.waits):
                chief = ray.get(run.waits[0])
                ran = {"ran_s": chief["elapsed"]} if "elapsed" in chief else {}
                ends = []
                if chief["status"] == "stopped" and job.profiling and job.stop_reason == "profiled":
                    ends.append(self.driver.profile_event(job, max(o["peak_memory_mb"] for o in outcomes)))
                if chief["status"] == "stopped":
                    ends.append({"ev": "requeue", "job_id": jid, "reason": job.stop_reason or "stopped", **ran})
                else:
                    ends.append({"ev": "finish", "job_id": jid, "status": "done", "result": chief.get("value"), **ran})
                self._close_run(jid, run, *ends)
                continue
            if run.stop_deadline is not None and now > run.stop_deadline:
                # did not checkpoint in time: resumes from its last checkpoint
                self._close_run(jid, run, {"ev": "requeue", "job_id": jid, "reason": job.stop_reason or "stopped"})

    def _close_run(self, jid: int, run: _Run, *events: dict) -> None:
        """Journal what the attempt came to (`events`, if this call knows), then release its ranks
        and group.

        In this order, an allocator killed in between finds the outcome in its journal and
        releases the group at its restart (`_release_ended_groups`); the other way round, it
        found the job running with its ranks gone and ran a finished job again."""
        group = self._group_left(self.driver.jobs[jid])   # before a requeue forgets the job's group
        for event in events:
            self._emit(event)
        self.runs.pop(jid, None)
        placement_groups.release(run.name, len(run.workers), run.workers, group)

    def _release(self, job: LiveJob, shared_too: bool = False) -> None:
        """Kill the current attempt's actors (found by name if this allocator never held their
        handles) and remove the group holding its GPUs, unless a packed partner still runs
        there (``shared_too``: remove it anyway, when every job goes)."""
        run = self.runs.pop(job.job_id, None)
        group = placement_groups.group_name(*job.gpu_group) if shared_too and job.gpu_group else self._group_left(job)
        placement_groups.release(placement_groups.group_name(job.job_id, job.attempt), len(self.driver.ranks(job)),
                          run.workers if run else None, group)

    def _group_left(self, job: LiveJob) -> str:
        """The name of the group to remove with ``job``'s ranks ("": none, a partner runs there)."""
        left = self.driver.group_left_by(job)
        return "" if left is None else placement_groups.group_name(*left)
