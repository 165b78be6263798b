"""Run files: rows of one shape from every source, atomic replacement, versioned runs, and a
damaged run state refused with the file named."""

from __future__ import annotations

import json
import math
import os
import time

import numpy as np
import pandas as pd
import pytest

from hpo.cli import EXIT_BAD_INPUT, EXIT_INTERRUPTED, EXIT_NO_RESULT, EXIT_TRIALS_ERRORED, main
from hpo.reporting.tune_state import newest_state
from hpo.reporting.live_results import SavedRunState
from hpo.reporting.rebuild import records_from_trial_dirs
from hpo.reporting.results_files import RESULTS_FILE, SUMMARY_FILE, TrialRecord, best_record, write_run_files
from hpo.tuner.run_folders import RunStateError, fresh_run_name, latest_run, verify_run_state


def record(trial_id, loss, iterations=3, **kwargs):
    return TrialRecord(trial_id, {"lr": float(trial_id[-1])}, {"loss": loss, "training_iteration": iterations, "acc": 0.5}, **kwargs)


def test_the_best_is_never_an_errored_diverged_running_or_unfinished_trial():
    records = [
        record("t1", 0.1, error="ValueError: boom"),
        record("t2", math.nan),
        record("t3", 0.2, running=True),
        record("t4", 0.9),
        record("t5", 0.5, iterations=1),  # stopped early by the scheduler: a finished outcome
    ]
    assert best_record(records, "loss", "min", max_iterations=3).trial_id == "t5"
    assert best_record(records[:3], "loss", "min", max_iterations=3) is None


