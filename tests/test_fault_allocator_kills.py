"""Fault tier: the live allocator killed at 10 seeded-random moments while jobs are submitted,
started, checkpointed and finished. After every restart its journal gives back every job, once;
an ended job stays ended as it was; a client's retried submit makes no second job. At the end
every job has finished exactly once, and replaying the journal from scratch rebuilds the live
table job for job. (`test_allocator_live` kills it once, on a multi-node cluster; this kills it
often, at random moments, on the module's one-node Ray.)"""

from __future__ import annotations

import json
import random
import time

import pytest

from patience import patience
from scheduler_bridge import make_policy
from scheduler_bridge.live import client as jobs_api
from scheduler_bridge.live.journal import Journal
from scheduler_bridge.live.driver import LiveDriver

pytestmark = pytest.mark.slow

KILLS = 10
ENTRY = "test_allocator_live:count_steps"   # counts steps, checkpoints every few, logs each step
ENDED = ("done", "failed", "cancelled")


def read_log(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_an_allocator_killed_at_10_random_moments_recovers_every_job_from_its_journal(ray_local, tmp_path):
    ray = ray_local
    rng = random.Random(1412)
    journal = tmp_path / "journal.jsonl"
    jobs_api.start_allocator(str(journal), str(tmp_path / "ckpt"), "fifo", tick_s=0.1,
                             stop_grace_s=patience(20.0))
    submitted: dict[str, int] = {}          # request id -> job id
    steps: dict[int, int] = {}              # job id -> steps it must count
    ended: dict[int, dict] = {}             # job id -> its summary when first seen ended

    def submit(request: str, gpus: int, config: dict) -> int:
        return jobs_api.submit(ENTRY, gpus, config=config, request_id=request, max_attempts=KILLS + 5)

    try:
        for kill in range(KILLS):
            for _ in range(rng.randint(1, 2)):
                request = f"req-{len(submitted)}"
                config = {"steps": rng.randint(8, 20), "step_s": 0.05, "every": 3,
                          "log": str(tmp_path / f"{request}.log")}
                submitted[request] = submit(request, rng.choice([1, 2, 3]), config)
                steps[submitted[request]] = config["steps"]
            time.sleep(rng.uniform(0.0, 1.5))
            for job in jobs_api.list_jobs():
                if job["state"] in ENDED:
                    ended.setdefault(job["job_id"], job)
            ray.kill(jobs_api.get_allocator(), no_restart=False)

            table = {job["job_id"]: job for job in jobs_api.list_jobs()}   # waits for the restarted allocator
            assert sorted(table) == sorted(submitted.values()), f"kill {kill}: jobs lost or duplicated"
            for jid, before in ended.items():
                assert {k: table[jid][k] for k in ("state", "result", "attempt", "finish_t")} == \
                       {k: before[k] for k in ("state", "result", "attempt", "finish_t")}, \
                       f"kill {kill}: job {jid} had ended, and changed after the restart"
            request = rng.choice(sorted(submitted))   # a client retrying a submit it never heard back from
            assert submit(request, 1, {"steps": 1}) == submitted[request], f"kill {kill}: a retried submit queued twice"

        final = {jid: jobs_api.wait_job(jid, patience(120)) for jid in sorted(submitted.values())}
        status = jobs_api.status()
        live = jobs_api.list_jobs()
    finally:
        jobs_api.stop_allocator()

    assert status["restarted"]
    assert [job["state"] for job in final.values()] == ["done"] * len(final), \
        {jid: (job["state"], job["error"]) for jid, job in final.items()}
    for request, jid in submitted.items():
        log = read_log(tmp_path / f"{request}.log")
        assert sum(r["ev"] == "done" for r in log) == 1, f"job {jid} finished {sum(r['ev'] == 'done' for r in log)} times"
        assert {r["step"] for r in log if r["ev"] == "step"} == set(range(1, steps[jid] + 1)), f"job {jid} skipped steps"
    assert all("torn tail dropped" in p for p in status["journal_problems"]), \
        f"a kill damaged more than the record being written: {status['journal_problems']}"

    replayed = LiveDriver(make_policy("fifo"))
    assert replayed.replay(Journal(journal).scan().records) == []
    rebuilt = [job.summary() for job in sorted(replayed.jobs.values(), key=lambda j: j.job_id)]
    keys = ("job_id", "state", "attempt", "result", "requeues", "submit_t", "first_start", "finish_t", "run_s")
    assert [{k: j[k] for k in keys} for j in rebuilt] == [{k: j[k] for k in keys} for j in live], \
        "the journal replayed from scratch does not rebuild the allocator's table"
