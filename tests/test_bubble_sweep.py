"""A sweep with `fusion.placement: bubbles` trains its trials inside a live DeepSpeed pipeline job.

The module runs a real 2-stage DeepSpeed pipeline job (gloo, CPU) as two Ray actors, each rank
lending its bubbles with `pipeline_bubble.lend_bubbles`, while Tune sweeps over four learning
rates queue fused groups of two for them: first an unmanaged sweep (any lending stage), then
`hpo run --allocator`, whose groups go only where the allocator grants bubbles. The job keeps
training in chunks of batches throughout.
"""

from __future__ import annotations

import math
import os
import textwrap
import threading
import time

import pandas as pd
import pytest
import ray
from ray import tune

from patience import patience

import hpo
from hpo.examples.mlp_digits import workload as digits
from hpo.base.training import TrialTrainer
from benchmarks.bubble_ab import ABSpec
from pipeline_bubble.launch import free_port

pytestmark = [pytest.mark.usefixtures("ray_local"), pytest.mark.slow]  # a DeepSpeed job on a real Ray

LRS = [3e-3, 1e-2, 3e-2, 1e-1]
#: What the sweeps train. Groups progress only a few guest steps per batch of the main job, so
#: the sweeps' time is nearly all bubble time: one iteration (22 steps) per trial shows every
#: property they are for, at half the cost of two.
SWEEP_ITERATIONS = 1
#: The resumed group below needs a second iteration to resume into.
ITERATIONS = 2
#: Groups only progress in bubbles: should a host ever offer none, the sweeps end (and the tests
#: fail) instead of waiting forever.
TIME_BUDGET_S = 300


@ray.remote(num_cpus=0.5)
class PipelineRank:
    """One rank of the main job: a DeepSpeed pipeline stage that lends its bubbles."""

    def __init__(self, rank: int, world_size: int, port: int):
        os.environ.update(
            RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world_size),
            MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
        )
        import torch

        torch.set_num_threads(1)

    def start(self, spec: ABSpec) -> int:
        """Initialise DeepSpeed and lend this stage's bubbles to any sweep."""
        import deepspeed

        from benchmarks.bubble_ab import build_engine, main_job_batches
        from pipeline_bubble.lending import lend_bubbles

        deepspeed.init_distributed(dist_backend="gloo")
        self.engine = build_engine(spec)
        self.lender = lend_bubbles(self.engine)  # the one call the job makes
        self.data = main_job_batches(spec, self.engine.device)
        self.losses: list[float] = []
        self.groups = 0
        return self.engine.stage_id

    def lend_as(self, owner: int) -> None:
        """Lend again as the allocator's job `owner`, so the allocator decides who uses the bubbles."""
        from pipeline_bubble.lending import lend_bubbles

        self.lender.close()
        self.groups += self.lender.groups_taken - self.lender.groups_given_back
        self.lender = lend_bubbles(self.engine, owner=owner)

    def train(self, batches: int) -> None:
        for _ in range(batches):
            self.losses.append(float(self.engine.train_batch(self.data)))

    def stats(self) -> dict:
        executor = self.engine.bubble_executor
        # A group a stage gave back unfinished (one whose steps fit none of its windows) ended on another.
        groups = self.groups + self.lender.groups_taken - self.lender.groups_given_back
        return {"losses": self.losses, "groups": groups, "guest_steps": executor.stats.steps}

    def finish(self) -> None:
        """The job is done lending: an unfinished group goes back, the stage leaves the pool."""
        self.lender.close()


#: Held while a call goes to both ranks of the main job, so that no batch starts on one rank
#: between the two.
BOTH_RANKS = threading.Lock()


def hold_gpus(ctx) -> None:
    """The allocator's record of the pipeline job above: holds its GPUs until cancelled."""
    while not ctx.should_stop():
        time.sleep(0.1)


@pytest.fixture(scope="module", autouse=True)
def pool_ends_with_the_module(ray_local):
    """The bubble pool is detached (the cluster's, outliving any one sweep or job): the module
    ends it, so that the shared Ray's next module starts without it."""
    yield
    from pipeline_bubble.bubble_pool import bubble_pool

    ray.kill(bubble_pool())


