"""Tiresias (discretised 2D-LAS) on hand-made traces whose right answer is known."""

import pytest

from scheduler_bridge import ClusterSpec, Job, make_policy, make_trace, simulate
from scheduler_bridge.policies.tiresias import Tiresias


def _frame(specs, policy, gpus=1, gpn=1, restart_cost=0.0):
    trace = make_trace([Job(i, s, g, d) for i, (s, g, d) in enumerate(specs)])
    return simulate(trace, policy, ClusterSpec(gpus, gpn), restart_cost=restart_cost).jobs_frame()


def test_a_newcomer_preempts_a_job_demoted_past_the_threshold_and_it_pays_the_restart_cost():
    # job 0 (1 GPU) crosses 100 GPU-s at t=100 and drops to queue 1; job 1 arrives at 150
    df = _frame([(0, 1, 300), (150, 1, 20)], Tiresias(thresholds=(100.0,)), restart_cost=5.0)
    assert df.finish.tolist() == [150 + 20 + 5 + 150, 170]
    assert df.restarts.tolist() == [1, 0]


def test_jobs_in_the_same_queue_run_first_come_first_served_without_preemption():
    df = _frame([(0, 1, 300), (50, 1, 20)], Tiresias(thresholds=(1000.0,)))
    assert df.finish.tolist() == [300, 320]
    assert df.restarts.tolist() == [0, 0]


def test_attained_service_counts_gpus_so_a_wide_job_is_demoted_sooner():
    # 4-GPU job reaches 100 GPU-s after 25 s; at t=30 a 4-GPU newcomer takes its place
    df = _frame([(0, 4, 100), (30, 4, 10)], Tiresias(thresholds=(100.0,)), gpus=4, gpn=4)
    assert df.start.tolist() == [0, 30]
    assert df.finish.tolist() == [110, 40]


def test_starvation_knob_promotes_a_long_waiting_job_back_to_queue_zero():
    # job 0 runs 100 s, drops to queue 1 and is preempted at t=100 by job 1. With knob 0.5
    # it is promoted to queue 0 after waiting 50 s (0.5 x its 100 s run), at t=150, so it
    # is ahead of job 2 (queue 0 from t=160) when job 1 drops to queue 1 at t=200.
    specs = [(0, 1, 150), (100, 1, 400), (160, 1, 10)]
    plain = _frame(specs, Tiresias(thresholds=(100.0,)))
    starve = _frame(specs, Tiresias(thresholds=(100.0,), starvation=0.5))
    assert plain.finish.tolist()[::2] == [260, 210], "without promotion job 2 goes first"
    assert starve.finish.tolist()[::2] == [250, 260], "the promoted job 0 goes first"


@pytest.mark.parametrize("bad", [dict(thresholds=(100.0, 50.0)), dict(thresholds=(-1.0,)),
                                 dict(starvation=-1.0)])
def test_bad_tiresias_parameters_are_refused(bad):
    with pytest.raises(ValueError, match="Tiresias"):
        Tiresias(**bad)


def test_tiresias_is_a_named_policy():
    assert make_policy("tiresias").name == "tiresias"
