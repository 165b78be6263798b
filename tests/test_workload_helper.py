"""`DatasetWorkload`: a model factory, a Dataset (or DataLoader) and a loss make a Workload that
sweeps plain and fused alike, without a line of batch-generator code."""

from __future__ import annotations

import itertools
import re

import pytest
import torch
from ray import tune
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset, TensorDataset

import hpo
from hpo.base.training import TrialTrainer
from hpo.base.workload import DatasetWorkload

LRS = [3e-3, 3e-2]


def two_blobs(n: int, seed: int) -> TensorDataset:
    """Two Gaussian classes in 8 dimensions: small data the test makes itself."""
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 2, (n,), generator=generator)
    points = torch.randn(n, 8, generator=generator) + labels[:, None].float() * 1.5
    return TensorDataset(points, labels)


def mlp(config):
    return nn.Sequential(nn.Linear(8, config["width"]), nn.ReLU(), nn.Linear(config["width"], 2))


def accuracy(output, target):
    return (output.argmax(dim=-1) == target).float().mean()


def blobs_workload(train=None) -> DatasetWorkload:
    return DatasetWorkload(
        model=mlp,
        train=train if train is not None else two_blobs(256, seed=0),
        val=two_blobs(128, seed=1),
        loss=F.cross_entropy,
        metrics={"accuracy": accuracy},
        defaults={"width": 16, "batch_size": 32},
        name="blobs",
    )


def first_batches(workload, config, seed, count=10):
    return list(itertools.islice(workload.train_batches(workload.resolve(config), seed), count))


def test_the_batch_stream_is_a_function_of_the_data_seed_and_batch_size_and_runs_past_an_epoch():
    workload = blobs_workload()
    again = first_batches(workload, {}, seed=5)
    assert len(again) == 10, "256 items in batches of 32 are 8 per epoch; the stream goes on"
    for (x, y), (x2, y2) in zip(again, first_batches(workload, {}, seed=5)):
        assert torch.equal(x, x2) and torch.equal(y, y2)
    assert not torch.equal(again[0][0], first_batches(workload, {}, seed=6)[0][0])
    assert first_batches(workload, {"batch_size": 64}, seed=5)[0][0].shape == (64, 8)


def test_a_users_dataloader_is_reshuffled_by_the_data_seed_without_touching_the_trainers_rng():
    workload = blobs_workload(train=DataLoader(two_blobs(256, seed=0), batch_size=32, shuffle=True))
    torch.manual_seed(123)
    before = torch.get_rng_state()
    seeded = first_batches(workload, {}, seed=5)
    assert torch.equal(torch.get_rng_state(), before)
    assert all(torch.equal(a[0], b[0]) for a, b in zip(seeded, first_batches(workload, {}, seed=5)))
    assert not torch.equal(seeded[8][0], seeded[0][0]), "the second epoch is shuffled anew"
    assert workload.steps_per_iteration == 8, "one report per epoch"


def test_a_dataloader_fixes_the_batch_size_and_says_so_when_the_config_differs():
    workload = blobs_workload(train=DataLoader(two_blobs(256, seed=0), batch_size=32, shuffle=True))
    with pytest.raises(ValueError, match="DataLoader was built with batch_size=32; pass its Dataset"):
        first_batches(workload, {"batch_size": 64}, seed=0)


class DictItems(Dataset):
    """What a Hugging Face style dataset yields: a dict per item."""

    def __len__(self):
        return 16

    def __getitem__(self, index):
        return {"features": torch.full((3,), float(index)), "label": index % 2}


@pytest.mark.parametrize("train, val, data, found", [
    (DictItems(), TensorDataset(torch.randn(8, 3), torch.zeros(8, dtype=torch.long)), "training", "dicts with keys ['features', 'label']"),
    (DataLoader(DictItems(), batch_size=4), TensorDataset(torch.randn(8, 3), torch.zeros(8, dtype=torch.long)), "training", "dicts with keys ['features', 'label']"),
    (TensorDataset(torch.randn(8, 3), torch.zeros(8, dtype=torch.long)), TensorDataset(torch.randn(8, 3), torch.zeros(8), torch.ones(8)), "validation", "lists of 3 items"),
])
def test_data_that_does_not_yield_inputs_and_target_pairs_is_refused_saying_what_it_yields(train, val, data, found):
    workload = DatasetWorkload(model=lambda config: nn.Linear(3, 2), train=train, val=val, loss=F.cross_entropy, defaults={"batch_size": 4})
    config = workload.resolve({})
    with pytest.raises(ValueError, match=rf"the {data} data must yield \(inputs, target\) pairs, and it yields {re.escape(found)}"):
        next(workload.train_batches(config, seed=0)) if data == "training" else workload.eval_batches(config)


def test_it_reports_val_loss_and_every_named_metric():
    trainer = TrialTrainer(blobs_workload(), {"lr": 1e-2})
    metrics = trainer.train_iteration()
    assert {"train_loss", "val_loss", "val_accuracy"} <= set(metrics)
    assert 0.0 <= metrics["val_accuracy"] <= 1.0


def test_two_fused_members_train_exactly_like_each_configuration_alone():
    from fusion.trainer import FusedTrainer

    workload = blobs_workload()
    configs = [{"lr": lr, "seed": 3} for lr in LRS]
    fused = FusedTrainer(workload, configs)
    alone = [TrialTrainer(workload, config) for config in configs]
    for _ in range(2):
        for together, single in zip(fused.train_iteration(), (trainer.train_iteration() for trainer in alone)):
            for key in ("train_loss", "val_loss", "val_accuracy"):
                assert together[key] == pytest.approx(single[key], rel=1e-5), key


def sweep(tmp_path, name, fusion):
    return hpo.run(
        blobs_workload(),
        config={"lr": tune.grid_search(LRS), "seed": 3},
        metric="val_loss",
        mode="min",
        stop={"training_iteration": 2},
        storage_path=str(tmp_path),
        name=name,
        fusion=fusion,
        resources_per_trial={"cpu": 2},  # one slot for the machine: both configurations in one group
    )


@pytest.mark.slow
def test_a_sweep_over_it_trains_the_same_fused_as_unfused(ray_local, tmp_path):
    plain = sweep(tmp_path, "plain", None)
    fused = sweep(tmp_path, "fused", hpo.FusionConfig(max_members=2))
    plain_frame = plain.get_dataframe().set_index("config/lr").sort_index()
    fused_frame = fused.get_dataframe().set_index("config/lr").sort_index()
    assert list(plain_frame.index) == LRS and (plain_frame["iterations"] == 2).all()
    assert list(fused_frame.index) == LRS and (fused_frame["iterations"] == 2).all()
    groups = fused.extras["fused_groups"]
    assert sorted(m for g in groups for m in g) == sorted(fused_frame["trial_id"]) and max(map(len, groups)) == 2
    relative = (fused_frame["val_loss"] - plain_frame["val_loss"]).abs() / plain_frame["val_loss"]
    assert relative.max() < 1e-4, relative
