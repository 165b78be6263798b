"""Lucid-style scheduling: profiling partition, packing by the interference table, and the table's reader."""

import time

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from patience import patience

from scheduler_bridge import ClusterSpec, Job, TraceError, make_trace, simulate
from scheduler_bridge.interference import InterferenceTable
from scheduler_bridge.policies.lucid import DEFAULT_TABLE, Lucid

TABLE = InterferenceTable({("a", "a"): 1.25, ("a", "b"): 3.0, ("b", "a"): 3.0, ("b", "b"): 1.9},
                          {"a": 1000.0, "b": 9000.0})


def _lucid(**kw):
    kw = {"profile_nodes": 1, "profile_s": 10.0, **kw}
    policy = Lucid(TABLE, **kw)
    policy.workload_of = lambda job: job.vc  # tests name the workload in the job's VC
    return policy


def _run(specs, policy, gpus=2, gpn=1):
    trace = make_trace([Job(i, s, g, d, vc=w) for i, (s, g, d, w) in enumerate(specs)])
    res = simulate(trace, policy, ClusterSpec(gpus, gpn))
    return res, res.jobs_frame()


def test_a_debugging_job_finishes_in_the_profiling_partition_without_queueing():
    res, df = _run([(0, 1, 5.0, "a")], _lucid())
    assert df.finish.tolist() == [5.0]
    assert res.summary()["debug_jobs_finished_in_profiling"] == 1


def test_a_long_job_is_profiled_then_restarts_on_the_main_partition():
    res, df = _run([(0, 1, 100.0, "a")], _lucid())
    assert df.start.tolist() == [10.0], "queued for the main partition after 10 s of profiling"
    assert df.finish.tolist() == [110.0], "the profiling run's work is not kept"


def test_two_jobs_with_low_interference_share_a_gpu_at_their_measured_speed():
    # 2 profiling GPUs, 1 main GPU; both jobs are workload a (slowdown 1.25 beside each other)
    res, df = _run([(0, 1, 100.0, "a"), (1, 1, 100.0, "a")], _lucid(profile_nodes=2), gpus=3)
    assert res.summary()["packed_starts"] == 1
    # job 0: alone 10..11 (1 s of work), packed from 11 at 0.8x: 99 s of work take 123.75 s;
    # job 1 from 11 at 0.8x: 100 s of work; when job 0 ends at 134.75 job 1 has 99 s... left
    j0_end = 11 + 99 * 1.25
    assert df.finish[0] == pytest.approx(j0_end)
    assert df.finish[1] == pytest.approx(j0_end + (100 - 99))
    assert res.log.packing[0][1:] == (1, 0, 1, 2000.0)


@pytest.mark.parametrize("change, reason", [
    (dict(max_slowdown=1.2), "slowdown"),
    (dict(gpu_memory_mb=1500.0), "memory"),
])
def test_packing_is_refused_when_interference_is_high_or_memory_does_not_fit(change, reason):
    policy = _lucid(profile_nodes=2, **change)
    ok, why = policy.pack_check("a", 100.0, "a", 100.0, (1, 1))
    assert not ok and reason in why
    res, df = _run([(0, 1, 100.0, "a"), (1, 1, 100.0, "a")], policy, gpus=3)
    assert res.summary()["packed_starts"] == 0
    assert df.start.tolist() == [10.0, 110.0]


def test_packing_needs_close_priorities_and_the_same_gpu_count():
    policy = _lucid(priority_ratio=2.0)
    assert policy.pack_check("a", 100.0, "a", 300.0, (1, 1)) == (False, "priorities 3.0x apart > 2.0x")
    assert policy.pack_check("a", 100.0, "a", 100.0, (1, 2))[0] is False
    assert policy.pack_check("a", 100.0, "b", 100.0, (1, 1))[0] is False, "slowdown 3.0 is too high"


def test_the_duration_model_says_which_features_drove_a_priority():
    jobs = [Job(i, 20.0 * i, 1, 15.0 if i % 2 else 200.0, vc="a" if i % 2 else "b") for i in range(60)]
    policy = _lucid(first_fit=10, refit_min=10)
    simulate(make_trace(jobs), policy, ClusterSpec(8, 1))
    why = policy.explain(Job(99, 0.0, 1, 0.0, vc="b"))
    assert why["source"] == "history and model"
    assert set(why["contributions_log_s"]) >= {"vc", "log2_gpus", "key_mean_log_s"}
    assert why["priority_gpu_s"] == pytest.approx(why["predicted_s"])


def test_the_shipped_interference_table_loads_and_describes_its_machine():
    table = InterferenceTable.load(DEFAULT_TABLE)
    assert len(table.workloads) >= 2 and "device" in table.machine
    assert all(table.pair(a, b) for a in table.workloads for b in table.workloads)


HEADER = "workload,partner,alone_steps_s,together_steps_s,slowdown,memory_mb\n"


