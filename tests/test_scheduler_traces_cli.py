"""Trace loaders (real and malformed files) and the ``sim`` command line."""

import json
import tomllib
from pathlib import Path

import pytest

from scheduler_bridge import TraceError, load_helios, load_philly, load_pollux
from scheduler_bridge.data_files import default_traces_dir
from scheduler_bridge.simulation.cli import main

TRACES = default_traces_dir()
PHILLY = TRACES / "pollux" / "traces" / "philly.csv"
WORKLOAD = TRACES / "pollux" / "workloads" / "workload-1.csv"


def test_every_shipped_data_file_is_package_data_so_an_installed_package_has_it():
    package = Path(__file__).resolve().parents[1] / "scheduler_bridge"
    pyproject = tomllib.loads((package.parent / "pyproject.toml").read_text())
    patterns = pyproject["tool"]["setuptools"]["package-data"]["scheduler_bridge"]
    shipped = {p for p in (package / "data").rglob("*") if p.is_file()}
    covered = {p for pattern in patterns for p in package.glob(pattern) if p.is_file()}
    assert (TRACES / "README.md") in shipped and (TRACES / "pollux" / "LICENSE") in shipped
    assert sorted(map(str, shipped - covered)) == []


def test_shipped_philly_trace_loads_every_job_sorted():
    trace = load_philly(PHILLY)
    assert len(trace) == 82247
    submits = [j.submit for j in trace.jobs]
    assert submits[0] == 0 and submits == sorted(submits)


def test_shipped_pollux_workload_loads_160_elastic_jobs_with_durations():
    trace = load_pollux(WORKLOAD)
    assert len(trace) == 160
    assert all(j.elastic is not None and j.duration > 0 for j in trace.jobs)


@pytest.mark.parametrize("name, path", [("philly", "traces/philly.csv"), ("workload-1", "workloads/workload-1.csv"),
                                        ("workloads-1.5/workload-8", "workloads-1.5/workload-8.csv")])
def test_sim_finds_a_shipped_trace_by_name_and_reads_it_in_its_format(tmp_path, monkeypatch, name, path):
    monkeypatch.chdir(tmp_path)  # no file of that name here
    out = tmp_path / "out.json"
    assert main(["sim", "--trace", name, "--policy", "fifo", "--gpus", "64", "--gpus-per-node", "4",
                 "--limit", "20", "--json", str(out)]) == 0
    summary = json.loads(out.read_text())
    assert (summary["trace"], summary["completed"]) == (str(TRACES / "pollux" / path), 20)


def test_sim_of_a_trace_file_without_its_format_exits_2_naming_the_flag(tmp_path, capsys):
    rc = main(["sim", "--trace", str(_small_philly(tmp_path)), "--policy", "fifo", "--gpus", "4"])
    err = capsys.readouterr().err
    assert rc == 2 and "small.csv: give its --format (philly, pollux, helios)" in err, err


def test_sim_of_neither_a_file_nor_a_shipped_name_lists_the_shipped_names(tmp_path, capsys):
    rc = main(["sim", "--trace", str(tmp_path / "nope"), "--policy", "fifo", "--gpus", "4"])
    err = capsys.readouterr().err
    assert rc == 2 and "no such file, nor a shipped trace (philly, workload-1," in err, err


def test_malformed_philly_row_names_the_line_and_value(tmp_path):
    p = tmp_path / "bad.csv"
    p.write_text("timestamp,duration,num_gpus,gpu_time,cluster\n"
                 "2017-10-09 07:01:55,66.0,1,66.0,a\n"
                 "2017-10-09 07:02:55,sixty,1,60.0,a\n")
    with pytest.raises(TraceError, match=r"bad.csv:3: column 'duration' = 'sixty'"):
        load_philly(p)


