"""A local filesystem for Tune's storage on which no file is ever seen half-written, and a file
that did not change is not written again.

Tune keeps a run's state (`experiment_state-*.json`, `tuner.pkl`, the searcher's state) and its
trials' logs (`params.json`, `result.json`, `progress.csv`) in a staging folder and copies the
whole folder to the run's storage at each save of its state, writing every file in place. A
driver killed during that copy (or a disk that fills up) leaves a truncated `tuner.pkl` or state
file, and `--resume` must then refuse the run. On this filesystem a file Tune writes is replaced
atomically when its writer closes it: the new bytes go to a temporary file in the same folder
that is renamed over the target under the project's one rule (`hpo.base.atomic_files`: the file
and then its folder fsynced), so the storage holds the old file or the new one, never a torn
one. A write that fails (ENOSPC) removes its temporary file and raises, and so does a stream closed while an exception raised after it was opened propagates (a second Ctrl-C while
Tune saves its state, an error in the writer between two writes): pyarrow closes the stream on its
way out, and the bytes written until then are not the file.

What a save costs is what changed since the last one, not the size of the sweep. A file of up to
`IN_MEMORY_BYTES` is held in memory until it is closed and compared with the file it would
replace: most of what Tune copies at each save (every finished trial's logs, `tuner.pkl`) is
byte for byte what the storage holds, and is neither written, fsynced nor renamed again. So a
finished trial's files and a checkpoint are made durable once, when they are written, and a save
fsyncs the files that changed: the run state, the searcher's state and the logs of the trials that
reported since the last save. Before, every file of every trial was rewritten and fsynced at
each save, about once a second: the work grew with the sweep, and a 1000-trial sweep spent most
of its driver's time in `fsync`.

It is `pyarrow.fs.LocalFileSystem` (which Tune uses for a local `storage_path`) with that one
change, passed to Tune as `RunConfig(storage_filesystem=...)` and `Tuner.restore(...,
storage_filesystem=...)`.
"""

from __future__ import annotations

import io
import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow
import pyarrow.fs

from hpo.base.atomic_files import new_temporary, replace_durably


#: Files up to this size are compared with the file they replace before anything is written
#: (Tune's state of a sweep of about a hundred trials; its trials' logs are a few KB each).
IN_MEMORY_BYTES = 1 << 20


class _ReplacedWhenClosed(io.RawIOBase):
    """The new content of `target`: it replaces `target` on a clean close unless it is what
    `target` holds already, and is dropped after a failed write (see the module docstring).

    While what was written is the start of what `target` holds, it is only kept in memory; at
    the first byte that differs it goes to a temporary file, in `write`, so that a full disk
    raises there: pyarrow's `copy_files`, which Tune's save uses, drops an error raised by
    `close`."""

    def __init__(self, target: str):
        self._target = target
        self._pending = bytearray()  # what was written, while it matches the target's start
        self._old: bytes | None = None  # the target's content (read at the first write), None if missing or large
        self._read_old = False
        self._spilled: io.FileIO | None = None  # else a temporary file beside the target
        self._temporary = ""
        self._failed = False
        # An exception already being handled where the stream is opened (a file written in an
        # `except` block) is the writer's context, not a failure of this write.
        self._handling = sys.exc_info()[1]

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        """All of `data`, or OSError: a raw write may stop short where the disk fills up."""
        view = memoryview(data).cast("B")
        try:
            if self._spilled is None and not self._target_continues_with(view):
                self._spill()
            if self._spilled is None:
                self._pending += view
            else:
                _write_all(self._spilled, view)
        except BaseException:  # a full disk, or a KeyboardInterrupt between two raw writes
            self._failed = True
            raise
        return len(view)

    def _target_continues_with(self, view: memoryview) -> bool:
        """Whether the target's next bytes, after those written so far, are `view`."""
        old = self._old_content()
        start = len(self._pending)
        return old is not None and old[start:start + len(view)] == view

    def _old_content(self) -> bytes | None:
        """Read with bare descriptors: Tune's save passes every trial's files through here, and a
        buffered file object per file was most of what an unchanged file cost."""
        if not self._read_old:
            self._read_old = True
            try:
                handle = os.open(self._target, os.O_RDONLY)
            except FileNotFoundError:
                return None
            try:
                if os.fstat(handle).st_size <= IN_MEMORY_BYTES:
                    self._old = _read_all(handle)
            finally:
                os.close(handle)
        return self._old

    def _spill(self) -> None:
        """Go on in a temporary file beside the target, starting with what was written so far."""
        handle, self._temporary = new_temporary(Path(os.path.abspath(self._target)), suffix=".partial")
        self._spilled = io.FileIO(handle, "wb")
        _write_all(self._spilled, memoryview(self._pending))
        self._pending, self._old = bytearray(), None

    def close(self) -> None:
        if self.closed:
            return
        if sys.exc_info()[1] not in (None, self._handling):
            self._failed = True  # closed by a `with` block (or pyarrow) that an exception is leaving
        try:
            unchanged = self._spilled is None and self._old_content() == self._pending
            if not self._failed and not unchanged:
                if self._spilled is None:  # the content is a shorter start of the target's, or empty
                    self._spill()
                self._spilled.close()
                replace_durably(self._temporary, self._target)
                self._temporary = ""
        except BaseException:
            self._failed = True
            raise
        finally:
            if self._spilled is not None:
                self._spilled.close()
            if self._temporary:
                os.unlink(self._temporary)
            self._pending, self._old = bytearray(), None
            super().close()


