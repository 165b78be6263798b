"""Invariants of the simulator on random small traces (hypothesis)."""

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from scheduler_bridge import (QSSF, ClusterSpec, Job, Tiresias, TuningAware, TuningJob, make_policy,
                              make_trace, simulate)

CLUSTER = ClusterSpec(16, 8)

job_st = st.tuples(st.integers(0, 2000), st.sampled_from([1, 1, 2, 4, 8, 16]),
                   st.integers(1, 900), st.sampled_from(["a", "b", "c"]))
trace_st = st.lists(job_st, min_size=1, max_size=25).map(
    lambda rows: make_trace([Job(i, float(s), g, float(d), vc=v) for i, (s, g, d, v) in enumerate(rows)],
                            tuning=[TuningJob(0, 100.0, groups=3, group_work=500.0)]))


def _policy(name):
    if name == "qssf":
        return QSSF(first_fit=5, refit_min=5)   # exercise the regressor on tiny traces
    if name == "tiresias":  # a low threshold, so that jobs of these short traces are demoted
        return Tiresias(thresholds=(300.0,))
    if name == "tuning-aware-srtf":
        return make_policy("tuning-aware", base="srtf")
    return make_policy(name)


def _max_concurrent_gpus(df):
    events = sorted([(s, g) for s, g in zip(df.start, df.gpus)] +
                    [(f, -g) for f, g in zip(df.finish, df.gpus)], key=lambda e: (e[0], e[1]))
    busy = peak = 0
    for _, g in events:
        busy += g
        peak = max(peak, busy)
    return peak


@pytest.mark.parametrize("name", ["fifo", "sjf", "srtf", "qssf", "tiresias", "tuning-aware",
                                  "tuning-aware-srtf"])
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=trace_st)
def test_random_traces_keep_the_simulator_invariants(name, trace):
    res = simulate(trace, _policy(name), CLUSTER, restart_cost=7.0)
    df = res.jobs_frame()
    assert df.finish.notna().all(), "every job must finish"
    assert (df.start >= df.submit).all(), "no job may start before it is submitted"
    assert (df.finish >= df.start + df.duration - 1e-9).all(), "a job cannot finish early"
    assert max(res.log.util_busy) <= CLUSTER.num_gpus, "more GPUs allocated than exist"
    if "srtf" not in name and name != "tiresias":  # non-preemptive: one interval per job
        assert _max_concurrent_gpus(df) <= CLUSTER.num_gpus
    again = simulate(trace, _policy(name), CLUSTER, restart_cost=7.0).jobs_frame()
    assert df.equals(again), "same trace, same seed: same result"


@pytest.mark.parametrize("base", ["fifo", "srtf", "tiresias"])
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=trace_st)
# Found by this test: Tiresias backfilled job 2, which job 1 outranked, and took that decision
# only at the tuning layer's next instant, preempting job 3 a quarter second before it finished.
@example(trace=make_trace([Job(i, float(s), g, float(d), vc="a") for i, (s, g, d) in
                           enumerate([(0, 8, 404), (0, 16, 19), (220, 1, 351), (220, 8, 88)])],
                          tuning=[TuningJob(0, 100.0, groups=3, group_work=500.0)]))
def test_tuning_work_never_changes_ordinary_jobs(base, trace):
    """Whatever the base decides (ranking and preempting too, as Tiresias does), its jobs run as if
    no tuning work existed."""
    plain = simulate(trace, _policy(base), CLUSTER).jobs_frame()
    tuned = simulate(trace, TuningAware(_policy(base)), CLUSTER)
    assert tuned.jobs_frame().equals(plain)
    assert tuned.summary()["tuning_groups_completed"] == 3


@pytest.mark.parametrize("name", ["elastic", "elastic-fixed-batch"])
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.lists(st.tuples(st.integers(0, 3000),
                               st.sampled_from(["cifar10", "ncf", "deepspeech2", "yolov3"]),
                               st.sampled_from([1, 2, 4])), min_size=1, max_size=6))
def test_elastic_random_workloads_finish_within_capacity(name, rows):
    from scheduler_bridge import ElasticSpec, load_profiles
    from scheduler_bridge.data_files import default_traces_dir
    apps = load_profiles(default_traces_dir() / "pollux" / "traces")
    jobs = [Job(i, float(t), g, apps[a].isolated_runtime(g, apps[a].init_bsz * g),
                elastic=ElasticSpec(a, apps[a].init_bsz * g, 1, apps[a].max_gpus))
            for i, (t, a, g) in enumerate(rows)]
    trace = make_trace(jobs)
    spec = ClusterSpec(8, 4)
    res = simulate(trace, make_policy(name), spec, profiles=apps)
    df = res.jobs_frame()
    assert df.finish.notna().all()
    assert (df.start >= df.submit).all()
    assert max(res.log.util_busy) <= spec.num_gpus
    again = simulate(trace, make_policy(name), spec, profiles=apps).jobs_frame()
    assert np.array_equal(df.finish.to_numpy(), again.finish.to_numpy())