def test_helios_cluster_log_is_read_and_cpu_jobs_skipped(tmp_path):
    p = tmp_path / "cluster_log.csv"
    p.write_text("job_id,user,vc,gpu_num,cpu_num,node_num,state,submit_time,start_time,end_time,duration,queue\n"
                 "j1,u1,vcA,8,48,1,COMPLETED,2020-04-01 00:00:10,2020-04-01 00:00:12,2020-04-01 01:00:12,3600,2\n"
                 "j2,u2,vcA,0,4,1,COMPLETED,2020-04-01 00:00:20,2020-04-01 00:00:20,2020-04-01 00:00:30,10,0\n"
                 "j3,u1,vcB,1,6,1,FAILED,2020-04-01 00:01:10,2020-04-01 00:01:10,2020-04-01 00:02:10,60,0\n")
    trace = load_helios(p)
    assert [(j.name, j.user, j.vc, j.gpus, j.submit, j.duration) for j in trace.jobs] == [
        ("j1", "u1", "vcA", 8, 0.0, 3600.0), ("j3", "u1", "vcB", 1, 60.0, 60.0)]


def test_a_trace_saved_with_a_byte_order_mark_and_windows_line_ends_reads_as_without(tmp_path):
    # Excel's "CSV UTF-8" starts the file with a byte-order mark, which is not part of the header.
    body = "job_id,user,vc,gpu_num,submit_time,duration\r\nj1,u1,vcA,2,100,10\r\nj2,u1,vcA,1,130,5\r\n"
    plain, marked = tmp_path / "plain.csv", tmp_path / "marked.csv"
    plain.write_text(body, newline="")
    marked.write_bytes(b"\xef\xbb\xbf" + body.encode())
    jobs = [[(j.name, j.gpus, j.submit, j.duration) for j in load_helios(p).jobs] for p in (plain, marked)]
    assert jobs[0] == jobs[1] == [("j1", 2, 0.0, 10.0), ("j2", 1, 30.0, 5.0)]


def test_missing_column_is_reported(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("timestamp,duration\n1,2\n")
    with pytest.raises(TraceError, match="missing column"):
        load_philly(p)


def _small_philly(tmp_path):
    p = tmp_path / "small.csv"
    rows = ["timestamp,duration,num_gpus,gpu_time,cluster"]
    for i in range(30):
        rows.append(f"2017-10-09 07:{i:02d}:00,{100 + 37 * (i % 7)},{1 + (i % 3 == 0)},0,vc{i % 2}")
    p.write_text("\n".join(rows) + "\n")
    return p


def test_cli_compares_policies_and_writes_json_and_plot(tmp_path, capsys):
    out, png = tmp_path / "out.json", tmp_path / "out.png"
    rc = main(["sim", "--trace", str(_small_philly(tmp_path)), "--format", "philly",
               "--policy", "fifo,sjf,qssf,tuning-aware", "--gpus", "4", "--gpus-per-node", "2",
               "--json", str(out), "--plot", str(png)])
    assert rc == 0
    data = json.loads(out.read_text())
    assert [d["policy"] for d in data] == ["fifo", "sjf", "qssf", "tuning-aware"]
    for key in ("policy", "jobs", "completed", "avg_jct", "p99_jct", "avg_queue", "makespan",
                "utilization", "wall_s"):
        assert key in data[0], key
    assert png.stat().st_size > 0
    assert "avg_jct" in capsys.readouterr().out


@pytest.mark.parametrize("argv, needle", [
    (["--policy", "lottery"], "unknown policy 'lottery'"),
    (["--policy", "elastic"], "use --format pollux"),
])
def test_cli_bad_input_exits_2_with_a_message(tmp_path, capsys, argv, needle):
    rc = main(["sim", "--trace", str(_small_philly(tmp_path)), "--format", "philly",
               "--gpus", "4"] + argv)
    err = capsys.readouterr().err
    assert rc == 2 and needle in err and "Traceback" not in err


def test_cli_malformed_trace_exits_2_naming_the_row(tmp_path, capsys):
    p = tmp_path / "bad.csv"
    p.write_text("timestamp,duration,num_gpus,gpu_time,cluster\n2017-10-09 07:01:55,5,two,0,a\n")
    rc = main(["sim", "--trace", str(p), "--format", "philly", "--policy", "fifo", "--gpus", "4"])
    err = capsys.readouterr().err
    assert rc == 2 and "bad.csv:2: column 'num_gpus' = 'two'" in err


def test_a_job_larger_than_the_cluster_exits_2_naming_the_trace_file_and_the_job(tmp_path, capsys):
    p = tmp_path / "big.csv"
    p.write_text("timestamp,duration,num_gpus,gpu_time,cluster\n2017-10-09 07:01:55,5,64,0,a\n")
    for policy, gpus in (("fifo", "8"), ("lucid", "24")):
        rc = main(["sim", "--trace", str(p), "--format", "philly", "--policy", policy, "--gpus", gpus])
        err = capsys.readouterr().err
        assert rc == 2 and f"{p}: job philly-2 asks for 64 GPUs" in err and "can never place it" in err, err


def test_add_sim_parser_plugs_into_another_cli_and_writes_per_policy_csv(tmp_path):
    import argparse

    from scheduler_bridge.simulation.cli import add_sim_parser, run_sim
    parser = argparse.ArgumentParser(prog="hpo")
    add_sim_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["sim", "--trace", str(_small_philly(tmp_path)), "--format", "philly",
                              "--policy", "fifo,srtf", "--gpus", "4", "--csv", str(tmp_path / "jobs.csv")])
    assert args.func is run_sim
    assert args.func(args) == 0
    assert (tmp_path / "jobs-fifo.csv").is_file() and (tmp_path / "jobs-srtf.csv").is_file()


