"""`hpo job` against a running allocator on the suite's one-node Ray, as a user types it: what the
allocator refuses, and an allocator that cannot start, are one line and exit status 2 (not Ray's
traceback of the actor), and relative paths mean the folder the command runs in."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from patience import patience
from scheduler_bridge.live import client

REPO = Path(__file__).resolve().parents[1]


def hpo_job(*argv: str, cwd: Path | None = None) -> tuple[int, str, str]:
    """`hpo job ARGV...` as a user runs it, a process of its own joining the suite's Ray by its
    address (with the cluster's token, as every client): (exit status, stdout, stderr)."""
    import ray

    env = {**os.environ, "RAY_ADDRESS": ray.get_runtime_context().gcs_address,
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "scheduler_bridge.live.cli", "job", *argv], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=patience(120))
    # Ray's own INFO lines on joining a cluster are not the command's output
    err = "".join(line for line in done.stderr.splitlines(keepends=True) if "\tINFO " not in line)
    return done.returncode, done.stdout, err


@pytest.fixture
def no_allocator_left(ray_local):
    yield
    with contextlib.suppress(ValueError):
        client.stop_allocator()


def test_what_the_allocator_refuses_is_its_one_line(ray_local, no_allocator_left, tmp_path):
    rc, _, _ = hpo_job("start", "--journal", str(tmp_path / "j.jsonl"), "--storage", str(tmp_path / "ckpt"))
    assert rc == 0
    rc, _, err = hpo_job("cancel", "999")
    assert rc == 2 and err == "error: no job 999; known: 0..-1\n", err
    with pytest.raises(ValueError) as refused:          # the Python API: the allocator's ValueError itself
        client.get_job(5)
    assert str(refused.value) == "no job 5; known: 0..-1"


@pytest.mark.parametrize("journal", ["folder", "under_a_file"])
def test_an_allocator_that_cannot_open_its_journal_is_one_line_naming_it(ray_local, no_allocator_left,
                                                                         tmp_path, journal):
    (tmp_path / "a_file").write_text("")
    path = {"folder": tmp_path, "under_a_file": tmp_path / "a_file" / "j.jsonl"}[journal]
    rc, _, err = hpo_job("start", "--journal", str(path), "--storage", str(tmp_path / "ckpt"))
    assert rc == 2 and err.startswith("error: the allocator could not start: ") and err.count("\n") == 1, err
    assert str(path if journal == "folder" else path.parent) in err, err
    with pytest.raises(ValueError, match="no allocator running"):
        client.get_allocator()


def test_relative_journal_storage_and_pythonpath_are_the_folder_the_command_runs_in(
        ray_local, no_allocator_left, tmp_path):
    # they once went to the folder Ray was started in: the journal and checkpoints appeared there,
    # and an entry point beside the user was not found
    here = tmp_path / "here"
    (here / "code").mkdir(parents=True)
    (here / "code" / "relative_entry.py").write_text(
        "def main(ctx):\n    ctx.save_checkpoint({'step': 1}, progress=1.0)\n    return 7\n")
    rc, out, err = hpo_job("start", "--journal", "j.jsonl", "--storage", "ckpt", "--pythonpath", f"code:{REPO}",
                           cwd=here)
    assert rc == 0, err
    assert client.status()["journal"] == str(here / "j.jsonl") and (here / "j.jsonl").is_file()
    rc, out, err = hpo_job("submit", "relative_entry:main", cwd=here)
    assert rc == 0, err
    job = client.wait_job(int(out), timeout_s=120)
    assert (job["state"], job["result"]) == ("done", 7), job["error"]
    assert (here / "ckpt" / "jobs").is_dir()


def test_starting_an_allocator_beside_a_running_one_with_other_settings_is_refused(
        ray_local, no_allocator_left, tmp_path):
    # it once printed the running allocator's status, exit 0, as if the new policy had been taken
    journal, storage = str(tmp_path / "j.jsonl"), str(tmp_path / "ckpt")
    assert hpo_job("start", "--journal", journal, "--storage", storage, "--policy", "fifo")[0] == 0
    assert hpo_job("start", "--journal", journal, "--storage", storage, "--policy", "fifo")[0] == 0
    for other in (["--policy", "sjf", "--journal", journal], ["--journal", str(tmp_path / "k.jsonl")]):
        rc, _, err = hpo_job("start", "--storage", storage, *other)
        assert rc == 2 and "an allocator is already running with --policy fifo and --journal " + journal in err, err
        assert err.count("\n") == 1
    assert client.status()["policy"] == "fifo"
