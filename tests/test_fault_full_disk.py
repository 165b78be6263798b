"""Fault tier: a full disk, on a real small filesystem (a tmpfs in a private mount namespace).

Writing results onto a full disk fails with one line naming the file and exit status 2; the
files already there (results.csv, summary.json, Tune's run state) stay the last complete ones,
and no half-written file is left to be read as a result.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest

from patience import patience

from hpo.cli import EXIT_STORAGE_FULL
from hpo.tuner.run_folders import verify_run_state

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
#: Names a half-written file would have beside its target: ours (results), the atomic storage's.
TEMPORARY = (".results.csv.", ".summary.json.", ".partial")


def namespace_prefix() -> list[str]:
    """A command prefix under which a tmpfs can be mounted privately: `unshare --mount` as root,
    else an unprivileged user namespace. Skips the test, saying why, where neither works."""
    if shutil.which("unshare") is None:
        pytest.skip("no `unshare` here: cannot mount a small tmpfs to fill")
    candidates = [["unshare", "--mount"]] if os.geteuid() == 0 else []
    candidates.append(["unshare", "--user", "--map-root-user", "--mount"])
    tried = []
    for prefix in candidates:
        probe = subprocess.run([*prefix, "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"],
                               capture_output=True, text=True)
        if probe.returncode == 0:
            return prefix
        tried.append(f"{' '.join(prefix)}: {probe.stderr.strip()}")
    pytest.skip("cannot mount a tmpfs here (not root, and no unprivileged user namespaces): " + "; ".join(tried))


def on_small_disk(tmp_path: Path, size: str, script: str) -> tuple[subprocess.CompletedProcess, Path]:
    """Run the shell `script` with a `size` tmpfs mounted at $DISK; returns the process and a copy
    of what the disk held at the end (the mount ends with the namespace)."""
    disk, copy = tmp_path / "disk", tmp_path / "copy"
    disk.mkdir()
    copy.mkdir()
    wrapped = (f"mount -t tmpfs -o size={size} tmpfs {shlex.quote(str(disk))} || exit 99\n"
               f"( {script} ); status=$?\ncp -a {shlex.quote(str(disk))}/. {shlex.quote(str(copy))}/\nexit $status")
    env = {**os.environ, "DISK": str(disk), "PY": sys.executable, "PYTHONPATH": str(REPO)}
    done = subprocess.run([*namespace_prefix(), "sh", "-c", wrapped], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=patience(300))
    assert done.returncode != 99, done.stderr
    return done, copy


FILL = """
def fill(folder):
    '''Write a ballast file into `folder` until the disk is full.'''
    import os
    with open(os.path.join(folder, "ballast"), "ab") as ballast:
        try:
            while True:
                ballast.write(b"\\0" * 65536)
                ballast.flush()
        except OSError:
            pass


def keep_full(folder):
    '''Fill the disk and keep it full while this process lives, as a disk that filled up stays:
    space that Tune frees later (a state file it replaces) is taken again at once, so whichever
    results file is written next finds no room, not a page that happened to come free.'''
    import threading, time

    def refill():
        while True:
            time.sleep(0.01)
            fill(folder)

    fill(folder)
    threading.Thread(target=refill, daemon=True).start()
"""

STORAGE_LAYER = FILL + """
import json, os, sys
from pathlib import Path
from hpo.reporting.results_files import TrialRecord, write_run_files
from hpo.tuner.atomic_storage import atomic_local_filesystem

disk = Path(os.environ["DISK"])
records = [TrialRecord(f"t{i}", {"x": i}, {"score": float(i), "training_iteration": 2}) for i in range(40)]
write_run_files(disk / "run", records[:2], "score", "min", 2)
storage = atomic_local_filesystem()
with storage.open_output_stream(str(disk / "run" / "tuner.pkl")) as out:
    out.write(b"the good state")
before = {p.name: p.read_bytes().hex() for p in (disk / "run").iterdir()}
fill(disk)
outcome = {}
try:
    write_run_files(disk / "run", records, "score", "min", 2)
except OSError as exc:
    outcome["results"] = [exc.errno, exc.filename]
try:
    with storage.open_output_stream(str(disk / "run" / "tuner.pkl")) as out:
        out.write(b"a newer state that does not fit" * 100000)
except OSError as exc:
    outcome["state"] = [exc.errno]