@pytest.fixture(scope="module")
def pipeline_job():
    """The main job's two ranks, training in the background until the module's tests are done."""
    port = free_port()
    ranks = [PipelineRank.remote(r, 2, port) for r in range(2)]
    ray.get([rank.start.remote(ABSpec(stages=2, micro_batches=4, width=1024)) for rank in ranks])
    done = threading.Event()

    def drive_main_job() -> None:
        # A batch per call: a rank runs one call at a time, so each of the tests' calls to it
        # (stats, lend_as, finish) waited for the chunk in progress, as the module's end did.
        while not done.is_set():
            with BOTH_RANKS:
                batch = [rank.train.remote(1) for rank in ranks]
            ray.get(batch)

    driver = threading.Thread(target=drive_main_job, daemon=True)
    driver.start()
    yield ranks
    done.set()
    driver.join(timeout=patience(120))
    for rank in ranks:  # now, not when garbage collection gets to them: the shared Ray's check waits for their CPUs
        ray.kill(rank)


@pytest.fixture(scope="module")
def bubble_sweep(pipeline_job, tmp_path_factory):
    result = hpo.run(
        digits,
        config={"lr": tune.grid_search(LRS), "width": 16, "seed": 3},
        metric="val_loss",
        mode="min",
        stop={"training_iteration": SWEEP_ITERATIONS},
        storage_path=str(tmp_path_factory.mktemp("runs")),
        name="in_bubbles",
        fusion=hpo.FusionConfig(placement="bubbles", max_members=2),
        time_budget_s=TIME_BUDGET_S,
    )
    return result, pipeline_job


def test_a_bubble_sweep_on_a_ray_where_no_stage_lends_says_so_when_it_starts(tmp_path, capsys):
    """Before any pipeline job lends its bubbles (here: before the module's job starts), a sweep's
    groups can only wait: it says so at once instead of waiting in silence until its trials end
    without a result."""
    from hpo.engines.bubbles.engine import NO_LENDING_STAGE
    from pipeline_bubble.bubble_pool import lending_stages

    assert lending_stages() == 0
    result = hpo.run(digits, config={"lr": 1e-2, "width": 16, "seed": 3}, metric="val_loss", mode="min",
                     stop={"training_iteration": 1}, storage_path=str(tmp_path), name="no_lender",
                     fusion=hpo.FusionConfig(placement="bubbles", max_members=1), time_budget_s=3)
    assert NO_LENDING_STAGE in capsys.readouterr().out
    assert result.get_dataframe()["iterations"].tolist() == [0]


def test_every_trial_is_reported_after_training_in_the_bubbles(bubble_sweep):
    result, ranks = bubble_sweep
    job = ray.get([rank.stats.remote() for rank in ranks])
    frame = result.get_dataframe()
    assert sorted(frame["config/lr"]) == LRS
    assert (frame["iterations"] == SWEEP_ITERATIONS).all() and (frame["status"] == "completed").all(), frame
    assert all(r.metrics["fused_members"] == 2 and r.checkpoint is not None for r in result.result_grid)
    assert sum(stage["groups"] for stage in job) == 2, "two groups of two, each trained to its end by a stage"
    assert sum(stage["guest_steps"] for stage in job) > 0, "some steps ran inside bubbles"


def test_bubble_trained_trials_match_training_each_config_alone(bubble_sweep):
    result, _ = bubble_sweep
    for trial in result.result_grid:
        alone = TrialTrainer(digits, {"lr": trial.config["lr"], "width": 16, "seed": 3})
        for _ in range(SWEEP_ITERATIONS):
            alone.train_iteration()
        expected = alone.evaluate()["val_loss"]
        assert math.isclose(trial.metrics["val_loss"], expected, rel_tol=1e-4), (trial.config, expected)