def _read_all(handle: int) -> bytes:
    chunks = []
    while chunk := os.read(handle, IN_MEMORY_BYTES + 1):
        chunks.append(chunk)
    return b"".join(chunks)


def _write_all(file: io.FileIO, view: memoryview) -> None:
    while view:
        view = view[file.write(view):]


class AtomicLocalHandler(pyarrow.fs.FileSystemHandler):
    """`LocalFileSystem`, except that output streams replace their file atomically."""

    def __init__(self) -> None:
        self._local = pyarrow.fs.LocalFileSystem()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, AtomicLocalHandler)

    def __hash__(self) -> int:
        return hash(AtomicLocalHandler)

    def __reduce__(self) -> tuple:  # trial actors receive the storage filesystem
        return (AtomicLocalHandler, ())

    def get_type_name(self) -> str:
        return "hpo-atomic-local"

    def normalize_path(self, path: str) -> str:
        return self._local.normalize_path(path)

    def equals(self, other: Any) -> bool:
        return self == other

    def get_file_info(self, paths: list[str]) -> list[pyarrow.fs.FileInfo]:
        return self._local.get_file_info(paths)

    def get_file_info_selector(self, selector: pyarrow.fs.FileSelector) -> list[pyarrow.fs.FileInfo]:
        return self._local.get_file_info(selector)

    def create_dir(self, path: str, recursive: bool) -> None:
        self._local.create_dir(path, recursive=recursive)

    def delete_dir(self, path: str) -> None:
        self._local.delete_dir(path)

    def delete_dir_contents(self, path: str, missing_dir_ok: bool = False) -> None:
        self._local.delete_dir_contents(path, missing_dir_ok=missing_dir_ok)

    def delete_root_dir_contents(self) -> None:
        raise OSError("refusing to delete the contents of the filesystem root")

    def delete_file(self, path: str) -> None:
        self._local.delete_file(path)

    def move(self, src: str, dest: str) -> None:
        self._local.move(src, dest)

    def copy_file(self, src: str, dest: str) -> None:
        with self._local.open_input_stream(src) as source, self.open_output_stream(dest, None) as target:
            while chunk := source.read(1 << 20):
                target.write(chunk)

    def open_input_stream(self, path: str) -> pyarrow.NativeFile:
        return self._local.open_input_stream(path)

    def open_input_file(self, path: str) -> pyarrow.NativeFile:
        return self._local.open_input_file(path)

    def open_output_stream(self, path: str, metadata: Any) -> pyarrow.NativeFile:
        return pyarrow.PythonFile(_ReplacedWhenClosed(path), mode="w")

    def open_append_stream(self, path: str, metadata: Any) -> pyarrow.NativeFile:
        return self._local.open_append_stream(path)


def atomic_local_filesystem() -> pyarrow.fs.PyFileSystem:
    """The filesystem to give Tune for a local `storage_path`; see the module docstring."""
    return pyarrow.fs.PyFileSystem(AtomicLocalHandler())


@contextmanager
def one_copying_thread(filesystem: Any) -> Iterator[None]:
    """Run the block with pyarrow's IO thread pool at one thread when `filesystem` is the atomic
    one, and put its size back after.

    Tune's save copies its whole staging folder with `pyarrow.fs.copy_files(use_threads=True)`, a
    task per file on pyarrow's IO pool (8 threads). On this filesystem each of those tasks calls
    into Python three times, so eight threads only take turns at the GIL, with the driver's own
    thread among them: a save of 5,000 unchanged files took 2.1 s of CPU that way and 0.8 s from
    one thread (`benchmarks/sweep_scale.py` shows what it does to a sweep). The pool is the
    process's, so a notebook's pyarrow has its threads back when the sweep returns; remote storage
    keeps Arrow's own filesystem and every thread."""
    if not isinstance(getattr(filesystem, "handler", None), AtomicLocalHandler):
        yield
        return
    with _copying_sweeps.lock:  # sweeps run side by side in one process: the last one out restores
        if _copying_sweeps.running == 0:
            _copying_sweeps.threads = pyarrow.io_thread_count()
            pyarrow.set_io_thread_count(1)
        _copying_sweeps.running += 1
    try:
        yield
    finally:
        with _copying_sweeps.lock:
            _copying_sweeps.running -= 1
            if _copying_sweeps.running == 0:
                pyarrow.set_io_thread_count(_copying_sweeps.threads)


class _CopyingSweeps:
    """How many sweeps of this process are inside `one_copying_thread`, and the pool size the
    first of them found."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running = 0
        self.threads = 0


_copying_sweeps = _CopyingSweeps()


def is_local_path(storage_path: str | None) -> bool:
    """A folder on this machine (no `scheme://`): where the atomic filesystem applies."""
    return storage_path is None or "://" not in str(storage_path)