def _busy_gpu_seconds(res):
    t = np.asarray(res.log.util_t, dtype=float)
    b = np.asarray(res.log.util_busy, dtype=float)
    return float(np.sum(b[:-1] * np.diff(t)))


@pytest.mark.parametrize("name", ["fifo", "sjf", "srtf", "qssf", "tiresias", "ces:fifo",
                                  "ces:tiresias"])
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=trace_st)
def test_every_policy_conserves_work(name, trace):
    """GPUs are busy for exactly the jobs' GPU time plus the restarts they paid for."""
    policy = Tiresias(thresholds=(300.0,)) if name == "tiresias" else _policy(name)
    res = simulate(trace, policy, CLUSTER, restart_cost=7.0)
    df = res.jobs_frame()
    work = float((df.gpus * df.duration).sum())
    restarts = float((df.gpus * df.restarts).sum()) * 7.0
    busy = _busy_gpu_seconds(res)
    assert work - 1e-6 <= busy <= work + restarts + 1e-6, (busy, work, restarts)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=trace_st, base=st.sampled_from(["fifo", "tiresias", "sjf"]),
       boot=st.sampled_from([5.0, 60.0, 400.0]), interval=st.sampled_from([30.0, 200.0]))
def test_ces_never_keeps_a_runnable_job_waiting_on_a_powered_down_node_past_the_boot_delay(
        trace, base, boot, interval):
    from scheduler_bridge.policies.demand_forecast import DemandForecaster
    from scheduler_bridge.policies.ces import CES
    from scheduler_bridge.power_model import PowerModel
    inner = Tiresias(thresholds=(300.0,)) if base == "tiresias" else make_policy(base)
    ces = CES(inner, power=PowerModel(boot_delay=boot), spare_nodes=0, margin=0.0,
              interval=interval, forecaster=DemandForecaster(bin_s=30, lookback=30, horizon=0, days=0))
    s = simulate(trace, ces, ClusterSpec(32, 8), restart_cost=7.0).summary()
    assert s["completed"] == len(trace)
    assert s["runnable_left_unbooted"] == 0, "a runnable job was left waiting on a node that is off"
    assert s["max_power_wait_s"] <= boot + 1e-9


table_st = st.tuples(st.floats(1.0, 2.5), st.floats(1.0, 2.5), st.floats(1.0, 2.5),
                     st.floats(100, 20000), st.floats(100, 20000))


def _lucid_policy(params, gpu_memory_mb):
    from scheduler_bridge.interference import InterferenceTable
    from scheduler_bridge.policies.lucid import Lucid
    s_aa, s_ab, s_bb, m_a, m_b = params
    table = InterferenceTable({("a", "a"): s_aa, ("a", "b"): s_ab, ("b", "a"): s_ab, ("b", "b"): s_bb},
                              {"a": m_a, "b": m_b})
    return Lucid(table, profile_nodes=1, profile_s=60.0, gpu_memory_mb=gpu_memory_mb,
                 priority_ratio=50.0, first_fit=5, refit_min=5)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=trace_st, params=table_st, gpu_memory=st.sampled_from([5000.0, 16000.0, 40000.0]))
def test_lucid_packing_never_exceeds_memory_or_two_jobs_per_gpu_and_conserves_work(
        trace, params, gpu_memory):
    policy = _lucid_policy(params, gpu_memory)
    res = simulate(trace, policy, ClusterSpec(24, 8))
    df = res.jobs_frame()
    assert df.finish.notna().all(), "every job must finish"
    fin = df.finish.to_numpy()
    partner_of = {}
    for t, q, r, g, mem in res.log.packing:
        assert mem <= gpu_memory, f"packed {mem} MB onto a {gpu_memory} MB GPU"
        sharing = {q, r} | {q2 for t2, q2, r2, *_ in res.log.packing if r2 == r and t2 < t and fin[q2] > t}
        if r in partner_of and fin[partner_of[r]] > t:
            sharing.add(partner_of[r])
        assert len(sharing) <= 2, f"{sorted(sharing)} share GPUs at t={t}"
        partner_of[q] = r
    worst = max(params[:3])
    run = df.finish - df.start
    assert (run >= df.duration - 1e-6).all(), "a job finished before doing its work"
    assert (run <= df.duration * worst + 1e-6).all(), "a job ran slower than its worst measured pairing"
    assert res.summary()["preemptions"] == 0