def test_hpo_run_via_the_allocator_trains_only_in_the_bubbles_it_granted(pipeline_job, tmp_path):
    from hpo.cli import main
    from pipeline_bubble.bubble_pool import bubble_pool
    from scheduler_bridge.live import client as jobs_api

    jobs_api.start_allocator(str(tmp_path / "journal.jsonl"), str(tmp_path / "ckpt"), "tuning-aware", tick_s=0.1)
    try:
        owner = jobs_api.submit("test_bubble_sweep:hold_gpus", 4, bubble_fraction=0.2)  # no GPU left idle
        ray.get([rank.lend_as.remote(owner) for rank in pipeline_job])  # its stages lend as that job
        groups_before = sum(stage["groups"] for stage in ray.get([rank.stats.remote() for rank in pipeline_job]))
        sweep = tmp_path / "granted.yaml"
        sweep.write_text(textwrap.dedent(f"""
            name: granted
            trainable: mlp_digits
            method: grid
            metric: {{name: val_loss, goal: minimize}}
            parameters:
              lr: {{values: {LRS}}}
              width: {{value: 16}}
            max_iterations: {SWEEP_ITERATIONS}
            max_concurrent_trials: 4
            time_budget_s: {TIME_BUDGET_S}
            storage_path: {tmp_path / "runs"}
            fusion: {{placement: bubbles, max_members: 2}}
        """))
        assert main(["run", "--allocator", str(sweep)]) == 0
        rows = pd.read_csv(tmp_path / "runs" / "granted" / "results.csv")
        assert len(rows) == 4 and (rows["status"] == "completed").all(), rows
        taken = sum(stage["groups"] for stage in ray.get([rank.stats.remote() for rank in pipeline_job]))
        assert taken - groups_before == 2, "both groups ran in the granted job's bubbles"
        tuning = [j for j in jobs_api.list_jobs() if j.get("name") == "granted"]
        assert [j["state"] for j in tuning] == ["cancelled"], "the sweep's tuning job ended with the sweep"
        deadline = time.monotonic() + patience(30)
        while ray.get(bubble_pool().state.remote())["quotas"]["granted"] != {}:
            assert time.monotonic() < deadline, "the allocator withdraws the ended sweep's bubbles"
            time.sleep(0.2)
    finally:
        jobs_api.stop_allocator()


def test_a_config_whose_model_cannot_be_built_fails_its_trial_and_never_the_main_job(pipeline_job, tmp_path):
    """`dropout: 1.5` makes the digits MLP raise where a stage builds the group, inside the main
    job's `train_batch`: that trial fails with the reason, the others train to their end, and the
    main job trains on as if no sweep had come."""
    with BOTH_RANKS:
        before = [len(stage["losses"]) for stage in ray.get([rank.stats.remote() for rank in pipeline_job])]
    result = hpo.run(
        digits,
        config={"lr": 1e-2, "width": 16, "seed": 3, "dropout": tune.grid_search([0.0, 1.5])},
        metric="val_loss",
        mode="min",
        stop={"training_iteration": SWEEP_ITERATIONS},
        storage_path=str(tmp_path / "runs"),
        name="unbuildable",
        fusion=hpo.FusionConfig(placement="bubbles", max_members=1),
        time_budget_s=TIME_BUDGET_S,
    )
    rows = pd.read_csv(tmp_path / "runs" / "unbuildable" / "results.csv").set_index("config/dropout")
    assert rows.loc[0.0, "status"] == "completed" and rows.loc[0.0, "iterations"] == SWEEP_ITERATIONS, rows
    assert rows.loc[1.5, "status"] == "error" and "dropout probability has to be between 0 and 1" in rows.loc[1.5, "error"]
    assert len(result.errors) == 1
    with BOTH_RANKS:
        job = ray.get([rank.stats.remote() for rank in pipeline_job])
    assert all(len(stage["losses"]) > trained for stage, trained in zip(job, before)), "the main job went on"
    assert all(math.isfinite(loss) for loss in job[-1]["losses"])


def test_the_main_job_kept_training_and_gave_the_pool_its_stages_back(pipeline_job):
    from pipeline_bubble.bubble_pool import bubble_pool

    with BOTH_RANKS:
        stats = [rank.stats.remote() for rank in pipeline_job]
    job = ray.get(stats)
    assert len(job[0]["losses"]) == len(job[1]["losses"]) > 0
    assert all(math.isfinite(loss) for loss in job[-1]["losses"])
    ray.get([rank.finish.remote() for rank in pipeline_job])
    assert ray.get(bubble_pool().state.remote())["hosts"] == {}


