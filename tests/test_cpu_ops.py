"""DeepSpeed's CPU op is built per Python environment, and a killed build's lock never hangs a process."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from torch.utils.file_baton import FileBaton

from patience import patience

from pipeline_bubble.cpu_ops import (
    EXTENSIONS_DIR_VAR,
    STALE_LOCK_S,
    clear_stale_locks,
    environment_extensions_dir,
    use_environment_extensions_dir,
)

REPO = Path(__file__).resolve().parents[1]


def _lock(root: Path, op: str, age_s: float) -> Path:
    lock = root / op / "lock"
    lock.parent.mkdir(parents=True)
    lock.touch()
    then = time.time() - age_s
    os.utime(lock, (then, then))
    return lock


def test_a_lock_older_than_any_build_is_removed_so_torch_can_build_again(tmp_path):
    killed = _lock(tmp_path, "deepspeed_shm_comm", age_s=STALE_LOCK_S + 60)

    with pytest.warns(UserWarning, match="deepspeed_shm_comm/lock"):
        assert clear_stale_locks(tmp_path, STALE_LOCK_S) == [killed]

    baton = FileBaton(str(killed))
    assert baton.try_acquire(), "torch's extension loader would still wait on the killed build's lock"
    baton.release()


def test_a_build_in_progress_keeps_its_lock(tmp_path):
    building = _lock(tmp_path, "deepspeed_shm_comm", age_s=60)

    assert clear_stale_locks(tmp_path, STALE_LOCK_S) == []
    assert building.exists()


@pytest.mark.slow
def test_a_pipeline_of_this_package_builds_extensions_in_this_environment_not_the_users_cache():
    """Every pipeline of this package imports the DeepSpeed adapter before DeepSpeed initialises."""
    env = {k: v for k, v in os.environ.items() if k != EXTENSIONS_DIR_VAR}
    code = f"import os, pipeline_bubble.deepspeed_adapter; print(os.environ[{EXTENSIONS_DIR_VAR!r}])"
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True, text=True,
                          timeout=patience(120))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == str(environment_extensions_dir())
    assert Path(environment_extensions_dir()).is_relative_to(sys.prefix)


def test_a_folder_the_user_chose_for_extensions_wins(tmp_path, monkeypatch):
    monkeypatch.setenv(EXTENSIONS_DIR_VAR, str(tmp_path))

    assert use_environment_extensions_dir() == tmp_path


@pytest.mark.slow
def test_setup_builds_the_op_past_a_lock_a_killed_setup_left():
    """`make setup`'s build step, with a lock as fresh as a setup killed a moment ago: it must not wait."""
    root = Path(os.environ.get(EXTENSIONS_DIR_VAR) or environment_extensions_dir())
    lock = root / "deepspeed_shm_comm" / "lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    lock.touch()
    code = "from pipeline_bubble.cpu_ops import build_pipeline_op; build_pipeline_op()"
    try:
        done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=patience(600))
    except subprocess.TimeoutExpired:
        lock.unlink(missing_ok=True)
        pytest.fail(f"the build waited on {lock}")
    assert done.returncode == 0, done.stderr[-2000:]
    assert not lock.exists()
