"""The live allocator on a real multi-node Ray (``ray.cluster_utils.Cluster``, fake GPUs).

One cluster for the module: a head without GPUs and three nodes of 4 GPUs. Each
test starts its own allocator (journal and checkpoints under ``tmp_path``) and
stops it at the end. Jobs are tiny step counters (``count_steps``) that
checkpoint every few steps and log every step, so a test can tell exactly which
steps ran in which attempt. The node-removal test runs last (it shrinks the cluster).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from patience import patience
from ray_cluster import ensure_ray_token

pytestmark = pytest.mark.slow   # a multi-node Ray cluster for the module

ENTRY = "test_allocator_live:count_steps"
GPUS_PER_NODE = 4


# ---- the entry point the jobs run (imported by the job actors) ------------------
def count_steps(ctx):
    """Count to ``steps``; checkpoint (with the fraction of steps done) every ``every``
    steps and when asked to stop; log ``start``/``step``/``done`` lines (rank 0, or every rank
    with ``log_ranks``) to ``log``.

    With ``occupancy`` (a folder), the job marks its (fake) GPU taken there while it runs, and
    each step takes ``step_s`` times the number of jobs marking that GPU: a GPU time-shared by
    two jobs runs each at half speed, which a packed pair must show in its progress reports.
    With ``alloc_mb``, it holds that much memory while it runs (what profiling measures)."""
    cfg = ctx.config
    state = ctx.load_checkpoint() or {"step": 0}
    ballast = b"\x01" * (cfg.get("alloc_mb", 0) << 20)   # written, so resident

    def log(**rec):
        if (ctx.is_chief or cfg.get("log_ranks")) and cfg.get("log"):
            with open(cfg["log"], "a") as f:
                f.write(json.dumps({"attempt": ctx.attempt, "rank": ctx.rank, "tag": cfg.get("tag"), **rec}) + "\n")

    import ray

    gpu_ids = [str(g) for g in ray.get_gpu_ids()]
    log(ev="start", step=state["step"], gpus=ctx.gpus, batch=ctx.batch_size, world=ctx.world_size,
        gpu_ids=gpu_ids)
    mark = None
    if cfg.get("occupancy"):
        mark = Path(cfg["occupancy"]) / f"{ray.get_runtime_context().get_node_id()}-{gpu_ids[0]}" / str(ctx.job_id)
        mark.parent.mkdir(parents=True, exist_ok=True)
        mark.touch()
    try:
        while state["step"] < cfg["steps"] and not ctx.should_stop():
            time.sleep(cfg.get("step_s", 0.05) * (len(list(mark.parent.iterdir())) if mark else 1))
            state["step"] += 1
            log(ev="step", step=state["step"])
            if state["step"] % cfg.get("every", 5) == 0:
                ctx.save_checkpoint(state, progress=state["step"] / cfg["steps"])
                log(ev="ckpt", step=state["step"])
    finally:
        if mark:
            mark.unlink(missing_ok=True)
    ctx.save_checkpoint(state, progress=state["step"] / cfg["steps"])
    log(ev="ckpt", step=state["step"])
    if state["step"] >= cfg["steps"]:
        log(ev="done", step=state["step"])
    return {"steps": state["step"], "held_mb": len(ballast) >> 20}


def pipeline_owner(ctx):
    """A pipeline job that, after ``reclaim_at`` steps, needs its bubbles' memory back."""
    for step in range(ctx.config["steps"]):
        if ctx.should_stop():
            return {"stopped_at": step}
        if step == ctx.config["reclaim_at"]:
            ctx.reclaim_bubbles()
        time.sleep(0.1)
    return {"steps": ctx.config["steps"]}