PHILLY_HEADER = "timestamp,duration,num_gpus,gpu_time,cluster\n"


@pytest.mark.parametrize("body, needle", [
    ("2017-10-09 07:01:55,1e308,1,0,a\n", "bad.csv:2: column 'duration' = '1e308' must be <= 1e+09"),
    ("-50,60,1,0,a\n", "bad.csv:2: column 'timestamp' = '-50' must be seconds in [0, 1e+11]"),
    ("1960-01-01 00:00:00,60,1,0,a\n", "bad.csv:2: column 'timestamp' = '1960-01-01 00:00:00' is before 1970"),
    ("", "bad.csv:2: no job rows after the header"),
])
def test_cli_refuses_out_of_range_or_empty_traces_naming_line_and_column(tmp_path, capsys, body, needle):
    p = tmp_path / "bad.csv"
    p.write_text(PHILLY_HEADER + body)
    rc = main(["sim", "--trace", str(p), "--format", "philly", "--policy", "fifo", "--gpus", "4"])
    err = capsys.readouterr().err
    assert rc == 2 and needle in err and "Traceback" not in err and err.count("\n") == 1


def test_cli_non_utf8_trace_names_the_file_line_and_column(tmp_path, capsys):
    p = tmp_path / "latin.csv"
    p.write_bytes(PHILLY_HEADER.encode() + b"2017-10-09 07:01:55,60,1,0,a\n2017-10-09 07:02:55,60,1,0,caf\xe9\n")
    rc = main(["sim", "--trace", str(p), "--format", "philly", "--policy", "fifo", "--gpus", "4"])
    err = capsys.readouterr().err
    assert rc == 2 and "latin.csv:3: byte 0xe9 at column 31 is not UTF-8" in err


