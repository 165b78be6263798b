"""``hpo job start`` refuses bad policy options with one line and exit status 2, before it
connects to any cluster (no Ray here: a refused start never reaches ``ray.init``; the
address is one where no cluster listens, so a start that got through could join no one's); and
``hpo job list``'s table says which placed jobs are still starting."""

from __future__ import annotations

import pytest

from scheduler_bridge.live.cli import job_table, main
from scheduler_bridge.live.job_state import JobSpec, LiveJob

NOWHERE = "127.0.0.1:9"


@pytest.mark.parametrize("extra, says", [
    (["--policy", "fifo", "--tiresias-thresholds", "60"], "--tiresias-* options need --policy tiresias"),
    (["--policy", "tiresias", "--tiresias-thresholds", "60,x"], "--tiresias-thresholds expects"),
    (["--policy", "tiresias", "--tiresias-thresholds", "600,60"], "positive and increasing"),
    (["--policy", "fifo", "--ces-boot-delay", "30"], "--ces-* options need --policy ces:<base>"),
    (["--policy", "ces:fifo", "--ces-spare-nodes", "-1"], "must be >= 0"),
    (["--policy", "qssf", "--pack-margin", "0.5"], "need --policy lucid"),
    (["--policy", "lucid", "--pack-margin", "-0.5"], "margin must be >= 0"),
    (["--policy", "fifo", "--profile-nodes", "1"], "--profile-* options need --policy lucid"),
    (["--policy", "lucid", "--profile-seconds", "0"], "profile_s > 0"),
])
def test_bad_policy_options_are_one_line_errors_with_exit_status_2(tmp_path, capsys, extra, says):
    args = ["job", "start", "--journal", str(tmp_path / "j.log"), "--storage", str(tmp_path),
            "--address", NOWHERE, *extra]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1, err


def test_every_ces_and_lucid_setting_reaches_the_policy_the_allocator_builds():
    """Each flag is gathered under the keyword the allocator's policy takes: a misnamed one would
    only fail on the cluster, when the allocator starts."""
    import argparse

    from scheduler_bridge.live.allocator import _live_ces, _live_lucid
    from scheduler_bridge.live.cli import _given, add_job_parser
    from scheduler_bridge import CES, FIFO

    parser = argparse.ArgumentParser()
    add_job_parser(parser.add_subparsers())
    args = parser.parse_args(["job", "start", "--journal", "j", "--storage", "s",
                              "--ces-spare-nodes", "2", "--ces-margin", "0.2", "--ces-interval", "60",
                              "--ces-boot-delay", "30", "--ces-max-nodes", "8", "--pack-max-slowdown", "1.5",
                              "--pack-gpu-memory-mb", "16384", "--pack-margin", "0.3", "--profile-nodes", "1",
                              "--profile-seconds", "60"])
    ces, max_nodes = _live_ces(CES(FIFO()), _given(args, "ces"))
    assert (ces.spare_nodes, ces.margin, ces.interval, ces.power.boot_delay, max_nodes) == (2, 0.2, 60.0, 30.0, 8)
    lucid = _given(args, "lucid")
    assert len(lucid) == 5 and _live_lucid(lucid, True, 0).margin == 0.3


def test_a_bad_interference_table_names_its_line_and_column(tmp_path, capsys):
    table = tmp_path / "t.csv"
    table.write_text("workload,partner,alone_steps_s,together_steps_s,slowdown,memory_mb\n"
                     "a,a,100,80,fast,200\n")
    args = ["job", "start", "--journal", str(tmp_path / "j.log"), "--storage", str(tmp_path),
            "--address", NOWHERE, "--policy", "lucid", "--interference", str(table)]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert f"{table}:2" in err and "'slowdown'" in err and err.count("\n") == 1, err


