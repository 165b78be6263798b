"""Fault tier: a node lost in the middle of a sweep, on a real multi-node Ray (`ray.cluster_utils.Cluster`).

The head holds no CPU; two nodes of one CPU each train the sweep's trials (or fused groups), one
on each. Once a trial on the first node has trained past its first checkpoint, that node is
removed without warning (its raylet and workers killed), and the sweep goes on on the other node.
Every configuration ends exactly once in results.csv, completed, and each trial that was on the
lost node trains again at most `checkpoint.every` iterations.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pandas as pd
import pytest
from ray import tune

import hpo
from examples.mlp_digits import DigitsMLP
from patience import patience
from ray_cluster import ensure_ray_token

pytestmark = pytest.mark.slow  # a multi-node Ray cluster for the module

ITERATIONS = 5
EVERY = 2
LRS = [1e-3, 3e-3, 1e-2, 3e-2]


class NodeLoggedDigits(DigitsMLP):
    """The digits MLP, slowed so that a node can be removed mid-trial, logging each batch it trains
    with the node it trains on (`markers/<node id>`, one line per batch: lr and batch index)."""

    name = "node_logged_digits"

    def __init__(self, markers: str):
        self.markers = markers

    def train_batches(self, config, seed):
        import ray

        node = ray.get_runtime_context().get_node_id()
        for index, batch in enumerate(super().train_batches(config, seed)):
            with open(Path(self.markers, node), "a") as log:
                log.write(f"{config['lr']} {index}\n")
            time.sleep(0.02)
            yield batch


@pytest.fixture(scope="module")
def cluster():
    import ray
    from ray.cluster_utils import Cluster

    ensure_ray_token()
    repo = Path(__file__).resolve().parents[1]
    if ray.is_initialized():  # the shared test Ray of an earlier module
        ray.shutdown()
    small = dict(object_store_memory=80 * 1024**2)
    c = Cluster(initialize_head=True, head_node_args=dict(num_cpus=0, include_dashboard=False, **small))
    survivor = c.add_node(num_cpus=1, **small)
    ray.init(address=c.address, namespace="hpo", log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": f"{repo / 'tests'}:{repo}"}})
    yield c, small
    ray.shutdown()
    c.shutdown()
    del survivor


def lose_a_node_mid_sweep(cluster, tmp_path: Path, fusion: hpo.FusionConfig | None) -> hpo.SweepResult:
    """Run the sweep on the survivor and a node added for it; remove that node once one of its
    trials has trained past its first checkpoint; return the sweep's result."""
    c, small = cluster
    doomed = c.add_node(num_cpus=1, **small)
    c.wait_for_nodes()
    markers = tmp_path / "markers"
    markers.mkdir()
    outcome: dict = {}

    def sweep() -> None:
        try:
            outcome["result"] = hpo.run(
                NodeLoggedDigits(str(markers)), config={"lr": tune.grid_search(LRS), "width": 16, "seed": 0},
                metric="val_loss", mode="min", stop={"training_iteration": ITERATIONS}, storage_path=str(tmp_path),
                name="lost_node", max_failures=2, fusion=fusion, checkpoint={"every": EVERY},
            )
        except BaseException as error:  # noqa: BLE001  (re-raised in the test's thread)
            outcome["error"] = error

    runner = threading.Thread(target=sweep)
    runner.start()
    past_first_checkpoint = (EVERY + 1) * DigitsMLP.steps_per_iteration
    log = markers / doomed.node_id
    deadline = time.monotonic() + patience(300)
    while not (log.exists() and max(int(line.split()[1]) for line in log.read_text().split("\n") if line) >= past_first_checkpoint):
        assert runner.is_alive() and time.monotonic() < deadline, outcome or "no trial got past its first checkpoint"
        time.sleep(0.05)
    c.remove_node(doomed, allow_graceful=False)
    runner.join(timeout=patience(600))
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]


def assert_every_configuration_ended_once(experiment: Path) -> None:
    rows = pd.read_csv(experiment / "results.csv")
    assert sorted(rows["config/lr"]) == LRS, "every configuration has exactly one row"
    assert (rows["status"] == "completed").all() and (rows["iterations"] == ITERATIONS).all(), \
        rows[["config/lr", "status", "iterations"]]


def assert_restarts_redo_at_most_every(reported: list[int], what: str) -> None:
    restarts = [(before, after) for before, after in zip(reported, reported[1:]) if after <= before]
    for before, after in restarts:
        assert before - (after - 1) <= EVERY, f"{what} trained {before - after + 1} iterations again: {reported}"


def test_an_unfused_sweep_that_loses_a_node_ends_every_configuration_once(cluster, tmp_path):
    result = lose_a_node_mid_sweep(cluster, tmp_path, fusion=None)
    assert_every_configuration_ended_once(tmp_path / "lost_node")
    histories = [list(trial.metrics_dataframe["training_iteration"]) for trial in result]
    assert any(h != sorted(set(h)) for h in histories), f"a trial on the lost node was restarted: {histories}"
    for history in histories:
        assert_restarts_redo_at_most_every(history, "a trial")


def test_a_fused_sweep_that_loses_a_node_ends_every_configuration_once(cluster, tmp_path):
    result = lose_a_node_mid_sweep(cluster, tmp_path, fusion=hpo.FusionConfig(max_members=2))
    assert_every_configuration_ended_once(tmp_path / "lost_node")
    groups = [list(group.metrics_dataframe["training_iteration"]) for group in result.result_grid]
    assert any(h != sorted(set(h)) for h in groups), f"a group on the lost node was restarted: {groups}"
    for history in groups:
        assert_restarts_redo_at_most_every(history, "a group")
    for member in result:
        assert list(member.metrics_dataframe["training_iteration"]) == list(range(1, ITERATIONS + 1)), \
            "a member's own history holds each iteration once"
    json.loads((tmp_path / "lost_node" / "summary.json").read_text())  # whole, not torn