def test_an_evicted_group_resumes_on_another_stage_from_its_last_published_iteration():
    from pipeline_bubble.bubble_pool import bubble_group_launcher, bubble_pool
    from pipeline_bubble.sweep_guest import SweepGroupGuest

    import torch

    configs = [{"lr": 1e-2, "width": 16, "seed": 3}, {"lr": 3e-2, "width": 16, "seed": 3}]
    members = ["a", "b"]
    pool = bubble_pool()
    for host in ("stage-x", "stage-y"):
        ray.get(pool.register.remote(host))
    group = bubble_group_launcher("evicted", digits, ITERATIONS)(configs, members, [None, None])

    def take(host: str) -> SweepGroupGuest:
        taken = ray.get(pool.take.remote(host))
        closed = lambda g, unfinished: pool.give_back.remote(host, g) if unfinished else pool.done.remote(host)
        return SweepGroupGuest(taken, ray.get(taken.assignment.remote()), torch.device("cpu"), closed)

    def step_when_ready(guest: SweepGroupGuest) -> None:
        while not guest.ready():
            time.sleep(0.01)
        guest.step()

    first = take("stage-x")
    fetched = [group.fetch.remote(m, 1) for m in members]  # the member trials wait for iteration 1
    while first.trainer.iteration < 1:
        step_when_ready(first)
    iteration_one = ray.get(fetched)
    for _ in range(5):  # part of iteration 2, then the owner evicts the guest
        step_when_ready(first)
    first.close(None)
    assert ray.get(pool.state.remote())["waiting"] == 1, "the unfinished group is back in the pool"

    second = take("stage-y")
    assert second.trainer.iteration == 1 and second.trainer.step == first.trainer.steps_per_iteration
    fetched = [group.fetch.remote(m, 2) for m in members]
    while not second.finished:
        if second.ready():
            second.step()
    second.close(None)
    for member, config, first_result, result in zip(members, configs, iteration_one, ray.get(fetched)):
        alone = TrialTrainer(digits, config)
        assert math.isclose(first_result["metrics"]["val_loss"], alone.train_iteration()["val_loss"], rel_tol=1e-4)
        assert math.isclose(result["metrics"]["val_loss"], alone.train_iteration()["val_loss"], rel_tol=1e-4), member
    for host in ("stage-x", "stage-y"):
        ray.get(pool.unregister.remote(host))


def test_a_managed_sweep_runs_only_in_granted_bubbles_and_yields_when_the_grant_moves():
    from pipeline_bubble.bubble_pool import bubble_group_launcher, bubble_pool

    pool = bubble_pool()
    hosts = {"job7-stage0": 7, "job8-stage0": 8, "unmanaged-stage": None}
    for host, owner in hosts.items():
        ray.get(pool.register.remote(host, owner))
    ray.get(pool.set_quotas.remote("managed", {7: 1}))  # the allocator put one group in job 7's bubbles
    group = bubble_group_launcher("managed", digits, ITERATIONS)([{"lr": 1e-2, "width": 16}], ["m"], [None])

    same = lambda taken: taken is not None and taken._actor_id == group._actor_id
    assert ray.get(pool.take.remote("unmanaged-stage")) is None, "a managed sweep only goes where it was granted"
    assert ray.get(pool.take.remote("job8-stage0")) is None
    assert same(ray.get(pool.take.remote("job7-stage0")))
    assert not ray.get(pool.should_yield.remote("job7-stage0"))

    ray.get(pool.set_quotas.remote("managed", {8: 1}))  # job 7 reclaimed its memory; the group moves to job 8
    assert ray.get(pool.should_yield.remote("job7-stage0"))
    ray.get(pool.give_back.remote("job7-stage0", group))
    assert ray.get(pool.take.remote("job7-stage0")) is None
    assert same(ray.get(pool.take.remote("job8-stage0")))

    ray.get(pool.done.remote("job8-stage0"))
    ray.get(pool.set_quotas.remote("managed", None))
    for host in hosts:
        ray.get(pool.unregister.remote(host))
    ray.kill(group)