@pytest.mark.parametrize("argv, needle", [
    (["--limit", "-5"], "--limit = -5 must be in [1, inf]"),
    (["--restart-cost", "-1"], "--restart-cost = -1.0 must be in"),
    (["--restart-cost", "nan"], "--restart-cost = nan must be a finite number"),
    (["--boot-delay", "-3"], "--boot-delay = -3.0 must be in"),
    (["--policy", "ces:lottery"], "unknown policy 'ces:lottery'"),
])
def test_cli_refuses_out_of_range_flags(tmp_path, capsys, argv, needle):
    base = ["sim", "--trace", str(_small_philly(tmp_path)), "--format", "philly", "--gpus", "4"]
    rc = main(base + (["--policy", "fifo"] if "--policy" not in argv else []) + argv)
    err = capsys.readouterr().err
    assert rc == 2 and needle in err, err


@pytest.mark.parametrize("flag", ["--json", "--plot", "--csv"])
def test_cli_checks_output_paths_before_simulating(tmp_path, capsys, monkeypatch, flag):
    import scheduler_bridge.simulation.cli as cli
    monkeypatch.setattr(cli, "simulate", lambda *a, **k: pytest.fail("simulated before the check"))
    rc = main(["sim", "--trace", str(_small_philly(tmp_path)), "--format", "philly", "--policy", "fifo",
               "--gpus", "4", flag, str(tmp_path / "missing" / "out")])
    err = capsys.readouterr().err
    assert rc == 2 and "missing does not exist" in err


def test_cli_bad_interference_table_exits_2_naming_row_and_column(tmp_path, capsys):
    t = tmp_path / "t.csv"
    t.write_text("workload,partner,alone_steps_s,together_steps_s,slowdown,memory_mb\na,a,1,1,x,5\n")
    rc = main(["sim", "--trace", str(_small_philly(tmp_path)), "--format", "philly", "--policy", "lucid",
               "--gpus", "40", "--interference", str(t)])
    err = capsys.readouterr().err
    assert rc == 2 and "t.csv:2: column 'slowdown' = 'x' is not a number" in err


def test_cli_runs_tiresias_lucid_and_ces_and_reports_energy(tmp_path):
    out, png = tmp_path / "out.json", tmp_path / "out.png"
    rc = main(["sim", "--trace", str(_small_philly(tmp_path)), "--format", "philly",
               "--policy", "tiresias,lucid,ces:qssf", "--gpus", "24", "--gpus-per-node", "4",
               "--json", str(out), "--plot", str(png)])
    assert rc == 0
    data = json.loads(out.read_text())
    assert [d["policy"] for d in data] == ["tiresias", "lucid", "ces:qssf"]
    for d in data:
        for key in ("energy_kwh", "powered_node_hours", "on_utilization", "p999_queue"):
            assert key in d, key
    assert png.stat().st_size > 0


HELIOS_HEADER = "job_id,user,vc,gpu_num,submit_time,duration\n"
POLLUX_HEADER = "name,time,application,num_replicas,batch_size\n"
TABLE_HEADER = "workload,partner,alone_steps_s,together_steps_s,slowdown,memory_mb\n"


def _sim(tmp_path, fmt, text, *extra):
    """``hpo sim`` of ``text`` as a trace of ``fmt`` (or, for fmt "table", as lucid's interference
    table beside a good trace): (exit status, stderr)."""
    import contextlib
    import io
    p = tmp_path / "t.csv"
    p.write_text(text, newline="")
    if fmt == "table":
        argv = ["--trace", str(_small_philly(tmp_path)), "--format", "philly", "--policy", "lucid",
                "--gpus", "40", "--interference", str(p)]
    else:
        argv = ["--trace", str(p), "--format", fmt, "--policy", "fifo", "--gpus", "16",
                "--gpus-per-node", "4"] + (["--profiles", str(TRACES / "pollux" / "traces")] if fmt == "pollux" else [])
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = main(["sim", *argv, *extra])
    return rc, err.getvalue()


