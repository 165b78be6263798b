"""The cluster side's input files (traces, application profiles, interference tables): where the
shipped ones live, how their text is read, and the one error every reader raises.

Every reader reports a bad file as a ``TraceError`` naming the file, line and column, which the
CLIs print as one line with exit status 2. It lives below the readers so that each imports it
one way (``simulation.traces`` builds Pollux jobs from ``app_profiles``, and both raise it).
"""

from __future__ import annotations

import os
from pathlib import Path


class TraceError(ValueError):
    """A trace file that cannot be read; the message names the file, row and value."""


def default_traces_dir() -> Path:
    """``$HPO_TRACES_DIR``, else ``shared/traces`` beside the repository."""
    env = os.environ.get("HPO_TRACES_DIR")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[1].parent / "shared" / "traces"


def read_text(path) -> str:
    """The file as UTF-8 text; a bad byte is reported with its line and column."""
    path = Path(path)
    if not path.is_file():
        raise TraceError(f"{path}: no such file")
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        col = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise TraceError(f"{path}:{line}: byte 0x{data[e.start]:02x} at column {col} is not UTF-8 "
                         "(traces must be UTF-8 CSV)") from None
