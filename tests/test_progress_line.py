"""The progress a sweep prints: a live status line on a terminal, one line per finished trial always."""

from __future__ import annotations

import io
import os
import pickle
import re
import threading
import time

import pytest
from ray import tune

import hpo
from hpo.engines.fused.members import MemberTrial
from hpo.reporting.progress import ProgressCallback, status_line

TRIALS = 4
TRIAL_LINE = re.compile(r"^\[\s*\d+/4\] trial \w+ finished after 3 it: loss=[\d.]+ \(best [\d.]+\)$")


def slow_trial(config):
    """Three iterations of 0.3 s, so the live line is redrawn while trials run; the last two
    trials (which start when the first two end, on the shared Ray's two CPUs) take 0.8 s each,
    so that Tune saves its run state, about once a second, while they run: the first two trials'
    lines wait for that save, and the live line after them shows trials done and still running."""
    for iteration in range(1, 4):
        time.sleep(0.3 if config["x"] <= 2 else 0.8)
        tune.report({"loss": config["x"] / iteration})


def test_the_eta_extrapolates_the_rate_at_which_trials_finished():
    line = status_line(running=2, done=2, total=8, metric="loss", best=0.25, elapsed_s=60, finished_here=2)
    assert line == "sweep: 2 running, 2/8 done, best loss=0.25, elapsed 1m00s, ETA 3m00s"


def test_no_eta_is_guessed_before_a_trial_finished_or_without_a_total():
    assert "ETA" not in status_line(2, 0, 8, "loss", None, 30, 0)
    assert status_line(1, 3, None, "loss", 1.5, 5, 3) == "sweep: 1 running, 3 done, best loss=1.5, elapsed 5s"


@pytest.fixture(scope="module")
def printed(ray_local, tmp_path_factory):
    """One sweep printing to a log file and to a terminal (a pseudo-terminal read as it is written)."""
    folder = tmp_path_factory.mktemp("progress")
    master, slave = os.openpty()
    chunks: list[bytes] = []

    def drain() -> None:  # a terminal's buffer is small; read while the sweep writes
        while True:
            try:
                data = os.read(master, 4096)
            except OSError:
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=drain)
    reader.start()
    with (folder / "progress.log").open("w") as log, os.fdopen(slave, "w") as terminal:
        result = hpo.run(
            slow_trial,
            config={"x": tune.grid_search([float(x) for x in range(1, TRIALS + 1)])},
            metric="loss",
            mode="min",
            storage_path=str(folder),
            name="progress",
            callbacks=[ProgressCallback("loss", "min", TRIALS, stream=log), ProgressCallback("loss", "min", TRIALS, stream=terminal)],
        )
    reader.join(timeout=10)
    os.close(master)
    screen = b"".join(chunks).decode().replace("\r\n", "\n")  # the terminal turns \n into \r\n
    yield (folder / "progress.log").read_text(), screen, result
    # The last test still holds this value while the module's shared Ray is checked for leftovers.
    for actor in result.actors:
        ray_local.kill(actor)


@pytest.mark.slow
def test_off_a_terminal_only_the_per_trial_lines_are_printed(printed):
    log, _, _ = printed
    lines = log.splitlines()
    assert len(lines) == TRIALS
    assert all(TRIAL_LINE.match(line) for line in lines), lines
    assert "\r" not in log and "\x1b" not in log


@pytest.mark.slow
def test_on_a_terminal_a_live_line_shows_running_done_best_and_eta(printed):
    _, screen, result = printed
    redraws = [part for part in screen.replace("\n", "\r\x1b[K").split("\r\x1b[K") if part.startswith("sweep:")]
    assert any(re.search(r"\d running, [1-3]/4 done, best loss=[\d.]+, elapsed (\d+m)?\d+s, ETA (\d+m)?\d+s", s) for s in redraws), redraws
    trial_lines = [line.rsplit("\r\x1b[K", 1)[-1] for line in screen.split("\n") if "] trial " in line]
    assert len(trial_lines) == TRIALS and all(TRIAL_LINE.match(line) for line in trial_lines), trial_lines
    assert screen.endswith("\r\x1b[K"), "the live line is cleared when the sweep ends"
    assert f"best loss={result.best_result.metrics['loss']:.4g}" in redraws[-1]


# -- the same measure as the final table, counted across a resume (issue 34, items 7 and 8) --------


def member(folder, trial_id: str, loss: float | None = None, ended: str | None = None) -> MemberTrial:
    """A configuration as a fused sweep's callbacks see it; `ended` once its end is on disk."""
    trial = MemberTrial(trial_id, {"x": 1}, "g", folder / trial_id, "train")
    trial.last_result = {} if loss is None else {"loss": loss, "training_iteration": 2}
    if ended is not None:
        trial.ended, trial.status = ended, MemberTrial.ERROR if ended == "error" else MemberTrial.TERMINATED
    return trial


