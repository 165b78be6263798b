"""Each scheduling policy on a hand-made trace whose right answer is known."""

import itertools

import numpy as np
import pytest

from scheduler_bridge import (CES, FIFO, QSSF, ClusterSpec, ElasticJobState, ElasticPolicy, FreeGPUs, Job,
                              Lucid, QueuePolicy, TuningAware, TuningJob, load_profiles, make_policy,
                              make_trace, simulate)
from scheduler_bridge.data_files import default_traces_dir

PROFILES = default_traces_dir() / "pollux" / "traces"


def _jobs(*specs):
    return make_trace([Job(i, s, g, d) for i, (s, g, d) in enumerate(specs)])


def _frame(trace, policy, gpus=1, gpn=1, **kw):
    return simulate(trace, policy, ClusterSpec(gpus, gpn), **kw).jobs_frame()


class LatestFirst(QueuePolicy):
    """A policy written against the interface alone: it names only its priority."""

    name = "latest-first"

    def priority(self, job, remaining, now):
        return -job.submit


def test_a_queue_policy_that_names_only_its_priority_is_simulated_by_the_rigid_replay():
    trace = _jobs((0.0, 1, 10.0), (1.0, 1, 5.0), (2.0, 1, 5.0))
    df = _frame(trace, LatestFirst())
    assert list(df.start) == [0.0, 15.0, 10.0], "the latest waiting job runs first"


def test_an_object_that_names_no_replay_is_refused_as_a_policy():
    with pytest.raises(TypeError, match="not a scheduling policy"):
        simulate(_jobs((0.0, 1, 1.0)), object(), ClusterSpec(1, 1))


@pytest.mark.parametrize("name, base", [("tuning-aware", "lucid"), ("tuning-aware", "elastic"),
                                        ("tuning-aware", "tuning-aware"), ("ces:lucid", None)])
def test_a_layer_runs_over_a_plain_queue_policy_only(name, base):
    with pytest.raises(ValueError, match="fifo, sjf, srtf, qssf, tiresias"):
        make_policy(name, base=base or "fifo")


def test_a_layer_over_a_layered_or_non_queue_policy_is_refused_naming_it():
    with pytest.raises(ValueError, match="CES runs over a plain queue policy, not tuning-aware"):
        CES(TuningAware(FIFO()))
    with pytest.raises(ValueError, match="TuningAware runs over a plain queue policy, not lucid"):
        TuningAware(Lucid())


def test_placement_small_job_best_fits_and_large_job_takes_whole_nodes():
    free = FreeGPUs(ClusterSpec(24, 8))
    free.take(((0, 6),))
    assert free.place(2) == ((0, 2),), "a 2-GPU job should fill the node with 2 free GPUs"
    assert free.place(12) == ((1, 8), (2, 4)), "12 GPUs = one whole node + 4 on another"
    assert free.place(17) == ((1, 8), (2, 8), (0, 1))
    assert free.place(19) is None, "only 18 GPUs are free"


def test_fifo_runs_jobs_in_submit_order():
    df = _frame(_jobs((0, 1, 10), (1, 1, 5), (2, 1, 1)), make_policy("fifo"))
    assert df.finish.tolist() == [10, 15, 16]


def test_fifo_without_backfill_blocks_behind_a_large_job_and_with_backfill_does_not():
    trace = _jobs((0, 1, 10), (1, 2, 5), (2, 1, 3))
    strict = _frame(trace, make_policy("fifo", backfill=False), gpus=2, gpn=2)
    assert strict.start.tolist() == [0, 10, 15]
    backfill = _frame(trace, make_policy("fifo", backfill=True), gpus=2, gpn=2)
    assert backfill.start.tolist() == [0, 10, 2]


def test_sjf_starts_the_shortest_waiting_job_first():
    df = _frame(_jobs((0, 1, 10), (1, 1, 5), (2, 1, 1)), make_policy("sjf"))
    assert df.finish.tolist() == [10, 16, 11]


def test_srtf_preempts_a_longer_job_and_charges_the_restart_cost():
    df = _frame(_jobs((0, 1, 10), (1, 1, 2)), make_policy("srtf"), restart_cost=5.0)
    assert df.finish.tolist() == [3 + 5 + 9, 3]
    assert df.restarts.tolist() == [1, 0]


def test_srtf_preempts_the_job_with_the_most_remaining_gpu_time():
    # at t=10: A has 2 GPUs x 90 s = 180 GPU-s left, B has 1 x 80 s = 80; C needs 1 GPU
    trace = _jobs((0, 2, 100), (0, 1, 90), (10, 1, 5))
    df = _frame(trace, make_policy("srtf"), gpus=3, gpn=4, restart_cost=0.0)
    assert df.restarts.tolist() == [1, 0, 0]
    assert df.finish.tolist()[2] == 15


