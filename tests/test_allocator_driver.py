"""The live allocator's decision layer without Ray: journal replay, the same policy
objects as the simulator, preemption, elastic resizes and tuning guests."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings, strategies as st

from scheduler_bridge import ClusterSpec, Job, make_policy, make_trace, simulate
from scheduler_bridge.live.journal import Journal
from scheduler_bridge.live.driver import LiveDriver
from scheduler_bridge.live.job_state import JobSpec

NODES = ["n0", "n1", "n2"]
INV = {n: 4 for n in NODES}


class Recorder:
    """What the allocator does with an event: journal it, then apply it."""

    def __init__(self, driver: LiveDriver, journal: Journal | None = None):
        self.driver, self.journal, self.t = driver, journal, 1000.0

    def emit(self, ev: dict, dt: float = 1.0) -> None:
        self.t += dt
        ev = {"t": self.t, **ev}
        if self.journal:
            self.journal.append(ev)
        self.driver.apply(ev)

    def submit(self, gpus: int, request_id: str = "", **spec) -> int:
        jid = self.driver.next_id
        spec = JobSpec(entrypoint="m:f", gpus=gpus, **spec).to_dict()
        self.emit({"ev": "submit", "job_id": jid, "request_id": request_id, "spec": spec})
        return jid

    def start_decided(self) -> list:
        d = self.driver.decide(INV, NODES, self.t)
        for jid, where, gpus, batch in d.starts:
            self.emit({"ev": "start", "job_id": jid, "attempt": self.driver.jobs[jid].attempt + 1,
                       "where": [list(w) for w in where], "gpus": gpus, "batch_size": batch,
                       **({"profiling": True} if jid in d.profiling else {})})
        return d.starts


def test_replaying_the_journal_rebuilds_the_same_table_and_policy_state(tmp_path):
    path = tmp_path / "j.jsonl"
    rec = Recorder(LiveDriver(make_policy("qssf")), Journal(path))
    a = rec.submit(8, user="long", request_id="r-a")
    b = rec.submit(8, user="short")
    rec.start_decided()
    rec.emit({"ev": "finish", "job_id": a, "status": "done", "ran_s": 300.0}, dt=300)
    rec.start_decided()
    rec.emit({"ev": "finish", "job_id": b, "status": "done", "ran_s": 5.0}, dt=5)
    c, d = rec.submit(8, user="long"), rec.submit(8, user="short")
    rec.start_decided()
    rec.emit({"ev": "requeue", "job_id": d, "reason": "node-lost"})

    again = LiveDriver(make_policy("qssf"))
    for ev in Journal(path).replay():
        again.apply(ev)
    summaries = lambda drv: [j.summary() for j in sorted(drv.jobs.values(), key=lambda j: j.job_id)]
    assert summaries(again) == summaries(rec.driver)
    assert again.next_id == 4 and again.by_request == {"r-a": a}
    assert again.jobs[c].priority > again.jobs[d].priority, "the rebuilt QSSF history ranks 'short' first"


@pytest.mark.parametrize("policy", ["fifo", "sjf", "qssf"])
def test_live_driver_starts_the_same_jobs_in_the_same_places_as_the_simulator(policy):
    demands = [(4, 50.0), (8, 10.0), (2, 30.0), (4, 5.0), (2, 70.0), (1, 20.0)]
    trace = make_trace([Job(i, 0.0, g, d) for i, (g, d) in enumerate(demands)])
    sim = simulate(trace, make_policy(policy), ClusterSpec(12, 4))
    sim_started = {i for i, t in enumerate(sim.log.first_start) if t == 0.0}

    rec = Recorder(LiveDriver(make_policy(policy)))
    for g, d in demands:
        rec.emit({"ev": "submit", "job_id": rec.driver.next_id, "spec":
                  JobSpec(entrypoint="m:f", gpus=g, expected_seconds=d).to_dict()}, dt=0.0)
    live_started = {jid for jid, *_ in rec.start_decided()}
    assert live_started == sim_started, f"{policy}: live started {live_started}, simulator {sim_started}"


def test_srtf_preempts_the_running_job_with_more_remaining_gpu_time():
    rec = Recorder(LiveDriver(make_policy("srtf")))
    big = rec.submit(12, expected_seconds=1000.0)
    rec.start_decided()
    small = rec.submit(4, expected_seconds=10.0)
    d = rec.driver.decide(INV, NODES, rec.t)
    assert d.starts == [] and d.stops == [(big, "preempt")]
    rec.emit({"ev": "stop", "job_id": big, "reason": "preempt"})
    assert rec.driver.decide(INV, NODES, rec.t).stops == [], "no second preemption while one is stopping"
    rec.emit({"ev": "requeue", "job_id": big, "reason": "preempt"})
    assert [s[0] for s in rec.start_decided()] == [small]


def test_elastic_policy_resizes_a_running_job_when_others_arrive():
    rec = Recorder(LiveDriver(make_policy("elastic")))
    el = dict(application="bert", max_gpus=8, batch_size=12, max_batch=256)
    a = rec.submit(8, **el)
    (start,) = rec.start_decided()
    assert start[2] == 8 and len(start[1]) == 2, "alone, bert is worth 8 GPUs on two nodes"
    b, c = rec.submit(4, **el), rec.submit(4, **el)
    d = rec.driver.decide(INV, NODES, rec.t)
    assert d.stops == [(a, "resize")], "three bert jobs: 4 + 4 + 4 beats keeping A on 8"
    assert all(s[0] in (b, c) for s in d.starts)
    rec.emit({"ev": "stop", "job_id": a, "reason": "resize"})
    first = {s[0] for s in rec.start_decided()}
    rec.emit({"ev": "requeue", "job_id": a, "reason": "resize", "ran_s": 2.0})
    then = {s[0]: (s[2], s[3]) for s in rec.start_decided()}
    assert first | set(then) == {a, b, c}, "a job whose GPUs A still holds waits for A's checkpoint"
    assert then[a] == (4, 256), "A back on 4 GPUs, bert's best batch 384 clamped to max_batch"
    assert rec.driver.jobs[a].requeues == ["resize"]


def test_elastic_policy_plans_with_reported_progress_which_survives_a_restart(tmp_path):
    path = tmp_path / "j.jsonl"
    rec = Recorder(LiveDriver(make_policy("elastic")), Journal(path))
    el = dict(application="cifar10", max_gpus=8, batch_size=128)
    a, b = rec.submit(4, **el), rec.submit(4, **el)
    assert sorted((s[0], s[2]) for s in rec.start_decided()) == [(a, 4), (b, 4)]
    assert rec.driver.decide(INV, NODES, rec.t).stops == [], "in epoch 0 more GPUs buy cifar10 nothing"
    rec.emit({"ev": "progress", "job_id": a, "done": 0.6})
    assert rec.driver.decide(INV, NODES, rec.t).stops == [(a, "resize")], \
        "60% done, A is in epoch 59 of 100, where its gradient noise makes 8 GPUs pay"

    again = LiveDriver(make_policy("elastic"))
    for ev in Journal(path).replay():
        again.apply(ev)
    assert again.decide(INV, NODES, rec.t).stops == [(a, "resize")], "a restarted allocator knows A's progress"


def test_srtf_does_not_preempt_a_job_whose_reported_progress_leaves_less_than_the_newcomer():
    rec = Recorder(LiveDriver(make_policy("srtf")))
    big = rec.submit(12, expected_seconds=1000.0)
    rec.start_decided()
    rec.emit({"ev": "progress", "job_id": big, "done": 0.99})
    rec.submit(4, expected_seconds=100.0)
    assert rec.driver.decide(INV, NODES, rec.t).stops == [], \
        "big has 1% of 1000 s on 12 GPUs left (120 GPU-s), less than the newcomer's 400 GPU-s"


def test_progress_reported_after_a_preempted_job_was_requeued_reranks_it():
    rec = Recorder(LiveDriver(make_policy("srtf")))
    a = rec.submit(4, expected_seconds=1000.0)
    rec.start_decided()
    rec.emit({"ev": "stop", "job_id": a, "reason": "preempt"})
    rec.emit({"ev": "requeue", "job_id": a, "reason": "preempt", "ran_s": 2.0})
    rec.emit({"ev": "progress", "job_id": a, "done": 0.5})   # its stop-time checkpoint, reported late
    assert rec.driver.jobs[a].priority == pytest.approx(500.0 * 4)


def test_a_node_that_disappears_reports_its_running_jobs_lost():
    rec = Recorder(LiveDriver(make_policy("fifo")))
    a, b = rec.submit(4), rec.submit(4)
    rec.start_decided()
    gone = rec.driver.jobs[b].where[0][0]
    inv = {n: g for n, g in INV.items() if n != gone}
    d = rec.driver.decide(inv, NODES, rec.t)
    assert d.lost == [b] and d.starts == []
    assert rec.driver.jobs[a].where[0][0] != gone


def test_tuning_groups_take_idle_gpus_and_bubbles_and_are_evicted_for_owners():
    rec = Recorder(LiveDriver(make_policy("tuning-aware", base="fifo")))
    inv, nodes = {"n0": 4}, ["n0"]
    pipe = rec.submit(2, bubble_fraction=0.3)
    d = rec.driver.decide(inv, nodes, rec.t)
    for jid, where, gpus, batch in d.starts:
        rec.emit({"ev": "start", "job_id": jid, "attempt": 1, "where": [list(w) for w in where],
                  "gpus": gpus, "batch_size": batch})
    tune = rec.submit(1, kind="tuning", groups=5, sweep="lr_sweep")
    d = rec.driver.decide(inv, nodes, rec.t)
    assert [w for *_, w in d.guests] == [["gpu", "n0"]] * 2 + [["bubble", pipe]] * 2, \
        "2 idle GPUs first, then the pipeline job's 2 GPUs of bubbles; the 5th group waits"
    for tid, g, w in d.guests:
        rec.emit({"ev": "guest", "job_id": tid, "group": g, "where": w})

    other = rec.submit(2)   # an ordinary job needs the idle GPUs: the guests there leave at once
    d = rec.driver.decide(inv, nodes, rec.t)
    assert [s[0] for s in d.starts] == [other]
    for jid, where, gpus, batch in d.starts:
        rec.emit({"ev": "start", "job_id": jid, "attempt": 1, "where": [list(w) for w in where],
                  "gpus": gpus, "batch_size": batch})
    assert sorted(d.evictions) == [(tune, 0), (tune, 1)]
    for tid, g in d.evictions:
        rec.emit({"ev": "evict", "job_id": tid, "group": g})

    rec.emit({"ev": "reclaim", "job_id": pipe})   # the owner needs its memory back
    assert rec.driver.jobs[tune].guests == {}
    assert rec.driver.decide(inv, nodes, rec.t).guests == [], "no bubbles offered after a reclaim"


def test_a_sweeps_groups_go_first_to_the_pipeline_job_with_the_most_predicted_bubble_room():
    rec = Recorder(LiveDriver(make_policy("tuning-aware", base="fifo")))
    inv, nodes = {"n0": 4}, ["n0"]
    roomy = rec.submit(2, bubble_capacity_gpu_s=0.3, iteration_s=1.0)  # 0.15 GPU-s per stage and second
    tight = rec.submit(2, bubble_capacity_gpu_s=0.1, iteration_s=0.5)  # 0.10
    for jid, where, gpus, batch in rec.driver.decide(inv, nodes, rec.t).starts:
        rec.emit({"ev": "start", "job_id": jid, "attempt": 1, "where": [list(w) for w in where],
                  "gpus": gpus, "batch_size": batch})
    rec.submit(1, kind="tuning", groups=3, sweep="lr_sweep")
    placed = [w for *_, w in rec.driver.decide(inv, nodes, rec.t).guests]
    # roomy has 0.30 left, then 0.15 (one stage taken); tight has 0.20 throughout the first two
    assert placed == [["bubble", roomy], ["bubble", tight], ["bubble", roomy]]
    assert rec.driver.jobs[roomy].summary()["bubble_capacity_gpu_s"] == 0.3


@pytest.mark.parametrize("bad, message", [
    (dict(entrypoint="train"), "package.module:function"),
    (dict(entrypoint="m:f", gpus=0), "gpus must be an int >= 1"),
    (dict(entrypoint="m:f", max_gpus=4), "application="),
    (dict(entrypoint="m:f", kind="tuning", sweep="s"), "groups >= 1"),
    (dict(entrypoint="m:f", kind="tuning", groups=2), "a tuning job is a running sweep"),
    (dict(entrypoint="m:f", sweep="lr_sweep"), "is for tuning jobs"),
    (dict(entrypoint="m:f", min_batch=64, max_batch=32), "min_batch 64 > max_batch 32"),
    (dict(entrypoint="m:f", bubble_capacity_gpu_s=0.5), "needs the iteration's length"),
])
def test_job_spec_names_the_bad_field(bad, message):
    with pytest.raises(ValueError, match=message):
        JobSpec(**bad)


def test_policies_refuse_jobs_they_cannot_run():
    with pytest.raises(ValueError, match="only runs elastic jobs"):
        LiveDriver(make_policy("elastic")).check(JobSpec(entrypoint="m:f", gpus=2))
    with pytest.raises(ValueError, match="no lower GPU bound"):
        LiveDriver(make_policy("elastic")).check(
            JobSpec(entrypoint="m:f", gpus=4, application="bert", min_gpus=2, max_gpus=8))
    with pytest.raises(ValueError, match="need the tuning-aware policy"):
        LiveDriver(make_policy("fifo")).check(JobSpec(entrypoint="m:f", kind="tuning", groups=2, sweep="s"))


def tiresias(thresholds=(100.0,)):
    from scheduler_bridge.policies.tiresias import Tiresias

    return Tiresias(thresholds=thresholds)


def test_tiresias_preempts_a_demoted_job_for_a_newcomer_by_attained_service_not_the_hint():
    rec = Recorder(LiveDriver(tiresias()))
    big = rec.submit(12, expected_seconds=1.0)      # a hint that would make SRTF keep it
    rec.start_decided()
    rec.submit(4, expected_seconds=1e6)
    assert rec.driver.decide(INV, NODES, rec.t + 5).stops == [], \
        "60 GPU-s attained: the running job is still in the first queue, ahead of the newcomer"
    assert rec.driver.decide(INV, NODES, rec.t + 9).stops == [(big, "preempt")], \
        "past 100 GPU-s it is demoted below the newcomer whatever its hint says"


def test_tiresias_ranks_a_preempted_job_by_the_service_it_ran_which_replay_rebuilds(tmp_path):
    path = tmp_path / "j.log"
    rec = Recorder(LiveDriver(tiresias()), Journal(path))
    a = rec.submit(12)
    rec.start_decided()
    b = rec.submit(12)
    rec.emit({"ev": "stop", "job_id": a, "reason": "preempt"}, dt=20.0)
    rec.emit({"ev": "requeue", "job_id": a, "reason": "preempt", "ran_s": 21.0})
    assert [s[0] for s in rec.start_decided()] == [b], "A (252 GPU-s, second queue) waits behind B"
    c = rec.submit(12)
    assert rec.driver.jobs[c].priority < rec.driver.jobs[a].priority, "a newcomer ranks ahead of demoted A"

    again = LiveDriver(tiresias())
    again.replay(Journal(path).scan().records)
    assert {j: again.jobs[j].priority for j in (a, c)} == {j: rec.driver.jobs[j].priority for j in (a, c)}


def ces_driver(days: int = 0, lookback: float = 5.0) -> LiveDriver:
    from scheduler_bridge.policies.demand_forecast import DemandForecaster
    from scheduler_bridge.policies.ces import CES
    from scheduler_bridge.policies.queue import FIFO

    return LiveDriver(CES(FIFO(), spare_nodes=0, interval=60.0,
                          forecaster=DemandForecaster(bin_s=1.0, lookback=lookback, horizon=0.0, days=days)))


def power_tick(rec: Recorder, now: float, gpus_per_node: int = 4, max_nodes: int = 3) -> int | None:
    """What the allocator's CES step does at ``now``: journal and apply the demand sample, then
    the new request; returns how many nodes it asked the autoscaler for (None: no new request)."""
    rec.t = now
    demand = rec.driver.demand_event(now)
    if demand is not None:
        rec.emit(demand, dt=0.0)
    ask = rec.driver.capacity_event(now, gpus_per_node, max_nodes)
    if ask is None:
        return None
    rec.emit(ask, dt=0.0)
    return len(rec.driver.capacity.requested)


def test_ces_capacity_grows_at_once_for_waiting_jobs_and_shrinks_only_after_a_quiet_interval():
    rec = Recorder(ces_driver())
    assert power_tick(rec, 0.0) == 0
    a = rec.submit(12)
    assert power_tick(rec, 1.0) == 3, "a waiting job: boot at once"
    rec.emit({"ev": "start", "job_id": a, "attempt": 1, "where": [[n, 4] for n in NODES], "gpus": 12})
    assert power_tick(rec, 2.0) is None, "unchanged: no new request"
    rec.emit({"ev": "finish", "job_id": a, "status": "done"})
    assert power_tick(rec, 30.0) is None, "demand gone, but not for 60 s"
    assert power_tick(rec, 62.0) == 0
    rec.submit(16)
    assert power_tick(rec, 63.0) == 4, "a job larger than the known nodes still gets its capacity asked for"


def test_ces_demand_history_and_last_request_survive_an_allocator_restart(tmp_path):
    path = tmp_path / "j.log"
    rec = Recorder(ces_driver(days=1, lookback=0.0), Journal(path))
    busy = rec.submit(12)
    rec.emit({"ev": "start", "job_id": busy, "attempt": 1, "where": [[n, 4] for n in NODES], "gpus": 12})
    yesterday = 50_000.0
    assert power_tick(rec, yesterday) == 3
    rec.emit({"ev": "finish", "job_id": busy, "status": "done"})
    assert [power_tick(rec, yesterday + t * 20_000.0) for t in range(1, 5)] == [0, None, None, None], \
        "the rest of the day is idle: every node may power down"
    now = yesterday + 86_400.0                   # the same time of day: yesterday's peak is forecast
    assert power_tick(rec, now) == 3, "idle now, but the forecast keeps what this hour needed yesterday"
    samples = [ev for ev in Journal(path).replay() if ev["ev"] == "demand"]
    assert len(samples) == 6, "only samples that add to the history are journaled: one per bin here"

    again = LiveDriver(ces_driver(days=1, lookback=0.0).policy)
    assert again.replay(Journal(path).scan().records) == []
    forecaster = lambda drv: drv.policy.forecaster
    assert forecaster(again).forecast(now) == forecaster(rec.driver).forecast(now) == 12.0
    assert again.capacity.requested == rec.driver.capacity.requested
    assert again.capacity_event(now + 1.0, 4, 3) is None, "the restarted plan asks nothing new"
    blind = ces_driver(days=1, lookback=0.0)
    assert blind.capacity_event(now + 1.0, 4, 3) == {"ev": "capacity", "t": now + 1.0, "nodes": 0,
                                                     "gpus_per_node": 4}, "without the history: scale down"


def test_a_journal_written_under_ces_replays_under_another_policy_and_bad_power_records_are_refused():
    rec = Recorder(ces_driver())
    power_tick(rec, 0.0)
    fifo = LiveDriver(make_policy("fifo"))
    assert fifo.replay([(0, {"ev": "demand", "t": 0.0, "gpus": 4.0}),
                        (60, {"ev": "capacity", "t": 0.0, "nodes": 1, "gpus_per_node": 4})]) == []
    assert fifo.capacity is None
    assert rec.driver.replay([(7, {"ev": "capacity", "t": 1.0, "nodes": "3", "gpus_per_node": 4}),
                              (90, {"ev": "demand", "gpus": 4.0})]) == [
        "record at byte offset 7 skipped: capacity event: field 'nodes' missing or not int",
        "record at byte offset 90 skipped: demand event needs a numeric t"]


SLOWDOWN = {("mlp", "gpt"): 1.2, ("gpt", "mlp"): 1.1, ("mlp", "mlp"): 1.6, ("gpt", "gpt"): 1.3}
MEMORY = {"mlp": 500.0, "gpt": 3000.0}


def packing_driver(margin=0.25, **knobs):
    from scheduler_bridge.interference import InterferenceTable
    from scheduler_bridge.live.packing import LivePacking
    from scheduler_bridge.policies.lucid import Lucid

    knobs.setdefault("profile_nodes", 0)   # every job names its workload: nothing to profile
    lucid = Lucid(InterferenceTable(SLOWDOWN, MEMORY), gpu_memory_mb=4096.0, min_gain=0.0, **knobs)
    return LiveDriver(lucid, packing=LivePacking(lucid, margin))


def fill(rec, workloads):
    """Start one one-GPU job per workload (the cluster's 12 GPUs hold 12)."""
    ids = [rec.submit(1, workload=w) for w in workloads]
    assert sorted(s[0] for s in rec.start_decided()) == ids
    return ids


def test_a_waiting_job_is_packed_beside_the_host_the_table_predicts_cheapest_and_shares_its_gpu():
    rec = Recorder(packing_driver())
    hosts = fill(rec, ["mlp"] * 6 + ["gpt"] * 6)
    a, b = rec.submit(1, workload="mlp"), rec.submit(1, workload="mlp")
    d = rec.driver.decide(INV, NODES, rec.t)
    assert d.starts == [] and d.stops == []
    assert d.packs == [(a, hosts[6]), (b, hosts[7])], "mlp beside gpt (1.2 + 1.1) beats mlp beside mlp (1.6)"
    rec.emit({"ev": "start-packed", "job_id": a, "attempt": 1, "host": hosts[6]})
    assert rec.driver.jobs[a].where == rec.driver.jobs[hosts[6]].where and rec.driver.jobs[a].gpus == 1
    assert rec.driver.decide(INV, NODES, rec.t).packs == [(b, hosts[7])], "a host takes one partner"
    rec.emit({"ev": "finish", "job_id": hosts[0], "status": "done"})
    assert [s[0] for s in rec.driver.decide(INV, NODES, rec.t).starts] == [b], \
        "the packed pair holds one GPU: the freed GPU goes to the next job alone"


def test_a_packed_job_outlives_its_host_in_the_hosts_group_and_hosts_the_next_partner_there():
    rec = Recorder(packing_driver())
    hosts = fill(rec, ["gpt"] * 12)
    a = rec.submit(1, workload="mlp")
    host = rec.driver.decide(INV, NODES, rec.t).packs[0][1]
    rec.emit({"ev": "start-packed", "job_id": a, "attempt": 1, "host": host})
    jobs = rec.driver.jobs
    assert jobs[a].gpu_group == jobs[host].gpu_group == [host, 1]
    assert rec.driver.group_left_by(jobs[host]) is None, "the partner still runs in the host's group"
    rec.emit({"ev": "finish", "job_id": host, "status": "cancelled"})
    b = rec.submit(1, workload="gpt")
    d = rec.driver.decide(INV, NODES, rec.t)
    assert d.starts == [], "the host's GPU is still the partner's: nothing was freed"
    assert d.packs == [(b, a)], "the partner, now alone, hosts (gpt beside gpt would not fit in memory)"
    rec.emit({"ev": "start-packed", "job_id": b, "attempt": 1, "host": a})
    assert jobs[b].gpu_group == [host, 1], "in the group that holds that GPU"
    rec.emit({"ev": "finish", "job_id": a, "status": "done"})
    assert rec.driver.group_left_by(jobs[b]) == [host, 1], "the last job in it takes the group along"
    assert set(hosts) - {host} <= {j.job_id for j in jobs.values() if j.state == "running"}


def test_the_rule_never_packs_past_memory_the_slowdown_limit_or_an_unmeasured_pair():
    rec = Recorder(packing_driver(max_slowdown=1.25))
    fill(rec, ["mlp"] * 12)
    rec.submit(1, workload="mlp")        # 1.6 beside mlp: over the limit
    rec.submit(1, workload="bert")       # never measured
    rec.submit(1)                        # no workload: never packed
    assert rec.driver.decide(INV, NODES, rec.t).packs == []
    rec2 = Recorder(packing_driver())
    fill(rec2, ["gpt"] * 12)
    rec2.submit(1, workload="gpt")       # 3000 + 3000 MB > 4096 MB
    assert rec2.driver.decide(INV, NODES, rec2.t).packs == []


def test_a_pair_slower_than_predicted_is_parted_and_never_packed_again(tmp_path):
    rec = Recorder(packing_driver(margin=0.25), Journal(tmp_path / "j.log"))
    hosts = fill(rec, ["gpt"] * 12)
    a = rec.submit(1, workload="mlp")
    host = rec.driver.decide(INV, NODES, rec.t).packs[0][1]
    for done in (0.10, 0.11):                       # alone: 0.01 per second
        rec.emit({"ev": "progress", "job_id": host, "done": done})
    rec.emit({"ev": "start-packed", "job_id": a, "attempt": 1, "host": host})
    for done in (0.115, 0.12, 0.125):               # beside A: 0.005 per second, 2.0x; predicted 1.1x
        rec.emit({"ev": "progress", "job_id": host, "done": done})
    assert rec.driver.decide(INV, NODES, rec.t).stops == [(a, "interference")]
    rec.emit({"ev": "stop", "job_id": a, "reason": "interference"})
    rec.emit({"ev": "requeue", "job_id": a, "reason": "interference"})
    again = LiveDriver(rec.driver.policy, packing=rec.driver.packing)
    again.replay(Journal(tmp_path / "j.log").scan().records)
    assert again.jobs[a].avoid == [host]
    packs = again.decide(INV, NODES, rec.t).packs
    assert packs and packs[0][0] == a and packs[0][1] != host and packs[0][1] in hosts


def test_run_time_and_tiresias_service_count_from_when_every_rank_is_up_not_from_placement():
    rec = Recorder(LiveDriver(tiresias()))
    a = rec.submit(12)
    rec.start_decided()
    assert not rec.driver.jobs[a].summary()["ready"], "placed, its ranks still starting"
    rec.emit({"ev": "ready", "job_id": a, "attempt": 1}, dt=30.0)      # 30 s of actor start-up
    assert rec.driver.jobs[a].summary()["ready"]
    ready_t = rec.t
    rec.submit(4)
    assert rec.driver.decide(INV, NODES, rec.t + 7).stops == [], "7 s x 12 GPUs = 84 GPU-s: not yet demoted"
    rec.emit({"ev": "ready", "job_id": a, "attempt": 1}, dt=5.0)       # a restarted allocator's repeat
    rec.emit({"ev": "requeue", "job_id": a, "reason": "fault"}, dt=5.0)
    assert rec.driver.jobs[a].run_s == rec.t - ready_t, "ran from its first ready, not from the start event"
    assert not rec.driver.jobs[a].summary()["ready"], "requeued: ready again only once its next run's ranks are up"


def test_lucid_profiles_an_unnamed_job_alone_on_its_partition_then_packs_it_by_what_it_measured(tmp_path):
    # the debugging run's 30 s teach the duration model that jobs are short, which would keep the
    # newcomer's priority far from its hosts': priorities are not what this test is about
    rec = Recorder(packing_driver(profile_nodes=1, profile_s=60.0, priority_ratio=1000.0),
                   Journal(tmp_path / "j.log"))
    hosts = [rec.submit(1, workload="gpt") for _ in range(8)]
    assert {where[0][0] for _, where, _, _ in rec.start_decided()} == {"n1", "n2"}, \
        "named jobs run on the main partition only: n0 profiles"
    job, debug, big = rec.submit(1), rec.submit(1), rec.submit(8)
    d = rec.driver.decide(INV, NODES, rec.t)
    assert d.profiling == [job, debug] and [(s[0], s[1]) for s in d.starts] == [
        (job, (("n0", 1),)), (debug, (("n0", 1),))], "first come, first profiled, alone on whole GPUs"
    rec.start_decided()
    assert not rec.driver.shareable(rec.driver.jobs[job]), "a job being profiled runs alone"
    for j in (job, debug):
        rec.emit({"ev": "ready", "job_id": j, "attempt": 1}, dt=0.0)
    rec.emit({"ev": "finish", "job_id": debug, "status": "done"}, dt=30.0)   # a debugging run
    assert rec.driver.decide(INV, NODES, rec.t).stops == [], "30 s of its 60 s profiling time"
    rec.t += 31.0
    assert rec.driver.decide(INV, NODES, rec.t).stops == [(job, "profiled")]
    rec.emit({"ev": "stop", "job_id": job, "reason": "profiled"})
    rec.emit(rec.driver.profile_event(rec.driver.jobs[job], memory_mb=420.0))
    rec.emit({"ev": "requeue", "job_id": job, "reason": "profiled"})
    assert rec.driver.jobs[job].profiled == {"memory_mb": 420.0, "workload": "mlp"}, "nearest: mlp's 500 MB"
    assert rec.driver.jobs[debug].requeues == [] and rec.driver.jobs[debug].state == "done", \
        "a debugging job ends in profiling and never queues"

    again = LiveDriver(rec.driver.policy, packing=rec.driver.packing)
    again.replay(Journal(tmp_path / "j.log").scan().records)
    for drv in (rec.driver, again):
        d = drv.decide(INV, NODES, rec.t)
        assert d.profiling == [] and d.starts == [], "profiled once; the main partition is full"
        assert d.packs and d.packs[0][0] == job and d.packs[0][1] in hosts, "packed as the mlp it measured"
        assert drv.jobs[big].state == "queued" and big not in d.profiling, "larger than a node: not profiled"



def test_a_two_gpu_job_is_packed_rank_by_rank_beside_a_two_gpu_host_never_beside_a_one_gpu_one():
    rec = Recorder(packing_driver())
    pairs = [rec.submit(2, workload="gpt") for _ in range(2)]
    singles = [rec.submit(1, workload="gpt") for _ in range(8)]
    assert len(rec.start_decided()) == 10, "the cluster's 12 GPUs are full"
    a, b = rec.submit(2, workload="mlp"), rec.submit(1, workload="mlp")
    packs = dict(rec.driver.decide(INV, NODES, rec.t).packs)
    assert packs[a] in pairs and packs[b] in singles, "Lucid packs only jobs of as many GPUs"
    rec.emit({"ev": "start-packed", "job_id": a, "attempt": 1, "host": packs[a]})
    jobs = rec.driver.jobs
    node = jobs[packs[a]].where[0][0]
    assert jobs[a].where == jobs[packs[a]].where == ((node, 2),) and jobs[a].gpus == 2
    assert rec.driver.ranks(jobs[a]) == rec.driver.ranks(jobs[packs[a]]) == ((node, 1), (node, 1)), \
        "one rank per GPU, so rank i of each shares GPU i"
    assert rec.driver.ranks(jobs[a]) != jobs[a].where


def test_a_job_rank_and_a_restarted_allocator_load_no_scikit_learn():
    """Every rank of every job imports the job runner, and every allocator (re)start the policies;
    neither may pay for QSSF's regressor (scikit-learn, SciPy, pandas: 27 s of imports per rank on
    CI's slow box, before the job's first step) until a policy fits one."""
    import subprocess
    import sys
    from pathlib import Path

    probe = ("import sys, scheduler_bridge.live.job_runner, scheduler_bridge.live.allocator\n"
             "print(sorted(m for m in ('sklearn', 'scipy', 'pandas', 'torch') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).resolve().parents[1])
    assert proc.stdout.split("\n")[0] == "[]", proc.stdout + proc.stderr[-2000:]


@settings(max_examples=200, deadline=None)
@given(field=st.sampled_from(["expected_seconds", "bubble_capacity_gpu_s", "iteration_s", "bubble_fraction"]),
       value=st.floats(allow_nan=True, allow_infinity=True))
def test_a_job_specs_times_and_fractions_are_finite_or_the_field_is_named(field, value):
    # a NaN hint once queued a job (nan <= 0 is false) whose SJF/SRTF rank compared false with every
    # other, so the queue's order was whatever the heap happened to hold
    fields = {field: value}
    if field == "bubble_capacity_gpu_s":
        fields["iteration_s"] = 1.0
    try:
        spec = JobSpec(entrypoint="m:f", **fields)
    except ValueError as e:
        assert field in str(e), str(e)
    else:
        assert math.isfinite(getattr(spec, field))


@settings(max_examples=100, deadline=None)
@given(field=st.sampled_from(["batch_size", "min_batch", "max_batch", "min_gpus", "max_gpus"]),
       value=st.integers(-10**6, 10**6))
def test_a_job_specs_batch_sizes_and_gpu_bounds_are_at_least_one_or_the_field_is_named(field, value):
    # `hpo job submit --batch-size -5` once ran the job with ctx.batch_size == -5; --max-gpus 0 meant "gpus"
    extra = {"application": "bert"} if "gpus" in field else {}
    try:
        JobSpec(entrypoint="m:f", gpus=1, **extra, **{field: value})
    except ValueError as e:
        assert value < 1 or field == "min_gpus" and value > 1, (field, value, e)
        assert field in str(e) or "min_gpus <= max_gpus" in str(e), str(e)
    else:
        assert value >= 1