def finish(callback, trials, trial, loss: float, status: str = "completed") -> None:
    trial.last_result = {"loss": loss, "training_iteration": 2}
    trial.ended, trial.status = status, MemberTrial.TERMINATED
    callback.on_trial_complete(0, trials, trial)
    callback.on_step_end(0, trials)


def test_the_best_so_far_is_the_best_finished_trials_last_value_never_a_running_trials(tmp_path):
    log = io.StringIO()
    callback = ProgressCallback("loss", "min", 3, stream=log)
    first, running, third = (member(tmp_path, f"t{i}") for i in range(3))
    trials = [first, running, third]
    running.last_result = {"loss": 0.9934, "training_iteration": 1}  # mid-run: may go up again
    finish(callback, trials, first, 1.133)
    running.last_result = {"loss": 0.5599, "training_iteration": 2}
    finish(callback, trials, third, 0.5721)
    finish(callback, trials, running, 0.6)
    assert log.getvalue().splitlines() == [
        "[  1/3] trial t0 finished after 2 it: loss=1.133 (best 1.133)",
        "[  2/3] trial t2 finished after 2 it: loss=0.5721 (best 0.5721)",
        "[  3/3] trial t1 finished after 2 it: loss=0.6 (best 0.5721)",
    ]


def test_errored_and_diverged_trials_are_never_the_best_so_far(tmp_path):
    log = io.StringIO()
    callback = ProgressCallback("loss", "min", 3, stream=log)
    good, failed, diverged = (member(tmp_path, f"t{i}") for i in range(3))
    trials = [good, failed, diverged]
    finish(callback, trials, good, 0.8)
    failed.last_result, failed.ended, failed.status = {"loss": 0.1, "training_iteration": 1}, "error", MemberTrial.ERROR
    callback.on_trial_error(0, trials, failed)
    diverged.last_result = {"loss": 0.05, "diverged": True, "training_iteration": 1}
    diverged.ended, diverged.status = "diverged", MemberTrial.TERMINATED
    callback.on_trial_complete(0, trials, diverged)
    assert all(line.endswith("(best 0.8)") for line in log.getvalue().splitlines()), log.getvalue()


def test_a_resumed_sweep_counts_on_from_the_trials_its_earlier_run_ended(tmp_path):
    earlier = [member(tmp_path, f"e{i}", loss=1.0 - i / 10, ended="completed") for i in range(9)]
    fresh = member(tmp_path, "n0")
    trials = [*earlier, fresh]
    log = io.StringIO()
    callback = pickle.loads(pickle.dumps(ProgressCallback("loss", "min", 12, stream=log)))  # as Tune restores it
    callback._stream = log
    callback.on_step_end(0, trials)
    finish(callback, trials, fresh, 0.95)
    assert log.getvalue().splitlines() == ["[ 10/12] trial n0 finished after 2 it: loss=0.95 (best 0.2)"]


def test_verbose_levels_follow_tune(tmp_path):
    printed = {}
    for verbose in (0, 1, 2, 3):
        log = io.StringIO()
        callback = ProgressCallback("loss", "min", 1, stream=log, verbose=verbose)
        trial = member(tmp_path, "t0")
        callback.on_trial_result(0, [trial], trial, {"loss": 0.5, "training_iteration": 1})
        finish(callback, [trial], trial, 0.4)
        printed[verbose] = log.getvalue().splitlines()
    assert printed[0] == printed[1] == []
    assert printed[2] == ["[  1/1] trial t0 finished after 2 it: loss=0.4 (best 0.4)"]
    assert printed[3] == ["      trial t0 it 1: loss=0.5", *printed[2]]


def one_report(config):
    tune.report({"loss": float(config["x"])})


@pytest.mark.slow
def test_hpo_run_prints_what_hpo_run_prints_in_at_most_25_lines_for_a_10_trial_grid(ray_local, tmp_path, capsys):
    """Issue 34, item 3: 359 lines of Tune's tables and warnings were printed for 10 trials."""
    result = hpo.run(one_report, config={"x": tune.grid_search(list(range(10)))}, metric="loss", mode="min",
                     storage_path=str(tmp_path), name="grid10")
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert len(lines) <= 25, out
    printed_ids = re.findall(r"^\[\s*\d+/10\] trial (\w+) finished after 1 it: loss=", out, re.M)
    assert sorted(printed_ids) == sorted(result.get_dataframe()["trial_id"]), "one trial id, in the lines and the rows"
    assert 'Best configuration (loss = 0): {"x": 0}' in lines and f"results: {tmp_path / 'grid10' / 'results.csv'}" in lines
    for noise in ("Trial status", "╭", "snapshotting", "driver_artifacts", "to opt out"):
        assert noise not in out + err, noise
    for actor in result.actors:  # the module's shared Ray is checked for leftovers
        ray_local.kill(actor)
