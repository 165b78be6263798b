"""Pairwise interference table: how much each workload slows down beside another.

Measured by ``hpo profile colocate`` (``live/colocate.py``) on the local device and
read by the Lucid-style packing policy. CSV, with ``#`` comment lines on top
describing the machine it was measured on:

    workload,partner,alone_steps_s,together_steps_s,slowdown,memory_mb
    mlp-small,gpt-small,812.0,640.3,1.268,95.0

``slowdown`` = alone / together throughput of ``workload`` while ``partner``
runs on the same device (>= 1 means slower); ``memory_mb`` = the peak memory of
``workload`` alone. Every bad row or value is reported as a ``TraceError``
naming the file, line and column.

>>> t = InterferenceTable({("a", "b"): 1.2, ("b", "a"): 1.5}, {"a": 10.0, "b": 20.0})
>>> t.pair("a", "b")
(1.2, 1.5)
"""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path

from .data_files import TraceError, csv_rows, read_text

COLUMNS = ("workload", "partner", "alone_steps_s", "together_steps_s", "slowdown", "memory_mb")


class InterferenceTable:
    def __init__(self, slowdown: dict[tuple[str, str], float], memory_mb: dict[str, float],
                 machine: str = ""):
        self.slowdown = dict(slowdown)
        self.memory_mb = dict(memory_mb)
        self.machine = machine

    @property
    def workloads(self) -> list[str]:
        return sorted(self.memory_mb)

    def pair(self, a: str, b: str) -> tuple[float, float] | None:
        """(slowdown of ``a`` beside ``b``, of ``b`` beside ``a``), or None if not measured."""
        sa, sb = self.slowdown.get((a, b)), self.slowdown.get((b, a))
        return None if sa is None or sb is None else (sa, sb)

    @classmethod
    def load(cls, path) -> "InterferenceTable":
        path = Path(path)
        text = read_text(path)
        lines = text.splitlines(keepends=True)
        machine = " ".join(line[1:].strip() for line in lines if line.startswith("#"))
        first = next((i for i, line in enumerate(lines) if not line.startswith("#")), len(lines))
        _, reader = csv_rows(path, "".join(lines[first:]), COLUMNS, first_line=first + 1)
        slow, mem = {}, {}
        for line, row in reader:
            for c in ("workload", "partner"):
                if not (row.get(c) or "").strip():
                    raise TraceError(f"{path}:{line}: column {c!r} is empty")
            vals = {}
            for c in COLUMNS[2:]:
                raw = row.get(c)
                try:
                    v = float(raw)
                except (TypeError, ValueError):
                    raise TraceError(f"{path}:{line}: column {c!r} = {raw!r} is not a number") from None
                if not math.isfinite(v) or v <= 0 or v > 1e9:
                    raise TraceError(f"{path}:{line}: column {c!r} = {raw!r} must be a finite number "
                                     "> 0 and <= 1e9")
                vals[c] = v
            key = (row["workload"].strip(), row["partner"].strip())
            if key in slow:
                raise TraceError(f"{path}:{line}: column 'partner': pair {key} appears twice")
            slow[key] = vals["slowdown"]
            mem[key[0]] = max(mem.get(key[0], 0.0), vals["memory_mb"])
        if not slow:
            raise TraceError(f"{path}:{first + 2}: no rows after the header")
        for a, b in slow:
            if (b, a) not in slow:
                raise TraceError(f"{path}: pair ({a!r}, {b!r}) has no row for ({b!r}, {a!r}); "
                                 "every pair needs both directions")
        return cls(slow, mem, machine)


def write_table(path, rows: list[dict], machine_lines: list[str]) -> None:
    """Write measured ``rows`` (dicts with ``COLUMNS``) below ``# machine`` lines."""
    out = io.StringIO()
    for line in machine_lines:
        out.write(f"# {line}\n")
    w = csv.DictWriter(out, fieldnames=COLUMNS, lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: (f"{r[k]:.4g}" if isinstance(r[k], float) else r[k]) for k in COLUMNS})
    Path(path).write_text(out.getvalue())
