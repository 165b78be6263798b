"""Replacing a file or a folder so that a reader, and a machine that loses power, finds the old
content or the new, never a torn one: one rule for every engine.

The rule: the new content is written to a temporary beside its target (the same folder, so the
rename is atomic), fsynced, renamed over the target, and then the folder is fsynced, since the
rename is an entry of the folder, and until the folder reaches the disk a crash can bring the old
file back, or leave neither. A write that fails (a full disk) removes its temporary and leaves
the target as it was; its OSError names the target, which is what a user can act on, not the
temporary's random name.

Temporaries are named `.<target name>.<random><target suffix>`: hidden, and with the target's
suffix, so a writer that picks a format by the file's name (matplotlib, pandas) picks the
target's. `tempfile.mkstemp` makes them private (0600); the file that replaces the target gets
the mode a plain `open` gives (`file_mode`: 0666 less the umask), so a run's results and
checkpoints are as readable as Tune leaves them, to a teammate or a TensorBoard on a shared disk,
unless the writer asks for a private file (`private=True`: the allocator's journal and its jobs'
checkpoints).
"""

from __future__ import annotations

import functools
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

#: The new content of a file: its bytes, its text (UTF-8), or a function that writes the file
#: at the path it is given (`torch.save`, `DataFrame.to_csv`).
Content = bytes | str | Callable[[str], object]


@functools.cache
def _umask() -> int:
    """The process's umask, read without setting it (`os.umask` sets it while reading it, which
    races any thread creating a file meanwhile)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o022


def file_mode() -> int:
    """The mode `open(path, "w")` gives a new file: 0666 less the umask."""
    return 0o666 & ~_umask()


def new_temporary(target: Path, suffix: str | None = None, private: bool = False) -> tuple[int, str]:
    """An open descriptor and the name of a new temporary beside `target` (see the module
    docstring; `suffix`: another than the target's), with the mode the target is to have."""
    suffix = target.suffix if suffix is None else suffix
    handle, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=suffix, dir=target.parent)
    if not private:
        os.fchmod(handle, file_mode())
    return handle, name


def fsync_folder(folder: str | os.PathLike) -> None:
    """Make the folder's entries (a rename, a new file) durable."""
    handle = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)


def fsync_file(path: str | os.PathLike) -> None:
    """Make a closed file's content durable (any descriptor of the file flushes its pages)."""
    with open(path, "rb") as file:
        os.fsync(file.fileno())


def replace_durably(temporary: str | os.PathLike, target: str | os.PathLike) -> None:
    """Rename the complete file `temporary` over `target` (same folder) under the rule above."""
    fsync_file(temporary)
    os.replace(temporary, target)
    fsync_folder(os.path.dirname(os.path.abspath(target)))


def write_atomically(path: str | os.PathLike, content: Content, private: bool = False) -> None:
    """Replace the file at `path` (its folder made if missing) by `content`, durably."""
    write_all_atomically({Path(path): content}, private)


def write_all_atomically(writes: Mapping[Path, Content], private: bool = False) -> None:
    """Write every file to its temporary (fsynced) before renaming any into place: a failed write
    changes none of the files, so a reader never pairs a new file with an old one."""
    staged: dict[Path, str] = {}
    try:
        for path, content in writes.items():
            with _naming(path):
                path.parent.mkdir(parents=True, exist_ok=True)
                handle, staged[path] = new_temporary(path, private=private)
                os.close(handle)
                _write(staged[path], content)
                fsync_file(staged[path])
        for path, temporary in staged.items():
            with _naming(path):
                os.replace(temporary, path)
        for folder in {path.parent for path in staged}:
            with _naming(folder):
                fsync_folder(folder)
    finally:
        for temporary in staged.values():
            if os.path.exists(temporary):
                os.unlink(temporary)


def replace_folder_durably(staging: str | os.PathLike, target: str | os.PathLike) -> None:
    """Make the complete folder `staging` the folder `target` (same parent), which a reader then
    finds whole or absent, never half-written. Every file and folder in `staging` is fsynced
    before the rename, so the renamed folder cannot come back from a crash with empty files."""
    for root, _, files in os.walk(staging):
        for name in files:
            fsync_file(os.path.join(root, name))
        fsync_folder(root)
    shutil.rmtree(target, ignore_errors=True)
    os.replace(staging, target)
    fsync_folder(os.path.dirname(os.path.abspath(target)))


@contextmanager
def _naming(path: Path) -> Iterator[None]:
    """An OSError raised inside names `path`, not a temporary."""
    try:
        yield
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, str(path)) from exc


def _write(path: str, content: Content) -> None:
    if isinstance(content, bytes):
        Path(path).write_bytes(content)
    elif isinstance(content, str):
        Path(path).write_text(content, encoding="utf-8")
    else:
        content(path)
