"""The cluster side's input files (traces, application profiles, interference tables): the ones the
package ships, how their text is read, and the one error every reader raises.

The Philly trace and the Pollux workloads and profiles ship inside the package
(``data/traces``, with their licence and attribution in ``data/traces/README.md``), so an
installed package and a plain clone have them; ``hpo sim --trace NAME`` finds them by name.

Every reader reports a bad file as a ``TraceError`` naming the file, line and column, which the
CLIs print as one line with exit status 2; ``csv_rows`` reads every CSV of them, so that a file
that is not a table (an unclosed quote, an unquoted comma, a column named twice) is reported the
same way in each. It lives below the readers so that each imports it
one way (``simulation.traces`` builds Pollux jobs from ``app_profiles``, and both raise it).

>>> shipped_traces()["workload-3"][1]
'pollux'
>>> shipped_traces()["philly"][0].name
'philly.csv'
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
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
        raise TraceError(f"{path}: {'a folder, not a file' if path.is_dir() else 'no such file'}")
    data = path.read_bytes()
    try:
        return data.decode("utf-8-sig")  # a leading byte-order mark (Excel's "CSV UTF-8") is not text
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        col = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise TraceError(f"{path}:{line}: byte 0x{data[e.start]:02x} at column {col} is not UTF-8 "
                         "(traces must be UTF-8 CSV)") from None


def csv_rows(path, text: str, required: tuple[str, ...] = (), *, first_line: int = 1
             ) -> tuple[list[str], Iterator[tuple[int, dict[str, str]]]]:
    """(header, rows) of CSV ``text`` read from ``path``, whose first line is line ``first_line``
    of the file: each row as (its line, {column: value}), blank lines skipped. The header must
    hold the ``required`` columns and name none twice, and every row must have as many fields as
    the header: a row with more is an unquoted comma that would shift or drop values, one with
    fewer lost its last values. A quote never closed (which would read the rest of the file into
    one value) or a value larger than Python's ``csv`` takes is reported at the line its row
    starts. Each problem is a ``TraceError`` naming the file and line."""
    import io
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)

    def records() -> Iterator[tuple[int, list[str]]]:
        while True:
            start = first_line + reader.line_num
            try:
                fields = next(reader)
            except StopIteration:
                return
            except csv.Error as e:
                raise TraceError(f"{path}:{start}: not CSV from this line on ({e}); a value with a "
                                 "quote, comma or line break must be quoted whole, its quotes doubled") from None
            if fields:
                yield start, fields

    rows = records()
    line, header = next(rows, (first_line, []))
    seen = set()
    for c in header:
        if c in seen:
            raise TraceError(f"{path}:{line}: column {c!r} appears twice in the header")
        seen.add(c)
    missing = [c for c in required if c not in seen]
    if missing:
        raise TraceError(f"{path}:{line}: missing column(s) {missing}; header is {header}")

    def dicts() -> Iterator[tuple[int, dict[str, str]]]:
        for n, fields in rows:
            if len(fields) != len(header):
                hint = ("a comma inside a value needs the value quoted" if len(fields) > len(header)
                        else "a value is missing")
                raise TraceError(f"{path}:{n}: row has {len(fields)} fields, the header has "
                                 f"{len(header)} ({hint})")
            yield n, dict(zip(header, fields))

    return header, dicts()