@st.composite
def cluster_and_trace(draw):
    """A cluster of any shape (a smaller last node, jobs spread over nodes or kept on whole ones)
    and a trace that fits it, with jobs of no work and many at one instant."""
    gpn = draw(st.sampled_from([1, 2, 3, 4, 8]))
    spec = ClusterSpec(gpn * draw(st.integers(1, 4)) + draw(st.integers(0, gpn - 1)), gpn,
                       consolidate=draw(st.booleans()))
    rows = draw(st.lists(st.tuples(st.sampled_from([0, 0, 1, 5, 30, 1000]), st.integers(1, spec.num_gpus),
                                   st.sampled_from([0.0, 0.5, 1.0, 7.0, 60.0, 3600.0]), st.sampled_from("ab")),
                         min_size=1, max_size=15))
    jobs = [Job(i, float(s), g, d, user=v, vc=v) for i, (s, g, d, v) in enumerate(rows) if spec.fits_ever(g)]
    return spec, make_trace(jobs or [Job(0, 0.0, 1, 1.0)], tuning=[TuningJob(0, 3.0, groups=2, group_work=100.0)])


NON_PREEMPTIVE = ("fifo", "sjf", "qssf", "lucid", "ces:fifo", "ces:qssf", "tuning-aware")


@pytest.mark.parametrize("name", ["fifo", "sjf", "srtf", "qssf", "tiresias", "lucid", "ces:fifo", "ces:srtf",
                                  "ces:tiresias", "tuning-aware"])
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cluster_and_trace(), restart_cost=st.sampled_from([0.0, 7.0]))
def test_every_policy_on_any_cluster_shape_ends_each_job_once_within_capacity_and_repeats_itself(
        name, case, restart_cost):
    spec, trace = case
    if name == "lucid":  # two profiling nodes beside a main partition of the shape drawn
        spec = ClusterSpec(spec.num_gpus + 2 * spec.gpus_per_node, spec.gpus_per_node, consolidate=spec.consolidate)
    res = simulate(trace, make_policy(name), spec, restart_cost=restart_cost)
    df = res.jobs_frame()
    assert df.finish.notna().all() and res.summary()["completed"] == len(trace), "every job ends, once"
    assert (df.start >= df.submit).all()
    assert (df.jct >= df.duration - 1e-9).all(), "no job ends sooner than its own run time"
    t, busy = np.asarray(res.log.util_t), np.asarray(res.log.util_busy)
    assert (np.diff(t) >= 0).all() and (busy >= 0).all() and busy.max() <= spec.num_gpus
    if name in NON_PREEMPTIVE:
        assert (df.restarts == 0).all(), f"{name} is non-preemptive"
    assert df.equals(simulate(trace, make_policy(name), spec, restart_cost=restart_cost).jobs_frame())


@pytest.mark.parametrize("name", ["fifo", "sjf"])
@pytest.mark.parametrize("backfill", [False, True])
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cluster_and_trace())
def test_a_queue_policy_starts_a_job_ahead_of_a_better_one_only_by_backfilling_past_a_larger_one(
        name, backfill, case):
    """FIFO ranks by submit time, SJF by GPU time (ties: arrival order). Without backfill a job
    starts only when no better one waits; with it, on whole nodes, every better one waiting then
    asked for more GPUs (there a smaller job fits wherever a larger one does; spread, a job of up
    to a node's GPUs still takes one node, so 5 GPUs over nodes of 3 and 2 free fit where 4 do not)."""
    spec, trace = case
    policy = make_policy(name, backfill=backfill)
    df = simulate(trace, policy, spec).jobs_frame()
    rank = {j.job_id: (policy.priority(j, j.duration, 0.0), j.job_id) for j in trace.jobs}
    for j in trace.jobs:
        started = df.start[j.job_id]
        for k in trace.jobs:
            if k.submit <= started < df.start[k.job_id] and rank[k.job_id] < rank[j.job_id]:
                assert backfill, f"job {j.job_id} started at {started} while the better job {k.job_id} waited"
                assert k.gpus > j.gpus or not spec.consolidate, f"job {j.job_id} backfilled past the no larger job {k.job_id}"