# A file a spreadsheet or a hand edit gets wrong: every reader (traces, the interference table) names
# the file and the line where the CSV stops being a table, instead of reading the rest of the file
# into one cell (an unclosed quote), taking one of two same-named columns, dropping or shifting values
# (a row with a field too few or too many: an unquoted comma), or ending in a traceback.
@pytest.mark.parametrize("fmt, header, good, line", [
    ("philly", PHILLY_HEADER, "0,60,1,0,a\n", "0,60,1,0,{}\n"),
    ("helios", HELIOS_HEADER, "j1,u,v,1,0,60\n", "j2,u,v,1,5,{}\n"),
    ("pollux", POLLUX_HEADER, "j1,0,cifar10,2,256\n", "j2,5,cifar10,2,{}\n"),
    ("table", TABLE_HEADER, "a,a,1,1,1.1,5\n", "a,b,1,1,1.1,{}\nb,a,1,1,1.2,5\nb,b,1,1,1,5\n"),
])
@pytest.mark.parametrize("bad, needle", [
    ('"5', "t.csv:3: "),                                   # a quote never closed
    ("x" * 200_000, "t.csv:3: "),                          # a cell larger than Python's csv takes
    ("5,6", "t.csv:3: row has 7 fields, the header has 6"),  # an unquoted comma (counts for a 6-column header)
])
def test_a_broken_csv_row_is_one_line_naming_file_and_line_in_every_reader(tmp_path, fmt, header, good, line,
                                                                           bad, needle):
    text = header + good + line.format(bad) + good.replace("j1", "j3").replace("0,", "9,", 1)
    rc, err = _sim(tmp_path, fmt, text)
    if "row has" in needle:
        n = header.count(",") + 1
        needle = f"t.csv:3: row has {n + 1} fields, the header has {n}"
    assert rc == 2 and needle in err and err.count("\n") == 1 and "Traceback" not in err, err


@pytest.mark.parametrize("fmt, header, good", [
    ("philly", PHILLY_HEADER, "0,60,1,0,a\n"), ("helios", HELIOS_HEADER, "j1,u,v,1,0,60\n"),
    ("pollux", POLLUX_HEADER, "j1,0,cifar10,2,256\n"), ("table", TABLE_HEADER, "a,a,1,1,1.1,5\n")])
def test_a_header_naming_a_column_twice_or_a_row_short_of_fields_is_refused(tmp_path, fmt, header, good):
    cols = header.rstrip("\n").split(",")
    twice = ",".join(cols + [cols[-1]]) + "\n"
    rc, err = _sim(tmp_path, fmt, twice + good.rstrip("\n") + ",7\n")
    assert rc == 2 and f"t.csv:1: column {cols[-1]!r} appears twice in the header" in err, err
    short = good.rstrip("\n").rsplit(",", 1)[0] + "\n"
    rc, err = _sim(tmp_path, fmt, header + short)
    assert rc == 2 and f"t.csv:2: row has {len(cols) - 1} fields, the header has {len(cols)}" in err, err


@pytest.mark.parametrize("batch", [1, 31, 4097, 99_999_999])
def test_a_pollux_job_whose_batch_its_profile_never_measured_is_refused_naming_the_row(tmp_path, batch):
    # cifar10's profile measured global batches 128..4096 and at least 32 per GPU: a batch of 1 once
    # made the job's duration infinite (fifo "completed 0", exit 0; elastic an error without a line)
    rc, err = _sim(tmp_path, "pollux", POLLUX_HEADER + "j1,0,cifar10,2,256\n" + f"j2,5,cifar10,8,{batch}\n")
    assert rc == 2 and f"t.csv:3: column 'batch_size' = '{batch}'" in err and err.count("\n") == 1, err


def test_a_helios_log_of_cpu_jobs_only_is_refused_not_simulated_as_nothing(tmp_path):
    rc, err = _sim(tmp_path, "helios", HELIOS_HEADER + "j1,u,v,0,0,60\nj2,u,v,0,5,60\n")
    assert rc == 2 and "t.csv: no GPU jobs" in err and err.count("\n") == 1, err


