"""The allocator journal as a write-ahead log, tested the way SQLite tests its journal:
crash (truncate) at every byte offset of a 50-record journal and flip 1,000 random
bytes; no valid record before the damage is ever lost and the allocator's job table
is always rebuilt. Pure Python: the allocator's replay runs through ``LiveDriver``."""

from __future__ import annotations

import json
import os
import random
import stat

import pytest

from scheduler_bridge import make_policy
from scheduler_bridge.live.journal import Journal, frame, scan
from scheduler_bridge.live.driver import LiveDriver


def events(n: int) -> list[dict]:
    """``n`` journal events of a real job table: submits (with --set values), starts, finishes."""
    out, t = [], 1000.0
    for i in range(n):
        jid = i // 3
        t += 1.0
        if i % 3 == 0:
            spec = {"entrypoint": "m:f", "gpus": 1 + jid % 4, "config": {"lr": jid + 1, "s": "ü€"}}
            out.append({"ev": "submit", "t": t, "job_id": jid, "spec": spec})
        elif i % 3 == 1:
            out.append({"ev": "start", "t": t, "job_id": jid, "attempt": 1, "where": [["n0", 1 + jid % 4]],
                        "gpus": 1 + jid % 4})
        else:
            out.append({"ev": "finish", "t": t, "job_id": jid, "status": "done", "ran_s": 1.0})
    return out


RECORDS = events(50)
BLOB = b"".join(frame(r) for r in RECORDS)
SPANS = []   # (start, end) of each record's frame in BLOB
for r in RECORDS:
    start = SPANS[-1][1] if SPANS else 0
    SPANS.append((start, start + len(frame(r))))


def write(path, data: bytes) -> None:
    path.write_bytes(data)


def rebuild(journal: Journal) -> LiveDriver:
    """What a (re)starting allocator does with its journal."""
    driver = LiveDriver(make_policy("fifo"))
    driver.replay(journal.scan().records)
    return driver


def test_appends_are_framed_with_length_and_checksum_and_the_file_is_private(tmp_path):
    path = tmp_path / "j.log"
    j = Journal(path)
    j.append(RECORDS[0])
    length, crc, payload = path.read_bytes().rstrip(b"\n").split(b" ", 2)
    assert int(length, 16) == len(payload) and json.loads(payload) == RECORDS[0]
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600, "the journal holds jobs' --set values"


def test_an_existing_world_readable_journal_is_made_private_on_open(tmp_path):
    path = tmp_path / "j.log"
    write(path, BLOB)
    os.chmod(path, 0o644)
    Journal(path).close()
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


@pytest.mark.slow
def test_a_crash_at_every_byte_offset_keeps_every_complete_record_and_later_appends(tmp_path):
    path = tmp_path / "j.log"
    extra = {"ev": "submit", "t": 9e9, "job_id": 999, "spec": RECORDS[0]["spec"]}
    for cut in range(len(BLOB) + 1):
        write(path, BLOB[:cut])
        j = Journal(path, fsync=False)
        kept = [r for r in j.replay()]
        complete = [r for r, (_, end) in zip(RECORDS, SPANS) if end - 1 <= cut]  # newline may be missing
        assert kept == complete, f"cut at byte {cut}: kept {len(kept)} records, {len(complete)} were complete"
        j.append(extra)
        j.close()
        assert [r for _, r in scan(path.read_bytes()).records] == complete + [extra], \
            f"cut at byte {cut}: a record appended after recovery did not follow cleanly"


def test_a_valid_last_record_without_its_newline_is_kept_not_cut(tmp_path):
    path = tmp_path / "j.log"
    write(path, BLOB[:-1])
    j = Journal(path)
    assert list(j.replay()) == RECORDS and j.problems == []
    assert path.read_bytes() == BLOB, "the newline is added back, nothing is removed"


