"""The live allocator's write-ahead log: framed, checksummed, fsynced records.

Every change of the allocator's job table is appended here (and fsynced) before
it is acted on, so a restarted allocator rebuilds the same table by replaying
the file. The file keeps other people's jobs (and their ``--set`` values), so it
is built like a database's log rather than a plain JSON-lines file:

- one record per line: ``<length:8 hex> <crc32:8 hex> <JSON object>\\n``; the
  CRC covers the length field and the payload, so damage to either is detected;
- the file is created with mode 0600 (a wider mode found on open is narrowed);
- recovery (``scan``) keeps every record whose checksum holds. Damage in the
  middle is skipped by searching for the next valid frame and reported with its
  byte offset; its bytes are copied to ``<journal>.quarantine/<offset>-<length>.bin``.
  Damage at the end with no valid record after it is a torn write: it is copied
  to the quarantine folder and cut off, so new records start clean. A valid last
  record whose newline never reached the disk is kept (the newline is added).

Nothing raises on a damaged file: ``Journal`` opens, reports the damage in
``problems`` and keeps appending. A journal of the earlier unframed format (one
JSON object per line) is converted on open; the original stays beside it.

>>> import tempfile, os
>>> j = Journal(os.path.join(tempfile.mkdtemp(), "j.log"))
>>> j.append({"ev": "submit", "job_id": 0})
>>> list(j.replay())
[{'ev': 'submit', 'job_id': 0}]
>>> oct(os.stat(j.path).st_mode & 0o777)
'0o600'
"""

from __future__ import annotations

import json
import logging
import os
import re
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from hpo.base.atomic_files import write_atomically

log = logging.getLogger(__name__)

FILE_MODE = 0o600
_HEADER = re.compile(rb"([0-9a-f]{8}) ([0-9a-f]{8}) ")
_HEADER_LEN = 18


def frame(record: dict) -> bytes:
    """One record as it is stored (ASCII JSON, so the payload never holds a newline)."""
    payload = json.dumps(record, separators=(",", ":"), default=str, ensure_ascii=True).encode("ascii")
    length = b"%08x" % len(payload)
    return b"%s %08x %s\n" % (length, zlib.crc32(payload, zlib.crc32(length)), payload)


@dataclass(frozen=True)
class Damage:
    """Bytes ``[offset, offset + length)`` held no valid record (or a record no one can apply)."""

    offset: int
    length: int
    reason: str
    torn_tail: bool = False

    def message(self, path: Path | str) -> str:
        what = "torn tail dropped" if self.torn_tail else "corrupt record quarantined"
        return f"{path}: {what} at byte offset {self.offset} ({self.length} bytes): {self.reason}"


@dataclass
class Scan:
    """What ``scan`` found: valid records as (offset, record), and the damaged spans."""

    records: list[tuple[int, dict]] = field(default_factory=list)
    damage: list[Damage] = field(default_factory=list)
    end: int = 0                      # where the valid part ends (the torn tail starts)