after = {p.name: p.read_bytes().hex() for p in (disk / "run").iterdir()}
print(json.dumps({"outcome": outcome, "unchanged": before == after, "files": sorted(after)}))
"""


def test_results_and_run_state_written_onto_a_full_disk_fail_and_leave_the_last_complete_files(tmp_path):
    (tmp_path / "storage_layer.py").write_text(STORAGE_LAYER)
    done, _ = on_small_disk(tmp_path, "256k", '"$PY" storage_layer.py')
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen["outcome"] == {"results": [28, str(tmp_path / "disk" / "run" / "results.csv")], "state": [28]}, seen
    assert seen["unchanged"], "a failed write changed a file that was there"
    assert seen["files"] == ["results.csv", "summary.json", "tuner.pkl"], "a half-written file was left behind"


def test_hpo_results_rebuild_onto_a_full_disk_is_one_line_with_exit_status_2(tmp_path):
    """The CLI's error path without Ray: rebuilding results from trial folders onto a full disk."""
    (tmp_path / "fill.py").write_text(FILL + "\nimport os, sys\nfill(sys.argv[1])\n")
    script = textwrap.dedent("""
        mkdir -p "$DISK/run/trial_0" && echo '{"x": 1}' > "$DISK/run/trial_0/params.json"
        echo '{"score": 0.5, "training_iteration": 1, "trial_id": "t0"}' > "$DISK/run/trial_0/result.json"
        "$PY" fill.py "$DISK" && "$PY" -m hpo.cli results "$DISK/run" --rebuild --metric score
    """)
    done, copy = on_small_disk(tmp_path, "128k", script)
    assert done.returncode == EXIT_STORAGE_FULL == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {tmp_path / 'disk' / 'run' / 'results.csv'}: No space left"), \
        done.stderr
    assert sorted(p.name for p in (copy / "run").iterdir()) == ["trial_0"], "nothing half-written was left"


SWEEP_TRAINABLE = FILL + '''
import csv, glob, json, os, time
from ray import tune


def trials_in_saved_state(run):
    """How many trials the newest saved Tune state of `run` lists (0 before Tune saved one)."""
    states = sorted(glob.glob(os.path.join(run, "experiment_state-*.json")))
    try:
        return len(json.loads(open(states[-1]).read())["trial_data"]) if states else 0
    except (OSError, ValueError):  # replaced while read: read the next one
        return 0


def completed_in_results(run):
    """How many rows of `run`'s results.csv say completed (0 before the driver wrote it)."""
    try:
        with open(os.path.join(run, "results.csv")) as rows:
            return sum(row["status"] == "completed" for row in csv.DictReader(rows))
    except (OSError, KeyError):
        return 0


def train(config):
    """Reports its score; the configuration `fill` (the last, x = 0..fill run one after another)
    fills the run's disk before its last report, once Tune's saved state lists every trial and
    results.csv holds the others as completed (the driver writes it after the save that records
    their end: filling the disk at the save alone raced that write, and on a slow box won it)."""
    run = os.path.join(config["disk"], "runs", "full")
    for step in range(1, 3):
        time.sleep(0.1)
        if config["x"] == config["fill"] and step == 2:
            deadline = time.monotonic() + 120
            while trials_in_saved_state(run) < config["fill"] + 1 or completed_in_results(run) < config["fill"]:
                if time.monotonic() > deadline:
                    raise RuntimeError("no saved state listing every trial, or no results.csv with the others completed, within 120 s")
                time.sleep(0.05)
            keep_full(config["disk"])
        tune.report({"score": float(config["x"]) + 1.0 / step})
'''

SWEEP = """
name: full
trainable: fill_trainable:train
method: grid
metric: {{name: score, goal: minimize}}
parameters:
  x: {{values: [0, 1, 2, 3]}}
  fill: {{value: 3}}
  disk: {{value: {disk}}}
max_iterations: 2
max_failures: 0
max_concurrent_trials: 1
storage_path: {disk}/runs
"""


def test_a_sweep_whose_disk_fills_up_exits_2_in_one_line_and_keeps_every_finished_row(tmp_path):
    (tmp_path / "fill_trainable.py").write_text(SWEEP_TRAINABLE)
    (tmp_path / "sweep.yaml").write_text(textwrap.dedent(SWEEP.format(disk=tmp_path / "disk")))
    done, copy = on_small_disk(tmp_path, "8m", '"$PY" -m hpo.cli run sweep.yaml')
    run = copy / "runs" / "full"

    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: {tmp_path / 'disk' / 'runs' / 'full' / 'results.csv'}: No space left on device"), last
    rows = pd.read_csv(run / "results.csv")
    finished = rows[rows["status"] == "completed"]
    assert list(finished["config/x"]) == [0, 1, 2], rows[["config/x", "status"]]
    assert len(rows) == len(set(rows["config/x"])) and 3 not in set(finished["config/x"]), \
        "the trial whose results could not be written is not reported finished"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["trials"] == len(rows) and summary["best"]["config"]["x"] == 0, "results and summary agree"
    assert not [p for p in run.rglob("*") if any(mark in p.name for mark in TEMPORARY)], "half-written files left"
    verify_run_state(run)  # Tune's state on the full disk is still whole: the run can be resumed
