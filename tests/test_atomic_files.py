"""The one rule for replacing a file or a folder (`hpo.base.atomic_files`): a reader finds the old
content or the new, a failed write leaves the old file and no temporary, and the rename itself is
made durable by fsyncing the folder after it."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest

from hpo.base import atomic_files
from hpo.base.atomic_files import _umask, replace_folder_durably, write_all_atomically, write_atomically


def tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_the_new_content_replaces_the_file_and_nothing_else_is_left_beside_it(tmp_path):
    target = tmp_path / "deep" / "state.json"
    write_atomically(target, "old")
    write_atomically(target, b"new")
    write_atomically(target, lambda temporary: Path(temporary).write_text("newest"))
    assert os.listdir(target.parent) == ["state.json"]
    assert target.read_text() == "newest"
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~_umask()  # as a plain open(path, "w") makes it
    write_atomically(target, "a job's settings", private=True)
    assert stat.S_IMODE(target.stat().st_mode) == 0o600


def test_a_writer_that_fails_halfway_leaves_the_old_file_no_temporary_and_an_error_naming_the_target(tmp_path):
    target = tmp_path / "results.csv"
    target.write_text("the last complete file")

    def fails_halfway(temporary: str) -> None:
        Path(temporary).write_text("half of a")
        raise OSError(errno.ENOSPC, "No space left on device", temporary)

    with pytest.raises(OSError) as raised:
        write_atomically(target, fails_halfway)
    assert (raised.value.errno, raised.value.filename) == (errno.ENOSPC, str(target))
    assert tree(tmp_path) == {"results.csv": b"the last complete file"}


def test_files_written_together_change_together_or_not_at_all(tmp_path):
    first, second = tmp_path / "results.csv", tmp_path / "summary.json"
    write_all_atomically({first: "rows 1", second: "summary 1"})

    def full_disk(temporary: str) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError, match="summary.json"):
        write_all_atomically({first: "rows 2", second: full_disk})
    assert tree(tmp_path) == {"results.csv": b"rows 1", "summary.json": b"summary 1"}


def test_the_folder_is_fsynced_after_the_rename_so_the_rename_survives_a_crash(tmp_path, monkeypatch):
    target = tmp_path / "checkpoint.json"
    synced = []  # (a folder?, the target's content when fsynced)
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        synced.append((stat.S_ISDIR(os.fstat(fd).st_mode), target.read_bytes() if target.exists() else None))
        real_fsync(fd)

    monkeypatch.setattr(atomic_files.os, "fsync", recording_fsync)
    write_atomically(target, b"state")
    assert synced == [(False, None), (True, b"state")]


def test_a_replaced_folder_is_the_new_one_whole_with_nothing_of_the_old(tmp_path):
    target, staging = tmp_path / "checkpoint_000002", tmp_path / ".checkpoint_000002.tmp"
    (target / "old").mkdir(parents=True)
    (target / "old" / "weights.pt").write_bytes(b"old weights")
    (staging / "optim").mkdir(parents=True)
    (staging / "weights.pt").write_bytes(b"new weights")
    (staging / "optim" / "state.pt").write_bytes(b"new state")
    replace_folder_durably(staging, target)
    assert not staging.exists()
    assert tree(target) == {"weights.pt": b"new weights", "optim/state.pt": b"new state"}


def test_a_folder_that_cannot_be_made_durable_is_not_renamed_in(tmp_path, monkeypatch):
    target, staging = tmp_path / "checkpoint", tmp_path / ".checkpoint.tmp"
    target.mkdir()
    (target / "weights.pt").write_bytes(b"old weights")
    staging.mkdir()
    (staging / "weights.pt").write_bytes(b"new weights")

    def failing_fsync(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(atomic_files.os, "fsync", failing_fsync)
    with pytest.raises(OSError):
        replace_folder_durably(staging, target)
    assert tree(target) == {"weights.pt": b"old weights"}
