"""The live driver: the same policy objects the simulator runs, driven by a real job table.

``LiveDriver`` has no Ray in it. It keeps the job table, changes it only by
``apply(event)`` (the allocator journals each event first, and a restarted
allocator replays the journal through the same method), and turns the table plus
the current GPU inventory into ``Decisions`` with the simulator's machinery:

- queue policies (FIFO, SJF, SRTF, QSSF, tuning-aware): ``policy.priority`` when a
  job (re-)enters the queue, ``policy.observe`` when one finishes (``priorities``
  after a refit), ``pending_queue.select_starts`` on the cluster's ``FreeGPUs`` for who
  starts where, ``policy.victims`` for preemptive policies;
- the elastic policy: ``ElasticPolicy.allocate`` over the active elastic jobs;
  a running job whose decided placement differs is stopped (checkpoint) and
  restarted where the policy put it, with the policy's GPU count and batch size;
- tuning-aware: ``TuningAware.evictions`` / ``fill`` place tuning groups as
  guests on idle GPUs and in pipeline jobs' bubbles;
- Tiresias ranks by the service a job has actually run (``_ranked``), counted
  from when its ranks are up (``ready`` events);
- Lucid profiles jobs that name no workload on its profiling partition first
  (``profiling``), then packs waiting jobs beside running ones of as many
  GPUs (``packing``); a packed job's GPUs are its host's, so the pair counts once;
- CES keeps its demand history and its last autoscaler request in the journal too
  (``demand`` and ``capacity`` events), so a restarted allocator forecasts from
  the same past (``autoscaling``).

Events that cannot be applied (a damaged or foreign journal record) are refused
whole by ``check_event``; ``replay`` skips them and says which, by offset.

A job that reports its progress with its checkpoints (``progress`` events: the
fraction of its work done) is planned with it, as the simulator plans with its
jobs' modelled progress: the remaining time SRTF ranks and preempts by, and the
epoch whose gradient statistics set the elastic policy's GPU count and batch size.

Nodes are Ray node ids; the policies see them as indices 0..n-1 of the alive
GPU nodes (``ClusterView``), in the order the allocator first saw them.

>>> from scheduler_bridge.policies.queue import FIFO
>>> d = LiveDriver(FIFO(backfill=True))
>>> d.apply({"ev": "submit", "t": 0.0, "job_id": 0, "spec": {"entrypoint": "m:f", "gpus": 2}})
>>> d.decide({"n1": 4}, ["n1"], now=1.0).starts
[(0, (('n1', 2),), 2, None)]
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import count

from ..cluster import ClusterSpec, FreeGPUs, Placement
from ..jobs import Job
from .packing import LivePacking, measured_slowdown, ranks
from .autoscaling import CapacityPlan
from .profiling import LiveProfiling
from .job_state import TERMINAL, JobSpec, LiveJob, Where
from ..policies._base import Policy, TuningHooks
from ..policies.pending_queue import PendingQueue, select_starts
from ..policies.elastic import ElasticJobState, ElasticPolicy
from ..policies.lucid import Lucid

FAULTS = ("fault", "node-lost", "lost")   # requeue reasons that count against max_attempts

# The fields each journal event must carry (beyond "ev" and "job_id") and their types: checked
# before an event touches the table, so a damaged or foreign record is refused whole.
_NUM = (int, float)
EVENT_FIELDS: dict[str, dict[str, type | tuple]] = {
    "submit": {"spec": dict}, "start": {"attempt": int, "where": list, "gpus": int},
    "start-packed": {"attempt": int, "host": int}, "ready": {"attempt": int},
    "stop": {"reason": str}, "requeue": {"reason": str}, "finish": {"status": str},
    "progress": {"done": _NUM}, "guest": {"group": (int, str), "where": list},
    "evict": {"group": (int, str)}, "reclaim": {}, "profile": {"memory_mb": _NUM, "workload": str},
}
# Events about the cluster rather than one job (no job_id): CES's demand samples and requests.
CLUSTER_EVENT_FIELDS: dict[str, dict[str, type | tuple]] = {
    "demand": {"gpus": _NUM}, "capacity": {"nodes": int, "gpus_per_node": int},
}


class ClusterView:
    """The alive GPU nodes as the policies' ``ClusterSpec`` / ``FreeGPUs``.

    Nodes with fewer GPUs than the largest one keep the difference permanently
    taken, so the policies' placement rule never uses GPUs that do not exist.
    """

    def __init__(self, inventory: dict[str, int], order: list[str]):
        self.nodes = [n for n in order if inventory.get(n, 0) > 0]
        self.index = {n: i for i, n in enumerate(self.nodes)}
        gpn = max((inventory[n] for n in self.nodes), default=1)
        self.spec = ClusterSpec(num_gpus=max(1, len(self.nodes)) * gpn, gpus_per_node=gpn)
        self.free = FreeGPUs(self.spec)
        if not self.nodes:
            self.free.take(((0, gpn),))
        for i, n in enumerate(self.nodes):
            if inventory[n] < gpn:
                self.free.take(((i, gpn - inventory[n]),))

    def alive(self, where: Where) -> bool:
        return all(n in self.index for n, _ in where)

    def to_placement(self, where: Where) -> Placement:
        return tuple((self.index[n], k) for n, k in where)

    def to_where(self, placement: Placement) -> Where:
        return tuple((self.nodes[i], k) for i, k in placement)


@dataclass
class Decisions:
    """What the allocator should do now. ``starts``: (job, where, gpus, batch)."""

    lost: list[int] = field(default_factory=list)
    starts: list[tuple[int, Where, int, int | None]] = field(default_factory=list)
    stops: list[tuple[int, str]] = field(default_factory=list)
    guests: list[tuple[int, int, list]] = field(default_factory=list)
    evictions: list[tuple[int, int]] = field(default_factory=list)
    packs: list[tuple[int, int]] = field(default_factory=list)   # (queued job, running host)
    profiling: list[int] = field(default_factory=list)   # the starts that are Lucid profiling runs

    def __bool__(self) -> bool:
        return bool(self.lost or self.starts or self.stops or self.guests or self.evictions or self.packs)


class LiveDriver:
    """Job table + policy. ``apply`` events, then ``decide`` against the inventory."""

    def __init__(self, policy, profiles: dict | None = None, packing: LivePacking | None = None):
        if not isinstance(policy, Policy):
            raise TypeError(f"not a scheduling policy: {policy!r}")
        self.policy = policy
        self.elastic = isinstance(policy, ElasticPolicy)
        self.tuning = "tuning" in policy.layers
        if self.elastic and profiles is None:
            from ..app_profiles import load_profiles
            profiles = load_profiles()
        self.profiles = profiles or {}
        if isinstance(policy, Lucid) and packing is None:
            packing = LivePacking(policy)
        self.packing = packing
        self.profiler = LiveProfiling(packing.lucid) if packing and packing.lucid.profile_nodes else None
        self.capacity = CapacityPlan(policy) if "power" in policy.layers else None
        policy.reset(0.0)  # live times are Unix seconds
        self.jobs: dict[int, LiveJob] = {}
        self.by_request: dict[str, int] = {}
        self.next_id = 0
        self._qseq = count()

    # ---- validation ---------------------------------------------------------------
    def check(self, spec: JobSpec) -> None:
        """Raise ValueError if this policy cannot run ``spec``."""
        if spec.kind == "tuning" and not self.tuning:
            raise ValueError(f"tuning jobs need the tuning-aware policy; this allocator runs {self.policy.name}")
        if self.elastic:
            if spec.kind != "train" or not spec.elastic:
                raise ValueError(f"the {self.policy.name} policy only runs elastic jobs: give application= "
                                 f"(one of {', '.join(sorted(self.profiles))})")
            if (spec.min_gpus or 1) > 1:
                raise ValueError(f"min_gpus={spec.min_gpus}: the {self.policy.name} policy (shared with the "
                                 "simulator) has no lower GPU bound; leave min_gpus at 1")
            if spec.application not in self.profiles:
                raise ValueError(f"unknown application {spec.application!r}; measured profiles: "
                                 f"{', '.join(sorted(self.profiles))}")

    # ---- events -------------------------------------------------------------------
    def _policy_job(self, job: LiveJob, duration: float | None = None) -> Job:
        s = job.spec
        return Job(job_id=job.job_id, submit=job.submit_t, gpus=s.gpus,
                   duration=s.expected_seconds if duration is None else duration,
                   user=s.user, name=s.name, vc=s.vc, bubble_fraction=s.bubble_fraction)

    def _ran(self, job: LiveJob, now: float) -> float:
        return job.run_s + (now - job.seg_start if job.state in ("running", "stopping") else 0.0)

    def _ranked(self, job: LiveJob, now: float) -> tuple[Job, float]:
        """(the policy's Job, remaining seconds) to rank ``job`` by. A policy that ranks by
        attained service (Tiresias) is told what the job actually ran, never an estimate:
        duration = run time + hint and remaining = hint, so duration - remaining is the run time."""
        if self.policy.ranks_running:
            hint = job.spec.expected_seconds
            return self._policy_job(job, self._ran(job, now) + hint), hint
        return self._policy_job(job), self._remaining(job, now)

    def _remaining(self, job: LiveJob, now: float) -> float:
        """Seconds of work left. From the job's own checkpointed progress when it
        reported any (the wall clock also counts start-up, waiting for a checkpoint
        and steps redone after a fault); else the hint minus the time it ran."""
        if job.progress is not None:
            return job.spec.expected_seconds * (1.0 - job.progress)
        return max(job.spec.expected_seconds - self._ran(job, now), 0.0)

    def _enqueue(self, job: LiveJob, t: float) -> None:
        job.state, job.where, job.gpus, job.stop_reason, job.share = "queued", (), 0, "", None
        job.gpu_group = None
        job.profiling = False
        if self.elastic:
            job.priority = job.submit_t
        else:
            job.priority = float(self.policy.priority(*self._ranked(job, t), t))
        job.qseq = next(self._qseq)

    def _end_segment(self, job: LiveJob, t: float, ran_s: float | None = None) -> None:
        """``ran_s``: how long the entry point itself ran, when its runner said so
        (actor start-up is not the job's run time); else the wall clock since start."""
        if job.state in ("running", "stopping"):
            job.run_s += max(0.0, t - job.seg_start) if ran_s is None else float(ran_s)
        self._drop_bubble_guests(job.job_id)

    def _drop_bubble_guests(self, owner: int) -> None:
        for tj in self.jobs.values():
            if tj.guests:
                tj.guests = {g: w for g, w in tj.guests.items() if not (w[0] == "bubble" and w[1] == owner)}

    def check_event(self, ev: dict) -> None:
        """Raise ValueError naming what is wrong if ``ev`` cannot be applied to this table."""
        kind = ev.get("ev")
        if kind in CLUSTER_EVENT_FIELDS:
            if not isinstance(ev.get("t"), _NUM):
                raise ValueError(f"{kind} event needs a numeric t")
            return self._check_fields(ev, CLUSTER_EVENT_FIELDS[kind], f"{kind} event")
        if kind not in EVENT_FIELDS:
            raise ValueError(f"unknown journal event {kind!r}")
        if not isinstance(ev.get("t", 0.0), _NUM) or not isinstance(ev.get("job_id"), int):
            raise ValueError(f"{kind} event needs a numeric t and an int job_id")
        self._check_fields(ev, EVENT_FIELDS[kind], f"{kind} event of job {ev['job_id']}")
        if kind == "submit":
            if ev["job_id"] in self.jobs:
                raise ValueError(f"job {ev['job_id']} submitted twice")
            try:
                JobSpec.from_dict(ev["spec"])
            except TypeError as exc:
                raise ValueError(f"submit of job {ev['job_id']}: {exc}") from None
        elif ev["job_id"] not in self.jobs:
            raise ValueError(f"{kind} event for job {ev['job_id']}, which was never submitted")
        if kind == "start" and not all(isinstance(w, list) and len(w) == 2 and isinstance(w[0], str)
                                       and isinstance(w[1], int) for w in ev["where"]):
            raise ValueError(f"start of job {ev['job_id']}: where must be [[node, gpus], ...]")
        if kind == "start-packed" and (ev["host"] not in self.jobs or not self.jobs[ev["host"]].where):
            raise ValueError(f"packed start of job {ev['job_id']}: host {ev['host']} is not running")
        if kind == "finish" and ev["status"] not in TERMINAL:
            raise ValueError(f"finish of job {ev['job_id']}: status {ev['status']!r} not one of {TERMINAL}")

    @staticmethod
    def _check_fields(ev: dict, fields: dict[str, type | tuple], what: str) -> None:
        for key, typ in fields.items():
            if not isinstance(ev.get(key), typ) or isinstance(ev.get(key), bool):
                raise ValueError(f"{what}: field {key!r} missing or not {getattr(typ, '__name__', 'a number')}")

    def replay(self, records) -> list[str]:
        """Apply journal ``records`` ((offset, event) pairs) in order; an event that cannot be
        applied is skipped, never fatal. Returns one line per skipped event, naming its offset."""
        skipped = []
        for offset, ev in records:
            try:
                self.check_event(ev)
            except ValueError as exc:
                skipped.append(f"record at byte offset {offset} skipped: {exc}")
                continue
            self.apply(ev)
        return skipped

    def apply(self, ev: dict) -> None:
        kind, t = ev["ev"], float(ev.get("t", 0.0))
        if kind in CLUSTER_EVENT_FIELDS:
            self._apply_power(kind, t, ev)
            return
        if kind == "submit":
            spec = JobSpec.from_dict(ev["spec"])
            job = LiveJob(job_id=ev["job_id"], spec=spec, submit_t=t, request_id=ev.get("request_id", ""))
            self.jobs[job.job_id] = job
            self.next_id = max(self.next_id, job.job_id + 1)
            if job.request_id:
                self.by_request[job.request_id] = job.job_id
            self._enqueue(job, t)
            return
        job = self.jobs[ev["job_id"]]
        if kind == "start-packed":   # into the reserved half of the host's GPU
            host = self.jobs[ev["host"]]
            ev = {**ev, "where": [list(w) for w in host.where], "gpus": job.spec.gpus}
            kind = "start"
        if kind == "start":
            job.state, job.attempt = "running", ev["attempt"]
            job.where = tuple((n, int(k)) for n, k in ev["where"])
            job.gpus, job.batch_size, job.seg_start = ev["gpus"], ev.get("batch_size"), t
            job.share = [ev["host"], self.jobs[ev["host"]].attempt] if "host" in ev else None
            # a packed job lives in its host's group, which outlives the host while it runs there
            job.gpu_group = list(self.jobs[ev["host"]].gpu_group) if "host" in ev else [job.job_id, job.attempt]
            job.profiling = bool(ev.get("profiling", False))
            job.samples = []
            if job.first_start is None:
                job.first_start = t
            if not self.elastic:
                self.policy.on_start(self._policy_job(job), t)
            job.runs.append({"attempt": job.attempt, "gpus": job.gpus, "batch_size": job.batch_size,
                             "where": [list(w) for w in job.where]})
        elif kind == "ready":   # every rank is up: run time counts from now, not from the start
            if ev["attempt"] == job.attempt and job.state == "running" and job.ready_attempt != job.attempt:
                job.seg_start, job.ready_attempt = t, job.attempt
        elif kind == "stop":
            job.state, job.stop_reason = "stopping", ev["reason"]
        elif kind == "requeue":
            self._end_segment(job, t, ev.get("ran_s"))
            job.requeues.append(ev["reason"])
            if ev["reason"] == "interference" and job.share:
                job.avoid.append(job.share[0])
            if ev["reason"] == "profiled" and job.profiled is None:
                job.profiled = {"memory_mb": None, "workload": ""}   # stopped before it measured
            if ev["reason"] in FAULTS:
                job.faults += 1
            self._enqueue(job, t)
        elif kind == "finish":
            self._end_segment(job, t, ev.get("ran_s"))
            was_running = job.first_start is not None
            job.state, job.finish_t = ev["status"], t
            job.where, job.gpus = (), 0
            job.result, job.error = ev.get("result"), ev.get("error", "")
            job.guests = {}
            if (ev["status"] == "done" and job.spec.kind == "train" and was_running
                    and not self.elastic and self.policy.observe(self._policy_job(job, job.run_s), t)):
                self._reprioritise(t)
        elif kind == "progress":
            job.progress = float(ev["done"])
            if job.state == "running":
                job.samples.append((t, job.progress))
            if job.state == "queued" and not self.elastic:  # reported after it was requeued
                job.priority = float(self.policy.priority(*self._ranked(job, t), t))
        elif kind == "guest":
            job.guests[str(ev["group"])] = list(ev["where"])
        elif kind == "evict":
            job.guests.pop(str(ev["group"]), None)
        elif kind == "profile":
            job.profiled = {"memory_mb": float(ev["memory_mb"]), "workload": ev["workload"]}
        elif kind == "reclaim":
            job.reclaimed = True
            self._drop_bubble_guests(job.job_id)
        else:
            raise ValueError(f"unknown journal event {kind!r}")

    def _apply_power(self, kind: str, t: float, ev: dict) -> None:
        """CES's demand history and last request. A journal written under CES and replayed
        under another policy has no plan to restore: the events describe the cluster, not a job."""
        if self.capacity is None:
            return
        if kind == "demand":
            self.capacity.record(t, float(ev["gpus"]))
        else:
            self.capacity.asked(t, ev["nodes"], ev["gpus_per_node"])

    # ---- decisions ----------------------------------------------------------------
    def _demand(self) -> tuple[int, list[int]]:
        """(busy GPUs, GPUs each waiting job asks for); a packed pair holds one GPU."""
        jobs = [j for j in self.jobs.values() if j.active and j.spec.kind == "train"]
        busy = sum(j.gpus for j in jobs if j.state != "queued" and self.host_of(j) is None)
        return busy, [j.spec.gpus for j in jobs if j.state == "queued"]

    def demand_event(self, now: float) -> dict | None:
        """CES: the demand sample to journal now, or None when it adds nothing to the history."""
        gpus = self.capacity.demand(now, *self._demand())
        return None if gpus is None else {"ev": "demand", "t": now, "gpus": gpus}

    def capacity_event(self, now: float, gpus_per_node: int, max_nodes: int) -> dict | None:
        """CES: the new autoscaler request to journal (and then make), or None (``autoscaling``)."""
        want = self.capacity.wanted(now, gpus_per_node, max_nodes, *self._demand())
        return None if want is None else {"ev": "capacity", "t": now, "nodes": len(want),
                                          "gpus_per_node": gpus_per_node}

    def active(self) -> list[LiveJob]:
        return sorted((j for j in self.jobs.values() if j.active and j.spec.kind == "train"),
                      key=lambda j: j.job_id)

    def decide(self, inventory: dict[str, int], order: list[str], now: float) -> Decisions:
        view = ClusterView(inventory, order)
        out = Decisions()
        holding = []
        for job in self.active():
            if job.state in ("running", "stopping"):
                if view.alive(job.where):
                    if self.host_of(job) is None:   # a packed job's GPU is its host's
                        view.free.take(view.to_placement(job.where))
                    holding.append(job)
                else:
                    out.lost.append(job.job_id)
        if self.elastic:
            self._decide_elastic(view, holding, out, now)
        else:
            self._decide_queue(view, holding, out, now)
        if self.tuning:
            self._decide_guests(view, out)
        return out

    def host_of(self, job: LiveJob) -> LiveJob | None:
        """The running job whose GPU ``job`` shares, or None (alone, or its host has left)."""
        if not job.share:
            return None
        host = self.jobs.get(job.share[0])
        if host is None or host.attempt != job.share[1] or host.state not in ("running", "stopping"):
            return None
        return host

    def group_left_by(self, job: LiveJob) -> list | None:
        """The group holding ``job``'s GPUs if no other running job is in it (remove it with the
        job), else None (a packed partner still runs there: the group stays)."""
        others = any(j is not job and j.state in ("running", "stopping") and j.gpu_group == job.gpu_group
                     for j in self.jobs.values())
        return None if others or job.gpu_group is None else job.gpu_group

    def partner_of(self, host: LiveJob) -> LiveJob | None:
        """The running job packed into ``host``'s GPU, if any."""
        for j in self.jobs.values():
            if j.state in ("running", "stopping") and self.host_of(j) is host:
                return j
        return None

    def shareable(self, job: LiveJob) -> bool:
        """Runs on half its GPU so that a partner can join it later (``packing``)."""
        return self.packing is not None and self.packing.shareable(self.workload_of(job))

    def ranks(self, job: LiveJob) -> Where:
        """Where ``job``'s ranks run: one per bundle of its placement, or one per GPU for a job
        that may be packed (``packing.ranks``)."""
        return ranks(job.where) if self.shareable(job) else job.where

    def workload_of(self, job: LiveJob) -> str:
        """Its interference-table workload: as submitted, else as its profiling run classified it."""
        return job.spec.workload or (job.profiled or {}).get("workload", "")

    def needs_profiling(self, job: LiveJob) -> bool:
        """Lucid profiles a job whose workload it does not know yet, once."""
        return self.profiler is not None and not job.spec.workload and job.profiled is None

    def profile_event(self, job: LiveJob, memory_mb: float) -> dict:
        """The journal record of what ``job``'s profiling run measured, and its class."""
        return {"ev": "profile", "job_id": job.job_id, "memory_mb": float(memory_mb),
                "workload": self.profiler.classify(memory_mb)}

    def _decide_packing(self, holding: list[LiveJob], waiting: list[LiveJob], out: Decisions) -> None:
        """Lucid: pack waiting jobs beside running ones its rule allows; part pairs that run
        slower than its table predicted."""
        rule = self.packing
        hosts = {}
        for h in holding:
            partner = self.partner_of(h)
            if partner is not None:
                slow = measured_slowdown(h.samples, partner.seg_start)
                if (partner.state == "running" and slow is not None
                        and rule.too_slow(self.workload_of(h), self.workload_of(partner), slow)):
                    out.stops.append((partner.job_id, "interference"))
            elif h.state == "running" and self.shareable(h) and self.host_of(h) is None:   # alone
                hosts[h.job_id] = h
        for job in waiting:
            if not self.shareable(job):
                continue
            costs = [(c, hid) for hid, h in hosts.items() if hid not in job.avoid
                     and (c := rule.cost(self.workload_of(job), job.priority, self.workload_of(h), h.priority,
                                         gpus=(job.spec.gpus, h.gpus))) is not None]
            if costs:
                _, hid = min(costs)
                out.packs.append((job.job_id, hid))
                del hosts[hid]

    def _decide_profiling(self, view: ClusterView, holding: list[LiveJob], queued: list[LiveJob],
                          out: Decisions, now: float) -> tuple[FreeGPUs, list[LiveJob]]:
        """Lucid's partition (``profiling``): stop profiling runs whose time is up, start
        unprofiled jobs there first come first served, and return the main partition's free
        GPUs with the jobs that queue for it (the profiled, and those too big to profile)."""
        for job in holding:
            if (job.profiling and job.state == "running" and job.ready_attempt == job.attempt
                    and now - job.seg_start >= self.profiler.seconds):
                out.stops.append((job.job_id, "profiled"))
        part = {view.index[n] for n in self.profiler.partition(view.nodes)}
        main, prof = view.free.copy(), view.free.copy()
        for i, k in enumerate(view.free.free):
            (prof if i not in part else main).take(((i, k),))
        largest = max((view.free.cap[i] for i in part), default=0)
        to_profile = PendingQueue()
        for job in queued:
            if self.needs_profiling(job) and job.spec.gpus <= largest:
                to_profile.push(job.job_id, job.spec.gpus, job.qseq)
        for jid, p in select_starts(to_profile, prof, backfill=True):
            out.starts.append((jid, view.to_where(p), self.jobs[jid].spec.gpus, self.jobs[jid].spec.batch_size))
            out.profiling.append(jid)
        waiting = set(to_profile.job_ids())
        return main, [j for j in queued if j.job_id not in waiting and j.job_id not in out.profiling]

    def _reprioritise(self, t: float) -> None:
        queued = [j for j in self.jobs.values() if j.state == "queued"]
        prios = self.policy.priorities([self._ranked(j, t) for j in queued], t)
        for j, p in zip(queued, prios):
            j.priority = float(p)

    def _decide_queue(self, view: ClusterView, holding: list[LiveJob], out: Decisions, now: float) -> None:
        if self.policy.ranks_running and self.policy.wake_at() <= now:
            self._reprioritise(now)   # Tiresias: starved jobs are promoted (not journaled: replay redoes it)
        queue = PendingQueue()
        queued = sorted((j for j in self.active() if j.state == "queued"), key=lambda j: j.qseq)
        free = view.free
        if self.profiler is not None:
            free, queued = self._decide_profiling(view, holding, queued, out, now)
        for job in queued:
            queue.push(job.job_id, job.spec.gpus, job.priority)
        for jid, p in select_starts(queue, free, self.policy.backfill):
            job = self.jobs[jid]
            out.starts.append((jid, view.to_where(p), job.spec.gpus, job.spec.batch_size))
        if self.packing is not None:
            waiting = sorted((self.jobs[j] for j in queue.job_ids()), key=lambda j: (j.priority, j.qseq))
            self._decide_packing(holding, waiting, out)
            if out.packs:
                return   # packing is Lucid's answer to a full cluster, instead of preempting
        if not (self.policy.preemptive and len(queue)):
            return
        if any(j.state == "stopping" for j in holding):
            return  # earlier victims are still checkpointing
        _, _, head_id, _ = queue.heads()[0]
        head = self.jobs[head_id]
        running = [j for j in holding if j.state == "running" and self.host_of(j) is None]
        cands = [self._ranked(j, now) for j in running]
        victims = self.policy.victims(self._ranked(head, now), cands, now)
        trial, chosen = view.free.copy(), []
        for v in victims:
            trial.give(view.to_placement(self.jobs[v].where))
            chosen.append(v)
            if trial.place(head.spec.gpus) is not None:
                break
        else:
            chosen = []
        out.stops.extend((v, "preempt") for v in chosen)

    def _decide_elastic(self, view: ClusterView, holding: list[LiveJob], out: Decisions, now: float) -> None:
        jobs = sorted(self.active(), key=lambda j: (j.submit_t, j.job_id))
        held = {j.job_id for j in holding if j.state == "running"}
        states = []
        for j in jobs:
            running = j.job_id in held
            app = self.profiles[j.spec.application]
            states.append(ElasticJobState(
                j.job_id, app, app.epoch_at(j.progress or 0.0), j.spec.batch_size or 0,
                j.spec.max_gpus or j.spec.gpus, j.gpus if running else 0,
                view.to_placement(j.where) if running else ()))
        decisions = self.policy.allocate(states, view.spec)
        for j in jobs:
            d = decisions.get(j.job_id)
            target = view.to_where(d.placement) if d else ()
            if j.job_id in held:
                if tuple(sorted(target)) != tuple(sorted(j.where)):
                    out.stops.append((j.job_id, "resize" if target else "preempt"))
            elif j.state == "queued" and d is not None:
                p = view.to_placement(target)
                if all(view.free.free[i] >= k for i, k in p):
                    view.free.take(p)
                    out.starts.append((j.job_id, target, d.gpus, j.spec.clamp_batch(int(d.batch_size))))

    def _decide_guests(self, view: ClusterView, out: Decisions) -> None:
        policy: TuningHooks = self.policy
        tuning = sorted((j for j in self.jobs.values() if j.active and j.spec.kind == "tuning"),
                        key=lambda j: j.job_id)
        on_node: dict[int, list[tuple[int, int]]] = {}
        in_bubbles: dict[int, int] = {}
        for tj in tuning:
            for g, w in sorted(tj.guests.items(), key=lambda kv: int(kv[0])):
                if w[0] == "gpu":
                    if w[1] in view.index:
                        on_node.setdefault(view.index[w[1]], []).append((tj.job_id, int(g)))
                    else:
                        out.evictions.append((tj.job_id, int(g)))
                else:
                    in_bubbles[w[1]] = in_bubbles.get(w[1], 0) + 1
        free = view.free.free
        for node, groups in on_node.items():  # ordinary jobs took the GPUs: evict at once
            k = policy.evictions(len(groups), free[node])
            for tid, g in groups[len(groups) - k:]:
                out.evictions.append((tid, g))
            del groups[len(groups) - k:]
        idle = {n: free[n] - len(on_node.get(n, [])) for n in range(len(view.nodes))
                if free[n] > len(on_node.get(n, []))}
        owners = {j.job_id: j for j in self.active()
                  if j.state == "running" and j.spec.bubble_fraction > 0 and not j.reclaimed}
        slots = {o: j.gpus - in_bubbles.get(o, 0) for o, j in owners.items() if j.gpus > in_bubbles.get(o, 0)}
        pending = [(tj.job_id, g) for tj in tuning for g in range(tj.spec.groups) if str(g) not in tj.guests]
        places, _ = policy.fill(idle, slots, len(pending))
        for (tid, g), (kind, at) in zip(pending, places):
            where = ["gpu", view.nodes[at]] if kind == "gpu" else ["bubble", at]
            out.guests.append((tid, g, where))