@pytest.mark.parametrize("body, needle", [
    ("a,a,10,8,fast,5\n", "t.csv:3: column 'slowdown' = 'fast' is not a number"),
    ("a,a,10,8,1e308,5\n", "t.csv:3: column 'slowdown' = '1e308' must be"),
    ("a,a,10,8,-1,5\n", "t.csv:3: column 'slowdown' = '-1' must be"),
    (",a,10,8,1.2,5\n", "t.csv:3: column 'workload' is empty"),
    ("a,b,10,8,1.2,5\n", "has no row for ('b', 'a')"),
    ("a,a,10,8,1.2,5\na,a,10,8,1.2,5\n", "t.csv:4: column 'partner': pair ('a', 'a') appears twice"),
    ("", "t.csv:3: no rows after the header"),
])
def test_a_bad_interference_table_names_the_row_and_column(tmp_path, body, needle):
    p = tmp_path / "t.csv"
    p.write_text("# machine: test\n" + HEADER + body)
    with pytest.raises(TraceError) as e:
        InterferenceTable.load(p)
    assert needle in str(e.value)


@pytest.mark.parametrize("argv, needle", [
    (["--workloads", "resnet"], "unknown ['resnet']"),
    (["--seconds", "0"], "--seconds = 0.0 must be in (0, 3600]"),
    (["--seconds", "nan"], "--seconds = nan must be in (0, 3600]"),
    (["--threads", "0"], "--threads = 0 must be in [1, 256]"),
])
def test_profile_colocate_refuses_bad_arguments_before_measuring(tmp_path, capsys, argv, needle):
    from hpo.cli import main
    assert main(["profile", "colocate", "--out", str(tmp_path / "t.csv")] + argv) == 2
    assert needle in capsys.readouterr().err


def test_profile_colocate_refuses_an_output_folder_that_does_not_exist(tmp_path, capsys):
    from hpo.cli import main
    assert main(["profile", "colocate", "--out", str(tmp_path / "no" / "t.csv")]) == 2
    assert "does its folder exist" in capsys.readouterr().err


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(names=st.lists(st.sampled_from(["mlp-small", "mlp-large", "gpt-small", "gpt-large"]), min_size=1, max_size=6))
def test_the_table_colocate_writes_has_one_row_per_pair_and_loads_whatever_workloads_are_listed(
        tmp_path, monkeypatch, capsys, names):
    """`--workloads mlp-small,mlp-small` once measured the one pair three times (30 s of a user's
    time) and wrote a table `hpo sim --interference` refused ("pair appears twice")."""
    from hpo.cli import main
    from scheduler_bridge.live import colocate

    def fake_run(group, device, cores, threads, warmup, seconds):  # no processes: rates by name
        rate = {n: 100.0 * (i + 1) for i, n in enumerate(colocate.WORKLOADS)}
        return [(n, rate[n] / len(group), 10.0) for n in group]

    monkeypatch.setattr(colocate, "_run", fake_run)
    out = tmp_path / "t.csv"
    assert main(["profile", "colocate", "--out", str(out), "--workloads", ",".join(names)]) == 0
    capsys.readouterr()
    table = InterferenceTable.load(out)
    distinct = set(names)
    assert set(table.slowdown) == {(a, b) for a in distinct for b in distinct}


@pytest.mark.slow
def test_colocation_measures_a_pair_alone_and_together_into_a_loadable_table(tmp_path):
    """Through the command a user runs, from a folder outside the checkout: the workers import the
    installed workloads, not the checkout's `examples`."""
    import subprocess
    import sys

    out = tmp_path / "t.csv"
    proc = subprocess.run([sys.executable, "-m", "hpo.cli", "profile", "colocate", "--out", str(out),
                           "--workloads", "mlp-small", "--seconds", "0.3", "--warmup", "0.2"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=patience(300))
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = InterferenceTable.load(out)
    slowdown = table.pair("mlp-small", "mlp-small")[0]
    assert slowdown > 0 and table.memory_mb["mlp-small"] > 0
    assert "device: cpu" in table.machine


@pytest.mark.slow
def test_a_profiling_worker_that_dies_is_reported_at_once_not_after_the_timeout():
    """Its partner would wait at the barrier forever, and the table waited WORKER_TIMEOUT (600 s)."""
    import os

    from scheduler_bridge.live.colocate import WORKER_TIMEOUT, ProfileError, _run

    started = time.monotonic()
    with pytest.raises(ProfileError, match=r"^no-such-workload\+mlp-small: profiling worker exited with 1"):
        _run(["no-such-workload", "mlp-small"], "cpu", sorted(os.sched_getaffinity(0)), 1, 0.1, 0.1)
    assert time.monotonic() - started < WORKER_TIMEOUT / 2


def test_a_measured_slowdown_below_one_is_noise_and_never_speeds_a_packed_job_up():
    table = InterferenceTable({("a", "a"): 0.5}, {"a": 100.0})
    policy = Lucid(table, profile_nodes=2, profile_s=10.0)
    policy.workload_of = lambda job: "a"
    assert policy.slowdowns("a", "a") == (1.0, 1.0)
    res, df = _run([(0, 1, 100.0, "a"), (1, 1, 100.0, "a")], policy, gpus=3)
    assert res.summary()["packed_starts"] == 1
    assert (df.finish - df.start >= df.duration).all()
