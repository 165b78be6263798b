"""A local filesystem for Tune's storage on which no file is ever seen half-written.

Tune keeps a run's state (`experiment_state-*.json`, `tuner.pkl`, the searcher's state) in a
staging folder and copies the whole folder to the run's storage after each snapshot, about once a
second, writing every file in place. A driver killed during that copy (or a disk that fills up)
leaves a truncated `tuner.pkl` or state file, and `--resume` must then refuse the run. On this
filesystem each file Tune writes goes to a temporary file in the same folder that is flushed,
fsynced and renamed over the target when complete: the storage holds the old file or the new one,
never a torn one. A write that fails (ENOSPC) removes its temporary file and raises, and so does
a stream closed while an exception raised after it was opened propagates (a second Ctrl-C while
Tune saves its state, an error in the writer between two writes): pyarrow closes the stream on its
way out, and the bytes written until then are not the file.

It is `pyarrow.fs.LocalFileSystem` (which Tune uses for a local `storage_path`) with that one
change, passed to Tune as `RunConfig(storage_filesystem=...)` and `Tuner.restore(...,
storage_filesystem=...)`.
"""

from __future__ import annotations

import io
import os
import sys
import tempfile
from typing import Any

import pyarrow
import pyarrow.fs


class _ReplacedWhenClosed(io.FileIO):
    """A temporary file beside `target` that replaces it on a clean close, and is removed after a
    failed write."""

    def __init__(self, target: str):
        folder, name = os.path.split(target)
        handle, self._temporary = tempfile.mkstemp(prefix=f".{name}.", suffix=".partial", dir=folder or ".")
        super().__init__(handle, "wb")
        self._target = target
        self._failed = False
        # An exception already being handled where the stream is opened (a file written in an
        # `except` block) is the writer's context, not a failure of this write.
        self._handling = sys.exc_info()[1]

    def write(self, data: Any) -> int:
        """All of `data`, or OSError: a raw write may stop short where the disk fills up."""
        view = memoryview(data).cast("B")
        try:
            rest = view
            while rest:
                rest = rest[super().write(rest):]
        except BaseException:  # a full disk, or a KeyboardInterrupt between two raw writes
            self._failed = True
            raise
        return len(view)

    def close(self) -> None:
        if self.closed:
            return
        if sys.exc_info()[1] not in (None, self._handling):
            self._failed = True  # closed by a `with` block (or pyarrow) that an exception is leaving
        try:
            if not self._failed:
                os.fsync(self.fileno())
        except OSError:
            self._failed = True
            raise
        finally:
            super().close()
            if self._failed:
                os.unlink(self._temporary)
            else:
                os.replace(self._temporary, self._target)


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


def is_local_path(storage_path: str | None) -> bool:
    """A folder on this machine (no `scheme://`): where the atomic filesystem applies."""
    return storage_path is None or "://" not in str(storage_path)