def test_a_lending_stage_gives_its_group_back_once_its_grant_is_withdrawn():
    from types import SimpleNamespace

    import torch

    from pipeline_bubble.bubble_pool import bubble_group_launcher, bubble_pool
    from pipeline_bubble.executor import BubbleExecutor
    from pipeline_bubble.lending import BubbleLender

    pool = bubble_pool()
    ray.get(pool.set_quotas.remote("withdrawn", {5: 1}))
    group = bubble_group_launcher("withdrawn", digits, ITERATIONS)([{"lr": 1e-2, "width": 16}], ["m"], [None])
    stage = SimpleNamespace(stage_id=0, device=torch.device("cpu"))  # the attributes a lender reads
    lender = BubbleLender(stage, poll_interval_s=0.0, owner=5)
    stage.bubble_executor = executor = BubbleExecutor(None, profile_steps=2, guest_source=lender.next_guest)
    executor.start(stage.device)
    deadline = time.monotonic() + patience(30)
    while not executor.stats.losses:  # between batches the stage takes the group and profiles its step
        assert time.monotonic() < deadline, "the granted stage takes the group"
        executor.end_batch()

    ray.get(pool.set_quotas.remote("withdrawn", {}))  # the owner reclaimed its memory
    while executor.guest.ready():  # asked before every guest step
        assert time.monotonic() < deadline, "the stage hears of the withdrawal"
    executor.end_batch()
    assert executor.guest is None and lender.groups_yielded == 1
    assert ray.get(pool.state.remote())["waiting"] == 1, "the group waits for another stage"
    lender.close()
    ray.get(pool.set_quotas.remote("withdrawn", None))
    ray.get(pool.end_sweep.remote("withdrawn"))
    ray.kill(group)


def test_a_sweep_that_ends_takes_its_groups_out_of_the_pool_wherever_they_are():
    from hpo.engines.bubbles.relay_trial import FusionCallback
    from pipeline_bubble.bubble_pool import bubble_pool

    pool = bubble_pool()
    waiting = ray.get(pool.state.remote())["waiting"]
    for host in ("stage-a", "stage-b"):
        ray.get(pool.register.remote(host))
    for group in ("trained-on-a", "trained-on-b", "in-line"):  # the pool never calls a group: any value stands for one
        ray.get(pool.submit.remote(group, "ended"))
    assert [ray.get(pool.take.remote(host)) for host in ("stage-a", "stage-b")] == ["trained-on-a", "trained-on-b"]

    FusionCallback("ended").on_experiment_end(trials=[])  # Tune ended the sweep (its time budget, say)
    assert ray.get(pool.state.remote())["waiting"] == waiting, "the group in line left it"
    assert ray.get(pool.should_yield.remote("stage-a")) and ray.get(pool.should_yield.remote("stage-b"))
    ray.get(pool.give_back.remote("stage-a", "trained-on-a"))  # the stage yields it, unfinished
    ray.get(pool.unregister.remote("stage-b"))  # the job of the other stage ended
    assert ray.get(pool.state.remote())["waiting"] == waiting, "neither went back in line for the next sweep"
    ray.get(pool.unregister.remote("stage-a"))


def test_a_group_its_broker_submits_after_the_sweep_ended_waits_for_no_stage():
    # a broker submits without waiting, and Tune's end of the sweep reaches the pool from the
    # driver: a group launched as a short sweep ended (its time budget) arrived after the end, and
    # the next pipeline job took it, found its actor gone, and counted a group it never trained
    from hpo.engines.bubbles.relay_trial import FusionCallback
    from pipeline_bubble.bubble_pool import bubble_pool

    pool = bubble_pool()
    waiting = ray.get(pool.state.remote())["waiting"]
    FusionCallback("late", "run-1").on_experiment_end(trials=[])
    ray.get(pool.submit.remote("launched-as-it-ended", "late", "run-1"))
    assert ray.get(pool.state.remote())["waiting"] == waiting, "a group of an ended run waits for no stage"
    ray.get(pool.submit.remote("resumed", "late", "run-2"))  # the same sweep resumed: a new run, same name
    assert ray.get(pool.state.remote())["waiting"] == waiting + 1
    ray.get(pool.end_sweep.remote("late", "run-2"))
    assert ray.get(pool.state.remote())["waiting"] == waiting
