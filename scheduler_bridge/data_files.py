"""The cluster side's input files (traces, application profiles, interference tables): the ones the
package ships, how their text is read, and the one error every reader raises.

The Philly trace and the Pollux workloads and profiles ship inside the package
(``data/traces``, with their licence and attribution in ``data/traces/README.md``), so an
installed package and a plain clone have them; ``hpo sim --trace NAME`` finds them by name.

Every reader reports a bad file as a ``TraceError`` naming the file, line and column, which the
CLIs print as one line with exit status 2. It lives below the readers so that each imports it
one way (``simulation.traces`` builds Pollux jobs from ``app_profiles``, and both raise it).

>>> shipped_traces()["workload-3"][1]
'pollux'
>>> shipped_traces()["philly"][0].name
'philly.csv'
"""

from __future__ import annotations

from pathlib import Path


class TraceError(ValueError):
    """A trace file that cannot be read; the message names the file, row and value."""


def default_traces_dir() -> Path:
    """The shipped traces: ``pollux/traces`` (Philly, the application profiles) and
    ``pollux/workloads*`` (the Pollux workloads at load 0.5x, 1.0x and 1.5x)."""
    return Path(__file__).resolve().parent / "data" / "traces"


def shipped_traces() -> dict[str, tuple[Path, str]]:
    """Name -> (file, format) of every shipped trace: ``philly``, the load-1.0x Pollux workloads
    ``workload-1`` ... ``workload-8``, and the other loads as ``workloads-0.5/workload-N``."""
    pollux = default_traces_dir() / "pollux"
    out = {"philly": (pollux / "traces" / "philly.csv", "philly")}
    for path in sorted(pollux.glob("workloads*/workload-*.csv")):
        folder = path.parent.name
        out[path.stem if folder == "workloads" else f"{folder}/{path.stem}"] = (path, "pollux")
    return out


def read_text(path) -> str:
    """The file as UTF-8 text; a bad byte is reported with its line and column."""
    path = Path(path)
    if not path.is_file():
        raise TraceError(f"{path}: no such file")
    data = path.read_bytes()
    try:
        return data.decode("utf-8-sig")  # a leading byte-order mark (Excel's "CSV UTF-8") is not text
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        col = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise TraceError(f"{path}:{line}: byte 0x{data[e.start]:02x} at column {col} is not UTF-8 "
                         "(traces must be UTF-8 CSV)") from None
