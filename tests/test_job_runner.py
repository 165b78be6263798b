"""A job rank's `start` returns only once the job's code is imported and running: the allocator
counts a job's service time, and Lucid's profiling window, from when every rank's `start` has
returned, so a node that is slow to import the job's modules must not eat into either."""

from __future__ import annotations

import sys
import textwrap

from scheduler_bridge.live.job_runner import JobRunner

CONTEXT = dict(job_id=0, attempt=1, rank=0, world_size=1, gpus=1, local_gpus=1, batch_size=None)


def test_start_returns_after_the_entry_points_module_is_imported(tmp_path, monkeypatch):
    (tmp_path / "slow_entry.py").write_text(textwrap.dedent("""\
        import time

        time.sleep(0.5)  # a module that takes a while to import, as a big model's does


        def train(ctx):
            return {"steps": ctx.config["steps"]}
        """))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "slow_entry", raising=False)
    runner = JobRunner("slow_entry:train", {**CONTEXT, "checkpoint_dir": str(tmp_path / "ckpt"),
                                            "config": {"steps": 3}})
    assert runner.start() is True
    assert "slow_entry" in sys.modules, "start returned before the job's code was imported"
    assert runner.start() is True, "start is idempotent: a restarted allocator calls it again"
    outcome = runner.wait()
    assert (outcome["status"], outcome["value"]) == ("done", {"steps": 3})


def test_an_entry_point_that_does_not_import_is_the_jobs_error_not_a_hang(tmp_path):
    runner = JobRunner("no_such_module_here:train", {**CONTEXT, "checkpoint_dir": str(tmp_path / "ckpt")})
    assert runner.start() is True
    outcome = runner.wait()
    assert outcome["status"] == "error" and "no_such_module_here" in outcome["error"]


def test_an_entry_point_the_module_lacks_is_named_in_the_jobs_error(tmp_path, monkeypatch):
    (tmp_path / "entry_without_train.py").write_text("def other(ctx):\n    return None\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    runner = JobRunner("entry_without_train:train", {**CONTEXT, "checkpoint_dir": str(tmp_path / "ckpt")})
    runner.start()
    outcome = runner.wait()
    assert outcome["status"] == "error" and "has no function 'train'" in outcome["error"]