@pytest.mark.slow
def test_1000_random_byte_flips_lose_no_undamaged_record_and_the_table_always_rebuilds(tmp_path):
    rng = random.Random(14)
    path = tmp_path / "j.log"
    for trial in range(1000):
        data = bytearray(BLOB)
        at = rng.randrange(len(data))
        data[at] = (data[at] + rng.randrange(1, 256)) % 256
        write(path, bytes(data))
        j = Journal(path, fsync=False)
        kept = list(j.replay())
        untouched = [r for r, (s, e) in zip(RECORDS, SPANS) if not s <= at < e]
        hit = [r for r, (s, e) in zip(RECORDS, SPANS) if s <= at < e]
        assert kept in (untouched, RECORDS), \
            f"trial {trial}: flip at byte {at}: kept {len(kept)} of {len(untouched)} undamaged records"
        if kept == untouched:   # the damaged record was refused, and the operator is told where
            assert j.problems and f"offset {SPANS[RECORDS.index(hit[0])][0]}" in j.problems[0], j.problems
        driver = rebuild(j)
        assert set(driver.jobs) <= {r["job_id"] for r in RECORDS}
        j.close()


def test_a_corrupt_record_in_the_middle_is_quarantined_by_offset_and_later_ones_survive(tmp_path):
    path = tmp_path / "j.log"
    s, e = SPANS[20]
    write(path, BLOB[:s] + b"#" * (e - s) + BLOB[e:])
    j = Journal(path)
    assert list(j.replay()) == RECORDS[:20] + RECORDS[21:]
    assert len(j.problems) == 1 and f"corrupt record quarantined at byte offset {s}" in j.problems[0]
    assert (j.quarantine_dir / f"{s}-{e - s}.bin").read_bytes() == b"#" * (e - s)
    assert path.read_bytes()[e:] == BLOB[e:], "valid records after the damage stay on disk"


def test_a_torn_tail_is_kept_aside_and_cut_so_new_records_follow_cleanly(tmp_path):
    path = tmp_path / "j.log"
    s, e = SPANS[-1]
    write(path, BLOB[:s] + frame(RECORDS[-1])[:7])
    j = Journal(path)
    assert "torn tail dropped at byte offset" in j.problems[0]
    assert path.read_bytes() == BLOB[:s]
    assert (j.quarantine_dir / f"{s}-7.bin").exists()


@pytest.mark.parametrize("payload", [
    b'["submit", 0]',                                        # a JSON array
    b'{"ev": "launch-missiles", "job_id": 0}',               # an unknown event
    b'{"ev": "start", "job_id": 77, "attempt": 1, "where": [], "gpus": 1}',  # a job never submitted
    b'{"ev": "submit", "job_id": 5, "spec": {"entrypoint": 3}}',             # an invalid spec
])
def test_records_no_one_can_apply_are_skipped_by_offset_and_the_table_still_rebuilds(tmp_path, payload):
    import zlib

    path = tmp_path / "j.log"
    length = b"%08x" % len(payload)
    bad = b"%s %08x %s\n" % (length, zlib.crc32(payload, zlib.crc32(length)), payload)
    s = SPANS[30][0]
    write(path, BLOB[:s] + bad + BLOB[s:])
    j = Journal(path)
    driver = LiveDriver(make_policy("fifo"))
    skipped = driver.replay(j.scan().records) + j.problems
    assert len(skipped) == 1 and f"offset {s}" in skipped[0], skipped
    assert sorted(driver.jobs) == sorted({r["job_id"] for r in RECORDS})
    assert [jb.state for jb in driver.jobs.values()].count("done") == 16


def test_bad_utf8_with_a_valid_frame_is_quarantined_not_fatal(tmp_path):
    import zlib

    path = tmp_path / "j.log"
    payload = b'{"ev": "submit", "name": "\xff\xfe"}'
    length = b"%08x" % len(payload)
    write(path, BLOB[:SPANS[1][0]] + b"%s %08x %s\n" % (length, zlib.crc32(payload, zlib.crc32(length)),
                                                       payload) + BLOB[SPANS[1][0]:])
    found = scan(path.read_bytes())
    assert [r for _, r in found.records] == RECORDS
    assert "not JSON" in found.damage[0].reason and found.damage[0].offset == SPANS[1][0]


def test_a_journal_of_the_unframed_format_is_converted_keeping_every_record_and_the_original(tmp_path):
    path = tmp_path / "journal.jsonl"
    legacy = b"".join(json.dumps(r).encode() + b"\n" for r in RECORDS[:10]) + b'{"ev": "sta'
    write(path, legacy)
    j = Journal(path)
    assert list(j.replay()) == RECORDS[:10]
    assert "converted 10 records of the unframed format (1 unreadable lines skipped)" in j.problems[0]
    assert (tmp_path / "journal.jsonl.unframed").read_bytes() == legacy
    j.append(RECORDS[10])
    assert list(Journal(path).replay()) == RECORDS[:11]
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