def test_qssf_learns_that_a_vc_runs_short_jobs_and_ranks_them_first():
    jobs, t = [], 0.0
    for i in range(40):  # history: vc "s" always 10 s, vc "l" always 1000 s, no contention
        vc, d = ("s", 10.0) if i % 2 else ("l", 1000.0)
        jobs.append(Job(i, t, 1, d, vc=vc))
        t += d + 1
    jobs.append(Job(100, t, 1, 500.0, vc="x"))         # blocker
    jobs.append(Job(101, t + 1, 1, 1000.0, vc="l"))    # queued first
    jobs.append(Job(102, t + 2, 1, 10.0, vc="s"))      # queued second
    trace = make_trace(jobs)
    policy = QSSF(first_fit=10, refit_min=10)
    df = _frame(trace, policy).set_index("name")
    assert policy.predictor.n_fits >= 1, "the regressor should have been fitted"
    assert df.start["102"] < df.start["101"], "QSSF must start the predicted-short job first"
    fifo = _frame(trace, make_policy("fifo")).set_index("name")
    assert fifo.start["101"] < fifo.start["102"]


def test_tuning_groups_fill_idle_gpus_and_leave_ordinary_jobs_untouched():
    base = _jobs((0, 1, 100), (10, 1, 5))
    trace = make_trace(base.jobs, tuning=[TuningJob(0, 0.0, groups=2, group_work=40.0)])
    res = simulate(trace, make_policy("tuning-aware", checkpoint_interval=4.0), ClusterSpec(2, 2))
    s = res.summary()
    plain = _frame(base, make_policy("fifo"), gpus=2, gpn=2)
    assert res.jobs_frame().finish.tolist() == plain.finish.tolist() == [100, 15]
    assert s["tuning_groups_completed"] == 2
    # group 0 is evicted at t=10 (checkpoint at 8 s: 2 s lost), so 80 s of work is done
    assert s["tuning_gpu_hours_free"] == pytest.approx(80 / 3600)
    assert s["tuning_gpu_hours_lost_to_eviction"] == pytest.approx(2 / 3600)


def test_tuning_groups_run_in_pipeline_bubbles_at_the_bubble_rate():
    trace = make_trace([Job(0, 0.0, 2, 100.0, bubble_fraction=0.5)],
                       tuning=[TuningJob(0, 0.0, groups=1, group_work=20.0)])
    s = simulate(trace, make_policy("tuning-aware"), ClusterSpec(2, 2)).summary()
    assert s["tuning_groups_completed"] == 1
    assert s["tuning_gpu_hours_bubbles"] == pytest.approx(20 / 3600)
    assert s["tuning_avg_jct"] == pytest.approx(40.0)


def test_elastic_dp_matches_brute_force_over_gpu_counts():
    apps = load_profiles(PROFILES)
    spec = ClusterSpec(8, 4)
    policy = ElasticPolicy(keep_bonus=0.0)
    jobs = [ElasticJobState(i, apps[a], 0, apps[a].init_bsz, apps[a].max_gpus)
            for i, a in enumerate(["cifar10", "imagenet", "deepspeech2"])]
    got = policy.allocate(jobs, spec)
    speedup = {}
    for j in jobs:
        base = policy.config(j, 1, spec)[1]
        speedup[j.job_id] = {n: policy.config(j, n, spec)[1] / base
                             for n in policy.allowed_counts(spec, j.max_gpus)}
    best = max((sum(speedup[j.job_id][n] for j, n in zip(jobs, ns)), ns)
               for ns in itertools.product(*[list(speedup[j.job_id]) for j in jobs])
               if sum(ns) <= 8)
    got_total = sum(speedup[i][d.gpus] for i, d in got.items())
    assert got_total == pytest.approx(best[0]), f"DP {got} vs brute force {best}"
    assert sum(d.gpus for d in got.values()) <= 8


def test_elastic_gives_a_lone_job_its_goodput_maximising_gpus_and_batch():
    apps = load_profiles(PROFILES)
    app = apps["cifar10"]
    spec = ClusterSpec(16, 4)
    d = ElasticPolicy().allocate([ElasticJobState(0, app, 0, 128, app.max_gpus)], spec)[0]
    counts = ElasticPolicy.allowed_counts(spec, app.max_gpus)
    best_n = max(counts, key=lambda n: app.best_batch(n, 4, 0)[1])
    assert (d.gpus, d.batch_size) == (best_n, app.best_batch(best_n, 4, 0)[0])


def test_fixed_batch_job_alone_on_one_gpu_takes_its_isolated_runtime():
    apps = load_profiles(PROFILES)
    app = apps["ncf"]
    trace = make_trace([Job(0, 0.0, 1, 0.0, elastic=_spec("ncf", 32768, app))])
    df = simulate(trace, make_policy("elastic-fixed-batch"), ClusterSpec(1, 1),
                  profiles=apps).jobs_frame()
    assert df.jct[0] == pytest.approx(app.isolated_runtime(1, 32768, gpus_per_node=1), rel=1e-6)


def _spec(app, bsz, prof):
    from scheduler_bridge import ElasticSpec
    return ElasticSpec(app, bsz, 1, prof.max_gpus)


def test_elastic_beats_its_fixed_batch_baseline_on_a_pollux_workload():
    from scheduler_bridge import load_pollux
    trace = load_pollux(default_traces_dir() / "pollux" / "workloads" / "workload-3.csv")
    trace = make_trace(trace.jobs[:40])
    apps = load_profiles(PROFILES)
    el = simulate(trace, make_policy("elastic"), ClusterSpec(16, 4), profiles=apps).summary()
    fx = simulate(trace, make_policy("elastic-fixed-batch"), ClusterSpec(16, 4), profiles=apps).summary()
    assert el["completed"] == fx["completed"] == 40
    assert el["avg_jct"] < fx["avg_jct"]
    assert np.isfinite(el["utilization"])