def test_the_job_table_shows_a_placed_job_whose_ranks_are_not_all_up_as_starting():
    def job(job_id: int, state: str, ready_attempt: int) -> dict:
        return LiveJob(job_id, JobSpec(entrypoint="pkg.train:main", gpus=2, name=f"job{job_id}"), submit_t=0.0,
                       state=state, attempt=1, ready_attempt=ready_attempt).summary()

    rows = job_table([job(1, "running", 0), job(2, "running", 1), job(3, "queued", 0)]).splitlines()[1:]
    assert [row.split()[1] for row in rows] == ["starting", "running", "queued"]


def test_a_bubble_profile_that_is_not_text_is_a_one_line_error_naming_it(tmp_path, capsys):
    profile = tmp_path / "profile.json"
    profile.write_bytes(b"\xff\xfe{}")     # a UTF-16 file, say: once "'utf-8' codec can't decode..." and no file
    assert main(["job", "submit", "m:f", "--gpus", "2", "--bubble-profile", str(profile), "--address", NOWHERE]) == 2
    err = capsys.readouterr().err
    assert f"{profile}: not a pipeline profile (byte 0xff at offset 0 is not UTF-8 text)" in err and err.count("\n") == 1, err


def test_a_bad_bubble_profile_is_a_one_line_error_before_connecting(tmp_path, capsys):
    profile = tmp_path / "profile.json"
    profile.write_text('{"format": "something else"}')
    assert main(["job", "submit", "m:f", "--gpus", "2", "--bubble-profile", str(profile), "--address", NOWHERE]) == 2
    err = capsys.readouterr().err
    assert f"{profile}: not a pipeline profile" in err and err.count("\n") == 1, err


@pytest.mark.parametrize("command", [["list"], ["cancel", "3"], ["stop"], ["submit", "m:f"]])
def test_an_address_where_no_cluster_listens_is_a_one_line_error_at_once(capsys, monkeypatch, command):
    """A mistyped port once left `hpo job list` retrying for minutes (Ray's warnings every few
    seconds), never exiting. Nothing listens on port 9 here; `ray.init` must not even be called."""
    import ray
    monkeypatch.setattr(ray, "init", lambda *a, **k: pytest.fail("ray.init was called"))
    assert main(["job", *command, "--address", NOWHERE]) == 2
    err = capsys.readouterr().err
    assert f"--address {NOWHERE}: no Ray cluster answers there" in err and err.count("\n") == 1, err


def test_an_address_that_is_not_host_and_port_is_refused(capsys, monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "head-node")
    assert main(["job", "list"]) == 2
    err = capsys.readouterr().err
    assert "RAY_ADDRESS 'head-node': expected HOST:PORT" in err and err.count("\n") == 1, err


@pytest.mark.parametrize("extra, says", [
    (["--policy", "ces:fifo", "--ces-margin", "nan"], "--ces-margin = nan must be a finite number"),
    (["--policy", "ces:fifo", "--ces-boot-delay", "inf"], "--ces-boot-delay = inf must be a finite number"),
    (["--policy", "tiresias", "--tiresias-starvation", "nan"], "--tiresias-starvation = nan must be a finite number"),
    (["--policy", "tiresias", "--tiresias-thresholds", "60,nan"], "--tiresias-thresholds = 60,nan must be finite"),
    (["--policy", "lucid", "--pack-gpu-memory-mb", "inf"], "--pack-gpu-memory-mb = inf must be a finite number"),
    (["--policy", "lucid", "--profile-seconds", "inf"], "--profile-seconds = inf must be a finite number"),
    (["--policy", "tuning-aware", "--base-policy", "lottery"], "tuning-aware base policy must be one of"),
])
def test_a_setting_the_policy_cannot_use_is_refused_before_connecting(tmp_path, capsys, extra, says):
    """NaN passed every `< 0` check and reached the allocator (a NaN CES margin, Tiresias
    threshold...), and an unknown --base-policy was only found by the allocator's constructor on
    the cluster. NOWHERE has no cluster: a check after connecting would say so instead."""
    args = ["job", "start", "--journal", str(tmp_path / "j.log"), "--storage", str(tmp_path),
            "--address", NOWHERE, *extra]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1, err