def read_log(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def wait_for(cond, timeout=60.0, what="condition", poll=0.2):
    timeout = patience(timeout)
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


# ---- fixtures -------------------------------------------------------------------
@pytest.fixture(scope="module")
def cluster():
    import ray
    from ray.cluster_utils import Cluster

    ensure_ray_token()
    repo = Path(__file__).resolve().parents[1]
    small = dict(object_store_memory=80 * 1024**2)
    c = Cluster(initialize_head=True,
                head_node_args=dict(num_cpus=1, num_gpus=0, include_dashboard=False, **small))
    workers = [c.add_node(num_cpus=1, num_gpus=GPUS_PER_NODE, **small) for _ in range(3)]
    ray.init(address=c.address, namespace="hpo", log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": f"{repo / 'tests'}:{repo}"}})
    c.wait_for_nodes()
    yield c, workers
    ray.shutdown()
    c.shutdown()


@pytest.fixture
def allocator(cluster, tmp_path):
    """start(policy, **kw) -> the allocator handle; stopped (jobs released) afterwards."""
    from scheduler_bridge.live import client as jobs_api

    def start(policy="fifo", **kw):
        kw.setdefault("tick_s", 0.1)
        # how long a stopped job may take to checkpoint and return: a liveness bound, so it scales
        # like the waits (on CI's box a job asked to stop was still importing its entry point)
        kw.setdefault("stop_grace_s", patience(20.0))
        return jobs_api.start_allocator(str(tmp_path / "journal.jsonl"), str(tmp_path / "ckpt"),
                                        policy, **kw)

    yield start
    try:
        jobs_api.stop_allocator()
    except ValueError:
        pass


def job(jid):
    from scheduler_bridge.live import client as jobs_api

    return jobs_api.get_job(jid)


def running(jid):
    j = job(jid)
    return j if j["state"] == "running" else None


def pg_row(jid, attempt):
    from ray.util.placement_group import placement_group_table

    for row in placement_group_table().values():
        if row["name"] == f"hpo-job-{jid}-a{attempt}" and row["state"] == "CREATED":
            return row
    return None


# ---- tests ----------------------------------------------------------------------
def test_jobs_land_in_groups_on_exactly_the_nodes_the_policy_chose(allocator, tmp_path):
    from scheduler_bridge.live import client as jobs_api
    from scheduler_bridge.live.driver import ClusterView
    from scheduler_bridge.policies.pending_queue import PendingQueue, select_starts

    allocator("fifo")
    demands = [2, 4, 6]   # 2 and 4 fit a node (STRICT_PACK); 6 spans two (STRICT_SPREAD)
    ids = [jobs_api.submit(ENTRY, g, config={"steps": 10_000}) for g in demands]
    for jid in ids:
        wait_for(lambda: running(jid) and pg_row(jid, 1), what=f"job {jid} placed")

    st = jobs_api.status()
    view = ClusterView(st["inventory"], st["nodes"])
    queue = PendingQueue()
    for jid, g in zip(ids, demands):
        queue.push(jid, g, float(jid))
    decided = {jid: view.to_where(p) for jid, p in select_starts(queue, view.free, backfill=True)}
    for jid in ids:
        j, row = job(jid), pg_row(jid, 1)
        where = tuple((n, k) for n, k in j["where"])
        assert where == decided[jid], f"job {jid} at {where}, FIFO + placement rule decided {decided[jid]}"
        assert [row["bundles_to_node_id"][i] for i in range(len(where))] == [n for n, _ in where], \
            f"Ray put job {jid}'s bundles elsewhere than the allocator decided"
        assert [row["bundles"][i]["GPU"] for i in range(len(where))] == [k for _, k in where]
        assert row["strategy"] == ("STRICT_PACK" if len(where) == 1 else "STRICT_SPREAD")
    assert sum(job(j)["gpus"] for j in ids) == 12
    for jid in ids:
        assert jobs_api.cancel(jid)
    wait_for(lambda: all(pg_row(j, 1) is None for j in ids), what="groups removed on cancel")


def test_qssf_starts_the_job_with_the_shorter_predicted_gpu_time_first(allocator, tmp_path):
    from scheduler_bridge.live import client as jobs_api

    allocator("qssf")
    # Teach QSSF: user "long" runs ~3 s on 8 GPUs, user "short" a fraction of that.
    for user, steps in (("long", 30), ("short", 1)):
        jid = jobs_api.submit(ENTRY, 8, user=user, config={"steps": steps, "step_s": 0.1})
        assert jobs_api.wait_job(jid, patience(60))["state"] == "done"
    blocker = jobs_api.submit(ENTRY, 8, user="blocker", config={"steps": 10_000})
    wait_for(lambda: running(blocker), what="blocker running")
    long_id = jobs_api.submit(ENTRY, 8, user="long", config={"steps": 10_000})
    short_id = jobs_api.submit(ENTRY, 8, user="short", config={"steps": 10_000})
    assert job(short_id)["priority"] < job(long_id)["priority"], "QSSF should predict 'short' shorter"
    jobs_api.cancel(blocker)
    wait_for(lambda: running(short_id), what="the short job started")
    assert job(long_id)["state"] == "queued", "8+8 GPUs do not fit 12: 'long' must wait behind 'short'"
    jobs_api.cancel(short_id)
    wait_for(lambda: running(long_id), what="the long job started next")
    jobs_api.cancel(long_id)


def test_elastic_job_is_resized_and_continues_from_its_checkpoint(allocator, tmp_path):
    from scheduler_bridge.live import client as jobs_api

    allocator("elastic")
    log = tmp_path / "a.log"
    el = dict(application="bert", max_gpus=8, batch_size=12, max_batch=256)
    a = jobs_api.submit(ENTRY, 8, config={"steps": 60, "step_s": 0.1, "log": str(log)}, **el)
    wait_for(lambda: running(a) and len(job(a)["where"]) == 2 and
             any(r["ev"] == "step" and r["step"] >= 8 for r in read_log(log)), what="A on 8 GPUs")
    others = [jobs_api.submit(ENTRY, 4, config={"steps": 10_000}, **el) for _ in range(2)]
    done = jobs_api.wait_job(a, patience(120))
    for o in others:
        jobs_api.cancel(o)

    assert done["state"] == "done", done["error"]
    assert "resize" in done["requeues"]
    assert [(r["gpus"], len(r["where"])) for r in done["runs"]][:2] == [(8, 2), (4, 1)], done["runs"]
    assert done["runs"][1]["batch_size"] == 256, "bert's best batch (384) clamped to max_batch"
    recs = read_log(log)
    starts = [r for r in recs if r["ev"] == "start"]
    assert [s["gpus"] for s in starts][:2] == [8, 4]
    first_ckpt = max(r["step"] for r in recs if r["ev"] == "ckpt" and r["attempt"] == 1)
    last_step = max(r["step"] for r in recs if r["ev"] == "step" and r["attempt"] == 1)
    assert starts[1]["step"] == first_ckpt == last_step, "resize lost steps beyond the checkpoint"
    steps = [r["step"] for r in recs if r["ev"] == "step"]
    assert steps == list(range(1, 61)), "every step ran exactly once across the resize"


def test_srtf_preempts_a_long_job_which_resumes_from_its_checkpoint(allocator, tmp_path):
    from scheduler_bridge.live import client as jobs_api

    allocator("srtf")
    log = tmp_path / "big.log"
    big = jobs_api.submit(ENTRY, 12, expected_seconds=1000.0,
                          config={"steps": 40, "step_s": 0.1, "every": 100, "log": str(log)})
    wait_for(lambda: any(r["ev"] == "step" and r["step"] >= 8 for r in read_log(log)), what="big running")
    small = jobs_api.submit(ENTRY, 4, expected_seconds=1.0, config={"steps": 5})
    fs, fb = jobs_api.wait_job(small, patience(120)), jobs_api.wait_job(big, patience(120))
    assert fs["state"] == fb["state"] == "done", (fs["error"], fb["error"])
    assert fb["requeues"] == ["preempt"] and fs["requeues"] == []
    recs = read_log(log)
    starts = [r for r in recs if r["ev"] == "start"]
    last_before = max(r["step"] for r in recs if r["ev"] == "step" and r["attempt"] == 1)
    assert len(starts) == 2 and starts[1]["step"] == last_before, \
        "preemption checkpointed on request (no periodic checkpoint here) and resumed there"
    assert [r["step"] for r in recs if r["ev"] == "step"] == list(range(1, 41))


def test_tiresias_preempts_a_demoted_job_for_a_newcomer_and_it_resumes_from_its_checkpoint(
        allocator, tmp_path):
    from scheduler_bridge.live import client as jobs_api

    # 60 GPU-s: 12 GPUs are demoted after 5 s (start-up included), 1 GPU only after a minute
    allocator("tiresias", tiresias={"thresholds": (60.0,)})
    log = tmp_path / "big.log"
    big = jobs_api.submit(ENTRY, 12, expected_seconds=1.0,   # the hint plays no part in Tiresias
                          config={"steps": 80, "step_s": 0.1, "every": 100, "log": str(log)})
    wait_for(lambda: any(r["ev"] == "step" and r["step"] >= 55 for r in read_log(log)),
             what="big past its demotion")
    small = jobs_api.submit(ENTRY, 1, expected_seconds=1e6, config={"steps": 5})
    fs, fb = jobs_api.wait_job(small, patience(120)), jobs_api.wait_job(big, patience(120))
    assert fs["state"] == fb["state"] == "done", (fs["error"], fb["error"])
    assert fb["requeues"] == ["preempt"] and fs["requeues"] == []
    assert fs["first_start"] < fb["finish_t"], "the newcomer ran before the demoted job finished"
    recs = read_log(log)
    starts = [r for r in recs if r["ev"] == "start"]
    last_before = max(r["step"] for r in recs if r["ev"] == "step" and r["attempt"] == 1)
    assert len(starts) == 2 and starts[1]["step"] == last_before, "checkpointed on request, resumed there"
    assert [r["step"] for r in recs if r["ev"] == "step"] == list(range(1, 81))


def test_an_allocator_starts_on_a_damaged_journal_keeps_every_valid_job_and_names_the_damage(
        allocator, tmp_path):
    from scheduler_bridge.live import client as jobs_api
    from scheduler_bridge.live.journal import frame

    good = [frame({"ev": "submit", "t": 1.0, "job_id": i, "request_id": f"r{i}",
                   "spec": {"entrypoint": ENTRY, "gpus": 16, "config": {"steps": 1}}}) for i in range(3)]
    unknown = frame({"ev": "launch", "job_id": 0})
    torn = frame({"ev": "finish", "job_id": 2, "status": "done"})[:-9]
    blob = good[0] + b"\xff\xfegarbage\n" + good[1] + unknown + good[2] + torn
    (tmp_path / "journal.jsonl").write_bytes(blob)
    allocator("fifo")
    st = jobs_api.status()
    problems = st["journal_problems"]
    assert [p.split(": ")[1] for p in problems] == [
        f"corrupt record quarantined at byte offset {len(good[0])} (10 bytes)",
        f"torn tail dropped at byte offset {len(blob) - len(torn)} ({len(torn)} bytes)",
        f"record at byte offset {len(good[0]) + 10 + len(good[1])} skipped"], problems
    assert [(j["job_id"], j["state"]) for j in jobs_api.list_jobs()] == [(0, "queued"), (1, "queued"),
                                                                       (2, "queued")]
    assert jobs_api.submit(ENTRY, 1, config={"steps": 1}, request_id="r1") == 1, "requests dedup after it"


def requested_capacity() -> list[dict]:
    """What ``request_resources`` last asked of the autoscaler, read back where Ray keeps it."""
    from ray.autoscaler._private.constants import AUTOSCALER_RESOURCE_REQUEST_CHANNEL
    from ray.autoscaler.v2.utils import is_autoscaler_v2
    from ray.experimental.internal_kv import _internal_kv_get

    assert not is_autoscaler_v2(), "this cluster runs autoscaler v2: read get_cluster_resource_state"
    raw = _internal_kv_get(AUTOSCALER_RESOURCE_REQUEST_CHANNEL)
    return json.loads(raw) if raw else []


def test_ces_asks_the_autoscaler_to_scale_down_and_boots_for_a_waiting_job_at_once(allocator):
    from scheduler_bridge.live import client as jobs_api

    boot = 30.0
    allocator("ces:fifo", ces={"spare_nodes": 1, "interval": 1.0, "boot_delay": boot,
                               "forecast": {"bin_s": 1.0, "lookback": 2.0, "horizon": 0.0, "days": 0}})
    wait_for(lambda: requested_capacity() == [{"GPU": 4.0}], what="no demand: keep only the spare node")
    assert jobs_api.status()["capacity_request"] == [{"GPU": 4.0}]
    jid = jobs_api.submit(ENTRY, 12, config={"steps": 20, "step_s": 0.1})
    wait_for(lambda: len(requested_capacity()) == 3, timeout=5, what="three nodes asked for the waiting job")
    done = jobs_api.wait_job(jid, patience(120))
    assert done["state"] == "done", done["error"]
    assert done["first_start"] - done["submit_t"] <= boot, "the job waited longer than a node takes to boot"
    wait_for(lambda: requested_capacity() == [{"GPU": 4.0}], timeout=30,
             what="capacity given back once the demand has left the forecast window")


def test_a_restarted_ces_allocator_keeps_the_capacity_its_journaled_demand_history_forecasts(allocator):
    import ray
    from scheduler_bridge.live import client as jobs_api

    actor = allocator("ces:fifo", ces={"spare_nodes": 1, "interval": 1.0,
                                       "forecast": {"bin_s": 1.0, "lookback": 600.0, "horizon": 0.0, "days": 0}})
    jid = jobs_api.submit(ENTRY, 12, config={"steps": 10, "step_s": 0.05})
    assert jobs_api.wait_job(jid, patience(60))["state"] == "done"
    three = [{"GPU": 4.0}] * 3
    assert requested_capacity() == three, "the last 10 minutes needed 12 GPUs: all three nodes stay on"

    ray.kill(actor, no_restart=False)
    wait_for(lambda: jobs_api.status()["restarted"], timeout=60, what="allocator restarted")
    # 30 decisions of the restarted allocator, a tick (0.1 s) apart: three quiet intervals, after
    # which a blind allocator would have asked for one node
    status = wait_for(lambda: (s := jobs_api.status())["ticks"] >= 30 and s, what="30 decisions after the restart")
    assert status["capacity_request"] == three and requested_capacity() == three


def test_an_allocator_releases_at_its_start_the_group_of_an_attempt_no_running_job_holds(allocator):
    """An attempt's end is journaled before its group is released, so an allocator killed between
    the two leaves a group that holds GPUs for no job (here: job 99's). The next allocator removes
    it when it starts; a running job's group is kept (the restart tests)."""
    import ray
    from ray.util.placement_group import placement_group

    leftover = placement_group([{"GPU": 1.0}], name="hpo-job-99-a1", lifetime="detached")
    ray.get(leftover.ready(), timeout=patience(60))
    allocator("fifo")
    wait_for(lambda: pg_by_name("hpo-job-99-a1") is None, what="the leftover group released")


def pg_by_name(name):
    from ray.util.placement_group import placement_group_table

    return next((r for r in placement_group_table().values() if r["name"] == name and r["state"] == "CREATED"),
                None)


def test_lucid_packs_a_waiting_job_into_the_half_gpu_its_host_reserved_and_they_share_that_gpu(
        allocator, tmp_path):
    import ray
    from scheduler_bridge.live import client as jobs_api

    table = tmp_path / "interference.csv"
    table.write_text("# measured for this test\nworkload,partner,alone_steps_s,together_steps_s,slowdown,memory_mb\n"
                     "mlp-small,mlp-small,100,80,1.25,200\n")
    allocator("lucid", lucid={"table": str(table), "gpu_memory_mb": 1000.0, "profile_nodes": 0})
    blockers = [jobs_api.submit(ENTRY, g, config={"steps": 10_000}) for g in (4, 4, 3)]
    logs = {k: tmp_path / f"{k}.log" for k in ("host", "guest")}
    host = jobs_api.submit(ENTRY, 1, workload="mlp-small", config={"steps": 10_000, "log": str(logs["host"])})
    wait_for(lambda: all(running(j) for j in (*blockers, host)), what="the cluster full")
    guest = jobs_api.submit(ENTRY, 1, workload="mlp-small", config={"steps": 10_000, "log": str(logs["guest"])})
    wait_for(lambda: running(guest), what="the waiting job packed")

    assert jobs_api.status()["packed"] == {guest: host}
    node = job(host)["where"][0][0]
    assert job(guest)["where"] == [[node, 1]], "the pair is accounted as one GPU of the host's node"
    group = pg_by_name(f"hpo-job-{host}-a1")
    assert group["bundles"] == {0: {"GPU": 1.0}} and group["bundles_to_node_id"] == {0: node}, group
    assert pg_by_name(f"hpo-job-{guest}-a1") is None and job(guest)["gpu_group"] == [host, 1], \
        "the guest runs in the host's group, on the half of its GPU the host leaves free"
    assert ray.available_resources().get("GPU", 0.0) == 0.0, "4 + 4 + 3 + 1: the pair fills one GPU"
    ids = {k: wait_for(lambda: next((r["gpu_ids"] for r in read_log(p) if r["ev"] == "start"), None),
                       what=f"{k} started") for k, p in logs.items()}
    assert ids["host"] == ids["guest"] and len(ids["host"]) == 1, f"both run on one GPU: {ids}"

    jobs_api.cancel(host)   # the guest stays, in the group, which outlives its host
    assert running(guest) and jobs_api.status()["packed"] == {}
    assert pg_by_name(f"hpo-job-{host}-a1") is not None and ray.available_resources().get("GPU", 0.0) == 0.0
    logs["third"] = tmp_path / "third.log"
    third = jobs_api.submit(ENTRY, 1, workload="mlp-small", config={"steps": 10_000, "log": str(logs["third"])})
    wait_for(lambda: jobs_api.status()["packed"] == {third: guest}, what="the guest, now alone, hosting")
    third_ids = wait_for(lambda: next((r["gpu_ids"] for r in read_log(logs["third"]) if r["ev"] == "start"), None),
                         what="third started")
    assert third_ids == ids["guest"] and job(third)["gpu_group"] == [host, 1], "on the guest's GPU, in its group"
    for j in (*blockers, guest, third):
        jobs_api.cancel(j)
    wait_for(lambda: pg_by_name(f"hpo-job-{host}-a1") is None, what="the group removed with the last job in it")


def test_lucid_packs_a_two_gpu_job_beside_a_two_gpu_host_rank_by_rank_on_the_same_two_gpus(
        allocator, tmp_path):
    import ray
    from scheduler_bridge.live import client as jobs_api

    table = tmp_path / "interference.csv"
    table.write_text("# measured for this test\nworkload,partner,alone_steps_s,together_steps_s,slowdown,memory_mb\n"
                     "mlp-small,mlp-small,100,91,1.1,200\n")
    allocator("lucid", lucid={"table": str(table), "gpu_memory_mb": 1000.0, "profile_nodes": 0})
    blockers = [jobs_api.submit(ENTRY, g, config={"steps": 10_000}) for g in (4, 4, 2)]
    log = tmp_path / "ranks.log"
    cfg = {"steps": 10_000, "log": str(log), "log_ranks": True}
    host = jobs_api.submit(ENTRY, 2, workload="mlp-small", config={**cfg, "tag": "host"})
    wait_for(lambda: all(running(j) for j in (*blockers, host)), what="the cluster full")
    guest = jobs_api.submit(ENTRY, 2, workload="mlp-small", config={**cfg, "tag": "guest"})
    wait_for(lambda: jobs_api.status()["packed"] == {guest: host}, what="the two-GPU job packed")

    node = job(host)["where"][0][0]
    assert job(host)["where"] == job(guest)["where"] == [[node, 2]]
    group = pg_by_name(f"hpo-job-{host}-a1")
    assert group["bundles"] == {0: {"GPU": 1.0}, 1: {"GPU": 1.0}}, group
    assert set(group["bundles_to_node_id"].values()) == {node}
    assert ray.available_resources().get("GPU", 0.0) == 0.0, "4 + 4 + 2 + 2: the pair fills two GPUs"
    starts = wait_for(lambda: (lambda rs: rs if len(rs) == 4 else None)(
        [r for r in read_log(log) if r["ev"] == "start"]), what="both ranks of both jobs started")
    gpu = {(r["tag"], r["rank"]): r["gpu_ids"] for r in starts}
    assert all(r["world"] == 2 for r in starts), starts
    assert gpu[("host", 0)] == gpu[("guest", 0)] and gpu[("host", 1)] == gpu[("guest", 1)], gpu
    assert gpu[("host", 0)] != gpu[("host", 1)], f"each rank on a GPU of its own: {gpu}"
    for j in (*blockers, host, guest):
        jobs_api.cancel(j)


def test_lucid_unpacks_a_partner_whose_measured_slowdown_exceeds_the_table_and_it_resumes_alone(
        allocator, tmp_path):
    from scheduler_bridge.live import client as jobs_api

    table = tmp_path / "interference.csv"     # predicts 1.1x; time-sharing the GPU costs 2x
    table.write_text("# measured for this test\nworkload,partner,alone_steps_s,together_steps_s,slowdown,memory_mb\n"
                     "mlp-small,mlp-small,100,91,1.1,200\n")
    allocator("lucid", lucid={"table": str(table), "gpu_memory_mb": 1000.0, "margin": 0.25, "profile_nodes": 0})
    blockers = [jobs_api.submit(ENTRY, g, config={"steps": 10_000}) for g in (4, 4, 3)]
    logs = {k: tmp_path / f"{k}.log" for k in ("host", "guest")}
    cfg = {"steps": 10_000, "step_s": 0.1, "every": 5, "occupancy": str(tmp_path / "gpus")}
    host = jobs_api.submit(ENTRY, 1, workload="mlp-small", config={**cfg, "log": str(logs["host"])})
    wait_for(lambda: all(running(j) for j in blockers) and (job(host)["progress"] or 0) >= 15 / 10_000,
             what="the cluster full and the host's pace alone reported")
    guest = jobs_api.submit(ENTRY, 1, workload="mlp-small", config={**cfg, "log": str(logs["guest"])})
    wait_for(lambda: jobs_api.status()["packed"] == {guest: host}, what="the waiting job packed")

    parted = wait_for(lambda: job(guest) if job(guest)["requeues"] else None, timeout=60,
                      what="the pair parted on its measured slowdown")
    assert parted["requeues"] == ["interference"] and parted["avoid"] == [host], parted
    assert parted["state"] == "queued" and jobs_api.status()["packed"] == {}
    assert running(host)["attempt"] == 1, "the host keeps running untouched (Lucid never preempts it)"
    seen = jobs_api.status()["ticks"]
    wait_for(lambda: jobs_api.status()["ticks"] >= seen + 10, what="ten decisions with the parted job waiting")
    assert job(guest)["state"] == "queued", "never packed beside that host again"
    stopped_at = max(r["step"] for r in read_log(logs["guest"]) if r["ev"] == "ckpt")

    jobs_api.cancel(blockers[2])                 # a GPU of its own frees up: it resumes there, alone
    wait_for(lambda: running(guest), what="the parted job started alone")
    starts = wait_for(lambda: [r for r in read_log(logs["guest"]) if r["ev"] == "start"][1:],
                      what="the guest's second attempt")
    assert starts[0]["attempt"] == 2 and starts[0]["step"] == stopped_at, "resumed from its checkpoint"
    assert job(guest)["share"] is None and jobs_api.status()["packed"] == {}, "it runs alone"
    for j in (*blockers[:2], host, guest):
        jobs_api.cancel(j)


def test_lucid_profiles_a_job_without_a_workload_alone_on_its_partition_then_packs_it_as_measured(
        allocator, tmp_path):
    from scheduler_bridge.live import client as jobs_api

    table = tmp_path / "interference.csv"
    table.write_text("# measured for this test\nworkload,partner,alone_steps_s,together_steps_s,slowdown,memory_mb\n"
                     "light,light,100,91,1.1,5\nlight,heavy,100,91,1.1,5\nheavy,light,100,91,1.1,400\n"
                     "heavy,heavy,100,67,1.5,400\n")
    # the debugging run (well under a second) teaches the duration model that jobs are short, which
    # puts the newcomer's priority far from its host's: priorities are not what this test is about.
    # The window is not under test, only that the debugging run fits in it: on CI's slow box its
    # five steps once took longer than a fixed 2 s.
    allocator("lucid", lucid={"table": str(table), "gpu_memory_mb": 1000.0, "profile_nodes": 1,
                              "profile_s": patience(3.0), "priority_ratio": 1e9})
    named_logs = [tmp_path / f"named-{g}.log" for g in (4, 3, 1)]
    named = [jobs_api.submit(ENTRY, g, workload="light", config={"steps": 10_000, "log": str(log)})
             for g, log in zip((4, 3, 1), named_logs)]
    host = named[-1]
    # The main partition full, its jobs' code running: the debugging run below must not share a
    # 2-core box with their eight ranks still starting (it once took 37 s for its five steps so).
    wait_for(lambda: all(any(r["ev"] == "start" for r in read_log(log)) for log in named_logs),
             timeout=120, what="the main partition's jobs running")
    partition = jobs_api.status()["nodes"][0]
    assert all(job(j)["where"][0][0] != partition for j in named), "named jobs skip the profiling node"

    logs = {k: tmp_path / f"{k}.log" for k in ("debug", "new")}
    debug = jobs_api.submit(ENTRY, 1, config={"steps": 5, "log": str(logs["debug"])})
    new = jobs_api.submit(ENTRY, 1, config={"steps": 10_000, "step_s": 0.1, "alloc_mb": 300,
                                            "log": str(logs["new"])})
    done = jobs_api.wait_job(debug, patience(60))
    assert done["state"] == "done" and done["requeues"] == [] and done["attempt"] == 1, done
    assert done["runs"][0]["where"] == [[partition, 1]], "a debugging job ends on the profiling node"

    wait_for(lambda: jobs_api.status()["packed"] == {new: host}, what="the profiled job packed by its class")
    profiled = job(new)
    assert profiled["requeues"] == ["profiled"] and profiled["runs"][0]["where"] == [[partition, 1]]
    assert profiled["profiled"]["workload"] == "heavy" and profiled["profiled"]["memory_mb"] >= 250, profiled
    starts = wait_for(lambda: [r for r in read_log(logs["new"]) if r["ev"] == "start"][1:],
                      what="its run on the main partition")
    first_ckpt = max(r["step"] for r in read_log(logs["new"]) if r["ev"] == "ckpt" and r["attempt"] == 1)
    assert starts[0]["attempt"] == 2 and starts[0]["step"] == first_ckpt, "resumed from its profiling run"
    for j in (*named, new):
        jobs_api.cancel(j)


def test_allocator_killed_restarts_from_its_journal_without_losing_or_duplicating_jobs(
        allocator, tmp_path):
    import ray
    from scheduler_bridge.live import client as jobs_api

    actor = allocator("fifo")
    logs = [tmp_path / f"{i}.log" for i in range(4)]
    cfg = [{"steps": 25, "step_s": 0.1, "log": str(p)} for p in logs]
    ids = [jobs_api.submit(ENTRY, g, config=c, request_id=f"req-{i}")
           for i, (g, c) in enumerate(zip([8, 4, 8, 4], cfg))]
    assert jobs_api.submit(ENTRY, 8, config=cfg[0], request_id="req-0") == ids[0], "retried submit"
    wait_for(lambda: running(ids[0]) and running(ids[1]), what="first two jobs running")
    assert job(ids[2])["state"] == "queued"

    ray.kill(actor, no_restart=False)
    wait_for(lambda: jobs_api.status()["restarted"], timeout=60, what="allocator restarted")
    assert jobs_api.submit(ENTRY, 8, config=cfg[0], request_id="req-0") == ids[0], "dedup after restart"
    assert [j["job_id"] for j in jobs_api.list_jobs()] == ids, "jobs lost or duplicated by the restart"

    final = [jobs_api.wait_job(j, patience(120)) for j in ids]
    assert [f["state"] for f in final] == ["done"] * 4, [f["error"] for f in final]
    for jid, f, p in zip(ids, final, logs):
        recs = read_log(p)
        assert sum(r["ev"] == "done" for r in recs) == 1, f"job {jid} finished more than once"
        assert [r["step"] for r in recs if r["ev"] == "step"] == list(range(1, 26))
    assert final[0]["attempt"] == 1 and final[1]["attempt"] == 1, \
        "running jobs survive an allocator restart (reattached, not restarted)"


def test_a_killed_job_actor_goes_back_to_the_queue_resumes_from_its_checkpoint_and_finishes_once(
        allocator, tmp_path):
    import ray
    from scheduler_bridge.live import client as jobs_api, placement_groups as placement

    allocator("fifo")
    log = tmp_path / "k.log"
    jid = jobs_api.submit(ENTRY, 4, config={"steps": 40, "step_s": 0.05, "every": 5, "log": str(log)})
    wait_for(lambda: (job(jid)["progress"] or 0.0) >= 10 / 40,
             what="the allocator told of the job's second checkpoint")
    rank0 = placement.rank_name(placement.group_name(jid, job(jid)["attempt"]), 0)
    ray.kill(ray.get_actor(rank0, namespace=placement.NAMESPACE), no_restart=True)

    final = jobs_api.wait_job(jid, patience(60))
    assert final["state"] == "done", final["error"]
    assert final["requeues"] == ["fault"] and final["attempt"] == 2, (final["requeues"], final["attempt"])
    recs = read_log(log)
    ckpt = max(r["step"] for r in recs if r["ev"] == "ckpt" and r["attempt"] == 1)
    starts = [r for r in recs if r["ev"] == "start"]
    assert [(s["attempt"], s["step"]) for s in starts] == [(1, 0), (2, ckpt)], \
        f"the relaunch resumed from the last checkpoint (step {ckpt}): {starts}"
    killed_at = max(r["step"] for r in recs if r["ev"] == "step" and r["attempt"] == 1)
    redone = [r["step"] for r in recs if r["ev"] == "step" and r["attempt"] == 2 and r["step"] <= killed_at]
    assert redone == list(range(ckpt + 1, killed_at + 1)), "only the steps after the checkpoint ran again"
    assert sorted({r["step"] for r in recs if r["ev"] == "step"}) == list(range(1, 41))
    assert sum(r["ev"] == "done" for r in recs) == 1, "the job finished exactly once"


def test_a_sweep_trains_on_idle_gpu_hosts_then_in_granted_bubbles_until_reclaimed(allocator):
    import ray

    from examples.mlp_digits import workload as digits
    from pipeline_bubble.bubble_pool import bubble_group_launcher, bubble_pool
    from scheduler_bridge.live import client as jobs_api

    allocator("tuning-aware", base_policy="fifo")
    sweep = jobs_api.submit_sweep("lr_sweep", groups=2)
    quotas = lambda: ray.get(bubble_pool().state.remote())["quotas"].get("lr_sweep")
    hosts = [f"gpu:{sweep}:{g}" for g in range(2)]
    wait_for(lambda: quotas() == {host: 1 for host in hosts}, what="both groups on idle GPUs, one host each")
    on_gpus = {w[1] for w in job(sweep)["guests"].values()}
    for host in hosts:  # each host holds its GPU on the node the policy chose
        actor = wait_for(lambda: _named(f"hpo:{host}"), what=f"{host} started")
        assert ray.get(actor.node_id.remote()) in on_gpus

    group = bubble_group_launcher("lr_sweep", digits, 1)([{"lr": 1e-2, "width": 16}], ["trial"], [None])
    result = ray.get(group.fetch.remote("trial", 1), timeout=patience(60))  # the member trial's first iteration
    assert result["metrics"]["step"] == digits.steps_per_iteration, "a host trained the group"

    pipe = jobs_api.submit("test_allocator_live:pipeline_owner", 12, bubble_fraction=0.3,
                           config={"steps": 60, "reclaim_at": 30})
    wait_for(lambda: quotas() == {pipe: 2}, what="GPU hosts evicted for the job, the groups in its bubbles")
    wait_for(lambda: not any(_named(f"hpo:{host}") for host in hosts), what="GPU hosts gone")
    wait_for(lambda: quotas() == {}, what="the grant withdrawn when the owner reclaims its memory")
    jobs_api.cancel(sweep)
    assert jobs_api.wait_job(pipe, patience(60))["state"] == "done"
    ray.kill(group)


def _named(name: str):
    import ray

    try:
        return ray.get_actor(name, namespace="hpo")
    except ValueError:
        return None


def test_job_cli_starts_the_allocator_submits_lists_and_cancels(cluster, tmp_path, capsys):
    from scheduler_bridge.live import client as jobs_api
    from scheduler_bridge.live.cli import main

    c, _ = cluster
    base = ["--address", c.address]
    assert main(["job", "start", "--journal", str(tmp_path / "j.jsonl"), "--storage",
                 str(tmp_path / "ckpt"), "--policy", "sjf", *base]) == 0
    try:
        capsys.readouterr()
        assert main(["job", "submit", ENTRY, "--gpus", "2", "--set", "steps=10000",
                     "--name", "cli-job", *base]) == 0
        jid = int(capsys.readouterr().out.strip())
        wait_for(lambda: running(jid), what="CLI job running")
        assert main(["job", "list", "--json", *base]) == 0
        listed = json.loads(capsys.readouterr().out)
        assert [(j["job_id"], j["name"], j["state"]) for j in listed] == [(jid, "cli-job", "running")]
        assert main(["job", "cancel", str(jid), *base]) == 0
        assert job(jid)["state"] == "cancelled"
        assert main(["job", "submit", "nomodule", *base]) == 2
    finally:
        assert main(["job", "stop", *base]) == 0
    with pytest.raises(ValueError, match="no allocator running"):
        jobs_api.get_allocator()


def test_job_cli_with_an_explicit_address_uses_the_clusters_token_without_ray_auth_mode(
        cluster, allocator):
    import os

    c, _ = cluster
    allocator("fifo")
    env = {k: v for k, v in os.environ.items() if k != "RAY_AUTH_MODE"}   # the README's client
    repo = Path(__file__).resolve().parents[1]
    env["PYTHONPATH"] = f"{repo}:{repo / 'tests'}"
    out = subprocess.run([sys.executable, "-m", "scheduler_bridge.live.cli", "job", "list", "--json",
                          "--address", c.address], env=env, capture_output=True, text=True, timeout=patience(120))
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout) == []


def test_node_removed_jobs_go_back_to_the_queue_and_resume_from_checkpoint(
        cluster, allocator, tmp_path):
    from scheduler_bridge.live import client as jobs_api

    c, workers = cluster
    allocator("fifo")
    log_a, log_b = tmp_path / "a.log", tmp_path / "b.log"
    a = jobs_api.submit(ENTRY, 4, config={"steps": 40, "step_s": 0.1, "every": 5, "log": str(log_a)})
    b = jobs_api.submit(ENTRY, 4, config={"steps": 60, "step_s": 0.1, "log": str(log_b)})
    wait_for(lambda: running(a) and running(b), what="both jobs running")
    node_a, node_b = job(a)["where"][0][0], job(b)["where"][0][0]
    assert node_a != node_b, "best fit puts two 4-GPU jobs on two nodes"
    wait_for(lambda: any(r["ev"] == "step" and r["step"] >= 12 for r in read_log(log_a)),
             what="job A past its second checkpoint")
    c.remove_node(next(w for w in workers if w.node_id == node_a))

    fa, fb = jobs_api.wait_job(a, patience(120)), jobs_api.wait_job(b, patience(120))
    assert fa["state"] == fb["state"] == "done", (fa["error"], fb["error"])
    assert fa["requeues"] and fa["requeues"][0] in ("node-lost", "fault"), fa["requeues"]
    assert fa["runs"][-1]["where"][0][0] != node_a, "A restarted on a live node"
    assert fb["requeues"] == [], "B's node stayed up: B was not touched"
    recs = read_log(log_a)
    ckpt = max(r["step"] for r in recs if r["ev"] == "ckpt" and r["attempt"] == 1)
    starts = [r for r in recs if r["ev"] == "start"]
    assert len(starts) == 2 and starts[1]["step"] == ckpt, f"A resumed from its last checkpoint {ckpt}: {starts}, {fa}"
    assert sorted({r["step"] for r in recs if r["ev"] == "step"}) == list(range(1, 41))
    assert sum(r["ev"] == "done" for r in recs) == 1
