"""Durable, append-only journal of the live allocator: one JSON object per line.

Every change of the allocator's job table is written here (and fsynced) before
it is acted on, so that a restarted allocator rebuilds exactly the same table by
replaying the file. A crash can leave at most one torn last line; ``replay``
skips it (the change it described never happened as far as anyone knows).

>>> import tempfile, os
>>> j = Journal(os.path.join(tempfile.mkdtemp(), "j.jsonl"))
>>> j.append({"ev": "submit", "job_id": 0})
>>> list(j.replay())
[{'ev': 'submit', 'job_id': 0}]
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterator


class Journal:
    """Append-only JSON-lines file at ``path`` (created with its folder)."""

    def __init__(self, path: str | os.PathLike, fsync: bool = True):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fsync = fsync
        self._repair_tail()
        self._f = open(self.path, "a", encoding="utf-8")

    def _repair_tail(self) -> None:
        """Drop a torn last line (no trailing newline) so new records start clean."""
        if not self.path.exists() or self.path.stat().st_size == 0:
            return
        with open(self.path, "rb+") as f:
            data = f.read()
            if data.endswith(b"\n"):
                return
            cut = data.rfind(b"\n") + 1
            f.truncate(cut)

    def append(self, record: dict) -> None:
        self._f.write(json.dumps(record, separators=(",", ":"), default=str) + "\n")
        self._f.flush()
        if self.fsync:
            os.fsync(self._f.fileno())

    def replay(self) -> Iterator[dict]:
        """Records in the order they were written; unreadable lines are skipped."""
        with open(self.path, encoding="utf-8") as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                try:
                    yield json.loads(line)
                except json.JSONDecodeError:
                    continue

    def close(self) -> None:
        self._f.close()