def test_run_files_hold_every_metric_status_and_checkpoint_and_leave_no_temporary(tmp_path):
    records = [record("t1", 0.3, checkpoint="/ck/1"), record("t2", 0.2, error="ValueError: boom", error_file="/e")]
    write_run_files(tmp_path, records, "loss", "min", 3)
    rows = pd.read_csv(tmp_path / RESULTS_FILE)
    assert list(rows["trial_id"]) == ["t2", "t1"]  # sorted by the metric
    assert list(rows["status"]) == ["error", "completed"]
    assert {"acc", "checkpoint", "error_file", "config/lr"} <= set(rows.columns)
    summary = json.loads((tmp_path / SUMMARY_FILE).read_text())
    assert summary["best"]["trial_id"] == "t1" and summary["errored"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == [RESULTS_FILE, SUMMARY_FILE]


def test_a_nested_metric_is_named_by_its_path_as_tune_names_it(tmp_path):
    """A trial that reports `{"val": {"loss": x}}` has the metric `val/loss`, as Tune's dataframes,
    schedulers and `get_best_result` read it; nested configs and other nested metrics are columns
    by their paths too, as in Tune's `get_dataframe`."""
    records = [
        TrialRecord(f"t{x}", {"opt": {"lr": x}}, {"val": {"loss": x, "acc": 1 - x}, "training_iteration": 3})
        for x in (0.3, 0.1, 0.2)
    ]
    assert best_record(records, "val/loss", "min", max_iterations=3).trial_id == "t0.1"
    rows = write_run_files(tmp_path, records, "val/loss", "min", 3)
    assert list(rows["val/loss"]) == [0.1, 0.2, 0.3]
    assert list(rows["config/opt/lr"]) == [0.1, 0.2, 0.3]
    assert list(rows["val/acc"]) == [0.9, 0.8, 0.7]
    assert json.loads((tmp_path / SUMMARY_FILE).read_text())["best"]["value"] == 0.1


def test_numpy_scalars_are_metric_values_like_python_numbers(tmp_path):
    """A trainable that reports `np.float32(...)` (what a numpy or torch computation `.item()`s to in
    float32 code) is ranked by it, and its row shows it: np.float32 is no Python float."""
    records = [TrialRecord(f"t{i}", {"x": i}, {"loss": kind(x), "training_iteration": 3})
               for i, (kind, x) in enumerate([(np.float32, 0.5), (np.int64, 2), (float, 1.0)])]
    rows = write_run_files(tmp_path, records, "loss", "min", 3)
    assert list(rows["loss"]) == [0.5, 1.0, 2.0]
    assert best_record(records, "loss", "min", 3).trial_id == "t0"
    best = json.loads((tmp_path / SUMMARY_FILE).read_text())["best"]
    assert (best["trial_id"], best["value"]) == ("t0", 0.5)


def test_integer_columns_stay_integer_beside_a_trial_that_never_started(tmp_path):
    # An interrupted sweep's trial that Tune created but never started has no config or metrics.
    started = TrialRecord("t1", {"width": 32, "lr": 0.01, "bn": True}, {"loss": 0.3, "training_iteration": 3, "epoch": 2})
    unstarted = TrialRecord("t2", {}, {}, running=True)
    write_run_files(tmp_path, [started, unstarted], "loss", "min", 3)
    lines = (tmp_path / RESULTS_FILE).read_text().splitlines()
    header, first, second = (line.split(",") for line in lines)
    cells = dict(zip(header, first))
    assert (cells["config/width"], cells["epoch"], cells["iterations"]) == ("32", "2", "3")
    assert (cells["config/lr"], cells["config/bn"]) == ("0.01", "True")
    assert dict(zip(header, second))["config/width"] == ""


def test_a_second_run_of_a_name_gets_a_new_folder_and_resume_takes_the_newest(tmp_path):
    assert fresh_run_name(tmp_path, "sweep") == "sweep"
    (tmp_path / "sweep").mkdir()
    (tmp_path / "sweep" / RESULTS_FILE).write_text("kept\n")
    assert fresh_run_name(tmp_path, "sweep") == "sweep-2"
    (tmp_path / "sweep-2").mkdir()
    assert fresh_run_name(tmp_path, "sweep") == "sweep-3"
    assert latest_run(tmp_path, "sweep") == tmp_path / "sweep-2"
    assert (tmp_path / "sweep" / RESULTS_FILE).read_text() == "kept\n"


def write_state(run, session, ended):
    entries = [[json.dumps({"trial_id": t, "status": "TERMINATED"}), json.dumps({})] for t in ended]
    (run / f"experiment_state-{session}.json").write_text(json.dumps({"trial_data": entries}))


def test_saved_run_state_sees_each_save_and_the_newest_session_at_a_sweeps_end(tmp_path, monkeypatch):
    monkeypatch.setattr(SavedRunState, "LIST_EVERY_S", 3600.0)  # no listing but the first and the end's
    monkeypatch.setattr(SavedRunState, "CHECK_EVERY_S", 0.0)
    write_state(tmp_path, "2026-01-01_00-00-00", ["old"])  # an interrupted run's state
    saved = SavedRunState(tmp_path)
    assert saved.ended() == {"old"}
    write_state(tmp_path, "2026-01-01_00-00-00", ["old", "t1"])  # the same file saved again
    os.utime(tmp_path / "experiment_state-2026-01-01_00-00-00.json", ns=(1, 10**18))
    assert saved.ended() == {"old", "t1"}
    write_state(tmp_path, "2026-02-01_00-00-00", ["t2"])  # a resumed run's own state
    assert saved.ended() == {"old", "t1"}  # not listed yet
    assert saved.ended(relist=True) == {"t2"}


def test_saved_run_state_looks_at_the_file_at_most_every_check_period_until_asked_at_the_end(tmp_path, monkeypatch):
    monkeypatch.setattr(SavedRunState, "CHECK_EVERY_S", 3600.0)
    own = tmp_path / "experiment_state-2026-02-01_00-00-00.json"
    write_state(tmp_path, "2026-02-01_00-00-00", ["t1"])
    saved = SavedRunState(tmp_path)
    assert saved.ended() == {"t1"}
    write_state(tmp_path, "2026-02-01_00-00-00", ["t1", "t2"])
    os.utime(own, ns=(time.time_ns() + 10**9,) * 2)
    assert saved.ended() == {"t1"}, "looked again within the period"
    assert saved.ended(relist=True) == {"t1", "t2"}


def test_saved_run_state_stops_listing_the_folder_once_this_runs_own_state_is_read(tmp_path, monkeypatch):
    import hpo.reporting.live_results as live_results

    listings = []
    monkeypatch.setattr(live_results, "newest_state", lambda path: listings.append(path) or newest_state(path))
    write_state(tmp_path, "2026-01-01_00-00-00", ["old"])  # an earlier run's state: the folder is listed again
    saved = SavedRunState(tmp_path)
    assert saved.ended(relist=True) == {"old"} and saved.ended(relist=True) == {"old"}
    assert len(listings) == 2
    own = tmp_path / "experiment_state-2026-02-01_00-00-00.json"
    write_state(tmp_path, "2026-02-01_00-00-00", ["t1"])  # this run's own, written after the reader began
    os.utime(own, ns=(time.time_ns(), time.time_ns()))  # the file system's clock may lag the reader's
    assert saved.ended(relist=True) == {"t1"}
    write_state(tmp_path, "2026-02-01_00-00-00", ["t1", "t2"])
    os.utime(own, ns=(time.time_ns() + 10**9,) * 2)
    assert saved.ended(relist=True) == {"t1", "t2"}  # read again as it changes, without a listing
    assert len(listings) == 3


def stored_run(tmp_path, trials=2):
    run = tmp_path / "run"
    run.mkdir()
    entries = [[json.dumps({"trial_id": f"t{i}"}), json.dumps({})] for i in range(trials)]
    (run / "experiment_state-2026-01-01_00-00-00.json").write_text(json.dumps({"trial_data": entries}))
    (run / "tuner.pkl").write_bytes(b"x")
    for i in range(trials):
        folder = run / f"trial_{i}"
        folder.mkdir()
        (folder / "params.json").write_text(json.dumps({"lr": i / 10}))
        lines = [json.dumps({"loss": 1.0 - i / 10 - step / 100, "training_iteration": step, "trial_id": f"t{i}"})
                 for step in (1, 2)]
        (folder / "result.json").write_text("\n".join(lines) + "\n")
        (folder / "checkpoint_000001").mkdir()
    return run


def test_a_run_stopped_before_tune_saved_anything_is_refused_by_resume_as_nothing_ran(tmp_path):
    (tmp_path / "tuner.pkl").write_bytes(b"x")  # all Tune writes before its first save
    with pytest.raises(RunStateError, match="nothing ran in this run.*without --resume"):
        verify_run_state(tmp_path)


def test_a_torn_experiment_state_is_refused_naming_the_file(tmp_path):
    run = stored_run(tmp_path)
    verify_run_state(run)
    state = next(run.glob("experiment_state-*.json"))
    state.write_text(state.read_text()[:40])  # a full disk cut the write short
    with pytest.raises(RunStateError, match=state.name):
        verify_run_state(run)


def test_a_state_listing_fewer_trials_than_the_folders_is_refused(tmp_path):
    run = stored_run(tmp_path, trials=3)
    state = next(run.glob("experiment_state-*.json"))
    data = json.loads(state.read_text())
    state.write_text(json.dumps({"trial_data": data["trial_data"][:1]}))
    with pytest.raises(RunStateError, match="lists 1 trials but 3 trial folders"):
        verify_run_state(run)


def test_results_are_rebuilt_from_the_trials_own_folders_even_with_a_torn_last_line(tmp_path, capsys):
    run = stored_run(tmp_path)
    with open(run / "trial_1" / "result.json", "a") as handle:
        handle.write('{"loss": 0.0, "training_it')  # torn by a crash
    records = records_from_trial_dirs(run)
    assert [r.metrics["training_iteration"] for r in records] == [2, 2]
    assert main(["results", str(run), "--rebuild", "--metric", "loss"]) == 0
    out = capsys.readouterr().out
    assert "rebuilt" in out and "Best configuration" in out and "checkpoint_000001" in out
    assert main(["results", str(tmp_path / "nowhere")]) == EXIT_BAD_INPUT


@pytest.mark.parametrize("records, status, says", [
    ([record("t1", 0.2), record("t2", 0.4)], 0, ""),
    ([record("t1", 0.2), record("t2", 0.4, error="ValueError: boom")], EXIT_TRIALS_ERRORED, "1 of 2 trials errored"),
    ([record("t1", 0.1, error="ValueError: boom"), record("t2", 0.4, error="OSError")], EXIT_TRIALS_ERRORED, "2 of 2 trials errored"),
    ([record("t1", 0.2), record("t2", 0.4, running=True)], EXIT_INTERRUPTED, "1 of 2 trials had not ended"),
    # stopped with an error among the finished: hpo run's report says interrupted first, and so does this
    ([record("t1", 0.2, error="ValueError: boom"), record("t2", 0.4, running=True)], EXIT_INTERRUPTED, "1 of 2 trials had not ended"),
    ([record("t1", math.nan)], EXIT_NO_RESULT, "no finished trial reported loss"),
])
def test_hpo_results_exits_as_hpo_run_did_for_the_stored_run(tmp_path, capsys, records, status, says):
    # a script checking a stored (or rebuilt) run must not read a failed sweep as a good one
    write_run_files(tmp_path, records, "loss", "min", 3)
    assert main(["results", str(tmp_path)]) == status
    assert says in capsys.readouterr().err


# -- labels follow one rule, and --rebuild keeps the verdicts given when trials ended (issue 34, item 8)


def test_a_trial_that_ended_without_a_single_result_is_an_error_not_early_stopped_or_completed(tmp_path):
    # Tune stops a sweep at a result without its metric, and keeps none of it: the trials end empty.
    rows = write_run_files(tmp_path, [TrialRecord("t1", {"lr": 0.1}, {}), record("t2", 0.5)], "loss", "min", 3)
    by_id = rows.set_index("trial_id")
    assert by_id.loc["t1", "status"] == "error" and by_id.loc["t1", "error"] == "ended without a single result"
    assert by_id.loc["t2", "status"] == "completed"
    assert json.loads((tmp_path / SUMMARY_FILE).read_text())["errored"] == 1


def test_rebuild_keeps_the_verdicts_tune_gave_when_trials_ended_even_without_summary_json(tmp_path, capsys):
    run = stored_run(tmp_path, trials=3)
    records = records_from_trial_dirs(run)
    records[0].metrics["training_iteration"] = 1  # ASHA stopped t0 at its first rung
    (run / "trial_0" / "result.json").write_text(json.dumps({**records[0].metrics, "trial_id": "t0"}) + "\n")
    write_run_files(run, records, "loss", "min", 2)
    before = pd.read_csv(run / RESULTS_FILE).set_index("trial_id")["status"]
    assert before["t0"] == "early_stopped"
    (run / SUMMARY_FILE).unlink()  # what is left of a damaged run: which iteration count was the end is lost
    assert main(["results", str(run), "--rebuild", "--metric", "loss"]) == 0
    after = pd.read_csv(run / RESULTS_FILE).set_index("trial_id")["status"]
    pd.testing.assert_series_equal(after.sort_index(), before.sort_index())


def test_a_fused_members_rows_take_the_verdict_its_scheduler_wrote_and_always_have_its_config(tmp_path):
    from hpo.engines.fused.members import MemberBook

    book = MemberBook(tmp_path, "train")
    stopped, unstarted = book.add_group("g1", [{"lr": 0.1}, {"lr": 0.2}])
    book.record_result(stopped, {"loss": 0.4, "training_iteration": 3})
    book.end(stopped, "early_stopped")  # stopped by its scheduler at iteration 3, though it reached 3
    frame = book.result(None, "loss", "min", 3).get_dataframe().set_index("trial_id")
    assert frame.loc[stopped.trial_id, "status"] == "early_stopped"
    assert frame.loc[unstarted.trial_id, "config/lr"] == 0.2, "a member stopped before it reported keeps its config"
    assert frame.loc[unstarted.trial_id, "status"] == "running"


def test_a_resumed_fused_sweeps_group_list_is_read_from_its_members_folders(tmp_path):
    from hpo.engines.fused.members import MemberBook

    earlier = MemberBook(tmp_path, "train")
    for group in ("g1", "g2"):
        for member in earlier.add_group(group, [{"lr": 0.1}, {"lr": 0.2}]):
            earlier.record_result(member, {"loss": 0.4, "training_iteration": 1})
            earlier.end(member, "completed")
    resumed = MemberBook(tmp_path, "train")  # after a resume, Tune's restored scheduler holds the groups
    groups = resumed.result(None, "loss", "min", 1, {"g1", "g2"}).extras["fused_groups"]
    assert str(groups) == "2 of 2 members each", "a resumed fused sweep printed fused_groups: [] for two groups"


# -- hpo results on a damaged run folder: one line and exit 2, never a traceback; --rebuild is the way back


@pytest.mark.parametrize("damage", [
    lambda run: (run / SUMMARY_FILE).write_text('{"metric": "lo'),  # torn by a crash or a copy cut short
    lambda run: (run / SUMMARY_FILE).write_text("[]\n"),  # not a summary at all
    lambda run: (run / RESULTS_FILE).write_text(""),
])
def test_hpo_results_on_a_damaged_results_file_is_one_line_naming_it_and_exit_2(tmp_path, capsys, damage):
    run = stored_run(tmp_path)
    assert main(["results", str(run), "--rebuild", "--metric", "loss"]) == 0
    damage(run)
    capsys.readouterr()
    assert main(["results", str(run)]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {run}/") and "--rebuild" in err[0], err


def test_rebuild_goes_on_past_a_damaged_summary_json_with_the_metric_named(tmp_path, capsys):
    run = stored_run(tmp_path)
    (run / SUMMARY_FILE).write_text('{"metric": "lo')
    assert main(["results", str(run), "--rebuild"]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and SUMMARY_FILE in err[0] and "--metric" in err[0], err
    assert main(["results", str(run), "--rebuild", "--metric", "loss"]) == 0
    assert json.loads((run / SUMMARY_FILE).read_text())["best"]["trial_id"] == "t1"


def test_rebuild_with_a_metric_no_trial_reported_is_refused_and_keeps_the_files(tmp_path, capsys):
    run = stored_run(tmp_path)
    assert main(["results", str(run), "--rebuild", "--metric", "loss"]) == 0
    before = {name: (run / name).read_bytes() for name in (RESULTS_FILE, SUMMARY_FILE)}
    capsys.readouterr()
    assert main(["results", str(run), "--rebuild", "--metric", "los"]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'los'" in err[0] and "loss" in err[0], err
    assert {name: (run / name).read_bytes() for name in before} == before, "a mistyped metric overwrote the run's files"


def test_sweeps_of_one_name_that_start_at_once_in_one_storage_path_each_get_a_run_folder_of_their_own(tmp_path):
    """Two terminals, each with its own local Ray, `hpo run sweep.yaml` at once: both picked `sweep`
    before either had written it, and both wrote there (one results.csv overwrote the other's)."""
    import threading

    from hpo.tuner.run_folders import claim_run_name

    starts = threading.Barrier(8)
    claimed: list[str] = []

    def claim() -> None:
        starts.wait()
        claimed.append(claim_run_name(tmp_path, "sweep"))

    threads = [threading.Thread(target=claim) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(claimed) == sorted(["sweep", *(f"sweep-{n}" for n in range(2, 9))])
    assert latest_run(tmp_path, "sweep") == tmp_path / "sweep-8"
    assert fresh_run_name(tmp_path, "sweep") == "sweep-9", "a claimed folder is taken, even before Tune writes it"
    from hpo.tuner.run_folders import release_claim

    release_claim(tmp_path / "sweep-8")  # refused before Tune wrote anything there
    assert not (tmp_path / "sweep-8").exists() and fresh_run_name(tmp_path, "sweep") == "sweep-8"