def _parse_at(data: bytes, pos: int) -> tuple[dict | None, int, str]:
    """(record, end, why-not) for a frame starting at ``pos``; record None if invalid."""
    m = _HEADER.match(data, pos)
    if m is None:
        return None, pos, "no record header"
    length = int(m.group(1), 16)
    start = pos + _HEADER_LEN
    end = start + length
    if end > len(data):
        return None, pos, f"record of {length} bytes runs past the end of the file"
    payload = data[start:end]
    if zlib.crc32(payload, zlib.crc32(m.group(1))) != int(m.group(2), 16):
        return None, pos, "checksum mismatch"
    try:
        record = json.loads(payload.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        return None, pos, f"checksum holds but the payload is not JSON ({exc})"
    if not isinstance(record, dict) or not isinstance(record.get("ev"), str):
        return None, pos, f"checksum holds but the payload is not an event object: {payload[:60]!r}"
    return record, end, ""


def scan(data: bytes) -> Scan:
    """Every valid record of ``data`` in order, and where the damage is (never raises)."""
    out = Scan()
    pos, bad_from, why = 0, None, ""
    while pos < len(data):
        record, end, reason = _parse_at(data, pos)
        if record is None:
            if bad_from is None:
                bad_from, why = pos, reason
            m = _HEADER.search(data, pos + 1)
            pos = m.start() if m else len(data)
            continue
        if bad_from is not None:
            out.damage.append(Damage(bad_from, pos - bad_from, why))
            bad_from = None
        out.records.append((pos, record))
        pos = end + 1 if end < len(data) and data[end:end + 1] == b"\n" else end
        out.end = pos
    if bad_from is not None:
        out.damage.append(Damage(bad_from, len(data) - bad_from, why, torn_tail=True))
    return out


class Journal:
    """The log at ``path`` (created, mode 0600, with its folder); see the module docstring.

    ``problems``: one line per damaged span found when it was opened (empty when clean).
    """

    def __init__(self, path: str | os.PathLike, fsync: bool = True):
        self.path = Path(path)
        self.fsync = fsync
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, FILE_MODE)
        if os.fstat(self._fd).st_mode & 0o777 != FILE_MODE:
            os.fchmod(self._fd, FILE_MODE)   # an older journal (0644) holds jobs' --set values
        self.problems: list[str] = []
        self._recover()
        if fsync:
            self._sync_dir()

    @property
    def quarantine_dir(self) -> Path:
        return self.path.with_name(self.path.name + ".quarantine")

    def _read(self) -> bytes:
        with open(self.path, "rb") as f:
            return f.read()

    def _recover(self) -> None:
        data = self._read()
        if data.startswith(b"{") and not scan(data).records:   # no valid frame: the old format
            data = self._convert_legacy(data)
        found = scan(data)
        for d in found.damage:
            self._quarantine(data, d)
        if found.damage and found.damage[-1].torn_tail:
            os.ftruncate(self._fd, found.end)
        if found.end and data[found.end - 1:found.end] != b"\n":
            self._write(b"\n")   # the last valid record's newline never reached the disk

    def _convert_legacy(self, data: bytes) -> bytes:
        """A journal of the earlier, unframed format (one JSON object per line): frame its
        records into a new file that replaces it (the original is kept beside it), so an
        upgrade loses no job. Lines that do not parse are left in the kept original."""
        framed, skipped = [], 0
        for line in data.splitlines():
            try:
                record = json.loads(line)
            except (UnicodeDecodeError, ValueError):
                record = None
            if isinstance(record, dict) and isinstance(record.get("ev"), str):
                framed.append(frame(record))
            elif line.strip():
                skipped += 1
        kept = self.path.with_name(self.path.name + ".unframed")
        write_atomically(kept, data, private=True)  # jobs' settings: for the allocator's user alone
        write_atomically(self.path, b"".join(framed), private=True)
        os.close(self._fd)
        self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND)
        self.note(f"{self.path}: converted {len(framed)} records of the unframed format "
                  f"({skipped} unreadable lines skipped); the original is kept at {kept}")
        return self._read()

    def _quarantine(self, data: bytes, d: Damage) -> None:
        """Keep the damaged bytes for the operator (never delete what may be someone's job)."""
        self.quarantine_dir.mkdir(mode=0o700, exist_ok=True)
        dest = self.quarantine_dir / f"{d.offset}-{d.length}.bin"
        fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
        with os.fdopen(fd, "wb") as f:
            f.write(data[d.offset:d.offset + d.length])
        self.note(f"{d.message(self.path)} (bytes kept in {dest})")

    def note(self, problem: str) -> None:
        """Record a problem found in this journal (also logged)."""
        self.problems.append(problem)
        log.error("%s", problem)

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view):]
        if self.fsync:
            os.fsync(self._fd)

    def _sync_dir(self) -> None:
        dfd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    def append(self, record: dict) -> None:
        """Durably add ``record`` (on disk when this returns)."""
        self._write(frame(record))

    def scan(self) -> Scan:
        return scan(self._read())

    def replay(self) -> Iterator[dict]:
        """Valid records in the order they were written."""
        for _, record in self.scan().records:
            yield record

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
