"""Tune's storage: a file is replaced whole when its writer finishes, and never by what a writer
that stopped part-way had written (a second Ctrl-C while Tune saves its state, an error in the
writer); a file written again with the content it has is not written at all, so a save of Tune's
state costs what changed since the last one."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

import pyarrow
import pyarrow.fs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpo.tuner.atomic_storage import IN_MEMORY_BYTES, atomic_local_filesystem, one_copying_thread


@pytest.fixture
def saved(tmp_path):
    target = tmp_path / "experiment_state.json"
    with atomic_local_filesystem().open_output_stream(str(target)) as stream:
        stream.write(b'{"trials": 2}')
    return target


def test_a_finished_write_replaces_the_file_and_leaves_no_temporary(saved):
    with atomic_local_filesystem().open_output_stream(str(saved)) as stream:
        stream.write(b'{"trials": ')
        stream.write(b"3}")
    assert saved.read_bytes() == b'{"trials": 3}'
    assert [p.name for p in saved.parent.iterdir()] == [saved.name]


@pytest.mark.parametrize("stop", [KeyboardInterrupt, RuntimeError])
def test_a_writer_stopped_part_way_leaves_the_last_complete_file(saved, stop):
    with pytest.raises(stop):
        with atomic_local_filesystem().open_output_stream(str(saved)) as stream:
            stream.write(b'{"trials": ')
            raise stop()
    assert saved.read_bytes() == b'{"trials": 2}'
    assert [p.name for p in saved.parent.iterdir()] == [saved.name]


def test_a_file_written_while_an_error_is_handled_is_written(saved):
    try:
        raise ValueError("the trial failed")
    except ValueError:  # as a writer of error files does
        with atomic_local_filesystem().open_output_stream(str(saved)) as stream:
            stream.write(b'{"trials": 3}')
    assert saved.read_bytes() == b'{"trials": 3}'


def test_a_file_written_again_unchanged_is_left_as_it_was(saved):
    before = saved.stat()
    with atomic_local_filesystem().open_output_stream(str(saved)) as stream:
        stream.write(b'{"trials": 2}')
    after = saved.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns), "nothing was written"


def test_a_file_larger_than_is_held_in_memory_is_replaced_whole_or_not_at_all(saved):
    big = b"x" * (IN_MEMORY_BYTES + 1)
    with atomic_local_filesystem().open_output_stream(str(saved)) as stream:
        stream.write(big[:10])
        stream.write(big[10:])
    assert saved.read_bytes() == big
    with pytest.raises(KeyboardInterrupt):
        with atomic_local_filesystem().open_output_stream(str(saved)) as stream:
            stream.write(b"y" * (IN_MEMORY_BYTES + 1))
            raise KeyboardInterrupt()
    assert saved.read_bytes() == big
    assert [p.name for p in saved.parent.iterdir()] == [saved.name]


contents = st.binary(max_size=64)


@settings(max_examples=30, deadline=None)
@given(files=st.dictionaries(st.sampled_from(["state.json", "t1/result.json", "t1/params.json", "t2/result.json",
                                              "t2/progress.csv", "t3/a/b.bin"]), contents, min_size=1),
       changes=st.dictionaries(st.sampled_from(["state.json", "t1/result.json", "t2/result.json", "t3/a/b.bin"]),
                               contents))
def test_copying_a_folder_again_as_tune_saves_writes_only_the_files_that_changed(files, changes):
    """Tune copies its whole staging folder to the storage at each save (`pyarrow.fs.copy_files`)."""
    with tempfile.TemporaryDirectory() as root:
        staging, storage = Path(root, "staging"), Path(root, "storage")
        for name, content in files.items():
            (staging / name).parent.mkdir(parents=True, exist_ok=True)
            (staging / name).write_bytes(content)
        filesystem = atomic_local_filesystem()
        filesystem.create_dir(str(storage))  # as Tune's upload does before it copies
        pyarrow.fs.copy_files(str(staging), str(storage), destination_filesystem=filesystem)
        inodes = {name: (storage / name).stat().st_ino for name in files}
        for name, content in changes.items():
            (staging / name).parent.mkdir(parents=True, exist_ok=True)
            (staging / name).write_bytes(content)
        pyarrow.fs.copy_files(str(staging), str(storage), destination_filesystem=filesystem)
        now = {**files, **changes}
        assert {name: (storage / name).read_bytes() for name in now} == now
        rewritten = {name for name in files if (storage / name).stat().st_ino != inodes[name]}
        assert rewritten == {name for name in files if files[name] != now[name]}
        assert not list(storage.rglob("*.partial"))


def test_a_sweep_on_the_atomic_filesystem_copies_from_one_io_thread_and_gives_the_pool_back():
    """Tune's save runs a task per file on pyarrow's IO pool; on this filesystem each task calls
    into Python, so more threads only queue at the GIL. The pool is the process's: it is put back."""
    before = pyarrow.io_thread_count()
    with one_copying_thread(atomic_local_filesystem()):
        assert pyarrow.io_thread_count() == 1
    assert pyarrow.io_thread_count() == before
    with pytest.raises(KeyboardInterrupt), one_copying_thread(atomic_local_filesystem()):
        raise KeyboardInterrupt
    assert pyarrow.io_thread_count() == before


def test_sweeps_side_by_side_leave_the_pool_as_they_found_it_whichever_ends_first():
    before = pyarrow.io_thread_count()
    first, second = one_copying_thread(atomic_local_filesystem()), one_copying_thread(atomic_local_filesystem())
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)
    assert pyarrow.io_thread_count() == 1, "the second sweep still copies"
    second.__exit__(None, None, None)
    assert pyarrow.io_thread_count() == before


def test_storage_on_arrows_own_filesystems_keeps_every_io_thread():
    """Arrow's filesystems (S3, GCS, its local one) copy without the GIL, each thread at once."""
    before = pyarrow.io_thread_count()
    assert before > 1
    with one_copying_thread(pyarrow.fs.LocalFileSystem()), one_copying_thread(None):
        assert pyarrow.io_thread_count() == before


@pytest.mark.parametrize("umask", [0o022, 0o002, 0o077])
def test_a_replaced_file_gets_the_mode_a_plain_write_gives_not_the_temporarys(tmp_path, umask):
    # the temporaries are private (0600), and renaming one over a run's files left every result
    # and checkpoint unreadable to a teammate or a TensorBoard on a shared disk, unlike Tune's own
    from hpo.base import atomic_files

    plain, via_storage, via_rule = tmp_path / "plain.json", tmp_path / "result.json", tmp_path / "summary.json"
    old = os.umask(umask)
    atomic_files._umask.cache_clear()
    try:
        plain.write_text("{}")
        with atomic_local_filesystem().open_output_stream(str(via_storage)) as stream:
            stream.write(b"{}")
        atomic_files.write_atomically(via_rule, "{}")
    finally:
        os.umask(old)
        atomic_files._umask.cache_clear()
    expected = stat.S_IMODE(plain.stat().st_mode)
    assert expected == 0o666 & ~umask
    assert stat.S_IMODE(via_storage.stat().st_mode) == expected and stat.S_IMODE(via_rule.stat().st_mode) == expected
