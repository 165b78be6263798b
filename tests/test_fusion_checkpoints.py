"""Fused checkpoints split into ordinary per-member checkpoints and join back without loss."""

from __future__ import annotations

import pytest
import torch

from examples.mlp_digits import workload as mlp_digits
from fusion import FusedTrainer
from hpo.base.training import TrialTrainer


BASE = {"width": 32, "steps_per_iteration": 10}
CONFIGS = [
    {**BASE, "seed": 0, "optimizer": "adamw", "lr": 2e-3, "weight_decay": 0.1, "lr_schedule": "cosine", "schedule_steps": 40},
    {**BASE, "seed": 1, "optimizer": "adamw", "lr": 1e-3, "warmup_steps": 15},
]
SGD_CONFIGS = [
    {**BASE, "seed": 0, "optimizer": "sgd", "lr": 0.05, "momentum": 0.9},
    {**BASE, "seed": 1, "optimizer": "sgd", "lr": 0.05, "momentum": 0.0},
]


def assert_same_state(a: dict, b: dict, what: str) -> None:
    for name, tensor in a["model"].items():
        assert torch.equal(tensor, b["model"][name]), f"{what}: parameter {name} differs"
    assert a["step"] == b["step"], f"{what}: step {a['step']} vs {b['step']}"
    for index, per_param in a["optimizer"]["state"].items():
        for key, tensor in per_param.items():
            assert torch.equal(tensor, b["optimizer"]["state"][index][key]), f"{what}: optimizer state {key} of param {index} differs"


@pytest.mark.parametrize("configs", [CONFIGS, SGD_CONFIGS], ids=["adamw", "sgd"])
def test_a_split_member_continues_unfused_exactly_as_it_would_have_fused(configs):
    fused = FusedTrainer(mlp_digits, configs)
    fused.train_iteration()
    split = [fused.member_state_dict(member) for member in range(len(configs))]
    next_lrs = fused.optimizer.current_lrs()
    fused.train_iteration()
    for member, config in enumerate(configs):
        alone = TrialTrainer(mlp_digits, config)
        alone.load_state_dict(split[member])  # an ordinary TrialTrainer checkpoint
        assert alone.step == split[member]["step"]
        assert alone.optimizer.param_groups[0]["lr"] == pytest.approx(next_lrs[member], rel=1e-12)
        alone.train_iteration()
        assert_same_state(alone.state_dict(), fused.member_state_dict(member), f"member {member} after continuing unfused")


def test_member_state_dict_loads_into_the_unfused_model():
    fused = FusedTrainer(mlp_digits, CONFIGS)
    fused.train_iteration()
    model = mlp_digits.build_model(mlp_digits.resolve(CONFIGS[1]))
    model.load_state_dict(fused.model.member_state_dict(1))  # strict: same names and shapes
    inputs, _ = mlp_digits.eval_batches(mlp_digits.resolve(CONFIGS[1]))[0]
    with torch.no_grad():
        fused.model.eval()
        assert torch.equal(model(inputs), fused.model(inputs)[1])


def test_a_group_rebuilt_from_member_checkpoints_resumes_losslessly(tmp_path):
    uninterrupted = FusedTrainer(mlp_digits, CONFIGS)
    uninterrupted.train_iteration()
    directories = []
    for member in range(len(CONFIGS)):
        directory = tmp_path / f"member{member}"
        directory.mkdir()
        uninterrupted.save_member(member, str(directory))
        directories.append(str(directory))
    resumed = FusedTrainer.from_member_checkpoints(mlp_digits, CONFIGS, directories)  # the actor was killed
    assert resumed.step == uninterrupted.step and resumed.iteration == uninterrupted.iteration
    expected = uninterrupted.train_iteration()
    got = resumed.train_iteration()
    assert got == expected
    for member in range(len(CONFIGS)):
        assert_same_state(resumed.member_state_dict(member), uninterrupted.member_state_dict(member), f"member {member}")


def test_trial_trainer_checkpoints_join_a_fused_group(tmp_path):
    directories = []
    for member, config in enumerate(CONFIGS):
        alone = TrialTrainer(mlp_digits, config)
        alone.train_iteration()
        directory = tmp_path / f"trial{member}"
        directory.mkdir()
        alone.save(str(directory))
        directories.append(str(directory))
    joined = FusedTrainer.from_member_checkpoints(mlp_digits, CONFIGS, directories)
    never_split = FusedTrainer(mlp_digits, CONFIGS)
    never_split.train_iteration()
    assert joined.train_iteration() == never_split.train_iteration()


def test_members_at_different_steps_cannot_share_a_group():
    first = FusedTrainer(mlp_digits, CONFIGS[:1])
    second = FusedTrainer(mlp_digits, CONFIGS[1:])
    second.train_iteration()
    with pytest.raises(ValueError, match="different steps"):
        FusedTrainer.from_member_states(mlp_digits, CONFIGS, [first.member_state_dict(0), second.member_state_dict(0)])


def test_group_checkpoint_restores_the_group_after_members_left(tmp_path):
    trainer = FusedTrainer(mlp_digits, [*CONFIGS, {**CONFIGS[0], "seed": 7}], member_ids=["a", "b", "c"])
    trainer.train_iteration()
    trainer.remove_members(["b"])
    trainer.save(str(tmp_path))
    restored = FusedTrainer.load(mlp_digits, str(tmp_path))
    assert restored.member_ids == ["a", "c"]
    assert restored.train_iteration() == trainer.train_iteration()


def test_a_member_checkpoint_directory_is_one_a_trial_trainer_restores(tmp_path):
    fused = FusedTrainer(mlp_digits, CONFIGS)
    fused.train_iteration()
    fused.save_member(1, str(tmp_path))
    alone = TrialTrainer(mlp_digits, CONFIGS[1])
    alone.restore(str(tmp_path))  # reads the directory as Tune hands it to an unfused trial
    assert_same_state(alone.state_dict(), fused.member_state_dict(1), "member 1 restored unfused")
