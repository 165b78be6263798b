"""Members of a fused group are independent: a poisoned member, a removed member or an added one
never changes another member's numbers; non-fusible configs never share a group."""

from __future__ import annotations

import pytest
import torch

from examples.mlp_digits import workload as mlp_digits
from fusion import FUSIBLE_KEYS, MULTIPLIER_KEYS, FusedTrainer, FusionError, check_fusible, group_configs
from hpo.base.hparams import OptimHParams


BASE = {"width": 32, "steps_per_iteration": 10}


def member_configs(count: int) -> list[dict]:
    return [{**BASE, "seed": i, "lr": 1e-3 * (1 + i), "optimizer": "adam", "grad_clip": 1.0 if i % 2 else 0.0} for i in range(count)]


def assert_bit_identical(a: FusedTrainer, a_id, b: FusedTrainer, b_id) -> None:
    state_a, state_b = a.member_state_dict(a_id), b.member_state_dict(b_id)
    for name, tensor in state_a["model"].items():
        assert torch.equal(tensor, state_b["model"][name]), f"member {a_id}: {name} differs from member {b_id} of the other run"
    for index, per_param in state_a["optimizer"]["state"].items():
        for key, tensor in per_param.items():
            assert torch.equal(tensor, state_b["optimizer"]["state"][index][key]), f"member {a_id}: optimizer {key} differs"


def test_nan_in_one_member_leaves_others_bit_identical():
    configs = member_configs(8)
    poisoned = FusedTrainer(mlp_digits, configs, strategy="stacked")
    without = FusedTrainer(mlp_digits, configs[:3] + configs[4:], member_ids=[0, 1, 2, 4, 5, 6, 7], strategy="stacked")
    with torch.no_grad():
        poisoned.model.module.get_parameter("body.2.weight")[3, 0, 0] = float("nan")
    for _ in range(3):
        poisoned_metrics = poisoned.train_iteration()
        without.train_iteration()
    assert poisoned_metrics[3]["diverged"], "member 3 was meant to diverge; the test would prove nothing"
    assert not any(m["diverged"] for i, m in enumerate(poisoned_metrics) if i != 3)
    for member in (0, 1, 2, 4, 5, 6, 7):
        assert_bit_identical(poisoned, member, without, member)


def test_nan_weights_in_one_vmap_member_leave_others_bit_identical():
    configs = member_configs(4)
    poisoned = FusedTrainer(mlp_digits, configs, strategy="vmap")
    clean = FusedTrainer(mlp_digits, configs, strategy="vmap")
    with torch.no_grad():
        poisoned.model.module.get_parameter("body.0.weight")[2].fill_(float("nan"))
    metrics = poisoned.train_iteration()
    clean.train_iteration()
    assert metrics[2]["diverged"]
    for member in (0, 1, 3):
        assert_bit_identical(poisoned, member, clean, member)


def test_removed_members_stop_training_and_survivors_are_unaffected():
    configs = member_configs(4)
    shrinking = FusedTrainer(mlp_digits, configs)
    survivors_only = FusedTrainer(mlp_digits, [configs[0], configs[3]], member_ids=[0, 3])
    shrinking.train_iteration()
    survivors_only.train_iteration()
    shrinking.remove_members([1, 2])
    assert shrinking.member_ids == [0, 3]
    assert shrinking.model.module.get_parameter("body.0.weight").shape[0] == 2, "parameters were not repacked"
    assert all(state.shape[0] == 2 for state in shrinking.optimizer.state.values()), "optimizer state was not repacked"
    metrics = shrinking.train_iteration()
    survivors_only.train_iteration()
    assert len(metrics) == 2
    for member in (0, 3):
        assert_bit_identical(shrinking, member, survivors_only, member)


def test_removing_an_unknown_member_names_it():
    trainer = FusedTrainer(mlp_digits, member_configs(2))
    with pytest.raises(KeyError, match="7"):
        trainer.remove_members([7])


def test_members_added_at_step_zero_train_as_if_there_from_the_start():
    configs = member_configs(3)
    grown = FusedTrainer(mlp_digits, configs[:1])
    grown.add_members(configs[1:])
    together = FusedTrainer(mlp_digits, configs)
    assert grown.member_ids == [0, 1, 2]
    grown.train_iteration()
    together.train_iteration()
    for member in (0, 1, 2):
        assert_bit_identical(grown, member, together, member)


def test_fresh_members_cannot_join_a_group_that_has_trained():
    trainer = FusedTrainer(mlp_digits, member_configs(1))
    trainer.train_iteration()
    with pytest.raises(ValueError, match="step 0"):
        trainer.add_members(member_configs(2)[1:])


def test_configs_split_into_groups_by_structural_keys():
    configs = [
        {"lr": 1e-3, "width": 64, "seed": 0},
        {"lr": 3e-3, "width": 64, "seed": 1, "weight_decay": 0.1, "output_mult": 2.0},
        {"lr": 1e-3, "width": 128},
        {"lr": 1e-3, "width": 64, "batch_size": 32},
        {"lr": 1e-3, "width": 64, "optimizer": "sgd"},
        {"lr": 1e-3, "width": 64.0, "dropout": 0.0},
        {"lr": 1e-3, "width": 64, "dropout": 0.1},
    ]
    resolved = [mlp_digits.resolve(c) for c in configs]
    assert group_configs(resolved) == [[0, 1, 5], [2], [3], [4], [6]]


def test_groups_respect_max_members():
    configs = [{"lr": 1e-3 * i, "width": 64} for i in range(1, 6)]
    assert group_configs(configs, max_members=2) == [[0, 1], [2, 3], [4]]


def test_fused_trainer_rejects_configs_that_differ_in_structure():
    with pytest.raises(FusionError, match="'width'"):
        FusedTrainer(mlp_digits, [{**BASE, "width": 32}, {**BASE, "width": 64}])


def test_fusible_keys_are_the_optimizer_settings_seed_and_mup_multipliers():
    from hpo.scaling import TRANSFERABLE

    assert MULTIPLIER_KEYS == TRANSFERABLE - OptimHParams.keys(), "MULTIPLIER_KEYS drifted from hpo.scaling.TRANSFERABLE"
    assert "optimizer" not in FUSIBLE_KEYS and {"lr", "seed", "nesterov"} <= FUSIBLE_KEYS
    check_fusible([{"lr": 1.0, "batch_size": 64}, {"lr": 2.0, "batch_size": 64.0}])