@pytest.mark.parametrize("spec", [",", " , ", ""])
def test_a_policy_list_without_a_name_is_refused(tmp_path, spec):
    rc, err = _sim(tmp_path, "philly", PHILLY_HEADER + "0,60,1,0,a\n", "--policy", spec)
    assert rc == 2 and "give --policy NAME[,NAME...] or --compare" in err and "Traceback" not in err, err


@pytest.mark.parametrize("fmt, header, row, column, gpus", [
    ("helios", HELIOS_HEADER, "j1,u,v,{gpus},{t},60\n", "job_id", 1),
    ("helios", HELIOS_HEADER, "j1,u,v,{gpus},{t},60\n", "job_id", 0),   # a CPU job, skipped, counts too
    ("pollux", POLLUX_HEADER, "j1,{t},cifar10,{gpus},256\n", "name", 1),
])
def test_a_job_id_given_twice_is_refused_naming_both_lines(tmp_path, fmt, header, row, column, gpus):
    """A trace pasted into itself, or two logs joined, once replayed every job twice and wrote two
    rows of one name to --csv."""
    text = header + row.format(gpus=2, t=0) + row.replace("j1", "j2").format(gpus=2, t=1) + row.format(gpus=gpus, t=5)
    rc, err = _sim(tmp_path, fmt, text)
    assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert f"t.csv:4: column {column!r} = 'j1' is the id of the job at line 2 too" in err, err


def test_one_job_id_in_two_clusters_of_a_joined_helios_log_is_two_jobs(tmp_path):
    """Helios' all_cluster_log.csv joins every cluster's log with a `cluster` column: an id is per cluster."""
    p = tmp_path / "all.csv"
    p.write_text("job_id,cluster,user,vc,gpu_num,submit_time,duration\nj1,Venus,u,v,1,0,60\nj1,Earth,u,v,1,5,60\n")
    assert len(load_helios(p)) == 2
    p.write_text("job_id,cluster,user,vc,gpu_num,submit_time,duration\nj1,Venus,u,v,1,0,60\nj1,Venus,u,v,1,5,60\n")
    with pytest.raises(TraceError, match="all.csv:3: column 'job_id' = 'j1' is the id of the job of cluster 'Venus' at line 2"):
        load_helios(p)


@pytest.mark.parametrize("fmt, header, row", [("philly", PHILLY_HEADER, "0,60,1,0,a\n"),
                                              ("helios", HELIOS_HEADER, "j1,u,v,1,0,60\n")])
def test_profiles_beside_a_trace_that_reads_none_are_refused_not_ignored(tmp_path, fmt, header, row):
    rc, err = _sim(tmp_path, fmt, header + row, "--profiles", str(TRACES / "pollux" / "traces"))
    assert rc == 2 and "only a --format pollux trace reads application profiles" in err, err


def test_a_pollux_workload_without_profiles_beside_it_names_the_flag_that_gives_them(tmp_path, capsys):
    """A workload of one's own, outside the shipped folders, was refused naming only the missing
    ../traces folder, not --profiles."""
    workload = tmp_path / "w.csv"
    workload.write_text(POLLUX_HEADER + "j1,0,cifar10,2,256\n")
    rc = main(["sim", "--trace", str(workload), "--format", "pollux", "--policy", "fifo", "--gpus", "8"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1, err
    assert f"{tmp_path.resolve().parent / 'traces'} does not exist; give --profiles FOLDER" in err, err
    assert str(TRACES / "pollux" / "traces") in err, "it names the shipped profiles"


def test_a_folder_given_as_the_trace_is_named_a_folder_not_a_missing_file(tmp_path, capsys):
    rc = main(["sim", "--trace", str(tmp_path), "--format", "philly", "--policy", "fifo", "--gpus", "8"])
    err = capsys.readouterr().err
    assert rc == 2 and f"{tmp_path}: a folder, not a file" in err and err.count("\n") == 1, err
